"""Baseline schedules: store-all, checkpoint-all and Chen et al.'s sqrt(n) and greedy segments.

These are the reference points every formulation is compared against (Checkmate, Jain et al.
2020, section 6, uses the same set):

* :func:`store_all` -- the graph's baseline order, every value kept until its last use.
* :func:`checkpoint_all` -- keep only what cannot be recomputed; recompute every other forward
  value at each backward use and free it right after: the lowest-memory baseline.
* :func:`chen_sqrt` -- Chen, Xu, Zhang and Guestrin 2016, "Training Deep Nets with Sublinear
  Memory Cost" (arXiv 1604.06174), section 4.1: split the forward into about sqrt(n) segments,
  keep only the segment boundaries, recompute a segment's values during the backward.
* :func:`chen_greedy` -- the same paper's greedy variant (its Algorithm "memory-optimized
  gradient graph with budget b"): walk the forward accumulating memory and cut a segment when it
  exceeds ``b``; sweep ``b`` over a grid.

All four share one scheduler, :func:`_forward_keep_backward_recompute`: "run the forward keeping
the set K; run the backward, recomputing on demand what is not resident". Checkpoint candidates
are the articulation points of the forward subgraph (cut vertices: every path from the inputs to
the loss crosses them), as Checkmate's implementation of Chen's methods does, else every forward
node in order. Every schedule is measured by the one simulator (coop.schedule.simulate); each
result reports ``extra["fits"]`` (peak <= budget) and leaves the decision to the caller.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import networkx as nx

from coop.errors import CoopError
from coop.formulations.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, Step, simulate

__all__ = ["checkpoint_all", "chen_greedy", "chen_sqrt", "store_all"]


# -------------------------------------------------------------------- entry points
def store_all(graph: Graph, budget: int, **options: Any) -> SolveResult:
    """The baseline order with no recomputation: each value is freed after its last use."""
    started = time.perf_counter()
    schedule = Schedule.from_order(graph.order)
    return _result("store-all", graph, budget, schedule, started)


def checkpoint_all(graph: Graph, budget: int, **options: Any) -> SolveResult:
    """Keep only values that cannot be recomputed; recompute the rest at every backward use.

    K = non-recomputable forward values (random ops) and forward outputs; caller-owned values are
    resident anyway. Each backward node recomputes the forward values it reads from resident
    ones, freeing every recomputed value as soon as this recomputation no longer needs it and
    the rest right after the backward node runs.
    """
    started = time.perf_counter()
    split = _split_forward_backward(graph, "checkpoint-all")
    schedule = _forward_keep_backward_recompute(graph, split, keep=set(), free_recomputed=True)
    return _result("checkpoint-all", graph, budget, schedule, started, checkpoints=[])


def chen_sqrt(graph: Graph, budget: int, *, use_articulation_points: bool = True, **options: Any) -> SolveResult:
    """Chen et al. 2016's sqrt(n) checkpointing (section 4.1).

    Of the checkpoint candidates C (articulation points of the forward subgraph in forward
    order, or every forward node when there are fewer than two), every ``round(sqrt(|C|))``-th
    is kept as a segment boundary; other forward values are freed after their last forward use
    and recomputed on demand in the backward, each recomputed value kept until its last use.
    """
    started = time.perf_counter()
    split = _split_forward_backward(graph, "chen-sqrt")
    candidates = _checkpoint_candidates(graph, split, use_articulation_points)
    stride = max(1, round(math.sqrt(len(candidates))))
    checkpoints = [v for position, v in enumerate(candidates, start=1) if position % stride == 0]
    schedule = _forward_keep_backward_recompute(graph, split, keep=set(checkpoints), free_recomputed=False)
    return _result("chen-sqrt", graph, budget, schedule, started, checkpoints=checkpoints)


def chen_greedy(
    graph: Graph,
    budget: int,
    *,
    use_articulation_points: bool = True,
    grid_size: int = 24,
    **options: Any,
) -> SolveResult:
    """Chen et al. 2016's greedy segmentation under a per-segment memory threshold ``b``.

    Walking the forward in order, memory accumulates over the values since the last cut; at a
    candidate where it exceeds ``b`` the candidate becomes a checkpoint and the count restarts.
    ``b`` sweeps a geometric grid of ``grid_size`` values between the smallest positive forward
    value and the whole forward's memory. Returns the cheapest schedule whose peak fits the
    budget, else the one with the lowest peak.
    """
    if grid_size < 1:
        raise CoopError(f"chen-greedy: grid_size {grid_size} must be at least 1")
    started = time.perf_counter()
    split = _split_forward_backward(graph, "chen-greedy")
    candidates = set(_checkpoint_candidates(graph, split, use_articulation_points))
    best: _Candidate | None = None
    seen: set[tuple[int, ...]] = set()
    for threshold in _threshold_grid(graph, split.forward, grid_size):
        checkpoints = _greedy_checkpoints(graph, split.forward, candidates, threshold)
        if tuple(checkpoints) in seen:
            continue
        seen.add(tuple(checkpoints))
        schedule = _forward_keep_backward_recompute(graph, split, keep=set(checkpoints), free_recomputed=False)
        candidate = _Candidate(schedule, simulate(graph, schedule), checkpoints, threshold)
        if best is None or candidate.better_than(best, budget):
            best = candidate
    assert best is not None  # the grid is never empty
    return _result(
        "chen-greedy", graph, budget, best.schedule, started, simulation=best.simulation,
        checkpoints=best.checkpoints, threshold=best.threshold, thresholds_tried=len(seen),
    )


# -------------------------------------------------------------------- the shared scheduler
@dataclass(frozen=True)
class _Split:
    """The baseline order cut into the forward (no backward ancestor) and the rest."""

    forward: tuple[int, ...]
    backward: tuple[int, ...]


def _split_forward_backward(graph: Graph, formulation: str) -> _Split:
    """Forward = computed nodes with no backward node among their ancestors (or themselves)."""
    if not graph.has_backward:
        raise CoopError(
            f"{formulation} needs a graph with a forward/backward split (nodes of kind 'backward'); "
            f"graph {graph.name!r} has none: use store-all or a solver formulation"
        )
    after_backward: set[int] = set()
    for node_id in graph.order:  # topological, so ancestors are classified first
        node = graph.node(node_id)
        if node.kind == "backward" or any(source in after_backward for source in node.inputs):
            after_backward.add(node_id)
    forward = tuple(v for v in graph.order if v not in after_backward)
    backward = tuple(v for v in graph.order if v in after_backward)
    return _Split(forward, backward)


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


def _forward_keep_backward_recompute(graph: Graph, split: _Split, keep: set[int], free_recomputed: bool) -> Schedule:
    """Forward pass keeping K; backward pass recomputing on demand what is not resident.

    K always includes the values that cannot be recomputed and the forward outputs. A forward
    value outside K is freed as soon as no later forward node reads it. In the backward, each
    node first recomputes the forward values it reads that are gone (recursively, from resident
    ancestors); with ``free_recomputed`` those are freed as soon as this recomputation and the
    node are done with them, otherwise they stay until their last use (the simulator ends an
    instance at its last read).
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


