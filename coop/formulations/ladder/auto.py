"""``auto``: try every formulation that can serve the graph within one time limit, return the cheapest schedule.

A ladder, each rung a wider space than the one before, sharing the caller's one deadline (each rung gets its
weight's part of what is left, :data:`RUNG_WEIGHTS`, so a rung that finishes early leaves its time to the next;
no rung outlives auto's deadline: :mod:`coop.formulations.core.deadline`):

1. the baseline order when it already fits (no solve needed, no recomputation: nothing is cheaper); where
   store-all in the deferred order fits instead, Moccasin comes first (it returns that order at once);
2. on a training step whose forward repeats blocks (:func:`coop.formulations.blocks.repeated.find_block_groups`)
   and that is larger than ``EXACT_MAX_NODES``: ``blocks`` first (Rockmate / HiRemate-style, Zhao et al. ICML
   2023 / 2025: each block's problem solved once, composed, polished by Moccasin), with most of the time: on a
   Llama-2-7B-shaped step at 0.75 it found 0.06 % where Moccasin alone, from the chen-greedy hint, stopped at
   16.77 % (issue 40); Moccasin then polishes with what is left, hinted with what blocks found. ``per-layer``
   (checkpoint every repeated layer) is a candidate from the start, as the baselines are;
3. Checkmate's MILP (Jain et al. 2020) on training steps of up to ``EXACT_MAX_NODES`` computed nodes: exact
   within the captured order of first computations. Not on a graph without a backward part (the random layered
   graphs), where Moccasin frees the order and searches a larger space: there auto gave part of its 30 s to a
   Checkmate that ended "unknown" and returned 8.36 % where Moccasin alone found 2.32 % (issue 40);
4. Moccasin's CP-SAT model (Bartan et al. 2023, O(n) variables) on every graph, warm-started with
   what the rungs before found: it may also reorder first computations (the deferred order of
   :mod:`coop.formulations.core.solving_order`), where a reordering alone can fit a budget that no
   recomputation in the captured order reaches. It is skipped only where its space is contained in
   one already searched to optimality: Checkmate proved its optimum and Moccasin would keep the same
   captured order;
5. MONeT (Shah et al. 2021) when the graph has operator implementations, warm-started likewise;
6. given a ``device_profile``, POET (Patil et al. 2022), which pages to the device's slower tier, when
   no rung before found a schedule (paging time is not part of a schedule's compute cost, so a paging
   schedule is not compared with recomputation-only ones on that cost).

The cheapest baseline schedule that fits (:func:`cheapest_fitting_baseline`, which the planner uses too;
baselines take no solver time) is a candidate from the start and a warm start of every rung (but checkpoint-all's:
:data:`NOT_HINTED`), so auto never returns more than a baseline would. Where none fits, on a training step of up to
:data:`NEAR_FLOOR_MAX_NODES` nodes, checkpoint-all with outputs computed last
(:mod:`coop.formulations.heuristics.late_outputs`, named ``"late-outputs"``) is that candidate and warm start: a
budget a few per cent above :func:`~coop.budget.min_budget` then has a schedule before any rung runs. The cheapest schedule found is returned (ties: the earlier
candidate); ``result.rungs`` lists every rung (:class:`~coop.formulations.core.result.Rung`: time spent, status,
overhead), ``extra["auto"]`` names who found it and ``extra["auto_tried"]`` each rung's status; a ``progress``
callback gets a milestone as the ladder starts and one as each rung ends (``"auto rung <rung line>; best
overhead so far ..."``, :func:`report_rung`), beside the rungs' own reports. Where
nothing fits, the result says "no schedule found within N s" with what to try: infeasibility is not
claimed without a proof (min_budget is checked before any formulation runs); :func:`no_schedule_error` is the
error a caller raises for it (:class:`~coop.errors.SolveTimeoutError` unless a solver proved it). A result that
is only a baseline because no solver ran to its end carries ``fallback`` (the entry warns with it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from coop.budget import baseline_peak, format_memory, min_budget
from coop.errors import CoopError, InfeasibleError, SolveTimeoutError
from coop.formulations.blocks.repeated import find_block_groups
from coop.formulations.core.deadline import Deadline
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import AutoOptions, SolverOptions
from coop.formulations.core.progress import ProgressClock
from coop.formulations.core.registry import BASELINES, registered
from coop.formulations.core.result import Rung, SolveResult
from coop.formulations.core.solving_order import solving_graph
from coop.formulations.heuristics.baselines import heuristic_result, split_forward_backward
from coop.formulations.heuristics.late_outputs import near_floor_schedule
from coop.graph import Graph, derived_from_graph
from coop.schedule import Schedule, simulate, validate

#: Above this many computed nodes the O(n^2) MILP gets slow; Moccasin's O(n) model takes over.
EXACT_MAX_NODES = 120
#: No rung is started with less than this many seconds once a solver's schedule fits (a solver needs time to
#: build its model); the first rungs always get their chance, within auto's deadline.
MIN_RUNG_SECONDS = 1.0
#: A rung's weight in the split of what is left among the rungs still to run (1 where not named): blocks polishes
#: with Moccasin itself, so the Moccasin rung after it is a short second polish.
RUNG_WEIGHTS = {"blocks": 4.0}


def run_solver(graph: Graph, budget: int, name: str, options: SolverOptions | None = None,
               **keywords: Any) -> SolveResult:
    """Run the formulation registered under ``name`` (:data:`coop.formulations.core.registry.FORMULATIONS`, the one
    table) with typed options, or with keywords typed here.

    Parameters
    ----------
    budget : int
        The budget in graph units (parsed).
    name : str
        A registered formulation.
    options : SolverOptions or None
        Options of ``name``'s type (:meth:`SolverOptions.from_options` converts others); None: from ``keywords``.
    **keywords : Any
        Without ``options``: the solver's options by name; None values mean the default.

    Returns
    -------
    SolveResult
        The solver's result.

    Raises
    ------
    CoopError
        When an option is one the solver does not take (and whatever the solver raises).
    """
    spec = registered(name)
    if options is None:
        options = spec.options.from_keywords(name, keywords)
    elif keywords:
        raise CoopError(f"run_solver: give {name!r} options=... or keywords, not both")
    return spec.run(graph, budget, options)


def choose_formulation(graph: Graph, budget: int, *, captured: Any = None) -> str:
    """The formulation ``auto`` runs first for this graph and budget.

    Parameters
    ----------
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
        small = len(graph.order) <= EXACT_MAX_NODES
        ladder = ["blocks"] if repeated_blocks(graph) and not small else []
        if small and graph.has_backward:
            ladder.append("checkmate")
        ladder.append("moccasin")
        if graph.has_impls:
            ladder.append("monet")
        if "checkmate" in ladder and _reordering_fits(graph, budget):
            ladder.remove("moccasin")
            ladder.insert(ladder.index("checkmate"), "moccasin")  # a free first candidate: no recomputation at all
    if device_profile is not None:
        ladder.append("poet")
    return ladder


