"""Kernels whose real output storage differs from their meta function's: a reviewed table, no kernel run.

Why: a captured value's bytes are read off its fake tensor, whose storage size comes from the op's
meta function (or Python decomposition); a few kernels return a larger storage than that, and the
executor runs the real kernels, so the Graph must count what they really hold. Learning this by
running ops on made-up data is not an option: ``_scaled_dot_product_efficient_attention_backward``
on zero-filled inputs (0-d int64 philox seed/offset) killed the process on an H100 (torch
2.11). So the sizes come from this table, a pure function of the fake
arguments, and, when capture profiles, from the real step itself
(:class:`coop.graph_capture.cost.TimingInterpreter` records each node's real storage; lowering
prefers it and lists in the graph's metadata where it differs from this table).

Survey (torch 2.13, CPU; an offline script run once, not part of the package): every aten op of the
captured training steps of the zoo models (mlp, cnn, transformer, gpt2, bert, llama, vit,
mobilenet, resnet), of the torch.nn.functional losses (mse, l1, smooth_l1 with beta 1 and 0, huber,
binary_cross_entropy with and without weight, binary_cross_entropy_with_logits with and without
pos_weight, cross_entropy with class indices, label smoothing and probabilities, nll, kl_div,
soft_margin, multilabel_soft_margin, poisson_nll, hinge_embedding, margin_ranking,
cosine_embedding, multi_margin, triplet_margin) at reductions none / mean / sum with their
backwards, and of reductions and friends (sum, mean, amax, amin, max, min, var, std, var_mean,
std_mean, vector norms, logsumexp, prod, cumsum, cumprod, softmax, log_softmax, dot, trace, dist,
cdist, sort, topk, median, nansum, count_nonzero, all, argmax, layer_norm, group_norm, SDPA with
and without a causal mask, bmm, addmm, gather, scatter_add), traced on fake tensors and then run
by an fx interpreter on the real parameters and random data, in float32 and bfloat16, comparing
each output's ``untyped_storage().nbytes()`` with the fake value's. Of the 160 distinct aten overloads
that ran, 156 always matched. Four differed, each with a mean or sum reduction (``none`` matched):
``mse_loss``, ``smooth_l1_loss``, ``soft_margin_loss`` and ``binary_cross_entropy`` return a 0-d
loss whose storage is the whole unreduced elementwise buffer (``numel`` of the broadcast input
and target, in the loss's dtype; e.g. 168 bytes for 6 x 7 float32, where the fake one holds 4).
The reason is in ATen: the structured meta functions of ``mse_loss`` and ``smooth_l1_loss``
allocate the broadcast output and then ``resize_({})`` it (a resize never shrinks a storage);
``soft_margin_loss_out`` writes the unreduced loss into its output and resizes it to 0-d;
``binary_cross_entropy`` computes into ``empty_like(input)`` and ``resize_as_`` s it to the reduced
value. The same for all four: huber_loss, l1_loss, the cross entropies and the other reductions
reduce into a fresh tensor.

CUDA: not surveyed here (no GPU on the machine that built this table). The CUDA entries are the
CPU ones, from reading ATen: the structured meta functions are shared by the CPU and CUDA kernels,
``soft_margin_loss_out`` is device-generic, and CUDA's ``binary_cross_entropy_out_cuda`` does the
same ``resize_as_``. An entry that over-counts only makes a plan conservative; a kernel this table
misses on CUDA is found by a profiled capture (its real sizes win, the miss is listed in the graph's
metadata) and by the GPU acceptance command, ``benchmarks/bench_cuda.py``, which compares the
allocated peak with the predicted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

aten = torch.ops.aten

#: A rule gives the real storage bytes of each output tensor of one call (pytree order), from the op,
#: its fake arguments and its fake output; None where the kernel's storage is the fake one.
StorageRule = Callable[[torch._ops.OpOverload, tuple[Any, ...], dict[str, Any], Any], list[int] | None]

#: ``at::Reduction::None``: the unreduced loss, allocated at exactly its fake shape.
REDUCTION_NONE = 0


def _argument(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """The value of the schema argument ``name`` of one call (positional, keyword or its default)."""
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == name:
            if index < len(args):
                return args[index]
            return kwargs.get(name, argument.default_value)
    raise KeyError(f"{op} has no argument {name!r}")


def unreduced_loss(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
    """A mean- or sum-reduced loss that keeps its unreduced buffer (see the module docstring).

    Parameters
    ----------
    args : tuple
        Its positional arguments (fake values); the first two are the input and target.
    kwargs : dict of str to Any
        Its keyword arguments.
    out : Any
        Its (fake) output.

    Returns
    -------
    list of int or None
        One size in bytes: ``numel`` of the broadcast input and target, in the loss's dtype; None for
        ``reduction="none"`` or a non-tensor output.
    """
    if _argument(op, args, kwargs, "reduction") == REDUCTION_NONE or not isinstance(out, torch.Tensor):
        return None
    shape = torch.broadcast_shapes(tuple(args[0].shape), tuple(args[1].shape))
    return [math.prod(shape) * out.element_size()]


#: (op overload packet, device type) -> rule. Reviewed: see the module docstring for the survey.
TABLE: dict[tuple[torch._ops.OpOverloadPacket, str], StorageRule] = {
    (packet, device): unreduced_loss
    for packet in (aten.mse_loss, aten.smooth_l1_loss, aten.soft_margin_loss, aten.binary_cross_entropy)
    for device in ("cpu", "cuda")
}


def table_storage_bytes(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
    """The real storage bytes of each output tensor of ``op(*args, **kwargs)``, where the table knows them.

    Parameters
    ----------
    op : Any
        The op (an ``OpOverload``; anything without an overload packet has no entry).
    args : tuple
        Its positional arguments (fake values).
    kwargs : dict of str to Any
        Its keyword arguments.
    out : Any
        Its (fake) output.

    Returns
    -------
    list of int or None
        Bytes per output tensor where the table has an entry for the op on its output's device; None otherwise,
        or when the entry gives no sizes or the wrong number (the fake storage is the real one).
    """
    packet = getattr(op, "_overloadpacket", None)
    tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if packet is None or not tensors:
        return None
    rule = TABLE.get((packet, tensors[0].device.type))
    if rule is None:
        return None
    sizes = rule(op, tuple(args), dict(kwargs), out)
    return None if sizes is None or len(sizes) != len(tensors) else sizes


def predicted_storage_bytes(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int]:
    """Storage bytes of each output tensor of ``op(*args, **kwargs)`` without running it.

    Parameters
    ----------
    args : tuple
        Its positional arguments (fake values).
    kwargs : dict of str to Any
        Its keyword arguments.
    out : Any
        Its (fake) output.

    Returns
    -------
    list of int
        The table's sizes (:func:`table_storage_bytes`) where it has an entry, else the (fake) output's own
        storage sizes.
    """
    table = table_storage_bytes(op, args, kwargs, out)
    if table is not None:
        return table
    return [t.untyped_storage().nbytes() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


__all__ = ["REDUCTION_NONE", "TABLE", "StorageRule", "predicted_storage_bytes", "table_storage_bytes", "unreduced_loss"]
