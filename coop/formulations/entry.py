"""The one entry check of every formulation: a budget below ``min_budget`` is answered before any model is built.

:func:`formulation` decorates a formulation's function ``f(graph, budget, *, options) -> SolveResult``
so that, however it is called (through :func:`coop.formulations.solve`, by ``auto``'s ladder, by
another solver warm-starting from it, or directly):

* a budget below :func:`coop.budget.min_budget` (the proven lower bound on every schedule's peak)
  returns an ``infeasible`` result with the one verdict line of :func:`coop.budget.below_min_budget`;
* where the formulation only recomputes (``store_all_is_optimal``), a budget that the baseline
  order's peak already fits returns store-all as ``optimal``: no schedule costs less than computing
  every node once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from coop.budget import baseline_peak, below_min_budget
from coop.formulations.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, simulate

Solver = TypeVar("Solver", bound=Callable[..., SolveResult])


def formulation(name: str, *, store_all_is_optimal: bool = False) -> Callable[[Solver], Solver]:
    """Decorator: the entry check of the formulation called ``name`` (see the module docstring).

    Parameters
    ----------
    name:
        The formulation's name, which its early results carry.
    store_all_is_optimal:
        Whether store-all is optimal wherever it fits: true of the recomputation-only formulations,
        whose cost is the compute a schedule repeats.

    Returns
    -------
    Callable
        The decorator; the decorated function keeps its signature (``inspect.signature`` follows it).
    """

    def decorate(function: Solver) -> Solver:
        @functools.wraps(function)
        def checked(graph: Graph, budget: int, **options: Any) -> SolveResult:
            started = time.perf_counter()
            if below := below_min_budget(budget, graph):
                return SolveResult(name, "infeasible", wall_s=time.perf_counter() - started, message=below)
            if store_all_is_optimal and budget >= baseline_peak(graph):
                schedule = Schedule.from_order(graph.order)
                sim = simulate(graph, schedule)
                return SolveResult(name, "optimal", schedule, sim, sim.cost, graph.baseline_cost,
                                   time.perf_counter() - started, "store-all fits the budget: no schedule costs "
                                   "less than computing every node once", {"warm_start": "store_all"})
            return function(graph, budget, **options)

        return checked  # type: ignore[return-value]

    return decorate
