"""Batch norm: its backward from its output, its backward written into its incoming gradient, its forward written
over its input (MONeT, Shah et al. 2021; in-place ABN).

**Backward from the output** (inexact, MONeT's output-activated normalisation):
``native_batch_norm_backward``'s implementation ``from_output`` reads batch norm's output ``y`` instead of its
input and recomputes ``x_hat = (y - beta) / gamma`` (:func:`batch_norm_from_output_program`); offered only where
every ``gamma`` is nonzero in the real ``values`` passed at capture, with ``exact=False`` and
:data:`BATCH_NORM_FROM_OUTPUT_TOLERANCE`.

**Backward over its incoming gradient:** eager PyTorch's ``native_batch_norm_backward(grad_out, x, ...)`` (training mode) allocates
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

from coop.graph_capture.alternatives.base import (
    CapturedStep,
    FoundAlternatives,
    ImplProgram,
    ImplProgramBuilder,
    same_layout,
    same_layouts,
    signature,
    whole_storage,
)

aten = torch.ops.aten

#: Training-mode batch norm forwards whose saved statistics ``native_batch_norm_backward`` reads.
BATCH_NORM_FORWARDS = (aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default,
                       aten._native_batch_norm_legit.default)

#: Declared relative error of batch norm's backward from its output against eager autograd, relative to the
#: size of each gradient's terms (max |gamma * invstd| * max |g| for grad_input, the largest per-channel
#: sum |g * x_hat| and sum |g| for grad_weight and grad_bias; relative to max |grad| itself the error is
#: unbounded, as grad_input cancels to ~0 when few elements share a channel). Measured in float32 over 200
#: random shapes (>= 16 elements a channel), 0.1 <= |gamma| <= 2, beta ~ N(0, 1): at most 6.1e-7; declared
#: with a safety factor of ~16. It grows with |beta| / |gamma| (y - beta loses x_hat's low bits).
BATCH_NORM_FROM_OUTPUT_TOLERANCE = 1e-5

#: The backward this module rewrites (``from_output``, ``grad_inplace``).
BATCH_NORM_BACKWARD = aten.native_batch_norm_backward.default


# -------------------------------------------------------------------- backward from the output
def batch_norm_gradients(grad_input: torch.Tensor | None, grad_weight: torch.Tensor | None,
                         grad_bias: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The output tuple of ``native_batch_norm_backward`` (the program's last call packs it).

    Parameters
    ----------
    grad_input, grad_weight, grad_bias
        The gradients (None where the backward's output mask leaves one out).

    Returns
    -------
    tuple
        The three, in that order.
    """
    return grad_input, grad_weight, grad_bias


def batch_norm_from_output_program(backward: fx.Node, output: fx.Node, bias: fx.Node | None) -> ImplProgram:
    """``native_batch_norm_backward`` (training mode) from batch norm's output ``y`` instead of its input.

    MONeT's output-activated normalisation: ``x_hat = (y - beta) / gamma`` per channel, then the
    training-mode gradients with per-channel sums over every dimension but 1 and ``n`` elements each::

        grad_bias   = sum(g)
        grad_weight = sum(g * x_hat)
        grad_input  = gamma * invstd * (g - grad_bias / n - x_hat * grad_weight / n)
                    = (y - beta) * (-invstd * grad_weight / n) + g * (gamma * invstd) - gamma * invstd * grad_bias / n

    The last form needs one full-size buffer at a time (written in place), so the program's workspace
    is one activation that is freed before the output exists. The saved mean is not needed. It is
    undefined where a ``gamma`` is zero (``y`` then holds nothing of ``x``): capture offers it only
    where every weight is nonzero, and a weight trained to zero later makes its gradients NaN or inf.

    Parameters
    ----------
    backward
        A captured training-mode ``native_batch_norm_backward``.
    output
        The forward's output ``y`` (its getitem 0).
    bias
        The forward's bias ``beta``, or None (no bias).

    Returns
    -------
    ImplProgram
        Reads ``[grad, y, weight, (bias,) save_invstd]``.
    """
    grad, _, weight, *_, invstd = backward.args[:7]
    output_mask = backward.args[9]
    reads = [(grad.name, grad.meta["val"]), (output.name, output.meta["val"]), (weight.name, weight.meta["val"])]
    reads += [(bias.name, bias.meta["val"])] if bias is not None else []
    reads += [(invstd.name, invstd.meta["val"])]
    builder = ImplProgramBuilder(reads)
    g, y, gamma, *beta, inv = builder.inputs
    y_value = y.meta["val"]
    channels = y_value.shape[1]
    shape = [1, channels] + [1] * (y_value.dim() - 2)
    dims = [d for d in range(y_value.dim()) if d != 1]
    count = y_value.numel() // max(channels, 1)
    gamma_c, inv_c = builder.call(aten.view.default, gamma, shape), builder.call(aten.view.default, inv, shape)
    beta_c = builder.call(aten.view.default, beta[0], shape) if beta else None

    def centered() -> fx.Node:  # y - beta, a fresh buffer
        return builder.call(aten.sub.Tensor, y, beta_c) if beta_c is not None else builder.call(aten.clone.default, y)

    x_hat = builder.call(aten.div_.Tensor, centered(), gamma_c)
    sum_g_xhat = builder.call(aten.sum.dim_IntList, builder.call(aten.mul_.Tensor, x_hat, g), dims, True)
    sum_g = builder.call(aten.sum.dim_IntList, g, dims, True)
    scale = builder.call(aten.mul.Tensor, gamma_c, inv_c)  # gamma * invstd
    slope = builder.call(aten.mul.Scalar, builder.call(aten.mul.Tensor, inv_c, sum_g_xhat), -1.0 / count)
    shift = builder.call(aten.mul.Scalar, builder.call(aten.mul.Tensor, scale, sum_g), -1.0 / count)
    grad_input = builder.call(aten.mul_.Tensor, centered(), slope)
    grad_input = builder.call(aten.addcmul_.default, grad_input, g, scale)
    grad_input = builder.call(aten.add_.Tensor, grad_input, shift)
    grad_weight = builder.call(aten.view.default, sum_g_xhat, [channels]) if output_mask[1] else None
    grad_bias = builder.call(aten.view.default, sum_g, [channels]) if output_mask[2] else None
    return builder.done(builder.call(batch_norm_gradients, grad_input if output_mask[0] else None, grad_weight, grad_bias))


