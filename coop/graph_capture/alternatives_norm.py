"""Batch norm backward written into its incoming gradient (MONeT, Shah et al. 2021; in-place ABN).

Eager PyTorch's ``native_batch_norm_backward(grad_out, x, ...)`` (training mode) allocates
grad_input while grad_out and x are resident: three activation-sized values at one step. MONeT
("Memory Optimization for Deep Networks", ICLR 2021) and in-place activated batch norm (Rota Bulo
et al., CVPR 2018) compute the backward into the incoming gradient's storage. The implementation
``grad_inplace`` (``Impl.inplace_of`` = grad_out) does it in channel blocks: for each block of
channels it copies grad_out's and x's slices out (contiguous), runs the eager kernel on them and
writes the block's grad_input back over grad_out's slice. Its workspace is three block-sized
buffers (:data:`CHANNEL_BLOCKS` blocks: at most ~3/16 of an activation) plus the weight and bias
gradients.

Bits: the CPU kernel for a contiguous input reduces each channel over (N, H, W) in an order that
depends only on N and the spatial size, not on the other channels, so each block's gradients
equal the full call's bit for bit. tests/test_alternatives_conv.py proves it (raw bits, extreme
magnitudes, 1 and 2 threads) where the spatial size is above 1; with a spatial size of 1
(BatchNorm1d, a 1x1 map) the kernel vectorizes across channels and the bits differ in the last
place, so the implementation is offered only for contiguous inputs with more than one element per
(sample, channel), and only on CPU, where it is proven (``exact=True``).

The forward has the same shape of problem: training-mode ``_native_batch_norm_legit_functional(x, ...)``
allocates its output while x is resident, and in a residual block (the bottleneck's last conv, batch
norm, then the add with the shortcut) the shortcut is alive too: three activations at one step, a floor
no recomputation lowers. MONeT and in-place ABN run the forward in place. ``forward_inplace``
(``Impl.inplace_of`` = x) does it in the same channel blocks: each block of x is copied out (contiguous),
normalized by the same aten op with the block's slices of weight, bias and running statistics (same
training flag, momentum and eps), and written back over x's slice; the saved mean and rstd and the new
running mean and variance are copied block by block into per-channel vectors allocated first. Its
workspace is two block-sized buffers (the copy and the block's output) plus those statistics. Bits: the
CPU kernel reduces each channel of a contiguous input over (N, spatial) independently of the other
channels and normalizes elementwise per channel, so each block's five outputs equal the full call's
slices (tests/test_alternatives_norm_forward.py: raw bits, extreme magnitudes, 1 and 2 threads, odd
channel counts, float32 and float64); offered under the same conditions as ``grad_inplace``, for float32
and float64 inputs. A schedule that takes it must not read x afterwards: the backward then
reads the output (``from_output``) or a recomputed x.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import torch
from torch import fx

from coop.graph import Graph

aten = torch.ops.aten

#: Channel blocks of ``grad_inplace``: each block's three temporaries are 1/CHANNEL_BLOCKS of an activation.
CHANNEL_BLOCKS = 16


def gradients_in_place(grad_input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       *written: Any) -> tuple[Any, ...]:
    """The output tuple of ``native_batch_norm_backward``: grad_input (grad_out's storage, written by the block
    copies), the weight and bias gradients (allocated first, each block's copied into its slice). ``written``:
    the block copies (listed so that they run first)."""
    return grad_input, weight, bias


def _blocks(channels: int) -> list[tuple[int, int]]:
    count = min(channels, CHANNEL_BLOCKS)
    bounds = [channels * i // count for i in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if a < b]


def grad_inplace_program(backward: fx.Node) -> Any:
    """``grad_inplace``: reads ``[grad_out, x, weight, save_mean, save_invstd]``, writes grad_input over grad_out."""
    from coop.graph_capture.alternatives import _Builder

    grad, source, weight, _, _, mean, invstd, training, eps, mask = backward.args[:10]
    reads = [(grad.name, grad.meta["val"]), (source.name, source.meta["val"])]
    reads += [(node.name, node.meta["val"]) for node in (weight, mean, invstd) if node is not None]
    builder = _Builder(reads)
    g, x, *rest = builder.inputs
    w = rest.pop(0) if weight is not None else None
    mean_in, invstd_in = rest
    channels = grad.meta["val"].shape[1]
    # the weight and bias gradients are allocated first and each block's copied in at once: no block value outlives
    # its block, so the priced workspace is the meter's (three block buffers and the two gradients)
    vectors = [builder.call(aten.new_empty.default, g, [channels], dtype=value.dtype) if value is not None else None
               for value in backward.meta["val"][1:3]]
    written = []
    for start, end in _blocks(channels):
        def block(value: fx.Node, dim: int = 1, a: int = start, b: int = end) -> fx.Node:
            return builder.call(aten.slice.Tensor, value, dim, a, b)

        g_block = builder.call(aten.clone.default, block(g))
        x_block = builder.call(aten.clone.default, block(x))
        result = builder.call(aten.native_batch_norm_backward.default, g_block, x_block,
                              block(w, 0) if w is not None else None, None, None, block(mean_in, 0),
                              block(invstd_in, 0), training, eps, [True, mask[1], mask[2]])
        for k, vector in enumerate(vectors, start=1):
            if vector is not None:
                part = builder.call(operator.getitem, result, k)
                written.append(builder.call(aten.copy_.default, block(vector, 0), part))
        written.append(builder.call(aten.copy_.default, block(g), builder.call(operator.getitem, result, 0)))
    return builder.done(builder.call(gradients_in_place, g, *vectors, *written))


def find_batch_norm_grad_inplace(backward: fx.Node, graph: Graph, owner_of: dict[str, int], found: Any) -> None:
    """Offer ``grad_inplace`` for a training-mode batch norm backward on CPU over a contiguous
    activation with more than one element per (sample, channel), whose grad_out it may overwrite."""
    from coop.graph_capture.alternatives import _same_layout, _whole_storage, shared_program, signature

    grad, source, weight, _, _, mean, invstd, training, _, mask = backward.args[:10]
    if not (training is True and all(isinstance(v, fx.Node) for v in (grad, source, mean, invstd))):
        return
    if not (isinstance(mask, (list, tuple)) and mask[0] is True and all(isinstance(m, bool) for m in mask)):
        return
    grad_value, source_value = grad.meta.get("val"), source.meta.get("val")
    if not (isinstance(grad_value, torch.Tensor) and isinstance(source_value, torch.Tensor)):
        return
    if grad_value.device.type != "cpu" or grad_value.dim() < 3 or math.prod(grad_value.shape[2:]) <= 1:
        return  # bit identity is proven for these only (see the module docstring)
    if not (_whole_storage(grad_value) and source_value.is_contiguous() and _same_layout(grad_value, source_value)):
        return
    if weight is not None and not isinstance(weight, fx.Node):
        return
    grad_node, node = graph.node(owner_of[grad.name]), graph.node(owner_of[backward.name])
    if grad_node.caller_owned or grad_node.output_of is not None or grad_node.mem != node.mem:
        return
    reads = tuple(v.name for v in (grad, source, weight, mean, invstd) if v is not None)
    program = shared_program(found, ("grad_inplace", *signature(backward)), reads,
                             lambda: grad_inplace_program(backward))
    produced, expected = program.output.meta["val"], backward.meta["val"]
    if all(a is None and b is None or _same_layout(a, b) for a, b in zip(produced, expected, strict=True)):
        found.impls.setdefault(node.id, {})["grad_inplace"] = (program, {"inplace_of": grad_node.id})


#: Batch norm forwards ``forward_inplace`` runs in blocks: the functional training op (running statistics
#: in, new ones out) and ``native_batch_norm`` without running statistics (with them it mutates its buffers).
FORWARD_IN_BLOCKS = (aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default)

#: Input dtypes whose blockwise bits are proven equal to the fused kernel's (tests/test_alternatives_norm_forward.py).
FORWARD_DTYPES = (torch.float32, torch.float64)


def normalized_in_place(output: torch.Tensor, statistics: int, *parts: Any) -> tuple[Any, ...]:
    """The output tuple of a batch norm forward run in channel blocks: ``output`` (x's storage, written by the block
    copies) and the ``statistics`` per-channel vectors the blocks were copied into. ``parts``: those vectors, then
    the block copies (listed so that they run first)."""
    return (output, *parts[:statistics])


def forward_inplace_program(forward: fx.Node) -> Any:
    """``forward_inplace``: reads ``[x, weight?, bias?, running_mean?, running_var?]``, writes the output over x.

    The per-channel outputs are allocated first and each block's statistics copied into their slices at once, so
    that no block value outlives its block (a block's five outputs die together: the workspace is the block copy
    and the block's output, plus the statistics)."""
    from coop.graph_capture.alternatives import _Builder

    source, *tensors = forward.args[:5]
    present = [t for t in tensors if t is not None]
    builder = _Builder([(node.name, node.meta["val"]) for node in (source, *present)])
    x, *bound = builder.inputs
    slots = iter(bound)
    per_channel = [next(slots) if t is not None else None for t in tensors]
    channels = source.meta["val"].shape[1]
    vectors = [builder.call(aten.new_empty.default, x, [channels], dtype=value.dtype)
               for value in forward.meta["val"][1:]]
    written = []
    for start, end in _blocks(channels):
        def block(value: fx.Node | None, dim: int = 1, a: int = start, b: int = end) -> fx.Node | None:
            return None if value is None else builder.call(aten.slice.Tensor, value, dim, a, b)

        x_block = builder.call(aten.clone.default, block(x), memory_format=torch.contiguous_format)
        result = builder.call(forward.target, x_block, *(block(t, 0) for t in per_channel), *forward.args[5:])
        for k, vector in enumerate(vectors, start=1):
            statistic = builder.call(operator.getitem, result, k)
            written.append(builder.call(aten.copy_.default, block(vector, 0), statistic))
        written.append(builder.call(aten.copy_.default, block(x), builder.call(operator.getitem, result, 0)))
    return builder.done(builder.call(normalized_in_place, x, len(vectors), *vectors, *written))


def find_batch_norm_forward_inplace(forward: fx.Node, graph: Graph, owner_of: dict[str, int], found: Any) -> None:
    """Offer ``forward_inplace`` for a training-mode batch norm forward on CPU over a computed, contiguous float
    activation with more than one element per (sample, channel), whose storage the output may take over."""
    from coop.graph_capture.alternatives import _same_layout, _whole_storage, shared_program, signature

    if forward.target not in FORWARD_IN_BLOCKS or len(forward.args) != 8 or forward.kwargs:
        return
    if forward.args[5] is not True:
        return  # training mode only: it saves the statistics the backward reads
    source, *tensors = forward.args[:5]
    if forward.target is aten.native_batch_norm.default and any(t is not None for t in tensors[2:]):
        return  # it would update the running statistics in place
    if not isinstance(source, fx.Node) or source.name not in owner_of:
        return
    if not all(t is None or isinstance(t, fx.Node) and isinstance(t.meta.get("val"), torch.Tensor) for t in tensors):
        return
    value, produced = source.meta.get("val"), forward.meta.get("val")
    if not (isinstance(value, torch.Tensor) and isinstance(produced, (tuple, list)) and produced):
        return
    if value.device.type != "cpu" or value.dtype not in FORWARD_DTYPES:
        return  # bit identity is proven for these only (see the module docstring)
    if value.dim() < 3 or math.prod(value.shape[2:]) <= 1:
        return  # one element per (sample, channel): the kernel vectorizes across channels (see grad_inplace)
    if not (_whole_storage(value) and _same_layout(value, produced[0])):
        return
    source_node, node = graph.node(owner_of[source.name]), graph.node(owner_of[forward.name])
    if source_node.caller_owned or source_node.output_of is not None or source_node.mem != node.mem:
        return
    reads = tuple(v.name for v in (source, *tensors) if v is not None)
    program = shared_program(found, ("forward_inplace", *signature(forward)), reads,
                             lambda: forward_inplace_program(forward))
    made = program.output.meta["val"]
    if len(made) == len(produced) and all(_same_layout(a, b) for a, b in zip(made, produced, strict=True)):
        found.impls.setdefault(node.id, {})["forward_inplace"] = (program, {"inplace_of": source_node.id})


__all__ = ["CHANNEL_BLOCKS", "FORWARD_DTYPES", "FORWARD_IN_BLOCKS", "find_batch_norm_forward_inplace",
           "find_batch_norm_grad_inplace", "forward_inplace_program", "grad_inplace_program", "gradients_in_place",
           "normalized_in_place"]
