"""The scheduler the baselines share: :func:`split_forward_backward` splits a step's graph into its forward
and backward (:class:`ForwardBackward`), and :func:`forward_keep_backward_recompute` runs the forward keeping
a set K, then the backward, recomputing on demand what is not resident (:mod:`coop.formulations.heuristics.baselines`
chooses K; blocks, per_layer, repeated_blocks and auto use it too). Everything here is importable from
:mod:`coop.formulations.heuristics.baselines` too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from coop.errors import CoopError
from coop.graph import Graph, Node
from coop.schedule import Schedule, Step


@dataclass(frozen=True)
class ForwardBackward:
    """The baseline order cut into the forward (no backward ancestor) and the rest."""

    forward: tuple[int, ...]
    backward: tuple[int, ...]


def split_forward_backward(graph: Graph, formulation: str) -> ForwardBackward:
    """Forward = computed nodes with no backward node among their ancestors (or themselves).

    An extra output of a forward op (a multi-output op's mean/rstd, a dropout mask, max-pool
    indices: not recomputable, kind backward, read off a forward node) is taken in the forward
    where the op runs, as eager PyTorch does: deferring it to the backward would force the op to
    be recomputed just to read it again.

    Parameters
    ----------
    graph : Graph
        A graph of a training step (nodes of kind ``backward``).
    formulation : str
        The name the refusal of a graph without a backward part gives.

    Returns
    -------
    ForwardBackward
        The forward and the backward, each in the baseline order.

    Raises
    ------
    CoopError
        When the graph has no backward nodes.
    """
    if not graph.has_backward:
        raise CoopError(
            f"{formulation} needs a graph with a forward/backward split (nodes of kind 'backward'); "
            f"graph {graph.name!r} has none: use store-all or a solver formulation"
        )
    after_backward: set[int] = set()
    for node_id in graph.order:  # topological, so ancestors are classified first
        node = graph.node(node_id)
        reads_backward = any(source in after_backward for source in node.inputs)
        if reads_backward or (node.kind == "backward" and not _extra_output_of_forward_op(node)):
            after_backward.add(node_id)
    forward = tuple(v for v in graph.order if v not in after_backward)
    backward = tuple(v for v in graph.order if v in after_backward)
    return ForwardBackward(forward, backward)


def _extra_output_of_forward_op(node: Node) -> bool:
    """A non-recomputable node that reads only forward or caller-owned values (already checked)."""
    return not node.recomputable and bool(node.inputs)


class _Emitter:
    """Appends schedule steps while tracking which computed values are resident."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.steps: list[Step] = []
        self.resident: set[int] = set()

    def compute(self, node_id: int) -> None:
        self.steps.append(Step(op="compute", node=node_id))
        self.resident.add(node_id)

    def free(self, node_id: int) -> None:
        self.steps.append(Step(op="free", node=node_id))
        self.resident.discard(node_id)

    def is_available(self, node_id: int) -> bool:
        return node_id in self.resident or self.graph.node(node_id).caller_owned


def forward_keep_backward_recompute(graph: Graph, split: ForwardBackward, keep: set[int], free_recomputed: bool) -> Schedule:
    """Forward pass keeping K; backward pass recomputing on demand what is not resident.

    K always includes the values that cannot be recomputed and the forward outputs. A forward
    value outside K is freed as soon as no later forward node reads it. In the backward, each
    node first recomputes the forward values it reads that are gone (recursively, from resident
    ancestors); with ``free_recomputed`` those are freed as soon as this recomputation and the
    node are done with them, otherwise they stay until their last use (the simulator ends an
    instance at its last read).

    Parameters
    ----------
    keep : set of int
        Forward values kept from the forward to the backward (K, besides those always kept).
    free_recomputed : bool
        Free recomputed values right after the backward node that needed them (checkpoint-all), or at their
        last use (Chen's segments: a segment recomputed once serves every later reader).

    Returns
    -------
    Schedule
        The forward, then the backward with its recomputations.
    """
    forward_set = set(split.forward)
    keep = set(keep) | {v for v in split.forward if not graph.node(v).recomputable}
    keep |= {v for v in graph.outputs if v in forward_set}
    emitter = _Emitter(graph)

    # Forward: frees follow the last forward read (values with no forward reader go at once).
    position = {v: i for i, v in enumerate(split.forward)}
    last_forward_read = {v: position[v] for v in split.forward}
    for v in split.forward:
        for source in graph.node(v).inputs:
            if source in last_forward_read:
                last_forward_read[source] = max(last_forward_read[source], position[v])
    frees_after: dict[int, list[int]] = {}
    for v, last in last_forward_read.items():
        if v not in keep:
            frees_after.setdefault(split.forward[last], []).append(v)
    for v in split.forward:
        emitter.compute(v)
        for dead in frees_after.get(v, ()):
            emitter.free(dead)

    # Backward: recompute what each node reads, then run it.
    for v in split.backward:
        recomputed = _recompute_missing(emitter, graph.node(v).inputs, position, free_recomputed, reader=v)
        emitter.compute(v)
        if free_recomputed:
            for value in recomputed:
                if value in emitter.resident:
                    emitter.free(value)
    return Schedule(steps=tuple(emitter.steps))


def _recompute_missing(
    emitter: _Emitter, needed: Iterable[int], position: dict[int, int], free_early: bool, reader: int
) -> list[int]:
    """Recompute, in forward order, the missing values ``needed`` and their missing ancestors.

    Returns the values recomputed. With ``free_early`` an ancestor recomputed only as a stepping
    stone is freed right after its last reader within this recomputation.
    """
    graph = emitter.graph
    missing: set[int] = set()
    stack = [v for v in needed if not emitter.is_available(v)]
    while stack:
        value = stack.pop()
        if value in missing:
            continue
        if value not in position:
            raise AssertionError(f"backward value {value} is not resident while {reader} reads it")
        missing.add(value)
        stack.extend(source for source in graph.node(value).inputs if not emitter.is_available(source))
    plan = sorted(missing, key=position.__getitem__)
    direct = set(needed)
    pending_reads = {v: sum(1 for c in graph.consumers[v] if c in missing) for v in plan}
    for value in plan:
        emitter.compute(value)
        if not free_early:
            continue
        for source in graph.node(value).inputs:
            if source in pending_reads:
                pending_reads[source] -= 1
                if pending_reads[source] == 0 and source not in direct:
                    emitter.free(source)
    return plan