@derived_from_graph
def repeated_blocks(graph: Graph) -> bool:
    """Whether the graph is a training step whose forward repeats blocks (where ``blocks`` and ``per-layer`` serve).

    Parameters
    ----------
    graph : Graph
        The graph (the answer is computed once per graph).

    Returns
    -------
    bool
        True when :func:`coop.formulations.blocks.repeated.find_block_groups` finds a group in its forward.
    """
    if not graph.has_backward:
        return False
    try:
        split = split_forward_backward(graph, "blocks")
    except CoopError:
        return False
    return bool(find_block_groups(graph, split.forward))


def _reordering_fits(graph: Graph, budget: int) -> bool:
    """Whether store-all in the deferred order (Moccasin's solving order) fits: reordering alone reaches the budget."""
    reordered, order = solving_graph(graph, "deferred")
    return order.startswith("deferred") and simulate(reordered, Schedule.from_order(reordered.order)).peak <= budget


@formulation("auto", options=AutoOptions, pages=lambda options: options.device_profile is not None)
def auto(graph: Graph, budget: int, options: AutoOptions) -> SolveResult:
    """Climb :func:`formulation_ladder` within ``time_limit`` seconds in all; return the cheapest fitting schedule.

    Each rung's options are derived from auto's (:meth:`SolverOptions.from_options`, then ``dataclasses.replace``
    with the rung's share of the time, auto's deadline and the hints so far).

    Parameters
    ----------
    budget : int
        The budget in graph units (parsed).
    options : AutoOptions
        ``time_limit``: seconds for the whole ladder, each rung getting its weight's part of what is left
        (:data:`RUNG_WEIGHTS`); ``deadline``: the ladder's, made by the entry, each rung's within it; ``threads``,
        ``captured`` and ``progress`` are passed to each rung (``progress`` also gets a milestone as the ladder
        starts and one per rung, :func:`report_rung`); ``hint``: a schedule or a list of schedules to warm-start
        the rungs with, before what earlier rungs found; ``device_profile``: given one, POET is the last rung.

    Returns
    -------
    SolveResult
        The cheapest fitting schedule found (ties: a rung's over the baseline's, then the earlier), with
        ``rungs`` listing every rung, ``extra["auto"]`` naming who found it and ``extra["auto_tried"]`` each
        rung's status; else a result with status "unknown", no schedule, and a message saying what to try. A rung
        that raises a CoopError counts as "unknown".
    """
    deadline, hint, device_profile = options.deadline, options.hint, options.device_profile
    ladder = formulation_ladder(graph, budget, device_profile)
    clock = ProgressClock(options.progress, deadline)
    clock.report(message=f"auto: trying {', '.join(ladder)} within {deadline.limit:g} s", milestone=True)
    found: list[SolveResult] = []
    rungs: list[Rung] = []
    hints = [] if hint is None else list(hint) if isinstance(hint, (list, tuple)) else [hint]
    # on a large graph checkpoint-all's schedule (O(n^2) steps) is built after the ladder, where no rung found one
    large = len(graph.order) > EXACT_MAX_NODES
    baseline, no_baseline = _fitting_baseline(graph, budget, "blocks" in ladder, costly=not large) if ladder != [
        "store-all"] else (None, "")
    if baseline is not None:  # a candidate and a warm start for every rung: auto never loses to a baseline
        found.append(baseline)
        rungs.append(Rung(baseline.formulation, "heuristic", baseline.wall_s, 0.0, baseline.simulation.overhead,
                          "the cheapest baseline that fits"))
        report_rung(clock, rungs[-1], found)
    if baseline is None and ladder != ["store-all"] and graph.has_backward and len(graph.order) <= NEAR_FLOOR_MAX_NODES:
        near = _near_floor(graph, budget, deadline)
        if near is not None:  # a candidate and every rung's warm start: Moccasin improves on it within the budget
            found.append(near)
            rungs.append(Rung(near.formulation, "heuristic", near.wall_s, 0.0, near.simulation.overhead,
                              "checkpoint-all with outputs computed last (no baseline fits)"))
            report_rung(clock, rungs[-1], found)
    # where checkpoint-all may be built after the ladder, its share of the limit is kept for it (not where it refuses
    # the graph: a graph without a backward part, e.g. the published random layered ones, gives the rungs every second)
    costly_after = not found and large and ladder != ["store-all"] and graph.has_backward
    reserve = COSTLY_RESERVE * deadline.limit if costly_after else 0.0
    for index, name in enumerate(ladder):
        skip = _skip_reason(graph, name, found, rungs)
        remaining = max(deadline.remaining() - reserve, 0.0)
        if not skip and remaining < MIN_RUNG_SECONDS and any(r is not baseline for r in found):
            skip = "time limit reached"
        if skip:
            rungs.append(Rung(name, f"skipped: {skip}"))
            report_rung(clock, rungs[-1], found)
            continue
        weights = [RUNG_WEIGHTS.get(later, 1.0) for later in ladder[index:]]
        share = max(remaining * weights[0] / sum(weights), min(MIN_RUNG_SECONDS, remaining), 1e-3)
        rung_options = dataclasses.replace(registered(name).options.from_options(options), time_limit=share,
                                           deadline=deadline, hint=[*hints, *_warm_starts(found)] or None)
        started = deadline.elapsed()
        try:
            result = run_solver(graph, budget, name, rung_options)
        except CoopError as exc:
            result = SolveResult(formulation=name, status="unknown", message=str(exc))
        fits = _fits(budget, result)
        status = result.status if fits or result.schedule is None else f"{result.status}, over budget"
        rungs.append(Rung(name, status, deadline.elapsed() - started, share,
                          result.simulation.overhead if fits else None, result.message))
        if fits:
            found.append(result)
        report_rung(clock, rungs[-1], found)
        if fits and result.simulation.cost <= graph.baseline_cost:  # no recomputation: nothing is cheaper
            break
    if costly_after and not found and deadline.remaining() <= 0:
        rungs.append(Rung("checkpoint-all", "skipped: time limit reached (built after the ladder where no rung "
                          "found a schedule; a longer time_limit leaves it time)"))
        report_rung(clock, rungs[-1], found)
    elif costly_after and not found:
        baseline = _costly_baseline(graph, budget)
        if baseline is not None:
            found.append(baseline)
            rungs.append(Rung(baseline.formulation, "heuristic", baseline.wall_s, 0.0, baseline.simulation.overhead,
                              "the cheapest baseline that fits (built after the ladder: no rung found a schedule)"))
            report_rung(clock, rungs[-1], found)
    summary = "; ".join(rung.line() for rung in rungs)
    tried = {rung.formulation: rung.status for rung in rungs}
    if found:
        # the cheapest; of equal costs a rung's result (it carries a bound and a status), then the earlier one
        best = min(found, key=lambda r: (r.simulation.cost, r is baseline))
        best.extra["auto"] = best.formulation
        best.extra["auto_tried"] = tried
        best.rungs = rungs
        best.message = f"auto chose {best.formulation} ({summary})" + (f": {best.message}" if best.message else "")
        best.wall_s = deadline.elapsed()
        if best is baseline:
            best.fallback = _fallback_words(rungs, deadline, baseline.formulation)
        return best
    return SolveResult(
        formulation="auto",
        status="unknown",
        wall_s=deadline.elapsed(),
        extra={"auto_tried": tried},
        rungs=rungs,
        message=(f"no schedule found within {deadline.limit:g} s ({summary}); {no_baseline}; min_budget is "
                 f"{format_memory(min_budget(graph), graph)}: try a longer time_limit, a larger budget"
                 + ("" if graph.has_impls else ", alternatives=True with formulation='monet'")
                 + ("" if device_profile is not None else ", or a device_profile to let poet page")),
    )


