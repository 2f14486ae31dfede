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


def gradients_in_place(grad_input: torch.Tensor, blocks: int, *parts: Any) -> tuple[Any, ...]:
    """The output tuple of ``native_batch_norm_backward``: grad_input (grad_out's storage, written by the
    block copies), the weight and bias gradients concatenated over the blocks. ``parts``: the ``blocks``
    weight gradients, the ``blocks`` bias gradients, then the block copies (listed so that they run first)."""
    weight_grads, bias_grads = parts[:blocks], parts[blocks:2 * blocks]
    weight = torch.cat(weight_grads) if all(g is not None for g in weight_grads) else None
    bias = torch.cat(bias_grads) if all(g is not None for g in bias_grads) else None
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
    weight_grads, bias_grads, written = [], [], []
    for start, end in _blocks(grad.meta["val"].shape[1]):
        def block(value: fx.Node, dim: int = 1, a: int = start, b: int = end) -> fx.Node:
            return builder.call(aten.slice.Tensor, value, dim, a, b)

        g_block = builder.call(aten.clone.default, block(g))
        x_block = builder.call(aten.clone.default, block(x))
        result = builder.call(aten.native_batch_norm_backward.default, g_block, x_block,
                              block(w, 0) if w is not None else None, None, None, block(mean_in, 0),
                              block(invstd_in, 0), training, eps, [True, mask[1], mask[2]])
        written.append(builder.call(aten.copy_.default, block(g), builder.call(operator.getitem, result, 0)))
        weight_grads.append(builder.call(operator.getitem, result, 1))
        bias_grads.append(builder.call(operator.getitem, result, 2))
    return builder.done(builder.call(gradients_in_place, g, len(written), *weight_grads, *bias_grads, *written))


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


__all__ = ["CHANNEL_BLOCKS", "find_batch_norm_grad_inplace", "grad_inplace_program", "gradients_in_place"]
