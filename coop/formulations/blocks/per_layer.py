"""Per-layer checkpointing: each repeated layer wrapped in ``torch.utils.checkpoint``, as practitioners do.

What Hugging Face's ``model.gradient_checkpointing_enable()`` does to a transformer, and what wrapping each
ResNet block in ``torch.utils.checkpoint.checkpoint`` does: the forward of a layer runs without keeping its
activations; what ``checkpoint(layer, hidden)`` saves is the layer's input; in the backward the layer's forward
is run again, once, right before its backward, and its activations serve that backward. It is Chen et al.
2016's segment checkpointing with the segments drawn at the model's layer boundaries rather than by a rule over
the linearised graph, and the "checkpoint every layer" baseline HiRemate (Zhao et al., ICML 2025) compares
against.

Here the layers are the step's repeated blocks (:func:`coop.formulations.blocks.repeated.find_block_groups`),
and the schedule is the shared baselines scheduler
(:func:`coop.formulations.heuristics.baselines.forward_keep_backward_recompute`) with the keep set K:

* every forward value a block reads from outside itself: the residual stream entering the layer (the previous
  layer's output or the embedding) and what the model builds once and hands to every layer (an attention mask,
  a rotary table): the arguments ``checkpoint`` holds;
* every forward value outside any block (embedding, final norm, head, loss), kept as in eager PyTorch, which
  checkpoints only the layers: a value there that no backward reads is still freed after its last use;
* every block value read outside its block (the last layer's output, which the final norm saves);
* what the graph cannot recompute: the extra outputs of a forward op (a layer norm's mean and rstd, attention's
  logsumexp), and random draws unless the graph is :meth:`~coop.graph.Graph.with_random_replay` (the graph the
  executor and ``coop compare`` plan on), where a draw is recomputed from its saved generator state as
  ``torch.utils.checkpoint`` replays the RNG.

Everything else inside a block is freed in the forward after its last forward read and recomputed in the
backward, each value once, when the first backward node reads it or a value derived from it, and kept until its
last use: the layer's forward re-run right before its backward, up to the last value that backward reads, which
is what ``torch.utils.checkpoint``'s non-reentrant mode (Transformers' default) does with its early stop (in a
transformer layer, the MLP's output projection and the residual add after it, whose outputs no backward reads,
are not re-run; the reentrant mode re-runs them too).

References
----------
Chen, Xu, Zhang and Guestrin, "Training Deep Nets with Sublinear Memory Cost", arXiv 1604.06174, 2016.
Zhao et al., "HiRemate" (ICML 2025; after Rockmate, ICML 2023): per-layer checkpointing as the baseline.
Hugging Face Transformers, ``PreTrainedModel.gradient_checkpointing_enable``; PyTorch,
``torch.utils.checkpoint.checkpoint``.
"""

from __future__ import annotations

import time

from coop.errors import CoopError
from coop.formulations.blocks.repeated import find_block_groups
from coop.formulations.core.result import SolveResult
from coop.formulations.heuristics.baselines import (
    forward_keep_backward_recompute,
    heuristic_result,
    split_forward_backward,
)
from coop.graph import Graph

NAME = "per-layer"


def per_layer_checkpoint(graph: Graph, budget: int) -> SolveResult:
    """Checkpoint every repeated layer: keep the layers' inputs, re-run each layer once before its backward.

    Parameters
    ----------
    graph : Graph
        A training step (nodes of kind ``backward``) whose forward repeats a layer at least twice.
    budget : int
        The budget in graph units; the rule has no budget knob, so it only decides the result's fit.

    Returns
    -------
    SolveResult
        A "heuristic" result with the schedule; returned even when its peak exceeds ``budget`` (then
        ``extra["fits"]`` is False and the message says so). ``extra["checkpoints"]`` holds the layers' inputs
        (the forward values a block reads from outside itself, in forward order), ``extra["layers"]`` the number
        of blocks checkpointed and ``extra["groups"]`` each group's (period, count).

    Raises
    ------
    CoopError
        When the graph has no backward nodes, or no repeated layers (then use chen-sqrt or chen-greedy, which
        draw segments over any forward).

    References
    ----------
    Chen, Xu, Zhang and Guestrin, "Training Deep Nets with Sublinear Memory Cost", arXiv 2016; Zhao et al.,
    HiRemate, ICML 2025; Hugging Face's ``gradient_checkpointing_enable``.
    """
    started = time.perf_counter()
    split = split_forward_backward(graph, NAME)
    groups = find_block_groups(graph, split.forward)
    if not groups:
        raise CoopError(f"per-layer checkpointing found no repeated layers in graph {graph.name!r}: "
                        "use chen-sqrt or chen-greedy")
    block_of = {v: index for index, block in enumerate(b for g in groups for b in g.blocks) for v in block}
    forward = set(split.forward)
    layer_inputs: set[int] = set()  # what checkpoint(layer, hidden) saves
    keep = {v for v in split.forward if v not in block_of}  # outside the layers: as in eager
    for v in split.forward:
        for source in graph.node(v).inputs:
            if source not in forward or block_of.get(source) == block_of.get(v):
                continue  # caller-owned (resident anyway), or inside the same block (recomputed)
            keep.add(source)
            if v in block_of:
                layer_inputs.add(source)
    schedule = forward_keep_backward_recompute(graph, split, keep=keep, free_recomputed=False)
    return heuristic_result(
        NAME, graph, budget, schedule, started,
        checkpoints=[v for v in split.forward if v in layer_inputs],
        layers=sum(g.count for g in groups),
        groups=[(g.period, g.count) for g in groups],
    )


__all__ = ["NAME", "per_layer_checkpoint"]