def report_rung(clock: ProgressClock, rung: Rung, found: list[SolveResult]) -> None:
    """Report a rung that just ended as a milestone: ``"auto rung <Rung.line()>; best overhead so far 1.23 %"``
    (``"none yet"`` before any schedule fits), stamped on ``clock``.

    Parameters
    ----------
    clock : ProgressClock
        Auto's progress callback (none: nothing is reported) on auto's deadline.
    found : list of SolveResult
        The fitting results so far, this rung's included.
    """
    best = min((result.simulation.overhead for result in found if result.simulation is not None), default=None)
    so_far = "none yet" if best is None else f"{100 * best:.2f} %"
    clock.report(message=f"auto rung {rung.line()}; best overhead so far {so_far}", milestone=True)


def _fallback_words(rungs: list[Rung], deadline: Deadline, name: str) -> str:
    """Why a baseline is all auto returns, and what time would let a solver run ('' when a solver ran to its end
    and found nothing cheaper: then the baseline is no last resort)."""
    solvers = [rung for rung in rungs if rung.status != "heuristic"]
    if any(rung.status in ("optimal", "infeasible") for rung in solvers):
        return ""
    suggest = max(2 * deadline.limit, MIN_RUNG_SECONDS * 10 * max(1, len(solvers)))
    suggest = 10 * math.ceil(suggest / 10)
    ran = "; ".join(rung.line() for rung in solvers) or "no solver rung"
    return (f"no solver found a schedule cheaper than the baseline within {deadline.limit:g} s ({ran}): the "
            f"{name} schedule is a last resort; a time_limit of {suggest:g} s or more would let the "
            "solvers search")