# -------------------------------------------------------------------- checkpoint choice
def _checkpoint_candidates(graph: Graph, split: _Split, use_articulation_points: bool) -> list[int]:
    """Articulation points of the forward subgraph in forward order, else every forward node.

    A virtual source feeds the forward nodes with no forward input and a virtual sink reads the
    ones with no forward reader, so that a cut vertex separates all the inputs from all the ends.
    """
    forward = list(split.forward)
    if not use_articulation_points:
        return forward
    forward_set = set(forward)
    undirected = nx.Graph()
    undirected.add_nodes_from(forward)
    source, sink = ("virtual", "source"), ("virtual", "sink")
    for v in forward:
        forward_inputs = [u for u in graph.node(v).inputs if u in forward_set]
        undirected.add_edges_from((u, v) for u in forward_inputs)
        if not forward_inputs:
            undirected.add_edge(source, v)
        if not any(c in forward_set for c in graph.consumers[v]):
            undirected.add_edge(v, sink)
    cut_vertices = set(nx.articulation_points(undirected)) - {source, sink}
    candidates = [v for v in forward if v in cut_vertices]
    return candidates if len(candidates) >= 2 else forward


def _greedy_checkpoints(graph: Graph, forward: Iterable[int], candidates: set[int], threshold: float) -> list[int]:
    """Chen's greedy cut: a candidate becomes a checkpoint once the segment's memory exceeds b."""
    checkpoints: list[int] = []
    segment_memory = 0
    for v in forward:
        segment_memory += graph.node(v).mem
        if v in candidates and segment_memory > threshold:
            checkpoints.append(v)
            segment_memory = 0
    return checkpoints


def _threshold_grid(graph: Graph, forward: tuple[int, ...], grid_size: int) -> list[float]:
    """A geometric grid of segment thresholds b from the smallest value to the whole forward."""
    sizes = [graph.node(v).mem for v in forward if graph.node(v).mem > 0]
    if not sizes:
        return [0.0]
    low, high = float(min(sizes)), float(sum(sizes))
    if grid_size == 1 or high <= low:
        return [math.sqrt(low * high)]
    ratio = (high / low) ** (1.0 / (grid_size - 1))
    return [0.0] + [low * ratio**i for i in range(grid_size)]


@dataclass
class _Candidate:
    schedule: Schedule
    simulation: Simulation
    checkpoints: list[int]
    threshold: float

    def better_than(self, other: _Candidate, budget: int) -> bool:
        """Fitting beats not fitting; among fits the lower cost, else the lower peak wins."""
        fits, other_fits = self.simulation.peak <= budget, other.simulation.peak <= budget
        if fits != other_fits:
            return fits
        if fits:
            return (self.simulation.cost, self.simulation.peak) < (other.simulation.cost, other.simulation.peak)
        return (self.simulation.peak, self.simulation.cost) < (other.simulation.peak, other.simulation.cost)


# -------------------------------------------------------------------- result
def _result(
    formulation: str,
    graph: Graph,
    budget: int,
    schedule: Schedule,
    started: float,
    simulation: Simulation | None = None,
    **extra: Any,
) -> SolveResult:
    simulation = simulation or simulate(graph, schedule)
    fits = simulation.peak <= budget
    message = "" if fits else f"{formulation}: peak {simulation.peak} exceeds the budget {budget}"
    return SolveResult(
        formulation=formulation,
        status="heuristic",
        schedule=schedule,
        simulation=simulation,
        objective=simulation.cost,
        wall_s=time.perf_counter() - started,
        message=message,
        extra={"fits": fits, "peak": simulation.peak, **extra},
    )