def find_batch_norm_from_output(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``from_output`` for batch norm's backward: training mode, an affine forward whose weight is a
    placeholder with no zero at capture (``step.values``), and an output of the layout the backward reads.

    Parameters
    ----------
    backward
        A captured ``native_batch_norm_backward``.
    step
        The capture; without ``values`` nothing is offered.
    found
        Receives the implementation (``exact=False``, :data:`BATCH_NORM_FROM_OUTPUT_TOLERANCE`).
    """
    owner_of, values = step.owner_of, step.values
    grad, source, weight, *_, invstd = backward.args[:7]
    training, output_mask = backward.args[7], backward.args[9]
    if not (training and isinstance(grad, fx.Node) and isinstance(weight, fx.Node) and isinstance(invstd, fx.Node)):
        return
    forward = invstd.args[0] if invstd.target is operator.getitem else None
    if not isinstance(forward, fx.Node) or forward.target not in BATCH_NORM_FORWARDS or forward.args[1] is not weight:
        return
    if forward.args[0] is not source or not all(isinstance(m, bool) for m in output_mask):
        return
    real = values.get(weight.name) if weight.op == "placeholder" else None
    if real is None or not bool(torch.all(real != 0)):
        return  # x_hat = (y - beta) / gamma is undefined at a zero gamma
    bias = forward.args[2]
    output = next((u for u in forward.users if u.target is operator.getitem and u.args[1] == 0), None)
    if output is None or output.name not in owner_of or (bias is not None and not isinstance(bias, fx.Node)):
        return
    if not same_layout(output.meta.get("val"), source.meta.get("val")):
        return
    program = batch_norm_from_output_program(backward, output, bias)
    if same_layouts(program.output.meta["val"], backward.meta["val"]):
        found.offer(owner_of[backward.name], "from_output", program,
                    {"exact": False, "tolerance": BATCH_NORM_FROM_OUTPUT_TOLERANCE})


# -------------------------------------------------------------------- backward over its incoming gradient
#: Channel blocks of ``grad_inplace``: each block's three temporaries are 1/CHANNEL_BLOCKS of an activation.
CHANNEL_BLOCKS = 16


def gradients_in_place(grad_input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       *written: Any) -> tuple[Any, ...]:
    """The output tuple of ``native_batch_norm_backward`` run in channel blocks (the program's last call packs it).

    Parameters
    ----------
    grad_input
        grad_out's storage, written by the block copies.
    weight, bias
        The weight and bias gradients (allocated first, each block's copied into its slice), or None.
    *written
        The block copies (listed so that they run first).

    Returns
    -------
    tuple
        ``(grad_input, weight, bias)``.
    """
    return grad_input, weight, bias


def _blocks(channels: int) -> list[tuple[int, int]]:
    count = min(channels, CHANNEL_BLOCKS)
    bounds = [channels * i // count for i in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if a < b]


def grad_inplace_program(backward: fx.Node) -> ImplProgram:
    """The implementation ``grad_inplace`` of batch norm's backward: grad_input written over grad_out, in channel
    blocks.

    Parameters
    ----------
    backward
        A captured training-mode ``native_batch_norm_backward``.

    Returns
    -------
    ImplProgram
        Reads ``[grad_out, x, weight, save_mean, save_invstd]`` (no weight where the forward has none).
    """
    grad, source, weight, _, _, mean, invstd, training, eps, mask = backward.args[:10]
    reads = [(grad.name, grad.meta["val"]), (source.name, source.meta["val"])]
    reads += [(node.name, node.meta["val"]) for node in (weight, mean, invstd) if node is not None]
    builder = ImplProgramBuilder(reads)
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


def find_batch_norm_grad_inplace(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``grad_inplace`` for a training-mode batch norm backward on CPU over a contiguous
    activation with more than one element per (sample, channel), whose grad_out it may overwrite.

    Parameters
    ----------
    backward
        A captured ``native_batch_norm_backward``.
    found
        Receives the implementation (its program shared by backwards of one configuration).
    """
    graph, owner_of = step.graph, step.owner_of
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
    if not (whole_storage(grad_value) and source_value.is_contiguous() and same_layout(grad_value, source_value)):
        return
    if weight is not None and not isinstance(weight, fx.Node):
        return
    grad_node, node = graph.node(owner_of[grad.name]), graph.node(owner_of[backward.name])
    if grad_node.caller_owned or grad_node.output_of is not None or grad_node.mem != node.mem:
        return
    reads = tuple(v.name for v in (grad, source, weight, mean, invstd) if v is not None)
    program = found.shared_program(("grad_inplace", *signature(backward)), reads, lambda: grad_inplace_program(backward))
    if same_layouts(program.output.meta["val"], backward.meta["val"]):
        found.offer(node.id, "grad_inplace", program, {"inplace_of": grad_node.id})


# -------------------------------------------------------------------- forward over its input
#: Batch norm forwards ``forward_inplace`` runs in blocks: the functional training op (running statistics
#: in, new ones out) and ``native_batch_norm`` without running statistics (with them it mutates its buffers).
FORWARD_IN_BLOCKS = (aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default)

#: Input dtypes whose blockwise bits are proven equal to the fused kernel's (tests/test_alternatives_norm_forward.py).
FORWARD_DTYPES = (torch.float32, torch.float64)


def normalized_in_place(output: torch.Tensor, statistics: int, *parts: Any) -> tuple[Any, ...]:
    """The output tuple of a batch norm forward run in channel blocks (the program's last call packs it).

    Parameters
    ----------
    output
        x's storage, written by the block copies.
    statistics
        How many per-channel vectors the blocks were copied into.
    *parts
        Those vectors, then the block copies (listed so that they run first).

    Returns
    -------
    tuple
        ``output`` and the ``statistics`` vectors.
    """
    return (output, *parts[:statistics])


def forward_inplace_program(forward: fx.Node) -> ImplProgram:
    """The implementation ``forward_inplace`` of a batch norm forward: the output written over x, in channel blocks.

    The per-channel outputs are allocated first and each block's statistics copied into their slices at once, so
    that no block value outlives its block (a block's five outputs die together: the workspace is the block copy
    and the block's output, plus the statistics).

    Parameters
    ----------
    forward
        A captured forward of :data:`FORWARD_IN_BLOCKS`.

    Returns
    -------
    ImplProgram
        Reads ``[x, weight?, bias?, running_mean?, running_var?]`` (those the forward has).
    """
    source, *tensors = forward.args[:5]
    present = [t for t in tensors if t is not None]
    builder = ImplProgramBuilder([(node.name, node.meta["val"]) for node in (source, *present)])
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


def find_batch_norm_forward_inplace(forward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``forward_inplace`` for a training-mode batch norm forward on CPU over a computed, contiguous float
    activation with more than one element per (sample, channel), whose storage the output may take over.

    Parameters
    ----------
    forward
        A captured forward of :data:`BATCH_NORM_FORWARDS` (only those of :data:`FORWARD_IN_BLOCKS` are offered it).
    found
        Receives the implementation (its program shared by forwards of one configuration).
    """
    graph, owner_of = step.graph, step.owner_of
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
    if not (whole_storage(value) and same_layout(value, produced[0])):
        return
    source_node, node = graph.node(owner_of[source.name]), graph.node(owner_of[forward.name])
    if source_node.caller_owned or source_node.output_of is not None or source_node.mem != node.mem:
        return
    reads = tuple(v.name for v in (source, *tensors) if v is not None)
    program = found.shared_program(("forward_inplace", *signature(forward)), reads,
                                   lambda: forward_inplace_program(forward))
    made = program.output.meta["val"]
    if len(made) == len(produced) and all(same_layout(a, b) for a, b in zip(made, produced, strict=True)):
        found.offer(node.id, "forward_inplace", program, {"inplace_of": source_node.id})


__all__ = [
    "BATCH_NORM_BACKWARD",
    "BATCH_NORM_FORWARDS",
    "BATCH_NORM_FROM_OUTPUT_TOLERANCE",
    "CHANNEL_BLOCKS",
    "FORWARD_DTYPES",
    "FORWARD_IN_BLOCKS",
    "batch_norm_from_output_program",
    "batch_norm_gradients",
    "find_batch_norm_forward_inplace",
    "find_batch_norm_from_output",
    "find_batch_norm_grad_inplace",
    "forward_inplace_program",
    "grad_inplace_program",
    "gradients_in_place",
    "normalized_in_place",
]
