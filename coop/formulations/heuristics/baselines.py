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

All four share one scheduler, :func:`forward_keep_backward_recompute`: "run the forward keeping
the set K; run the backward, recomputing on demand what is not resident". Chen's segments are
chosen over the forward linearised in topological order, as Checkmate applies them to non-linear
graphs: a boundary at position k keeps its whole frontier (every recomputable forward value made
before k and read by a forward node at k or later), so a segment is recomputed from kept values
only. On real models values such as attention masks read by every block leave the forward with
no articulation point; the frontier of a block boundary is then the residual stream plus those
small values, kept once. Graphs that do have articulation points (Checkmate's benchmark graphs)
also get the paper's own candidates, and the better schedule is returned. Every schedule is
measured by the one simulator (coop.schedule.simulate); each result reports ``extra["fits"]``
(peak <= budget) and, when it does not fit, a message naming the peak and the budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import networkx as nx

from coop.errors import CoopError
from coop.formulations.core.result import SolveResult
from coop.formulations.heuristics.forward_backward import (
    ForwardBackward,
    forward_keep_backward_recompute,
    split_forward_backward,
)
from coop.graph import Graph, derived_from_graph
from coop.schedule import Schedule, Simulation, simulate

__all__ = ["ForwardBackward", "checkpoint_all", "chen_greedy", "chen_sqrt", "forward_keep_backward_recompute",
           "heuristic_result", "split_forward_backward", "store_all"]


# -------------------------------------------------------------------- entry points
def store_all(graph: Graph, budget: int) -> SolveResult:
    """The baseline order with no recomputation: each value is freed after its last use.

    Parameters
    ----------
    budget : int
        The budget in graph units; only checked against the schedule's peak.

    Returns
    -------
    SolveResult
        A "heuristic" result with the schedule of ``graph.order``; returned even when its peak
        exceeds ``budget`` (then ``extra["fits"]`` is False and the message says so).
    """
    started = time.perf_counter()
    schedule = Schedule.from_order(graph.order)
    return heuristic_result("store-all", graph, budget, schedule, started)


def checkpoint_all(graph: Graph, budget: int) -> SolveResult:
    """Keep only values that cannot be recomputed; recompute the rest at every backward use.

    K = non-recomputable forward values (random ops) and forward outputs; caller-owned values are
    resident anyway. Each backward node recomputes the forward values it reads from resident
    ones, freeing every recomputed value as soon as this recomputation no longer needs it and
    the rest right after the backward node runs.

    Parameters
    ----------
    graph : Graph
        The graph to schedule; it must have a forward/backward split.
    budget : int
        The budget in graph units; only checked against the schedule's peak.

    Returns
    -------
    SolveResult
        A "heuristic" result with the schedule; returned even when its peak exceeds ``budget``
        (then ``extra["fits"]`` is False and the message says so).

    Raises
    ------
    CoopError
        When the graph has no backward nodes.
    """
    started = time.perf_counter()
    split = split_forward_backward(graph, "checkpoint-all")
    schedule, simulation = _kept_schedule(graph, split, frozenset(), free_recomputed=True)
    return heuristic_result("checkpoint-all", graph, budget, schedule, started, simulation=simulation, checkpoints=[])


def chen_sqrt(graph: Graph, budget: int, *, use_articulation_points: bool = True) -> SolveResult:
    """Chen et al. 2016's sqrt(n) checkpointing (section 4.1), over the linearised forward.

    The forward's n nodes in topological order form a chain; boundaries every about sqrt(n)
    positions (each moved within half a segment to its cheapest frontier) split it into
    segments, and the frontier of every boundary is kept (:class:`_Chain`). Other forward values
    are freed after their last forward use and recomputed on demand in the backward from the
    kept frontier, each recomputed value kept until its last use.

    Parameters
    ----------
    graph : Graph
        The graph to schedule; it must have a forward/backward split.
    budget : int
        The budget in graph units; it does not steer the rule, only the result's fit.
    use_articulation_points : bool
        Also try the paper's own candidates: every ``round(sqrt(|C|))``-th articulation point of the
        forward (Checkmate's choice on graphs that have them); the schedule with the lower peak
        (then cost) is returned.

    Returns
    -------
    SolveResult
        A "heuristic" result with the schedule, its checkpoints and which candidate won; returned
        even when its peak exceeds ``budget`` (then ``extra["fits"]`` is False).

    Raises
    ------
    CoopError
        When the graph has no backward nodes.

    References
    ----------
    Chen, Xu, Zhang and Guestrin, "Training Deep Nets with Sublinear Memory Cost", arXiv 2016,
    section 4.1.
    """
    started = time.perf_counter()
    split = split_forward_backward(graph, "chen-sqrt")
    chain = _linearise(graph, split)
    checkpoint_sets = {"frontier": chain.kept_for(_sqrt_boundaries(chain))}
    cut_vertices = _articulation_points(graph, split) if use_articulation_points else []
    if len(cut_vertices) >= 2:
        stride = max(1, round(math.sqrt(len(cut_vertices))))
        checkpoint_sets["articulation"] = [v for i, v in enumerate(cut_vertices, start=1) if i % stride == 0]
    # A fixed rule with no budget knob: the lower peak (then cost) wins, whatever the budget.
    best = _best_candidate(graph, split, 0, checkpoint_sets.items())
    return heuristic_result("chen-sqrt", graph, budget, best.schedule, started, simulation=best.simulation,
                            checkpoints=best.checkpoints, candidates=best.label)


def chen_greedy(
    graph: Graph,
    budget: int,
    *,
    use_articulation_points: bool = True,
    grid_size: int = 24,
) -> SolveResult:
    """Chen et al. 2016's greedy segmentation under a per-segment memory threshold ``b``.

    Walking the linearised forward, recomputable memory accumulates since the last cut; once it
    exceeds ``b`` the segment is cut at its cheapest boundary (fewest frontier bytes) and the
    frontier there is kept. ``b`` sweeps a geometric grid between the smallest positive forward
    value and the whole forward's memory (and 0).

    Parameters
    ----------
    graph : Graph
        The graph to schedule; it must have a forward/backward split.
    budget : int
        The budget in graph units.
    use_articulation_points : bool
        Run the paper's own rule too: an articulation point becomes a checkpoint once the
        segment's memory exceeds ``b``.
    grid_size : int
        The number of thresholds ``b`` swept (at least 1).

    Returns
    -------
    SolveResult
        A "heuristic" result with the cheapest schedule whose peak fits the budget, else the one
        with the lowest peak (then ``extra["fits"]`` is False); with its checkpoints, the winning
        candidate and the number of checkpoint sets tried.

    Raises
    ------
    CoopError
        When ``grid_size`` is below 1 or the graph has no backward nodes.

    References
    ----------
    Chen, Xu, Zhang and Guestrin, "Training Deep Nets with Sublinear Memory Cost", arXiv 2016.
    """
    if grid_size < 1:
        raise CoopError(f"chen-greedy: grid_size {grid_size} must be at least 1")
    started = time.perf_counter()
    split = split_forward_backward(graph, "chen-greedy")
    chain = _linearise(graph, split)
    cut_vertices = set(_articulation_points(graph, split)) if use_articulation_points else set()
    checkpoint_sets: dict[tuple[int, ...], str] = {}
    for threshold in _threshold_grid(graph, split.forward, grid_size):
        label = f"frontier b={threshold:.6g}"
        checkpoint_sets.setdefault(tuple(chain.kept_for(_greedy_boundaries(chain, threshold))), label)
        if len(cut_vertices) >= 2:
            label = f"articulation b={threshold:.6g}"
            checkpoint_sets.setdefault(tuple(_greedy_checkpoints(graph, split.forward, cut_vertices, threshold)), label)
    best = _best_candidate(graph, split, budget, ((label, list(kept)) for kept, label in checkpoint_sets.items()))
    return heuristic_result(
        "chen-greedy", graph, budget, best.schedule, started, simulation=best.simulation,
        checkpoints=best.checkpoints, candidates=best.label, thresholds_tried=len(checkpoint_sets),
    )


# -------------------------------------------------------------------- the linearised forward
@dataclass(frozen=True)
class _Chain:
    """The forward in topological order, seen as a chain of positions 0..n-1.

    A boundary at position k (1 <= k < n) separates ``forward[:k]`` from ``forward[k:]``; its
    frontier is every recomputable forward value produced before k and read by a forward node at
    k or later. Keeping the frontier makes ``forward[k:]`` recomputable without touching
    ``forward[:k]``: this is how Checkmate applies Chen's segments to non-linear graphs, where a
    value such as an attention mask read by every block leaves no articulation point.
    """

    forward: tuple[int, ...]
    last_forward_read: tuple[int, ...]  # position -> last position of a forward node reading it
    pinned: frozenset[int]              # kept anyway: not recomputable, or a graph output
    frontier_bytes: tuple[int, ...]     # boundary k -> bytes of its frontier (index 0 and n unused)
    mem: tuple[int, ...]                # position -> output bytes

    @property
    def size(self) -> int:
        return len(self.forward)

    def frontier(self, boundary: int) -> list[int]:
        """The forward values that must be kept for a segment to start at ``boundary``."""
        return [
            self.forward[p] for p in range(boundary)
            if self.last_forward_read[p] >= boundary and self.forward[p] not in self.pinned
        ]

    def kept_for(self, boundaries: Iterable[int]) -> list[int]:
        """Union of the frontiers of these boundaries, in forward order."""
        kept: set[int] = set()
        for boundary in boundaries:
            kept.update(self.frontier(boundary))
        return [v for v in self.forward if v in kept]


def _linearise(graph: Graph, split: ForwardBackward) -> _Chain:
    forward = split.forward
    position = {v: p for p, v in enumerate(forward)}
    last_read = list(range(len(forward)))
    for p, v in enumerate(forward):
        for source in graph.node(v).inputs:
            if source in position:
                last_read[position[source]] = max(last_read[position[source]], p)
    pinned = frozenset(v for v in forward if not graph.node(v).recomputable) | frozenset(
        v for v in graph.outputs if v in position
    )
    # Difference array: value p is on the frontier of boundaries p+1 .. last_read[p].
    delta = [0] * (len(forward) + 2)
    mem = tuple(graph.node(v).mem for v in forward)
    for p, v in enumerate(forward):
        if v not in pinned and last_read[p] > p:
            delta[p + 1] += mem[p]
            delta[last_read[p] + 1] -= mem[p]
    frontier_bytes, running = [], 0
    for k in range(len(forward) + 1):
        running += delta[k]
        frontier_bytes.append(running)
    return _Chain(forward, tuple(last_read), pinned, tuple(frontier_bytes), mem)


def _sqrt_boundaries(chain: _Chain) -> list[int]:
    """Chen's sqrt(n) spacing, each boundary moved within half a segment to its cheapest frontier.

    Segments of L = round(sqrt(n)) positions; the i-th boundary is the position in
    ``[i L - L/2, i L + L/2]`` (after the previous boundary) with the fewest frontier bytes,
    nearest to ``i L`` on ties, so that cuts land between blocks rather than inside them.
    """
    n = chain.size
    length = max(1, round(math.sqrt(n)))
    boundaries: list[int] = []
    for target in range(length, n, length):
        low = max(target - length // 2, (boundaries[-1] + 1) if boundaries else 1)
        high = min(target + length // 2, n - 1)
        if low > high:
            continue
        best = min(range(low, high + 1), key=lambda k: (chain.frontier_bytes[k], abs(k - target)))
        boundaries.append(best)
    return boundaries


def _greedy_boundaries(chain: _Chain, threshold: float) -> list[int]:
    """Chen's greedy segmentation over the chain with segment memory threshold b.

    Walking the forward, the recomputable memory since the last cut accumulates; once it exceeds
    b, the segment is cut at the boundary with the fewest frontier bytes since that cut (the
    latest on ties), and the count restarts from there.
    """
    boundaries: list[int] = []
    start = 0  # first position of the open segment
    segment_memory = 0
    for p in range(chain.size - 1):
        if chain.forward[p] not in chain.pinned:
            segment_memory += chain.mem[p]
        if segment_memory <= threshold:
            continue
        cut = min(range(start + 1, p + 2), key=lambda k: (chain.frontier_bytes[k], -k))
        boundaries.append(cut)
        start = cut
        segment_memory = sum(chain.mem[q] for q in range(cut, p + 1) if chain.forward[q] not in chain.pinned)
    return boundaries


def _articulation_points(graph: Graph, split: ForwardBackward) -> list[int]:
    """Articulation points (cut vertices) of the forward subgraph, in forward order.

    A virtual source feeds the forward nodes with no forward input and a virtual sink reads the
    ones with no forward reader, so that a cut vertex separates all the inputs from all the ends.
    Keeping one makes everything before it unnecessary for recomputing what follows: its
    frontier is itself alone. Real models often have none (a mask read by every block bypasses
    them), hence the frontier linearisation.
    """
    forward_set = set(split.forward)
    undirected = nx.Graph()
    undirected.add_nodes_from(split.forward)
    source, sink = ("virtual", "source"), ("virtual", "sink")
    for v in split.forward:
        forward_inputs = [u for u in graph.node(v).inputs if u in forward_set]
        undirected.add_edges_from((u, v) for u in forward_inputs)
        if not forward_inputs:
            undirected.add_edge(source, v)
        if not any(c in forward_set for c in graph.consumers[v]):
            undirected.add_edge(v, sink)
    cut_vertices = set(nx.articulation_points(undirected)) - {source, sink}
    return [v for v in split.forward if v in cut_vertices]


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
    label: str

    def better_than(self, other: _Candidate, budget: int) -> bool:
        """Fitting beats not fitting; among fits the lower cost, else the lower peak wins."""
        fits, other_fits = self.simulation.peak <= budget, other.simulation.peak <= budget
        if fits != other_fits:
            return fits
        if fits:
            return (self.simulation.cost, self.simulation.peak) < (other.simulation.cost, other.simulation.peak)
        return (self.simulation.peak, self.simulation.cost) < (other.simulation.peak, other.simulation.cost)


@derived_from_graph
def _kept_schedule(graph: Graph, split: ForwardBackward, keep: frozenset[int],
                   free_recomputed: bool = False) -> tuple[Schedule, Simulation]:
    """The schedule keeping ``keep`` (:func:`forward_keep_backward_recompute`) and its simulation, once per graph and
    arguments: a planner that re-solves one graph at several budgets (the arena plan's measure-and-re-solve rounds)
    builds the same budget-independent baselines each time."""
    schedule = forward_keep_backward_recompute(graph, split, keep=set(keep), free_recomputed=free_recomputed)
    return schedule, simulate(graph, schedule)


def _best_candidate(graph: Graph, split: ForwardBackward, budget: int,
                    checkpoint_sets: Iterable[tuple[str, list[int]]]) -> _Candidate:
    """Schedule and simulate every checkpoint set; the best by :meth:`_Candidate.better_than`."""
    best: _Candidate | None = None
    for label, checkpoints in checkpoint_sets:
        schedule, simulation = _kept_schedule(graph, split, frozenset(checkpoints))
        candidate = _Candidate(schedule, simulation, checkpoints, label)
        if best is None or candidate.better_than(best, budget):
            best = candidate
    if best is None:
        raise AssertionError("no checkpoint set to try")  # callers always pass at least one
    return best


# -------------------------------------------------------------------- result
def heuristic_result(
    formulation: str,
    graph: Graph,
    budget: int,
    schedule: Schedule,
    started: float,
    simulation: Simulation | None = None,
    **extra: Any,
) -> SolveResult:
    """The result of a heuristic schedule (these baselines, :mod:`coop.formulations.blocks.per_layer`), judged by the simulator.

    Parameters
    ----------
    formulation : str
        The formulation's name, which the result and its message carry.
    budget : int
        The budget in graph units, against which the schedule's peak is checked.
    schedule : Schedule
        The heuristic's schedule.
    started : float
        ``time.perf_counter()`` when the formulation started (the result's ``wall_s`` counts from it).
    simulation : Simulation or None
        The schedule's simulation where the caller already has it; None: simulated here.
    **extra : Any
        Details for ``extra`` (checkpoints, candidates, ...).

    Returns
    -------
    SolveResult
        Status ``"heuristic"``, objective the simulated cost, ``extra["fits"]`` and ``extra["peak"]``; where the peak
        exceeds ``budget`` the schedule is still returned and the message says it does not fit.
    """
    simulation = simulation or simulate(graph, schedule)
    fits = simulation.peak <= budget
    message = ""  # as every formulation: silent when the schedule fits
    if not fits:  # the schedule is still returned (callers compare it), but must not run under this budget
        message = (f"{formulation}: peak {simulation.peak} exceeds the budget {budget}; the schedule does not fit "
                   f"(extra['fits'] is False)")
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
