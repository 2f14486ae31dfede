"""Moccasin: rematerialization with retention intervals and CP-SAT.

Implements the constraint model of Bartan, Li, Teague, Feng, Jain and Taylor, "Moccasin:
Efficient Tensor Rematerialization for Neural Networks", ICML 2023 (arXiv 2304.14463):

* every computed node v owns up to C retention intervals ``[s_vi, e_vi]`` on a time axis of
  compute events (one compute per slot); the first interval is always present, the others are
  optional (presence literal ``p_vi``); a non-recomputable node has exactly one;
* precedence: every present interval of a consumer v starts inside some present interval of each
  input u (``s_uj < s_vi <= e_uj``), so u is resident while v is computed;
* memory: one ``AddCumulative`` over the retention intervals with demand ``mem_v`` (plus the
  node's workspace on its unit compute interval) and capacity = budget - caller-owned bytes;
* objective: the total duration, ``sum_vi cost_v * p_vi``. O(n C) integer variables.

:func:`coop.formulations.moccasin.interval_model.build_model` creates them in that order on the shared substrate of
:mod:`coop.formulations.intervals.model` (the interval variables, precedence, first-computation order,
hints and solution to schedule, shared with MONeT's and POET's interval models).

Beyond the paper (on current OR-Tools the published model alone may find no feasible schedule
for large graphs within a practical time limit; BENCHMARKS.md records the measurements), this module

* starts from the best warm start of :mod:`coop.formulations.heuristics.warm_start` (Checkmate's LP
  rounding on small graphs, the heuristics, the baselines, the online policies' schedules and any
  ``hint`` s) and passes it to CP-SAT as a hint; on large graphs the destroy-and-repair local
  search of :mod:`coop.formulations.heuristics.fast_schedules` improves it before CP-SAT runs;
* keeps the first computations in the baseline order (``prompt_order(graph)``: extra outputs right
  after their op, the same memory) on training-step graphs (``keep_order``, the restriction
  Checkmate makes), which removes most of the symmetry of the time axis, and tightens each first
  start by the node's ancestor and descendant counts; on graphs without a backward part (the
  random layered graphs) the order is left free (the paper's published runs pin every first
  computation at its Checkmate stage, ``use_stage=True`` in its repository; freeing it finds
  reorderings that need no recomputation at all);
* sizes the model in one of two ways. A *proof model* gets, per node, as many intervals as
  :func:`sufficient_intervals` shows a schedule at least as good as the incumbent can need, and
  the horizon :func:`sufficient_horizon`: it contains (a schedule as good as) every schedule that
  beats the incumbent, so CP-SAT's OPTIMAL there is a proof and its bound a valid bound. Where
  that model would be too large, a *restricted model* gets C intervals per node (more where the
  warm start needs them) on the warm start's slots plus a slack: its optimum is only optimal
  within the restriction and is reported as ``feasible`` with ``extra["restricted_bound"]``.
  When a restricted solve finishes and the cheaper incumbent makes a proof model small enough,
  a second round solves that;
* when no warm start fits, first asks CP-SAT whether anything of the space fits at all, in a
  time-indexed model with the hard capacity and no objective (:func:`build_feasibility_model`:
  one compute per slot, residency per slot, the :func:`sufficient_intervals` and
  :func:`sufficient_horizon` of any cost). That model contains every schedule of the space, so
  its INFEASIBLE is a proof ("infeasible"), and it tends to come much sooner than one from the
  capacity-relaxed interval model (minimise overflow), which may never prove it just below the
  least peak. A solution becomes the incumbent; an open answer leaves the rest of the time to the
  relaxed model as before.

The solution becomes a coop Schedule (computes at interval starts in time order, frees at interval
ends) that is always checked with the one simulator, :func:`coop.schedule.simulate`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from coop.budget import baseline_peak
from coop.errors import CoopError
from coop.formulations.core.deadline import Deadline, cp_sat_solver
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import MoccasinOptions
from coop.formulations.core.progress import ProgressClock
from coop.formulations.core.result import SolveResult
from coop.formulations.core.solving_order import check_order, solving_graph
from coop.formulations.heuristics.fast_schedules import improve_by_local_search
from coop.formulations.heuristics.warm_start import best_warm_start
from coop.formulations.intervals.feasibility import (
    FEASIBILITY_SHARE,
    CpSatParameters,
    FeasibilityCheck,
    check_feasibility,
    space_words,
)
from coop.formulations.intervals.model import (
    Interval,
    first_computations_in_order,
)
from coop.formulations.intervals.slots import SlotProblem, sufficient_horizon, sufficient_intervals
from coop.formulations.moccasin.interval_model import (
    add_hint,
    build_model,
    intervals_to_schedule,
    proof_model_affordable,
    schedule_intervals,
    solution_intervals,
)
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, simulate

FORMULATION = "moccasin"


class _ProgressReporter(cp_model.CpSolverSolutionCallback):
    """Forwards every incumbent and CP-SAT's best bound to coop's progress callback."""

    def __init__(self, clock: ProgressClock, to_cost: Callable[[float], float], overflow: Any) -> None:
        super().__init__()
        self.clock = clock
        self.to_cost = to_cost
        self.overflow = overflow
        self.solutions = 0

    def on_solution_callback(self) -> None:
        self.solutions += 1
        bound = self.to_cost(self.BestObjectiveBound())
        if self.overflow is not None and self.Value(self.overflow) > 0:
            self.clock.report(None, bound, f"moccasin: {self.Value(self.overflow)} over the budget")
        else:
            self.clock.report(self.to_cost(self.ObjectiveValue()), bound, "moccasin")


# ==================================================================== the feasibility question
def _feasibility_check(problem: SlotProblem, settings: _Settings, clock: ProgressClock
                       ) -> tuple[FeasibilityCheck, _Incumbent | None]:
    """Ask whether any schedule of the space fits before the capacity-relaxed model runs; a
    schedule found there becomes the incumbent (:func:`check_feasibility`)."""
    if not settings.prove:
        return FeasibilityCheck(reason="skipped: prove=False (no proof models)"), None
    check, schedule = check_feasibility(
        problem, keep_order=settings.keep_order, share_s=FEASIBILITY_SHARE * settings.deadline.limit,
        left_s=lambda: settings.deadline.remaining() - 0.5,
        parameters=CpSatParameters(settings.threads, settings.seed, settings.options))
    if schedule is not None:
        sim = simulate(problem.graph, schedule)
        if sim.peak <= problem.budget:
            clock.report(sim.cost, None, "moccasin: feasibility model")
            return check, _Incumbent("cp-sat-feasibility", schedule, sim)
    return check, None


def _infeasible_result(problem: SlotProblem, check: FeasibilityCheck, keep_order: bool, clock: ProgressClock,
                       order: str) -> SolveResult:
    budget = problem.budget
    least = ""
    if check.least_peak is not None:
        least = f" (least peak {check.least_peak})" if check.least_peak_exact else f" (least peak >= {check.least_peak})"
    order_words = "graph.order" if order.startswith("captured") else "the deferred order (coop.formulations.core.solving_order)"
    space = space_words(problem, keep_order, order_words)
    message = (f"{space} fits budget {budget}{least}: CP-SAT proved its feasibility model infeasible in "
               f"{check.wall_s:.2f} s; raise the budget")
    return SolveResult(FORMULATION, "infeasible", wall_s=clock.elapsed_s, message=message,
                       extra={"feasibility": check.__dict__, "proof_model": True, "cp_sat_status": check.status,
                              "order": order})


# ==================================================================== entry point
@dataclass
class _Incumbent:
    """The best schedule so far, where it came from, and the simulator's verdict on it."""

    source: str
    schedule: Schedule
    simulation: Simulation