def _fitting_baseline(graph: Graph, budget: int, per_layer: bool = False,
                      costly: bool = True) -> tuple[SolveResult | None, str]:
    """The cheapest baseline schedule that fits (no solver time; per-layer too on repeated blocks), or None and why
    none does; without ``costly``, checkpoint-all is not tried on a graph above ``EXACT_MAX_NODES``."""
    try:
        return cheapest_fitting_baseline(graph, budget, extra=("per-layer",) if per_layer else (),
                                         costly_last=len(graph.order) > EXACT_MAX_NODES, costly=costly), ""
    except InfeasibleError as exc:
        return None, str(exc)


#: Where no baseline fits, auto constructs a schedule near the floor (:mod:`coop.formulations.heuristics.late_outputs`)
#: on graphs of up to this many nodes: it builds checkpoint-all's schedule (O(n^2) steps) at most twice. ResNet's
#: compiled step at 0.7 (278 nodes, issue 41): 0.8-5.9 s (loaded machine), peak 2,246,200 B within 2,246,305 B (its
#: floor 2,240,168 B), where every baseline held 2,252,468 B or more and Moccasin alone found nothing in 26.6 s;
#: Moccasin hinted with it returned 63 % overhead within auto's 30 s.
NEAR_FLOOR_MAX_NODES = 600
#: The share of auto's time the near-floor construction may take (each output it moves is one more simulation of an
#: O(n^2)-step schedule): where it cannot fit, the rungs keep the rest.
NEAR_FLOOR_SHARE = 0.25


