"""Max-pool backward from its indices alone, or from the indices packed to a byte (MONeT, Shah et al. 2021:
what a backward op stores).

``max_pool2d_with_indices_backward(grad_out, self, ..., indices)`` scatters ``grad_out`` through the
saved argmax ``indices`` into a zero tensor of ``self``'s shape: the CPU kernel reads ``self``'s
sizes and memory format, never its values. Eager keeps the pooled input (a full activation) alive
until the backward only for that. The implementation ``from_indices`` reads ``[grad_out, indices]``
and passes a zero-stride ``expand`` of a 0-d zero in ``self``'s place (no allocation: measured on
CPU, the kernel does not materialize it, unlike the convolution kernels; and its suggested memory
format is the contiguous one, as for the captured input). Offered on CPU for contiguous inputs,
where tests/test_alternatives_conv.py proves the bits equal to the default backward's.

``from_packed`` goes further, as MONeT stores max-pool's argmax compactly: the int64 ``indices`` (8 bytes an
output element, twice a float32 activation of the pooled size) say where in the input plane each maximum
lies, but each lies inside its own window, so its offset in the window (row * kernel width + column, counted
from the window's first element inside the input, below 128 for windows of up to 128 elements) fits one byte. An optional value ``packed_indices:<indices>`` is made
once from the op's indices right after the forward (then the indices need not be kept), and the backward
``from_packed`` rebuilds the int64 indices from the window geometry and runs the same kernel (its ``.grad_input``
variant, one batch chunk at a time, so that at most a chunk of int64 indices exists at once: the kernel
scatters each (sample, channel) plane independently, so the chunks write what one call writes). Both are
integer arithmetic: exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from coop.graph_capture.alternatives.base import (
    CapturedStep,
    FoundAlternatives,
    ImplProgram,
    ImplProgramBuilder,
    same_layout,
)

aten = torch.ops.aten

#: The op this module rewrites.
MAX_POOL_BACKWARD = aten.max_pool2d_with_indices_backward.default

#: A max-pool window's (kernel, stride, padding, dilation), each as (rows, columns).
WindowGeometry = tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]


def from_indices_program(backward: fx.Node) -> ImplProgram:
    """The implementation ``from_indices`` of a max-pool backward: a zero-stride stand-in for ``self``.

    Parameters
    ----------
    backward
        A captured ``max_pool2d_with_indices_backward``.

    Returns
    -------
    ImplProgram
        Reads ``[grad_out, indices]``.
    """
    grad, source, *geometry, indices = backward.args
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (indices.name, indices.meta["val"])])
    g, index = builder.inputs
    zero = builder.call(aten.new_zeros.default, g, [])
    stand_in = builder.call(aten.expand.default, zero, list(source.meta["val"].shape))
    return builder.done(builder.call(aten.max_pool2d_with_indices_backward.default, g, stand_in, *geometry, index))


def find_max_pool_from_indices(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``from_indices`` for a CPU max-pool backward over a contiguous, computed (not caller-owned) input.

    Parameters
    ----------
    backward
        A captured ``max_pool2d_with_indices_backward``.
    found
        Receives the implementation.
    """
    graph, owner_of = step.graph, step.owner_of
    if len(backward.args) != 8 or backward.kwargs:
        return
    grad, source, indices = backward.args[0], backward.args[1], backward.args[7]
    if not all(isinstance(v, fx.Node) for v in (grad, source, indices)):
        return
    value = source.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or not value.is_contiguous():
        return
    if graph.node(owner_of[source.name]).caller_owned:
        return  # the input stays resident anyway
    program = from_indices_program(backward)
    if same_layout(program.output.meta["val"], backward.meta["val"]):
        found.offer(owner_of[backward.name], "from_indices", program)


# -------------------------------------------------------------------- packed indices
#: Batch chunks of the packing and of the backward from packed indices (each holds int64 temporaries of a chunk).
PACK_CHUNKS = 16


