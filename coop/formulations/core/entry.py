"""The one entry of every solver: options typed and checked, the deadline made, a budget below ``min_budget`` answered.

:func:`formulation` decorates a solver's implementation ``f(graph, budget, options) -> SolveResult``, where
``options`` is an instance of the solver's :class:`~coop.formulations.core.options.SolverOptions` subclass. The
decorated function is called in either form (through :func:`coop.formulations.solve`, by ``auto``'s ladder, by
another solver warm-starting from it, or directly):

* ``solver(graph, budget, time_limit=5, threads=1, ...)``: keywords, typed into the options class (``None``
  meaning the default; an unknown one refused in one line naming it);
* ``solver(graph, budget, options=obj)``: an options object of the solver's class.

Then, however it was called:

* a bad option is refused first, in one line, at every budget: a time limit that is not a positive number of
  seconds or fewer than one thread by the options object itself (its one check,
  :func:`coop.formulations.core.deadline.check_common_options`, named for the formulation when typed from
  keywords), then the solver's own ``check_options``, given the graph, the budget and the options;
* the solve's one :class:`~coop.formulations.core.deadline.Deadline` is made here, from ``options.time_limit``, before
  any model is built (so building counts), within ``options.deadline`` when a caller gave one (a solver running
  another: ``auto``'s rungs), so a nested solve never outlives its parent; the implementation gets the options
  with that deadline in ``options.deadline`` (``dataclasses.replace``);
* a budget below :func:`coop.budget.min_budget` (the proven lower bound on every schedule's peak; for a
  formulation that ``pages``, the bound of schedules that may page) returns an ``infeasible`` result with the one
  verdict line of :func:`coop.budget.below_min_budget`;
* where a formulation asks for it (``store_all_is_optimal``: Moccasin), a budget that the baseline
  order's peak already fits returns store-all as ``optimal``: no schedule costs less than computing
  every node once. Checkmate's MILP and LP rounding do not ask: they prove that optimum themselves and
  report their own bound and model size (and a ``cost_limit`` may exclude store-all);
* a result that is a last resort (``SolveResult.fallback``: no solver ran to its end) is warned about, saying
  why and what time would let one run, once, by the outermost call.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

from coop.budget import baseline_peak, below_min_budget
from coop.errors import CoopError, LastResortWarning
from coop.formulations.core.deadline import Deadline
from coop.formulations.core.options import SolverOptions
from coop.formulations.core.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, simulate

#: A solver's implementation: ``(graph, budget, options) -> SolveResult``.
Implementation = Callable[[Graph, int, Any], SolveResult]

#: How many formulation calls enclose the current one (0: a caller's own call; a rung of auto is at 1).
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("coop_formulation_depth", default=0)


def formulation(name: str, *, options: type[SolverOptions],
                store_all_is_optimal: bool | Callable[[Any], bool] = False,
                check_options: Callable[[Graph, int, Any], None] | None = None,
                pages: bool | Callable[[Any], bool] = False,
                ) -> Callable[[Implementation], Callable[..., SolveResult]]:
    """Decorator: the entry of the formulation called ``name`` (see the module docstring).

    Parameters
    ----------
    name:
        The formulation's name, which its early results and its option errors carry.
    options:
        The solver's options class: keywords are typed into it, an options object must be one.
    store_all_is_optimal:
        Whether to answer with store-all wherever it fits (optimal for a recomputation-only formulation,
        whose cost is the compute a schedule repeats); a callable decides from the options object.
    check_options:
        Called first with the graph, the budget and the options object; raises the formulation's one-line
        error for a bad option, so that a bad option is refused at every budget.
    pages:
        Whether the formulation may page values out (POET; auto given a device profile); a callable decides from
        the options object. Its budgets are then checked against ``min_budget(graph, paging=True)``: a value that
        cannot be recomputed may still be paged out and back.

    Returns
    -------
    Callable
        The decorator; the decorated function is ``solver(graph, budget, *, options=None, **keywords)`` and
        carries the class as ``solver.options_type``.
    """
    options_type = options

    def decorate(implementation: Implementation) -> Callable[..., SolveResult]:
        @functools.wraps(implementation)
        def checked(graph: Graph, budget: int, *, options: SolverOptions | None = None,
                    **keywords: Any) -> SolveResult:
            typed = _typed(name, options_type, options, keywords)
            deadline = Deadline.after(typed.time_limit, within=typed.deadline)
            if check_options is not None:
                check_options(graph, budget, typed)
            paging = pages(typed) if callable(pages) else pages
            if below := below_min_budget(budget, graph, paging=paging):
                return SolveResult(name, "infeasible", wall_s=deadline.elapsed(), message=below)
            store_all = store_all_is_optimal(typed) if callable(store_all_is_optimal) else store_all_is_optimal
            if store_all and budget >= baseline_peak(graph):
                schedule = Schedule.from_order(graph.order)
                sim = simulate(graph, schedule)
                return SolveResult(name, "optimal", schedule, sim, sim.cost, graph.baseline_cost,
                                   deadline.elapsed(), "store-all fits the budget: no schedule costs "
                                   "less than computing every node once", {"warm_start": "store_all"})
            depth = _DEPTH.set(_DEPTH.get() + 1)
            try:
                result = implementation(graph, budget, dataclasses.replace(typed, deadline=deadline))
            finally:
                _DEPTH.reset(depth)
            if _DEPTH.get() == 0 and result.fallback:
                warnings.warn(f"{name}: {result.fallback}", LastResortWarning, stacklevel=2)
            return result

        del checked.__wrapped__  # its signature is the call's, not the implementation's
        checked.options_type = options_type  # type: ignore[attr-defined]
        return checked

    return decorate


def _typed(name: str, options_type: type[SolverOptions], options: SolverOptions | None,
           keywords: dict[str, Any]) -> SolverOptions:
    """The call's options object: ``options`` (of the solver's class), or the keywords typed into the class."""
    if options is None:
        return options_type.from_keywords(name, keywords)
    if keywords:
        raise CoopError(f"formulation {name!r} takes options=... or keywords, not both (given "
                        f"{', '.join(sorted(keywords))} beside options)")
    if not isinstance(options, options_type):
        raise CoopError(f"formulation {name!r} takes {options_type.__name__}, not {type(options).__name__}: "
                        f"convert with {options_type.__name__}.from_options(...)")
    return options
