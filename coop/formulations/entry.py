"""The one entry check of every formulation: a budget below ``min_budget`` is answered before any model is built.

:func:`formulation` decorates a formulation's function ``f(graph, budget, *, options) -> SolveResult``
so that, however it is called (through :func:`coop.formulations.solve`, by ``auto``'s ladder, by
another solver warm-starting from it, or directly):

* a budget below :func:`coop.budget.min_budget` (the proven lower bound on every schedule's peak)
  returns an ``infeasible`` result with the one verdict line of :func:`coop.budget.below_min_budget`;
* a bad option is refused first (a time limit that is not a positive number of seconds, fewer than one
  thread: :func:`coop.formulations.deadline.check_common_options`; the solver's own ``check_options``), in one
  line, at every budget;
* the solve's one :class:`~coop.formulations.deadline.Deadline` is made here, from ``time_limit``, before any
  model is built (so building counts), and handed to the solver as ``deadline``; a ``deadline`` given by a
  caller (a solver running another: ``auto``'s rungs) bounds it, so a nested solve never outlives its parent;
* a result that is a last resort (``SolveResult.fallback``: no solver ran to its end) is warned about, saying
  why and what time would let one run, once, by the outermost call;
* where a formulation asks for it (``store_all_is_optimal``: Moccasin), a budget that the baseline
  order's peak already fits returns store-all as ``optimal``: no schedule costs less than computing
  every node once. Checkmate's MILP and LP rounding do not ask: they prove that optimum themselves and
  report their own bound and model size (and a ``cost_limit`` may exclude store-all).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from coop.budget import baseline_peak, below_min_budget
from coop.errors import LastResortWarning
from coop.formulations.deadline import Deadline, check_common_options
from coop.formulations.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, simulate

Solver = TypeVar("Solver", bound=Callable[..., SolveResult])

#: How many formulation calls enclose the current one (0: a caller's own call; a rung of auto is at 1).
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("coop_formulation_depth", default=0)


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
        takes_deadline = "deadline" in signature.parameters

        @functools.wraps(function)
        def checked(graph: Graph, budget: int, **options: Any) -> SolveResult:
            parent: Deadline | None = options.pop("deadline", None)
            bound = signature.bind(graph, budget, **options)
            bound.apply_defaults()
            time_limit = bound.arguments.get("time_limit")
            check_common_options(time_limit, bound.arguments.get("threads"), name)
            deadline = Deadline.after(time_limit, within=parent) if time_limit is not None else parent
            started = deadline or Deadline.after(0.0)  # a solver without a time limit: its wall time from here
            if check_options is not None:
                check_options(**bound.arguments)
            if below := below_min_budget(budget, graph):
                return SolveResult(name, "infeasible", wall_s=started.elapsed(), message=below)
            store_all = store_all_is_optimal(bound.arguments) if callable(store_all_is_optimal) else store_all_is_optimal
            if store_all and budget >= baseline_peak(graph):
                schedule = Schedule.from_order(graph.order)
                sim = simulate(graph, schedule)
                return SolveResult(name, "optimal", schedule, sim, sim.cost, graph.baseline_cost,
                                   started.elapsed(), "store-all fits the budget: no schedule costs "
                                   "less than computing every node once", {"warm_start": "store_all"})
            if takes_deadline:
                options["deadline"] = deadline
            depth = _DEPTH.set(_DEPTH.get() + 1)
            try:
                result = function(graph, budget, **options)
            finally:
                _DEPTH.reset(depth)
            if _DEPTH.get() == 0 and result.fallback:
                warnings.warn(f"{name}: {result.fallback}", LastResortWarning, stacklevel=2)
            return result

        return checked  # type: ignore[return-value]

    return decorate