@dataclass
class _Round:
    """One CP-SAT solve: the model's shape, whether it covers every better schedule, the outcome."""

    horizon: int
    intervals: int
    covers: bool  # contains a schedule at least as good as each one no worse than its hint
    relaxed: bool  # memory capacity relaxed: there was no schedule that fits to start from
    status: str = "UNKNOWN"
    bound: float | None = None  # CP-SAT's bound in true cost units (valid for this model)
    overflow: int = 0
    wall_s: float = 0.0
    not_run: str = ""  # why CP-SAT was not run: "size" (the model) or "time" (none left)
    build_s: float = 0.0  # the expected seconds to build the model (MODEL_BUILD_S_PER_INTERVAL)


def _check_moccasin_options(graph: Graph, budget: int, options: MoccasinOptions) -> None:
    """Moccasin's option checks, run first at every budget (one CoopError line each)."""
    if options.max_intervals < 1:
        raise CoopError(f"max_intervals={options.max_intervals} must be at least 1 (the paper's C)")
    check_order(options.order)


@formulation(FORMULATION, options=MoccasinOptions, store_all_is_optimal=True, check_options=_check_moccasin_options)
def moccasin(graph: Graph, budget: int, options: MoccasinOptions) -> SolveResult:
    """Solve rematerialization under ``budget`` with the Moccasin CP-SAT model.

    Parameters
    ----------
    graph : Graph
        The model works in the order of :func:`coop.formulations.core.solving_order.solving_graph` (see
        ``order``); below, ``graph`` is the graph in that order.
    budget : int
        Bytes, caller-owned values included.
    options : MoccasinOptions
        The options; their fields follow.
    time_limit : float
        Seconds for the whole solve.
    deadline : Deadline
        The solve's deadline, made from ``time_limit`` by the entry (:mod:`coop.formulations.core.deadline`): every
        stage (warm starts, local search, each CP-SAT round) gets what is left of it.
    threads, seed : int
        CP-SAT's workers and random seed.
    max_intervals : int
        The paper's C, the number of retention intervals a recomputable node gets in a restricted model
        (raised per node where the warm start needs more); with ``prove`` a proof model with what
        :func:`sufficient_intervals` says a proof needs replaces it when that model stays small (see the
        module docstring).
    hint : Schedule, SolveResult or a list of them, optional
        Schedules to start from (the cheapest that fits is used).
    progress : callable, optional
        Called with each incumbent and bound.
    keep_order : bool or None
        Keep first computations in the baseline order (Checkmate's restriction). None (default) keeps it
        on graphs of a training step (a backward part: the order is all but forced, a forward chain then
        its reverse, and fixing it removes the time axis' symmetry) and frees it elsewhere (on graphs
        without a backward part, such as the random layered graphs, the order itself is a large degree of
        freedom: a reordering may fit a budget with no recomputation at all, see BENCHMARKS.md).
    extra_slots : int or None
        How many compute slots beyond the warm start's a restricted model's horizon gets (default
        n // 5 + 2).
    prove : bool
        Build proof models (and ask the feasibility question) where they stay small.
    lp_warm_start : bool
        Add Checkmate's LP rounding to the warm starts on graphs of at most LP_WARM_START_MAX_NODES nodes.
    local_search : float or None
        The share of the time spent in :func:`improve_by_local_search` before CP-SAT (default 0.5 on
        graphs of at least LOCAL_SEARCH_MIN_NODES nodes, where CP-SAT alone rarely improves the warm start
        within a minute; else at most 0.25, ending early once LOCAL_SEARCH_SMALL_STALL repairs in a row
        found nothing cheaper).
    cp_sat_parameters : dict, optional
        CP-SAT parameters by name (e.g. ``{"log_search_progress": True}``).
    order : str
        "auto" (the default: ``graph.order``, or the deferred order where that lowers the store-all
        peak), "captured" or "deferred"; ``extra["order"]`` says which.

    Returns
    -------
    SolveResult
        What the statuses prove. ``optimal``: no legal schedule (contract 2) whose first computations
        follow ``prompt_order(graph)`` (so none following ``graph.order`` either: taking an extra output
        earlier never adds memory) costs less than the one returned. It is claimed only when CP-SAT
        proved its model optimal, the graph's costs are integers (the model's costs are then exact) and
        the model has at least :func:`sufficient_intervals` intervals per node and
        :func:`sufficient_horizon` slots for the returned cost, so that it contains a schedule at least
        as good as any schedule of lower cost. ``infeasible``: no such schedule fits (CP-SAT proved the
        feasibility model or a proof model infeasible, or the budget is below
        :func:`coop.budget.min_budget`); without ``keep_order`` the space is every order in which the
        random ops draw as captured. ``extra["feasibility"]`` says whether the feasibility question was
        asked (not when a warm start fits, nor with ``prove=False``, nor when the model would exceed
        ``slot_feasibility.FEASIBILITY_MAX_CELLS``) and what CP-SAT answered; it gets FEASIBILITY_SHARE
        of the time limit. ``feasible``: a schedule that fits; ``bound`` is then a valid lower bound on
        every such schedule's cost when the last model was large enough for the proof, else None, and
        the bound within the restricted model (at most C intervals per node, the given horizon) is
        ``extra["restricted_bound"]``.

    References
    ----------
    Bartan, Li, Teague, Feng, Jain and Taylor, "Moccasin: Efficient Tensor Rematerialization for Neural
    Networks", ICML 2023.
    """
    deadline, threads, seed, keep_order = options.deadline, options.threads, options.seed, options.keep_order
    clock = ProgressClock(options.progress, deadline)
    graph, order = solving_graph(graph, options.order)
    if budget >= baseline_peak(graph):
        return _store_all_result(graph, order, clock)
    problem = SlotProblem.build(graph, budget)
    lp_time = min(10.0, deadline.remaining() / 4) if options.lp_warm_start else 0.0
    warm = best_warm_start(graph, budget, options.hint, lp_time, deadline=deadline.share(WARM_START_SHARE), until=deadline)
    incumbent = _Incumbent(*warm) if warm is not None else None
    if keep_order is None:
        keep_order = graph.has_backward
    settings = _Settings(deadline, threads, seed, options.max_intervals, keep_order, options.extra_slots,
                         options.prove, dict(options.cp_sat_parameters or {}))
    incumbent = _improve_warm_start(incumbent, problem, settings, options.local_search, clock)
    check = None
    if incumbent is None:
        # Nothing fits yet: first ask whether anything of the space fits at all (a proof is often
        # quick where the capacity-relaxed model below would spend the whole limit).
        check, incumbent = _feasibility_check(problem, settings, clock)
        if check.status == "INFEASIBLE":
            return _infeasible_result(problem, check, keep_order, clock, order)
    incumbent, rounds = _solve_rounds(problem, incumbent, settings, clock)
    result = _result(problem, incumbent, warm, rounds, clock)
    result.extra["order"] = order
    if check is not None:
        result.extra["feasibility"] = check.__dict__
    return result