def _near_floor(graph: Graph, budget: int, deadline: Deadline) -> SolveResult | None:
    """:func:`~coop.formulations.heuristics.late_outputs.near_floor_schedule`'s schedule (within
    :data:`NEAR_FLOOR_SHARE` of what is left of ``deadline``) as a heuristic result named ``"late-outputs"`` where it
    validates within ``budget``, else None."""
    started = time.perf_counter()
    found = near_floor_schedule(graph, budget, deadline.share(NEAR_FLOOR_SHARE))
    if found is None or not validate(graph, found[0], budget).ok:
        return None
    return heuristic_result("late-outputs", graph, budget, found[0], started, simulation=found[1])


def _costly_baseline(graph: Graph, budget: int) -> SolveResult | None:
    """Checkpoint-all's result where its schedule validates within ``budget`` (the other baselines did not fit),
    else None."""
    try:
        result = run_solver(graph, budget, "checkpoint-all")
    except CoopError:
        return None
    fits = result.schedule is not None and validate(graph, result.schedule, budget).ok
    return result if fits else None


#: Fitting schedules auto keeps as candidates but does not hand its rungs as warm starts: checkpoint-all's (O(n^2)
#: steps, the costliest baseline, reached only where no other fits; each solver's own warm start tries it last). A
#: hint that fits ends a solver's warm-start collection at its share of the time: on DenseNet-121 (2,556 nodes) at
#: 0.6 of the peak, 30 s, Moccasin hinted with it started from 9,350 % and returned 4,441 % in 41 s of a 20 s
#: share, where Moccasin alone found 7.83 % (issue 40).
NOT_HINTED = ("checkpoint-all",)