def window_geometry(backward: fx.Node) -> WindowGeometry | None:
    """A max-pool's window.

    Parameters
    ----------
    backward
        A captured ``max_pool2d_with_indices_backward``.

    Returns
    -------
    WindowGeometry or None
        (kernel, stride, padding, dilation) as (rows, columns) pairs, or None where a window has more than 128
        elements (its offsets would not fit a signed byte).
    """
    def pair(value: Any, default: tuple[int, int]) -> tuple[int, int]:
        items = list(value) if value else list(default)
        return (int(items[0]), int(items[-1]))

    kernel = pair(backward.args[2], (1, 1))
    stride = pair(backward.args[3], kernel)
    geometry = (kernel, stride, pair(backward.args[4], (0, 0)), pair(backward.args[5], (1, 1)))
    return geometry if kernel[0] * kernel[1] <= 128 else None


def _chunks(batch: int) -> list[tuple[int, int]]:
    step = max(1, -(-batch // PACK_CHUNKS))
    return [(start, min(start + step, batch)) for start in range(0, batch, step)]


def _window_origins(builder: ImplProgramBuilder, out_shape: torch.Size, geometry: WindowGeometry) -> tuple[fx.Node, fx.Node]:
    """The input row of each output row's first window row inside the input (shape [1, 1, OH, 1]) and the column
    of its first column inside ([1, 1, 1, OW]): the window's start, moved past the padding in steps of the dilation
    as the kernel does. Offsets count from there, so offset 0 is an element of the input whatever the data (a
    zero-filled packed value decodes to in-bounds indices)."""
    _, stride, padding, dilation = geometry
    rows, cols = out_shape[-2], out_shape[-1]

    def first_inside(count: int, step: int, pad: int, spacing: int) -> fx.Node:
        start = builder.call(aten.arange.start_step, -pad, count * step - pad, step)
        deficit = builder.call(aten.clamp_min.default, builder.call(aten.neg.default, start), 0)
        skipped = builder.call(aten.floor_divide.Scalar, builder.call(aten.add.Scalar, deficit, spacing - 1), spacing)
        return builder.call(aten.add.Tensor, start, builder.call(aten.mul.Scalar, skipped, spacing))

    top = first_inside(rows, stride[0], padding[0], dilation[0])
    left = first_inside(cols, stride[1], padding[1], dilation[1])
    return builder.call(aten.view.default, top, [1, 1, rows, 1]), builder.call(aten.view.default, left, [1, 1, 1, cols])


def packed_indices_program(backward: fx.Node, geometry: WindowGeometry) -> ImplProgram:
    """The optional value ``packed_indices``: each argmax's offset inside its window, int8.

    Parameters
    ----------
    backward
        A captured ``max_pool2d_with_indices_backward``.
    geometry
        Its :func:`window_geometry`.

    Returns
    -------
    ImplProgram
        Reads ``[indices]``.
    """
    indices = backward.args[7]
    width = backward.args[1].meta["val"].shape[-1]
    (_, kernel_w), _, _, dilation = geometry
    value = indices.meta["val"]
    builder = ImplProgramBuilder([(indices.name, value)])
    (index,) = builder.inputs
    top, left = _window_origins(builder, value.shape, geometry)
    packed = builder.call(aten.empty.memory_format, list(value.shape), dtype=torch.int8, device=value.device)
    for start, end in _chunks(value.shape[0]):
        part = builder.call(aten.slice.Tensor, index, 0, start, end)
        row = builder.call(aten.floor_divide.Scalar, part, width)  # input row of the maximum
        column = builder.call(aten.remainder.Scalar, part, width)
        row = builder.call(aten.sub_.Tensor, row, top)
        column = builder.call(aten.sub_.Tensor, column, left)
        if dilation != (1, 1):
            row = builder.call(aten.floor_divide_.Scalar, row, dilation[0])
            column = builder.call(aten.floor_divide_.Scalar, column, dilation[1])
        offset = builder.call(aten.add_.Tensor, builder.call(aten.mul_.Scalar, row, kernel_w), column)
        builder.call(aten.copy_.default, builder.call(aten.slice.Tensor, packed, 0, start, end), offset)
    return builder.done(packed)


def from_packed_program(backward: fx.Node, packed_id: int, packed: torch.Tensor, geometry: WindowGeometry) -> ImplProgram:
    """The implementation ``from_packed`` of a max-pool backward.

    The int64 indices rebuilt from the window offsets a batch chunk at a time, each chunk's gradient written by the
    kernel's ``.grad_input`` variant into its rows of one zero-filled result.

    Parameters
    ----------
    backward
        A captured ``max_pool2d_with_indices_backward``.
    packed_id, packed
        The packed indices' Graph id and (fake) value (see :func:`packed_indices_program`).
    geometry
        The backward's :func:`window_geometry`.

    Returns
    -------
    ImplProgram
        Reads ``[grad_out, packed]``.
    """
    grad, source = backward.args[0], backward.args[1]
    width = source.meta["val"].shape[-1]
    (_, kernel_w), _, _, dilation = geometry
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (packed_id, packed)])
    g, offsets = builder.inputs
    top, left = _window_origins(builder, packed.shape, geometry)
    shape = list(source.meta["val"].shape)
    result = builder.call(aten.new_zeros.default, g, shape)
    zero = builder.call(aten.new_zeros.default, g, [])
    for start, end in _chunks(shape[0]):
        wide = builder.call(aten._to_copy.default, builder.call(aten.slice.Tensor, offsets, 0, start, end),
                            dtype=torch.int64)
        row = builder.call(aten.floor_divide.Scalar, wide, kernel_w)
        column = builder.call(aten.remainder_.Scalar, wide, kernel_w)
        if dilation != (1, 1):
            row = builder.call(aten.mul_.Scalar, row, dilation[0])
            column = builder.call(aten.mul_.Scalar, column, dilation[1])
        row = builder.call(aten.add_.Tensor, row, top)
        column = builder.call(aten.add_.Tensor, column, left)
        index = builder.call(aten.add_.Tensor, builder.call(aten.mul_.Scalar, row, width), column)
        stand_in = builder.call(aten.expand.default, zero, [end - start, *shape[1:]])
        builder.call(aten.max_pool2d_with_indices_backward.grad_input, builder.call(aten.slice.Tensor, g, 0, start, end),
                     stand_in, *backward.args[2:7], index,
                     grad_input=builder.call(aten.slice.Tensor, result, 0, start, end))
    return builder.done(result)