def _store_all_result(graph: Graph, order: str, clock: ProgressClock) -> SolveResult:
    """Store-all fits, and no schedule costs less than computing every node once: optimal."""
    schedule = Schedule.from_order(graph.order)
    sim = simulate(graph, schedule)
    return SolveResult(FORMULATION, "optimal", schedule, sim, sim.cost, graph.baseline_cost, clock.elapsed_s,
                       f"store-all in the {order.split(' ')[0]} order fits the budget",
                       {"warm_start": "store_all", "order": order})


def _improve_warm_start(incumbent: _Incumbent | None, problem: SlotProblem, settings: _Settings,
                        local_search: float | None, clock: ProgressClock) -> _Incumbent | None:
    """The warm start reported, then improved by the local search for its share of the time (see ``local_search``
    of :func:`moccasin`); sets ``settings.cp_sat_worth``. None (no warm start fits): None."""
    if incumbent is None:
        return None
    clock.report(incumbent.simulation.cost, None, f"warm start {incumbent.source}")
    large = len(problem.order) >= LOCAL_SEARCH_MIN_NODES
    share = local_search if local_search is not None else (0.5 if large else 0.25)
    # CP-SAT's model takes seconds to build (it cannot be stopped): the local search leaves that time, and
    # takes all of it where CP-SAT would get less time to search than to build its model.
    build_s = _build_seconds(problem, incumbent, settings)
    left = settings.deadline.remaining()
    settings.cp_sat_worth = left >= 2 * build_s + 1.0
    seconds = share * (left - build_s) if settings.cp_sat_worth else left
    if share > 0 or not settings.cp_sat_worth:
        # Small graphs: stop once repairs keep failing, CP-SAT then gets the rest of the time.
        stall = None if large or not settings.cp_sat_worth else LOCAL_SEARCH_SMALL_STALL
        incumbent = _locally_improved(incumbent, problem, max(0.0, seconds), settings.seed, clock, stall)
    return incumbent