#: The share of auto's limit its ladder leaves for checkpoint-all where that baseline is built after the ladder (a
#: large graph none of the other baselines fits): on EfficientNet-B0 (b8, 64 px) at 0.5 of the peak, with no
#: reserve, auto took 37.1 s of a 30 s limit building it after rungs that used the whole limit (issue 40).
#: On the published random_layered_n1000 at 0.8 and 5 s (no backward part: checkpoint-all refuses it), a reserve there
#: left Moccasin 4.4 s, where its warm starts found nothing under load and Moccasin alone found 2.725 %.
COSTLY_RESERVE = 0.1


def _warm_starts(found: list[SolveResult]) -> list[Schedule]:
    """The schedules found so far that the next rung starts from (all but :data:`NOT_HINTED`'s)."""
    return [result.schedule for result in found if result.formulation not in NOT_HINTED]


def _fits(budget: int, result: SolveResult) -> bool:
    return result.schedule is not None and result.simulation is not None and result.simulation.peak <= budget


def _skip_reason(graph: Graph, name: str, found: list[SolveResult], rungs: list[Rung]) -> str:
    """Why a rung cannot improve on what was found ('' when it may)."""
    if name == "poet" and found:
        return "a recomputation-only schedule fits (paging time is not compared on compute cost)"
    if (name == "moccasin" and any(r.formulation == "checkmate" and r.status == "optimal" for r in rungs)
            and graph.has_backward and solving_graph(graph, "auto")[1].startswith("captured")):
        return "Checkmate proved its optimum over the same space (first computations in the captured order)"
    return ""


def no_schedule_error(graph: Graph, budget: int, result: SolveResult, time_limit: float | None = None,
                      fits_at: int | None = None) -> CoopError:
    """The error to raise where ``result`` holds no schedule within ``budget``: the right type, in one line.

    An :class:`~coop.errors.InfeasibleError` only where the result is a proof (status "infeasible": min_budget, or
    a solver's proof over its whole space); otherwise a :class:`~coop.errors.SolveTimeoutError` saying "no
    schedule found within N s", the best peak reached, the smallest budget known to fit and what to try.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    result : SolveResult
        The formulation's result (no schedule within the budget).
    time_limit : float or None
        The seconds it had (None: its wall time).
    fits_at : int or None
        The least peak of a schedule known to exist (e.g. a baseline's), graph units; None: the least peak of the
        baselines, computed here.

    Returns
    -------
    CoopError
        InfeasibleError or SolveTimeoutError.
    """
    if result.status == "infeasible":
        return InfeasibleError(f"{result.formulation}: {result.message}")
    peak = baseline_peak(graph)
    reached = result.simulation.peak if result.simulation is not None else None
    if fits_at is None:
        fits_at = _least_baseline_peak(graph, budget)
    best = min((p for p in (reached, fits_at) if p is not None), default=None)
    seconds = time_limit if time_limit is not None else result.wall_s

    def words(value: int) -> str:
        return f"{format_memory(value, graph)} ({value / peak:.2f} of the peak)"

    parts = [(f"no schedule found within {seconds:g} s by {result.formulation} under the budget "
             f"{words(budget)}, and no proof that none exists")]
    if best is not None:
        parts.append(f"the best peak reached is {words(best)}")
    if fits_at is not None:
        parts.append(f"the smallest budget known to fit is {words(fits_at)}")
    tries = [f"a longer time_limit (e.g. {max(60.0, 4 * seconds):g} s)"]
    if result.formulation != "blocks" and repeated_blocks(graph):
        tries.append("formulation='blocks'")
    elif result.formulation != "moccasin":
        tries.append("formulation='moccasin'")
    if fits_at is not None:
        tries.append(f"a budget of {words(fits_at)}")
    return SolveTimeoutError("; ".join(parts) + "; try " + ", ".join(tries), best_peak=best, fits_at=fits_at)


