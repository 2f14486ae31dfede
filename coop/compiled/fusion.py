"""Inductor's pointwise fusion in the joint graph's coop Graph: values a fused kernel never writes to memory.

Inductor lowers a pointwise op (``Tag.pointwise``: add, mul, tanh, the RNG's ``inductor_random``...) to a loop body
that it inlines into the kernel of the op reading it, when that reader is itself a loop (pointwise, or a reduction
such as ``sum``, ``amax``, ``var_mean``); extern kernels (matmul, convolution) read realized buffers only. A value
inlined so never exists as a buffer, yet coop's lowering gives it a node of its own, so without this pass the
Graph prices every intermediate of ``gelu`` or ``layer_norm`` and its store-all peak and floor are far above what
the compiled step holds.

:func:`fuse_pointwise` contracts such values into their reader: a pointwise value with exactly one reader, of its
own phase (forward or backward), that is a loop op, and that no one else needs (not a Graph output, not random,
not a multi-output op's part), joins its reader's node. The joined node computes all its members at once (its
cost is their sum less the traffic of the values it never writes; its inputs are what its members read from
outside), and its bytes are those of the reader
alone, the one buffer the fused kernel writes. The emitter (:mod:`coop.compiled.emit`) writes each member out just
before the node that reads it, for each compute of the group, so a recomputed group is recomputed whole. A value
read twice stays a node: inductor may inline it into both readers (recomputing it) or realize it, and coop keeps
the realized, more conservative, picture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import fx

from coop.graph import Graph, Node
from coop.graph_capture.lower import Lowered

__all__ = ["LOOP_REDUCTIONS", "fuse_pointwise", "is_loop_op", "is_pointwise", "with_node_flops"]

#: aten reductions that inductor lowers to a loop, into which it inlines pointwise producers
LOOP_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "prod", "any", "all",
                             "argmax", "argmin", "std", "logsumexp"})


def is_pointwise(node: fx.Node) -> bool:
    """Whether an fx node calls an aten op tagged pointwise.

    Parameters
    ----------
    node : fx.Node
        A node of a joint graph.

    Returns
    -------
    bool
        True for a ``call_function`` of an op with ``torch.Tag.pointwise``.
    """
    tags = getattr(node.target, "tags", ())
    return node.op == "call_function" and torch.Tag.pointwise in tags


def is_loop_op(node: fx.Node) -> bool:
    """Whether inductor lowers this node to a loop it can inline a pointwise producer into.

    Parameters
    ----------
    node : fx.Node
        A node of a joint graph.

    Returns
    -------
    bool
        True for a pointwise op or one of :data:`LOOP_REDUCTIONS`; False for extern kernels (matmul, convolution).
    """
    if is_pointwise(node):
        return True
    packet = getattr(node.target, "_overloadpacket", None)
    return node.op == "call_function" and getattr(packet, "__name__", "") in LOOP_REDUCTIONS


def fuse_pointwise(lowered: Lowered, fx_nodes: dict[str, fx.Node], keep: set[int],
                   unwritten_seconds: Callable[[fx.Node], float] | None = None) -> tuple[Lowered, dict[int, int]]:
    """Contract each value inductor's pointwise fusion never writes into the node that reads it (module docstring).

    Parameters
    ----------
    lowered : Lowered
        The joint graph's lowering; left unchanged.
    fx_nodes : dict
        fx name -> the fx node of the graph ``lowered`` came from.
    keep : set of int
        Node ids that stay nodes of their own (the tangents).
    unwritten_seconds : callable or None
        The seconds a member's value costs to write and read back (its memory traffic, which the fused kernel
        does not have), taken off the group's summed cost; None keeps the sum.

    Returns
    -------
    tuple
        The contracted lowering (node ids renumbered densely; each group's fx names: the reader's first, then its
        members') and the map from old node ids to new ones (a member maps to its group's).
    """
    graph = lowered.graph
    readers: dict[int, list[int]] = {node.id: [] for node in graph.nodes}
    for node in graph.nodes:
        for source in node.inputs:
            readers[source].append(node.id)
    outputs = set(graph.outputs)
    producers = {node.output_of for node in graph.nodes if node.output_of is not None}
    joins: dict[int, int] = {}  # absorbed id -> the id of the node that reads it
    for node in graph.nodes:
        if _absorbable(node, readers[node.id], graph, lowered, fx_nodes, outputs | keep | producers):
            joins[node.id] = readers[node.id][0]

    def group_of(node_id: int) -> int:
        while node_id in joins:
            node_id = joins[node_id]
        return node_id

    members: dict[int, list[int]] = {}
    for node_id in graph.order:  # topological: a group's members in the order they run
        if node_id in joins:
            members.setdefault(group_of(node_id), []).append(node_id)
    survivors = [node.id for node in graph.nodes if node.id not in joins]
    new_id = {old: index for index, old in enumerate(survivors)}
    for absorbed in joins:
        new_id[absorbed] = new_id[group_of(absorbed)]
    nodes = []
    for old in survivors:
        node = graph.nodes[old]
        group = [*members.get(old, []), old]
        inside = set(group)
        external = []
        for member in group:
            for source in graph.nodes[member].inputs:
                if source not in inside and new_id[source] not in external:
                    external.append(new_id[source])
        cost = sum(graph.nodes[m].cost for m in group)
        if unwritten_seconds is not None:
            saved = sum(unwritten_seconds(fx_nodes[lowered.fx_names[m][0]]) for m in members.get(old, []))
            cost = max(cost - saved, cost / len(group))
        nodes.append(node.model_copy(update={
            "id": new_id[old], "inputs": tuple(external), "cost": cost,
            "output_of": None if node.output_of is None else new_id[node.output_of]}))
    flops: dict[int, int] = {}
    for old, count in lowered.node_flops.items():
        flops[new_id[old]] = flops.get(new_id[old], 0) + count
    fused = Graph(name=graph.name, nodes=tuple(nodes), outputs=tuple(new_id[i] for i in graph.outputs),
                  order=tuple(new_id[i] for i in graph.order if i not in joins), meta=with_node_flops(graph.meta, flops))
    fx_names = {new_id[old]: [*lowered.fx_names[old], *(name for m in members.get(old, [])
                                                        for name in lowered.fx_names[m])] for old in survivors}
    owner_of = {name: new_id[old] for name, old in lowered.owner_of.items()}
    return replace(lowered, graph=fused, fx_names=fx_names, owner_of=owner_of, node_flops=flops), new_id


def with_node_flops(meta: dict, flops: dict[int, int]) -> dict:
    """A Graph's ``meta`` with its ``node_flops`` (node id as text -> FLOPs) keyed by a renumbered Graph's ids.

    A contracted or inlined Graph renumbers its nodes; the capture's per-node FLOPs, keyed by the old ids, would
    name other nodes (a pointwise group given a matmul's FLOPs).

    Parameters
    ----------
    meta : dict
        The Graph's meta before renumbering.
    flops : dict
        New node id -> its FLOPs (a group's: its members' summed).

    Returns
    -------
    dict
        A copy of ``meta`` whose ``node_flops`` is ``flops`` (zeros left out, as the capture writes it).
    """
    return {**meta, "node_flops": {str(i): f for i, f in sorted(flops.items()) if f}}


def _absorbable(node: Node, readers: list[int], graph: Graph, lowered: Lowered, fx_nodes: dict[str, fx.Node],
                pinned: set[int]) -> bool:
    """A computed pointwise value with one reader, a loop op of its own phase, that nobody else needs."""
    if node.caller_owned or node.id in pinned or node.random or node.impls or node.output_of is not None:
        return False
    if len(readers) != 1 or not node.recomputable:
        return False
    reader = graph.nodes[readers[0]]
    if reader.kind != node.kind or reader.impls:
        return False
    own = fx_nodes.get(lowered.fx_names[node.id][0])
    target = fx_nodes.get(lowered.fx_names[reader.id][0])
    return own is not None and target is not None and is_pointwise(own) and is_loop_op(target)