def _solve_rounds(problem: SlotProblem, incumbent: _Incumbent | None, settings: _Settings, clock: ProgressClock
                  ) -> tuple[_Incumbent | None, list[_Round]]:
    """CP-SAT rounds until another is not worth it (:func:`_worth_another_round`): the incumbent and every round."""
    rounds: list[_Round] = []
    while True:  # at least one round, so that every result says what CP-SAT did
        round_, found = _solve_round(problem, incumbent, settings, clock)
        rounds.append(round_)
        if found is not None:
            incumbent = found
        if not _worth_another_round(problem, incumbent, round_, settings, clock):
            break
    return incumbent, rounds


#: Above this many retention intervals the CP-SAT model is not built (see :func:`_solve_round`).
MODEL_MAX_INTERVALS = 20_000

#: The share of the time limit the warm starts may take before the slower ones (checkpoint-all's O(n^2)
#: schedule) are skipped, once one fits (:func:`coop.formulations.heuristics.warm_start.best_warm_start`).
WARM_START_SHARE = 0.2
#: From this many computed nodes on, part of the time goes to the local search before CP-SAT.
LOCAL_SEARCH_MIN_NODES = 200
#: Seconds to build and hint the CP-SAT model, per retention interval: 4.7 s for 1,213 intervals (captured
#: ResNet-50 at 0.8) and 8.8 s for 2,001 (random layered n1000 at 0.9), measured with 11 processes on 2 cores. A
#: round is not started when less time is left than this (it cannot be stopped once begun).
MODEL_BUILD_S_PER_INTERVAL = 4e-3