def _least_baseline_peak(graph: Graph, budget: int) -> int | None:
    """The least validated peak of the baselines' schedules at ``budget`` (a budget known to fit), or None."""
    peaks = []
    for name in BASELINES:
        try:
            result = run_solver(graph, budget, name)
        except CoopError:
            continue
        if result.schedule is not None:
            check = validate(graph, result.schedule, None)
            if check.peak is not None:
                peaks.append(check.peak)
    return min(peaks, default=None)


def cheapest_fitting_baseline(graph: Graph, budget: int, *, failed: str | None = None,
                              result: SolveResult | None = None, time_limit: float | None = None,
                              extra: tuple[str, ...] = (), costly_last: bool = False,
                              costly: bool = True) -> SolveResult:
    """The baseline schedule of least cost whose validated peak fits ``budget`` (graph units).

    The one fallback for a formulation that found no schedule within the budget (``auto``, the
    planner) and for a step re-planned inside a training loop: baselines take no solver time.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    failed : str or None
        The formulation tried first, for the message.
    result : SolveResult or None
        That formulation's result, when there is one: where it proves nothing (a time-out), no baseline fitting
        raises :class:`~coop.errors.SolveTimeoutError` (:func:`no_schedule_error`), not InfeasibleError.
    time_limit : float or None
        The seconds ``result``'s formulation had, for that message.
    extra : tuple of str
        Further heuristics to try beside :data:`BASELINES` (``"per-layer"`` on repeated blocks).
    costly_last : bool
        Build checkpoint-all's schedule (O(n^2) steps: seconds on a graph of a thousand nodes, and the costliest
        baseline) only where no other fits.
    costly : bool
        With ``costly_last``: False never builds checkpoint-all's schedule (auto builds it after its ladder, where
        no rung found a schedule: on DenseNet-121, 2,556 nodes, building and checking it took 10-24 s of a 30 s
        limit before any solver ran, issue 40).

    Returns
    -------
    SolveResult
        The result of the cheapest of :data:`BASELINES` (and ``extra``) whose schedule validates within ``budget``.

    Raises
    ------
    InfeasibleError
        When no baseline fits (and ``result`` is None or a proof), naming ``failed``, the best peak any baseline
        reached and the baselines' errors.
    SolveTimeoutError
        When no baseline fits and ``result`` proves nothing.
    """
    best: SolveResult | None = None
    best_cost = 0.0
    best_peak: int | None = None
    errors: list[str] = []
    names = [name for name in (*BASELINES, *extra) if not (costly_last and name == "checkpoint-all")]
    for name in names + (["checkpoint-all"] if costly_last and costly else []):
        if costly_last and name == "checkpoint-all" and best is not None:
            break
        try:
            candidate = run_solver(graph, budget, name)
        except CoopError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if candidate.schedule is None:
            continue
        check = validate(graph, candidate.schedule, budget)
        if check.peak is not None:
            best_peak = check.peak if best_peak is None else min(best_peak, check.peak)
        if check.ok and check.cost is not None and (best is None or check.cost < best_cost):
            best, best_cost = candidate, check.cost
    if best is None and result is not None and result.status != "infeasible":
        raise no_schedule_error(graph, budget, result, time_limit, fits_at=best_peak)
    if best is None:
        what = f"{failed} and the baselines" if failed else "the baselines"
        reached = f"; the best peak reached is {format_memory(best_peak, graph)}" if best_peak else ""
        failures = "".join(f"; {error}" for error in errors)
        raise InfeasibleError(f"no schedule within budget {format_memory(budget, graph)} found by {what}{reached}"
                              f"{failures}; raise the budget, give the solver more time or choose another formulation")
    return best
