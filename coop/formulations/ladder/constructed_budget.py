"""The constructed budget: the lowest budget a graph is known to fit, an upper bound found by construction.

:func:`coop.budget.min_budget` is the proven lower bound (no schedule fits below it); the least
budget any schedule fits lies between it and the peak of the lowest-memory schedule anyone
constructs. This module constructs such a schedule: the lowest of the peaks of checkpoint-all (keep only what may not
be recomputed, rebuild everything else at each use) and of Chen's baselines asked for the lower
bound, and the lowest budget at which the greedy eviction heuristic
(:func:`coop.formulations.heuristics.fast_schedules.greedy_eviction_schedule`, offline DTR with exact next uses, with each of its
rebuild-size penalties, over the captured order and the solvers' deferred order of
:func:`coop.formulations.core.solving_order.solving_graph`) still finds a schedule, located by bisection between the
two bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from coop.budget import min_budget
from coop.errors import CoopError
from coop.formulations.core.solving_order import solving_graph
from coop.formulations.heuristics.baselines import checkpoint_all, chen_greedy, chen_sqrt
from coop.formulations.heuristics.fast_schedules import REBUILD_SIZE_PENALTIES, greedy_eviction_schedule
from coop.graph import Graph
from coop.schedule import Schedule, simulate

#: Bisection stops when the bracket is narrower than this fraction of the lower bound.
TOLERANCE = 0.002


@dataclass(frozen=True)
class ConstructedBudget:
    """A budget that some schedule fits (its simulated peak), the schedule, and where it came from."""

    budget: int
    schedule: Schedule
    source: str
    lower_bound: int  # min_budget: the proven lower bound, no schedule fits below it

    @property
    def gap(self) -> float:
        """How far the constructed budget may be above the least feasible one, relative to min_budget."""
        return (self.budget - self.lower_bound) / self.lower_bound if self.lower_bound else 0.0


def constructed_budget(graph: Graph, tolerance: float = TOLERANCE) -> ConstructedBudget:
    """The lowest budget that a constructed schedule fits (see the module docstring).

    Parameters
    ----------
    graph : Graph
        The graph to find a budget for.
    tolerance : float
        The bisection stops when the bracket is narrower than this fraction of the lower bound
        (and at 1 graph unit).

    Returns
    -------
    ConstructedBudget
        The lowest simulated peak found, the schedule reaching it, its source ("store-all",
        "checkpoint-all", "chen-greedy", "chen-sqrt" or "greedy-eviction") and
        :func:`coop.budget.min_budget` as the lower bound.
    """
    lower = min_budget(graph)
    # The baseline order always fits its own peak: the bisection starts from it.
    baseline = Schedule.from_order(graph.order)
    best = ConstructedBudget(simulate(graph, baseline).peak, baseline, "store-all", lower)
    for name, baseline in (("checkpoint-all", checkpoint_all), ("chen-greedy", chen_greedy), ("chen-sqrt", chen_sqrt)):
        try:
            result = baseline(graph, lower)
        except CoopError:  # a graph without a forward/backward split: the bisection alone decides
            continue
        if result.schedule is not None:
            peak = simulate(graph, result.schedule).peak
            if peak < best.budget:
                best = ConstructedBudget(peak, result.schedule, name, lower)
    deferred = solving_graph(graph)[0]
    orders = [graph] if deferred is graph else [graph, deferred]
    low, high = lower, best.budget
    while high - low > max(1, tolerance * lower):
        middle = (low + high) // 2
        found = [s for ordered in orders for penalty in REBUILD_SIZE_PENALTIES
                 if (s := greedy_eviction_schedule(ordered, middle, penalty)) is not None]
        if not found:
            low = middle
            continue
        peak, schedule = min(((simulate(graph, s).peak, s) for s in found), key=lambda item: item[0])
        if peak < best.budget:
            best = ConstructedBudget(peak, schedule, "greedy-eviction", lower)
        high = min(middle, peak)
    return best