def _build_seconds(problem: SlotProblem, incumbent: _Incumbent | None, settings: _Settings) -> float:
    """The seconds building and hinting the model around ``incumbent`` is expected to take."""
    return MODEL_BUILD_S_PER_INTERVAL * sum(_model_shape(problem, incumbent, settings)[1].values())


#: On smaller graphs the local search stops after this many repairs in a row that found nothing cheaper.
LOCAL_SEARCH_SMALL_STALL = 300


def _locally_improved(incumbent: _Incumbent, problem: SlotProblem, seconds: float, seed: int,
                      clock: ProgressClock, max_stall: int | None) -> _Incumbent:
    schedule = improve_by_local_search(problem.graph, problem.budget, incumbent.schedule, seconds, seed, max_stall)
    sim = simulate(problem.graph, schedule)
    if sim.peak <= problem.budget and sim.cost < incumbent.simulation.cost:
        clock.report(sim.cost, None, "local search")
        return _Incumbent("local-search", schedule, sim)
    return incumbent


@dataclass
class _Settings:
    deadline: Deadline
    threads: int
    seed: int
    max_intervals: int
    keep_order: bool
    extra_slots: int | None
    prove: bool
    options: dict[str, Any]
    cp_sat_worth: bool = True  # False: too little time to build the model and search, the local search took it


def _model_shape(problem: SlotProblem, incumbent: _Incumbent | None, settings: _Settings
                 ) -> tuple[dict[int, list[Interval]], dict[int, int], int, bool]:
    """The start intervals, intervals per node, horizon, and whether the model covers every
    schedule at least as good as the incumbent (every schedule at all when there is none)."""
    graph = problem.graph
    start = incumbent.schedule if incumbent is not None else Schedule.from_order(graph.order)
    intervals, slots = schedule_intervals(graph, start)
    extra = incumbent.simulation.cost - graph.baseline_cost if incumbent is not None else None
    # Never more intervals than a better schedule can use: a node whose recomputation costs more
    # than the incumbent's extra cost is computed once in every better schedule.
    limits = sufficient_intervals(problem, extra)
    least = {v: max(len(intervals[v]), min(settings.max_intervals if problem.recomputable[v] else 1, limits[v]))
             for v in problem.order}
    if settings.prove:
        needed = sufficient_horizon(problem, limits, extra)
        # The proof model needs no more than the limits (and the warm start's intervals), even
        # when the caller's C is larger: it already contains every better schedule.
        exact = {v: max(len(intervals[v]), limits[v]) for v in problem.order}
        horizon = max(slots, needed)
        if proof_model_affordable(problem, exact, horizon):
            return intervals, exact, horizon, True
    slack = settings.extra_slots if settings.extra_slots is not None else len(problem.order) // 5 + 2
    return intervals, least, slots + slack, False


