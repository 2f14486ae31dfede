"""``auto``: try every formulation that can serve the graph within one time limit, return the cheapest schedule.

A ladder, each rung a wider space than the one before, sharing the caller's time limit (each rung
gets an equal share of what is left, so a rung that finishes early leaves its time to the next):

1. the baseline order when it already fits (no solve needed, no recomputation: nothing is cheaper); where
   store-all in the deferred order fits instead, Moccasin comes first (it returns that order at once);
2. Checkmate's MILP (Jain et al. 2020) on graphs of up to ``EXACT_MAX_NODES`` computed nodes: exact
   within the captured order of first computations;
3. Moccasin's CP-SAT model (Bartan et al. 2023, O(n) variables) on every graph, warm-started with
   what the rungs before found: it may also reorder first computations (the deferred order of
   :mod:`coop.formulations.solving_order`), where a reordering alone can fit a budget that no
   recomputation in the captured order reaches. It is skipped only where its space is contained in
   one already searched to optimality: Checkmate proved its optimum and Moccasin would keep the same
   captured order;
4. MONeT (Shah et al. 2021) when the graph has operator implementations, warm-started likewise;
5. given a ``device_profile``, POET (Patil et al. 2022), which pages to the device's slower tier, when
   no rung before found a schedule (paging time is not part of a schedule's compute cost, so a paging
   schedule is not compared with recomputation-only ones on that cost).

The cheapest baseline schedule that fits (:func:`cheapest_fitting_baseline`, which the planner uses too;
baselines take no solver time) is a candidate from the start and a warm start of every rung, so auto
never returns more than a baseline would. The cheapest schedule found is returned (ties: the earlier
candidate); ``extra["auto"]`` names who found it and ``extra["auto_tried"]`` each rung's status. Where
nothing fits, the result says "no schedule found within N s" with what to try: infeasibility is not
claimed without a proof (min_budget is checked before any formulation runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from coop.budget import baseline_peak, format_memory, min_budget
from coop.errors import CoopError, InfeasibleError
from coop.formulations.baselines import checkpoint_all, chen_greedy, chen_sqrt, store_all
from coop.formulations.checkmate import checkmate
from coop.formulations.entry import formulation
from coop.formulations.moccasin import moccasin
from coop.formulations.monet import monet
from coop.formulations.options import (
    BaselineOptions,
    CheckmateOptions,
    ChenGreedyOptions,
    ChenSqrtOptions,
    MoccasinOptions,
    MonetOptions,
    PoetOptions,
    SolverOptions,
)
from coop.formulations.poet import poet
from coop.formulations.registry import BASELINES
from coop.formulations.result import SolveResult
from coop.formulations.solving_order import solving_graph
from coop.graph import Graph
from coop.schedule import Schedule, simulate, validate

#: Above this many computed nodes the O(n^2) MILP gets slow; Moccasin's O(n) model takes over.
EXACT_MAX_NODES = 120
#: No rung is started with less than this many seconds (a solver needs time to build its model).
MIN_RUNG_SECONDS = 1.0

#: What auto may run, by the names its ladder and messages use: each solver's function and options type.
SOLVERS: dict[str, tuple[Callable[..., SolveResult], type[SolverOptions]]] = {
    "store-all": (store_all, BaselineOptions),
    "checkpoint-all": (checkpoint_all, BaselineOptions),
    "chen-sqrt": (chen_sqrt, ChenSqrtOptions),
    "chen-greedy": (chen_greedy, ChenGreedyOptions),
    "checkmate": (checkmate, CheckmateOptions),
    "moccasin": (moccasin, MoccasinOptions),
    "monet": (monet, MonetOptions),
    "poet": (poet, PoetOptions),
}


def run_solver(graph: Graph, budget: int, name: str, **options: Any) -> SolveResult:
    """Call one of :data:`SOLVERS` as a function, with the options its type declares it takes.

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units (parsed).
    name : str
        A key of :data:`SOLVERS`.
    **options : Any
        The solver's options; None values mean the default.

    Returns
    -------
    SolveResult
        The solver's result.

    Raises
    ------
    CoopError
        When an option is one the solver does not take (and whatever the solver raises).
    """
    function, options_type = SOLVERS[name]
    return function(graph, budget, **options_type.from_keywords(name, options).keywords())


def choose_formulation(graph: Graph, budget: int, *, captured: Any = None) -> str:
    """The formulation ``auto`` runs first for this graph and budget.

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    captured : Any
        Not used: the choice depends on the graph and budget only.

    Returns
    -------
    str
        The first rung of :func:`formulation_ladder` (without a device profile).
    """
    return formulation_ladder(graph, budget)[0]


def needs_implementations(graph: Graph, budget: int) -> bool:
    """Whether the graph has implementations (MONeT) and recomputation alone provably cannot reach the budget.

    That is, the budget is below min_budget of the graph with default implementations only.

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.

    Returns
    -------
    bool
        True when ``graph.has_impls`` and ``budget < min_budget(graph.remat_only())``.
    """
    return graph.has_impls and budget < min_budget(graph.remat_only())


def formulation_ladder(graph: Graph, budget: int, device_profile: Any = None) -> list[str]:
    """The formulations ``auto`` tries, in order (see the module docstring).

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    device_profile : Any
        A device profile, or None; given one, "poet" ends the ladder.

    Returns
    -------
    list of str
        The formulation names: ``["store-all"]`` alone when the baseline peak fits the budget.
    """
    if budget >= baseline_peak(graph):
        return ["store-all"]
    if needs_implementations(graph, budget):  # recomputation alone provably cannot reach it
        ladder = ["monet"]
    else:
        ladder = ["checkmate"] if len(graph.order) <= EXACT_MAX_NODES else []
        ladder.append("moccasin")
        if graph.has_impls:
            ladder.append("monet")
        if "checkmate" in ladder and _reordering_fits(graph, budget):
            ladder = ["moccasin", "checkmate", *ladder[2:]]  # a free first candidate: no recomputation at all
    if device_profile is not None:
        ladder.append("poet")
    return ladder


def _reordering_fits(graph: Graph, budget: int) -> bool:
    """Whether store-all in the deferred order (Moccasin's solving order) fits: reordering alone reaches the budget."""
    reordered, order = solving_graph(graph, "deferred")
    return order.startswith("deferred") and simulate(reordered, Schedule.from_order(reordered.order)).peak <= budget


@formulation("auto")
def auto(graph: Graph, budget: int, *, time_limit: float = 60.0, threads: int = 2, progress: Any = None,
         captured: Any = None, hint: Any = None, device_profile: Any = None) -> SolveResult:
    """Climb :func:`formulation_ladder` within ``time_limit`` seconds in all; return the cheapest fitting schedule.

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units (parsed).
    time_limit : float
        Seconds for the whole ladder; each rung gets an equal share of what is left (at least
        ``MIN_RUNG_SECONDS``).
    threads : int
        Solver threads, passed to each rung.
    progress : Any
        A progress callback, passed to each rung.
    captured : Any
        The captured program, passed to each rung.
    hint : Any
        A schedule or a list of schedules to warm-start the rungs with, before what earlier rungs
        found.
    device_profile : Any
        A device profile; given one, POET is the last rung.

    Returns
    -------
    SolveResult
        The cheapest fitting schedule found (ties: a rung's over the baseline's, then the earlier),
        with ``extra["auto"]`` naming who found it and ``extra["auto_tried"]`` each rung's status;
        else a result with status "unknown", no schedule, and a message saying what to try. A rung
        that raises a CoopError counts as "unknown".
    """
    started = time.perf_counter()
    ladder = formulation_ladder(graph, budget, device_profile)
    found: list[SolveResult] = []
    tried: dict[str, str] = {}
    hints = [] if hint is None else list(hint) if isinstance(hint, (list, tuple)) else [hint]
    baseline, no_baseline = _fitting_baseline(graph, budget) if ladder != ["store-all"] else (None, "")
    if baseline is not None:  # a candidate and a warm start for every rung: auto never loses to a baseline
        found.append(baseline)
        tried[baseline.formulation] = "heuristic"
    for index, name in enumerate(ladder):
        skip = _skip_reason(graph, name, found, tried)
        if skip:
            tried[name] = f"skipped: {skip}"
            continue
        remaining = time_limit - (time.perf_counter() - started)
        if remaining < MIN_RUNG_SECONDS and any(r is not baseline for r in found):  # every rung gets one chance
            tried[name] = "skipped: time limit reached"
            continue
        share = max(remaining / (len(ladder) - index), MIN_RUNG_SECONDS)
        options: dict[str, Any] = {"time_limit": share, "threads": threads, "progress": progress, "captured": captured,
                                   "hint": [*hints, *(r.schedule for r in found)] or None}
        if name == "poet":
            options["device_profile"] = device_profile
        try:
            result = run_solver(graph, budget, name, **options)
        except CoopError as exc:
            result = SolveResult(formulation=name, status="unknown", message=str(exc))
        fits = _fits(graph, budget, result)
        tried[name] = result.status if fits or result.schedule is None else f"{result.status}, over budget"
        if fits:
            found.append(result)
            if result.simulation.cost <= graph.baseline_cost:  # no recomputation: nothing is cheaper
                break
    summary = ", ".join(f"{name}: {status}" for name, status in tried.items())
    if found:
        # the cheapest; of equal costs a rung's result (it carries a bound and a status), then the earlier one
        best = min(found, key=lambda r: (r.simulation.cost, r is baseline))
        best.extra["auto"] = best.formulation
        best.extra["auto_tried"] = dict(tried)
        best.message = f"auto chose {best.formulation} ({summary})" + (f": {best.message}" if best.message else "")
        best.wall_s = time.perf_counter() - started
        return best
    return SolveResult(
        formulation="auto",
        status="unknown",
        wall_s=time.perf_counter() - started,
        extra={"auto_tried": dict(tried)},
        message=(f"no schedule found within {time_limit:g} s ({summary}); {no_baseline}; min_budget is "
                 f"{format_memory(min_budget(graph), graph)}: try a longer time_limit, a larger budget"
                 + ("" if graph.has_impls else ", alternatives=True with formulation='monet'")
                 + ("" if device_profile is not None else ", or a device_profile to let poet page")),
    )


def _fitting_baseline(graph: Graph, budget: int) -> tuple[SolveResult | None, str]:
    """The cheapest baseline schedule that fits (no solver time), or None and why none does."""
    try:
        return cheapest_fitting_baseline(graph, budget), ""
    except InfeasibleError as exc:
        return None, str(exc)


def _fits(graph: Graph, budget: int, result: SolveResult) -> bool:
    return result.schedule is not None and result.simulation is not None and result.simulation.peak <= budget


def _skip_reason(graph: Graph, name: str, found: list[SolveResult], tried: dict[str, str]) -> str:
    """Why a rung cannot improve on what was found ('' when it may)."""
    if name == "poet" and found:
        return "a recomputation-only schedule fits (paging time is not compared on compute cost)"
    return ""


def cheapest_fitting_baseline(graph: Graph, budget: int, *, failed: str | None = None) -> SolveResult:
    """The baseline schedule of least cost whose validated peak fits ``budget`` (graph units).

    The one fallback for a formulation that found no schedule within the budget (``auto``, the
    planner) and for a step re-planned inside a training loop: baselines take no solver time.

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    failed : str or None
        The formulation tried first, for the message.

    Returns
    -------
    SolveResult
        The result of the cheapest of :data:`BASELINES` whose schedule validates within ``budget``.

    Raises
    ------
    InfeasibleError
        When no baseline fits, naming ``failed``, the best peak any baseline reached and the
        baselines' errors.
    """
    best: SolveResult | None = None
    best_cost = 0.0
    best_peak: int | None = None
    errors: list[str] = []
    for name in BASELINES:
        try:
            result = run_solver(graph, budget, name)
        except CoopError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if result.schedule is None:
            continue
        check = validate(graph, result.schedule, budget)
        if check.peak is not None:
            best_peak = check.peak if best_peak is None else min(best_peak, check.peak)
        if check.ok and check.cost is not None and (best is None or check.cost < best_cost):
            best, best_cost = result, check.cost
    if best is None:
        what = f"{failed} and the baselines" if failed else "the baselines"
        reached = f"; the best peak reached is {format_memory(best_peak, graph)}" if best_peak else ""
        failures = "".join(f"; {error}" for error in errors)
        raise InfeasibleError(f"no schedule within budget {format_memory(budget, graph)} found by {what}{reached}"
                              f"{failures}; raise the budget, give the solver more time or choose another formulation")
    return best