def find_max_pool_from_packed(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``from_packed`` for a CPU max-pool backward over a contiguous 4-d input whose indices are a computed
    value and whose windows have at most 128 elements.

    Parameters
    ----------
    backward
        A captured ``max_pool2d_with_indices_backward``.
    found
        Receives the implementation and its optional value ``packed_indices:<indices>`` (shared by backwards of one
        indices value and geometry).
    """
    graph, owner_of = step.graph, step.owner_of
    if len(backward.args) != 8 or backward.kwargs:
        return
    grad, source, indices = backward.args[0], backward.args[1], backward.args[7]
    if not all(isinstance(v, fx.Node) for v in (grad, source, indices)) or indices.name not in owner_of:
        return
    value, index_value = source.meta.get("val"), indices.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or not value.is_contiguous() or value.dim() != 4:
        return
    if not isinstance(index_value, torch.Tensor) or not index_value.is_contiguous() or index_value.dtype != torch.int64:
        return
    geometry = window_geometry(backward)
    if geometry is None or graph.node(owner_of[indices.name]).caller_owned:
        return
    key = (f"packed_indices:{indices.name}", *map(repr, geometry))
    packed_id, packed = found.optional_once(key, lambda: packed_indices_program(backward, geometry),
                                            owner_of[indices.name])
    program = from_packed_program(backward, packed_id, packed.output.meta["val"], geometry)
    if same_layout(program.output.meta["val"], backward.meta["val"]):
        found.offer(owner_of[backward.name], "from_packed", program)


__all__ = ["MAX_POOL_BACKWARD", "PACK_CHUNKS", "WindowGeometry", "find_max_pool_from_indices", "find_max_pool_from_packed", "from_indices_program",
           "from_packed_program", "packed_indices_program", "window_geometry"]