def _solve_round(problem: SlotProblem, incumbent: _Incumbent | None, settings: _Settings, clock: ProgressClock
                 ) -> tuple[_Round, _Incumbent | None]:
    """Build the model around the incumbent, hint it, solve for the remaining time."""
    graph = problem.graph
    intervals, per_node, horizon, covers = _model_shape(problem, incumbent, settings)
    too_large = sum(per_node.values()) > MODEL_MAX_INTERVALS
    build_s = MODEL_BUILD_S_PER_INTERVAL * sum(per_node.values())
    if too_large or not settings.cp_sat_worth or settings.deadline.remaining() < build_s + 0.2:
        # Building and hinting a model this large (a warm start with tens of thousands of
        # recomputations) would take longer than the time limit allows: CP-SAT is not run.
        return _Round(horizon=horizon, intervals=sum(per_node.values()), covers=covers, relaxed=incumbent is None,
                      status="NOT_RUN", not_run="size" if too_large else "time", build_s=build_s), None
    keep_order = settings.keep_order and first_computations_in_order(intervals, problem.order)
    built = build_model(problem, horizon, per_node, keep_order, relax_memory=incumbent is None)
    add_hint(built, intervals, problem.outputs)
    round_ = _Round(horizon=horizon, intervals=sum(per_node.values()), covers=covers, relaxed=incumbent is None)
    # Without the order constraints, presolve probing alone took two passes of ~9 s on random layered n250 (2
    # workers) and often left CP-SAT no time to search: with probing off it found a reordering at 0.0 % TDI at 0.9
    # x the baseline peak and proved it in 19 s. CP-SAT gets what is left less a reserve (it stops a little after
    # its limit, and the schedule is then rebuilt and simulated).
    parameters = settings.options if keep_order else {"cp_model_probing_level": 0, **settings.options}
    solver = cp_sat_solver(settings.deadline, settings.threads, seed=settings.seed, parameters=parameters)
    base_cost = sum(graph.node(v).cost for v in problem.order)
    reporter = _ProgressReporter(clock, lambda extra: base_cost + extra / problem.cost_scale, built.overflow)
    started = time.perf_counter()
    status = solver.Solve(built.model, reporter)
    round_.wall_s = time.perf_counter() - started
    round_.status = solver.StatusName(status)
    solved = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if solved:
        # Floored costs: the model's extra cost never exceeds the true one, so this bound is valid.
        extra_bound = solver.BestObjectiveBound()
        if built.overflow is None:
            round_.bound = base_cost + extra_bound / problem.cost_scale
    if not solved:
        return round_, None
    round_.overflow = solver.Value(built.overflow) if built.overflow is not None else 0
    if round_.overflow > 0:
        return round_, None
    schedule = intervals_to_schedule(problem, solution_intervals(solver, built))
    sim = simulate(graph, schedule)
    if sim.peak > problem.budget:  # never hand out a schedule the simulator rejects
        raise AssertionError(f"moccasin schedule peaks at {sim.peak} > budget {problem.budget}")
    if incumbent is not None and incumbent.simulation.cost <= sim.cost:
        return round_, None
    return round_, _Incumbent("cp-sat", schedule, sim)


def _worth_another_round(problem: SlotProblem, incumbent: _Incumbent | None, last: _Round, settings: _Settings,
                         clock: ProgressClock) -> bool:
    """Another solve helps when a relaxed model just found the first schedule that fits, or when
    a restricted model was solved to the end and a model that can prove the result is now small
    enough (the incumbent got cheaper, so fewer intervals suffice)."""
    if settings.deadline.remaining() <= 0.5 or incumbent is None or _proven(problem, last):
        return False
    if last.relaxed:
        return True
    if last.covers or last.status not in ("OPTIMAL", "INFEASIBLE"):
        return False
    return _model_shape(problem, incumbent, settings)[3]


