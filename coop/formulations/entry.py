"""The one entry check of every formulation: a budget below ``min_budget`` is answered before any model is built.

:func:`formulation` decorates a formulation's function ``f(graph, budget, *, options) -> SolveResult``
so that, however it is called (through :func:`coop.formulations.solve`, by ``auto``'s ladder, by
another solver warm-starting from it, or directly):

* a budget below :func:`coop.budget.min_budget` (the proven lower bound on every schedule's peak)
  returns an ``infeasible`` result with the one verdict line of :func:`coop.budget.below_min_budget`;
* a bad option is refused first (``check_options``: one line), at every budget;
* where a formulation asks for it (``store_all_is_optimal``: Moccasin), a budget that the baseline
  order's peak already fits returns store-all as ``optimal``: no schedule costs less than computing
  every node once. Checkmate's MILP and LP rounding do not ask: they prove that optimum themselves and
  report their own bound and model size (and a ``cost_limit`` may exclude store-all).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

from coop.budget import baseline_peak, below_min_budget
from coop.formulations.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, simulate

Solver = TypeVar("Solver", bound=Callable[..., SolveResult])


def formulation(name: str, *, store_all_is_optimal: bool | Callable[[dict[str, Any]], bool] = False,
                check_options: Callable[..., None] | None = None) -> Callable[[Solver], Solver]:
    """Decorator: the entry check of the formulation called ``name`` (see the module docstring).

    Parameters
    ----------
    name:
        The formulation's name, which its early results carry.
    store_all_is_optimal:
        Whether to answer with store-all wherever it fits (optimal for a recomputation-only formulation,
        whose cost is the compute a schedule repeats); a callable decides from the call's arguments (all
        of them by name, defaults included).
    check_options:
        Called first with the call's arguments by name (defaults included); raises the formulation's
        one-line error for a bad option, so that a bad option is refused at every budget.

    Returns
    -------
    Callable
        The decorator; the decorated function keeps its signature (``inspect.signature`` follows it).
    """

    def decorate(function: Solver) -> Solver:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def checked(graph: Graph, budget: int, **options: Any) -> SolveResult:
            started = time.perf_counter()
            bound = signature.bind(graph, budget, **options)
            bound.apply_defaults()
            if check_options is not None:
                check_options(**bound.arguments)
            if below := below_min_budget(budget, graph):
                return SolveResult(name, "infeasible", wall_s=time.perf_counter() - started, message=below)
            store_all = store_all_is_optimal(bound.arguments) if callable(store_all_is_optimal) else store_all_is_optimal
            if store_all and budget >= baseline_peak(graph):
                schedule = Schedule.from_order(graph.order)
                sim = simulate(graph, schedule)
                return SolveResult(name, "optimal", schedule, sim, sim.cost, graph.baseline_cost,
                                   time.perf_counter() - started, "store-all fits the budget: no schedule costs "
                                   "less than computing every node once", {"warm_start": "store_all"})
            return function(graph, budget, **options)

        return checked  # type: ignore[return-value]

    return decorate
