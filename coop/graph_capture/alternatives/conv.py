"""Convolution backward split into its weight part and its data part (MONeT, Shah et al. 2021).

Eager PyTorch runs a convolution's backward as one fused call,
``convolution_backward(grad_out, input, weight, ..., output_mask=[True, True, True])``: grad_out,
the input and the new grad_input (three activation-sized values) are resident at once. MONeT
("Memory Optimization for Deep Networks", ICLR 2021, section 4) runs backward-data and
backward-weight as separate operators so that no step needs all three. Here:

* an optional value ``W`` = ``convolution_backward(..., output_mask=[False, True, bias])`` (the
  weight and bias gradients: reads grad_out and the input, stores weight-sized bytes), computed
  while the input is alive (:func:`weight_part_program`);
* the node's implementation ``split`` reads ``[grad_out, weight, W]`` and computes grad_input with
  ``output_mask=[True, False, False]``, handing out W's tensors as the weight/bias gradients
  (:func:`data_part_program`). The data part needs only the input's *shape*: the kernels
  (mkldnn and slow2d on CPU, cuDNN) call ``input.contiguous()`` first, so a zero-stride
  ``expand`` (what ``torch.nn.grad.conv2d_input`` passes) is materialized into a full copy
  (measured: +1 input of resident memory on CPU). The program instead passes grad_out's own
  storage viewed in the input's contiguous shape (``as_strided``, no allocation), which exists
  only where grad_out's storage holds at least as many elements as the input; elsewhere (a
  channel-reducing or strided convolution whose grad_out is smaller) the split would keep the
  same footprint and is not offered. The data kernel never reads the input's values:
  tests/test_alternatives_conv.py fills that storage with NaN and infinities and still gets the
  fused op's bits.

Bits: on CPU each part equals the fused call bit for bit (``torch.equal``; the kernels compute the
same reductions, the fused call only runs both), so ``split`` is exact. On other devices (cuDNN
picks algorithms by shape; unmeasured here) it is offered as inexact, with
:data:`CONV_SPLIT_TOLERANCE`: capture runs no kernel on made-up data to find out (issue 22; an
earlier version ran the fused call and the split on random tensors of each configuration), so
``plan(..., exact=True)`` never chooses it there.

Memory (contract 2): the fused op's weight/bias gradients are extra outputs (``Node.output_of``),
counted from the step after the op's first compute and, at that step, as the op's workspace (the
Graph requires an op's workspace to cover its extra outputs, also under an implementation). Under
``split`` they are W's storages: at the split step W is resident (a read) and the split's workspace
covers the extra outputs too, so the prediction counts those weight-sized bytes twice at that one
step (an upper bound of what a meter sees: the storages exist once); after it W is dead (its last
read) and only the extra outputs count them.

Where grad_out's storage is too small to stand for the input (a channel-reducing or strided
convolution), :func:`chunked_data_part_program` allocates grad_input first and computes it in
:data:`CHUNKS` chunks of input channels, each with a stand-in over grad_input's own unwritten
storage; its workspace is one chunk. Chunking changes the kernel's blocking, and on a few shapes
its bits (measured on CPU: a 1x1 convolution 512 -> 2048 at batch 1 differs in the last place):
the chunked split is therefore offered as inexact, with :data:`CONV_SPLIT_TOLERANCE`.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch
from torch import fx

from coop.graph_capture.alternatives.base import (
    CapturedStep,
    FoundAlternatives,
    ImplProgram,
    ImplProgramBuilder,
    same_layouts,
    signature,
)

aten = torch.ops.aten

#: The op this module rewrites.
CONVOLUTION_BACKWARD = aten.convolution_backward.default

#: Relative tolerance declared for a split whose bits are not proven equal to the fused call's (the chunked
#: split; any split off the CPU): chunking input channels changes the kernel's blocking, and with it the order
#: of a reduction's float additions. tests/test_alternatives_conv.py measures the chunked split on CPU against
#: the fused call (float32, random shapes); declared with a safety factor, as batch norm's from_output.
CONV_SPLIT_TOLERANCE = 1e-5


#: Input-channel chunks of the chunked data part (each chunk's temporary is 1/CHUNKS of grad_input).
CHUNKS = 8


def convolution_gradients(grad_input: torch.Tensor | None, weight_part: tuple[Any, ...], *written: Any) -> tuple[Any, ...]:
    """The output tuple of the fused ``convolution_backward`` (a split program's last call packs it).

    Parameters
    ----------
    grad_input
        The data part's grad_input.
    weight_part
        W: the weight part's output tuple.
    *written
        The chunk copies into grad_input (listed so that they run first).

    Returns
    -------
    tuple
        ``(grad_input, grad_weight, grad_bias)``.
    """
    return grad_input, weight_part[1], weight_part[2]


def _contiguous_strides(shape: tuple[int, ...] | torch.Size) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


def weight_part_program(backward: fx.Node) -> ImplProgram:
    """The optional value W of a split convolution backward: its weight and bias gradients.

    Parameters
    ----------
    backward
        A captured ``convolution_backward``.

    Returns
    -------
    ImplProgram
        Reads ``[grad_out, input, weight]``; ``convolution_backward`` with ``output_mask=[False, mask[1], mask[2]]``.
    """
    grad, source, weight = backward.args[:3]
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (source.name, source.meta["val"]), (weight.name, weight.meta["val"])])
    g, x, w = builder.inputs
    mask = backward.args[10]
    return builder.done(builder.call(aten.convolution_backward.default, g, x, w, *backward.args[3:10],
                                     [False, mask[1], mask[2]]))


def data_part_program(backward: fx.Node, weight_part_id: int, weight_part: Any) -> ImplProgram:
    """The implementation ``split`` where grad_out's storage can stand for the input.

    Parameters
    ----------
    backward
        A captured ``convolution_backward``.
    weight_part_id, weight_part
        W's Graph id and (fake) value (see :func:`weight_part_program`).

    Returns
    -------
    ImplProgram
        Reads ``[grad_out, weight, W]``; grad_input with the input's shape over grad_out's storage, W's tensors as
        the weight and bias gradients.
    """
    grad, source, weight = backward.args[:3]
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (weight.name, weight.meta["val"]), (weight_part_id, weight_part)])
    g, w, part = builder.inputs
    shape = list(source.meta["val"].shape)
    like_input = builder.call(aten.as_strided.default, g, shape, _contiguous_strides(shape), 0)
    data = builder.call(aten.convolution_backward.default, g, like_input, w, None, *backward.args[4:10],
                        [True, False, False])
    grad_input = builder.call(operator.getitem, data, 0)
    return builder.done(builder.call(convolution_gradients, grad_input, part))


def chunked_data_part_program(backward: fx.Node, weight_part_id: int, weight_part: Any) -> ImplProgram:
    """The implementation ``split`` where grad_out cannot stand for the input.

    grad_input in :data:`CHUNKS` chunks of input channels (of whole groups for a grouped convolution), each
    computed from its weight slice (and grad_out slice) with a stand-in over grad_input's own, not yet written,
    storage, then copied into its channels.

    Parameters
    ----------
    backward
        A captured ``convolution_backward``.
    weight_part_id, weight_part
        W's Graph id and (fake) value (see :func:`weight_part_program`).

    Returns
    -------
    ImplProgram
        Reads ``[grad_out, weight, W]``.
    """
    grad, source, weight = backward.args[:3]
    stride, padding, dilation, _, output_padding, groups = backward.args[4:10]
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (weight.name, weight.meta["val"]), (weight_part_id, weight_part)])
    g, w, part = builder.inputs
    shape = list(source.meta["val"].shape)
    channels, outputs = shape[1], grad.meta["val"].shape[1]
    grad_input = builder.call(aten.new_empty.default, g, shape)
    units = groups if groups > 1 else channels
    per_in, per_out = channels // groups, outputs // groups
    bounds = [units * i // min(units, CHUNKS) for i in range(min(units, CHUNKS) + 1)]
    written = []
    for a, b in itertools.pairwise(bounds):
        if groups > 1:  # whole groups: their input and output channels, weight rows and grad_out channels
            first, last = a * per_in, b * per_in
            g_chunk = builder.call(aten.clone.default, builder.call(aten.slice.Tensor, g, 1, a * per_out, b * per_out))
            w_chunk = builder.call(aten.clone.default, builder.call(aten.slice.Tensor, w, 0, a * per_out, b * per_out))
        else:
            first, last, g_chunk = a, b, g
            w_chunk = builder.call(aten.clone.default, builder.call(aten.slice.Tensor, w, 1, a, b))
        chunk_shape = [shape[0], last - first, *shape[2:]]
        stand_in = builder.call(aten.as_strided.default, grad_input, chunk_shape, _contiguous_strides(chunk_shape), 0)
        data = builder.call(aten.convolution_backward.default, g_chunk, stand_in, w_chunk, None, stride, padding,
                            dilation, False, output_padding, b - a if groups > 1 else 1, [True, False, False])
        target = builder.call(aten.slice.Tensor, grad_input, 1, first, last)
        written.append(builder.call(aten.copy_.default, target, builder.call(operator.getitem, data, 0)))
    return builder.done(builder.call(convolution_gradients, grad_input, part, *written))


def _shape_cover(grad: torch.Tensor, source: torch.Tensor) -> bool:
    """grad_out's storage can stand for the input's contiguous shape: same dtype and device, enough elements."""
    return (grad.dtype == source.dtype and grad.device == source.device and grad.storage_offset() == 0
            and grad.untyped_storage().nbytes() >= source.numel() * source.element_size())


def find_convolution_split(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``split`` for a convolution backward that computes grad_input and the weight gradient.

    Parameters
    ----------
    backward
        A captured ``convolution_backward``.
    found
        Receives the implementation and W, an optional value (key: ``conv_weight_grad:<backward>``).
    """
    graph, owner_of = step.graph, step.owner_of
    grad, source, weight = backward.args[:3]
    mask = backward.args[10]
    if not all(isinstance(v, fx.Node) for v in (grad, source, weight)) or not isinstance(mask, (list, tuple)):
        return
    if not (mask[0] and mask[1]) or not all(isinstance(m, bool) for m in mask):
        return  # nothing to split: no grad_input (a first layer) or no weight gradient
    if graph.node(owner_of[source.name]).caller_owned:
        return  # the input stays resident anyway: the fused call holds nothing more
    grad_value, source_value = grad.meta.get("val"), source.meta.get("val")
    if not isinstance(grad_value, torch.Tensor) or not isinstance(source_value, torch.Tensor):
        return
    if not source_value.is_contiguous():
        return
    weight_program = weight_part_program(backward)
    weight_part_id = found.next_id  # W's id, once it is added below
    covered = _shape_cover(grad_value, source_value)
    if covered:
        program = data_part_program(backward, weight_part_id, weight_program.output.meta["val"])
    elif backward.args[7] is False:
        program = found.shared_program(
            ("split", *signature(backward)), (grad.name, weight.name, weight_part_id),
            lambda: chunked_data_part_program(backward, weight_part_id, weight_program.output.meta["val"]))
    else:
        return
    if not same_layouts(program.output.meta["val"], backward.meta["val"]):
        return
    proven = covered and source_value.device.type == "cpu"  # bit for bit: tests/test_alternatives_conv.py
    fields = {} if proven else {"exact": False, "tolerance": CONV_SPLIT_TOLERANCE}
    found.add_optional((f"conv_weight_grad:{backward.name}",), weight_program,
                       tuple(dict.fromkeys(owner_of[v.name] for v in (grad, source, weight))))
    found.offer(owner_of[backward.name], "split", program, fields)


__all__ = ["CHUNKS", "CONVOLUTION_BACKWARD", "CONV_SPLIT_TOLERANCE", "chunked_data_part_program", "convolution_gradients", "data_part_program", "find_convolution_split", "weight_part_program"]