def _fallback_words(last: _Round, source: str, elapsed: float) -> str:
    """Why the result is only a warm start (CP-SAT never ran) and what would let CP-SAT run."""
    if last.not_run == "size":
        return (f"CP-SAT not run (a model of {last.intervals} intervals, above {MODEL_MAX_INTERVALS}): the schedule "
                f"is the {source} warm start, a last resort that no time limit improves here; try formulation='blocks' "
                "on a step with repeated layers")
    suggest = 10 * math.ceil(max(10.0, 2 * elapsed + 3 * last.build_s + 5) / 10)
    return (f"CP-SAT not run: the warm starts and the model ({last.intervals} intervals, about {last.build_s:.0f} s "
            f"to build) needed more than the time ({elapsed:.1f} s); the schedule is the {source} warm start, a last "
            f"resort: a time_limit of {suggest:g} s or more would let CP-SAT search")


def _proven(problem: SlotProblem, last: _Round) -> bool:
    """An optimal solve of a model covering every schedule at least as good, with exact costs."""
    return (last.status == "OPTIMAL" and last.covers and not last.relaxed and last.overflow == 0
            and problem.cost_scale == 1.0)


def _result(problem: SlotProblem, incumbent: _Incumbent | None, warm: tuple[str, Schedule, Simulation] | None,
            rounds: list[_Round], clock: ProgressClock) -> SolveResult:
    budget, last = problem.budget, rounds[-1]
    extra: dict[str, Any] = {
        "horizon": last.horizon,
        "intervals": last.intervals,
        "rounds": [r.__dict__ for r in rounds],
        "warm_start": warm[0] if warm else None,
        "warm_start_cost": warm[2].cost if warm else None,
        "solver_wall_s": sum(r.wall_s for r in rounds),
        "cp_sat_status": last.status,
        "proof_model": last.covers,
        "restricted_bound": None if last.covers else last.bound,
        "overflow": last.overflow,
    }
    if incumbent is not None:
        sim = incumbent.simulation
        proven = _proven(problem, last)
        bound = last.bound if last.covers and last.bound is not None else None
        if proven:
            bound = sim.cost  # the model's optimum is the returned schedule's cost (exact costs)
        elif bound is not None:
            bound = min(bound, sim.cost)
        label = "optimal" if proven else "feasible"
        if proven:
            message = "CP-SAT OPTIMAL on a model that contains every schedule at least as good"
        elif last.status == "NOT_RUN" and last.not_run == "time":
            message = (f"CP-SAT not run: its model ({last.intervals} intervals, about {last.build_s:.0f} s to build) "
                       f"would not have been built and searched in the time left")
        elif last.status == "NOT_RUN":
            message = (f"CP-SAT not run: a model of {last.intervals} intervals (above {MODEL_MAX_INTERVALS}) would "
                       "not be built and solved within the time limit")
        elif last.covers:
            message = f"CP-SAT {last.status} (stopped at the time limit)"
        else:
            message = (f"CP-SAT {last.status} within at most {last.intervals} intervals on {last.horizon} slots; "
                       "optimality not proven for the unrestricted problem")
        if incumbent.source != "cp-sat":
            message += f"; the best schedule comes from {incumbent.source}"
        clock.report(sim.cost, bound, "done", final=True)
        result = SolveResult(FORMULATION, label, incumbent.schedule, sim, sim.cost, bound, clock.elapsed_s, message,
                             extra)
        if all(r.status == "NOT_RUN" for r in rounds):
            result.fallback = _fallback_words(last, incumbent.source, clock.elapsed_s)
        return result
    no_schedule = last.status == "INFEASIBLE" or (last.status == "OPTIMAL" and last.overflow > 0)
    if no_schedule and last.covers:
        least = f" (least peak {budget + last.overflow})" if last.overflow else ""
        message = (f"no schedule whose first computations follow the baseline order fits budget {budget}{least}; "
                   "raise the budget")
        return SolveResult(FORMULATION, "infeasible", wall_s=clock.elapsed_s, message=message, extra=extra)
    if no_schedule:
        message = (f"no schedule fits budget {budget} with at most {last.intervals} intervals on {last.horizon} "
                   f"compute slots (least peak {budget + last.overflow}); raise max_intervals or the budget")
        return SolveResult(FORMULATION, "unknown", wall_s=clock.elapsed_s, message=message, extra=extra)
    best = f" (best peak reached {budget + last.overflow})" if last.overflow else ""
    return SolveResult(FORMULATION, "unknown", wall_s=clock.elapsed_s, extra=extra,
                       message=f"CP-SAT found no schedule within the budget {budget} in {clock.elapsed_s:.0f} s{best}")
