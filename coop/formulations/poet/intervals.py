"""POET's recomputation and paging on large graphs, as a Moccasin-style interval model in CP-SAT.

POET (Patil, Jain, Dutta, Stoica, Gonzalez, "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022) solves a T x T MILP (:mod:`coop.formulations.poet.milp`)
that is not built above ``max_nodes`` computed nodes. This module carries POET's choices over to
Moccasin's O(n) retention-interval model (Bartan et al., ICML 2023; :mod:`coop.formulations.moccasin.intervals`),
with the same prices (:func:`coop.formulations.poet.setting.node_price`) and the same simulator:

* every computed value v has up to C device-residency intervals ``[s_vi, e_vi]`` on a slot axis
  (one compute per slot); the first is present and starts with a compute, the others are optional
  (``p_vi``) and each starts either with a compute (``c_vi``, a recomputation) or with a page-in
  (``g_vi``), ``c_vi + g_vi = p_vi``; a value that is not recomputable gets page-in intervals only, and
  a value that is not pageable (:meth:`coop.graph.Graph.pageable`: a host value of a CUDA step) none;
* a page-in interval needs a host copy: contract 2's ``page_out`` moves a value off the device at
  once and a ``page_in`` moves it back (the host copy does not persist), so the copy is made by a
  page-out right after the previous interval ``i - 1`` of the same value ends; a page-in interval
  pays both copies, ``pageout_v + pagein_v``. Page-ins of a slot run before its compute and count
  from that slot on; page-outs and frees run after the compute of the slot where an interval ends;
* a compute interval of v starts inside a present interval of each input u: ``s_uj + 1 - g_uj <=
  s_vi <= e_uj`` (a value paged in at slot s can be read at slot s; a computed one from the next);
* memory: one ``AddCumulative`` over the residency intervals (demand ``mem_v``) and each compute's
  workspace, capacity = budget - caller-owned bytes (caller-owned values stay on the device, as in
  poet's MILP); an extra output of a multi-output op counts from right after its op's first compute,
  as Moccasin has it, is never recomputed, and may be paged like any computed value;
* objective: POET's energy or time, ``sum c_vi compute_v + sum g_vi (pagein_v + pageout_v)`` beyond
  the first computations, as integers (prices scaled to OBJECTIVE_RESOLUTION and floored, so the
  model never overstates a schedule's price); ``runtime_budget`` bounds compute plus paging seconds.
* first computations follow ``prompt_order(graph)`` on training-step graphs, as in Moccasin.

The model is restricted (C intervals per value, the warm start's slots plus a slack), so its optimum
proves nothing about the whole space: the result is ``feasible`` with poet's baseline-price bound,
which every schedule pays, never ``optimal``. CP-SAT is hinted with poet's best warm start, and the
cheaper of its schedule and the warm start is returned; every schedule is checked by
:func:`coop.schedule.simulate` and by poet's admission test (budget, runtime budget, allowed kind).
Where no warm start fits, a capacity-relaxed copy of the model (minimise the bytes over the budget,
from the baseline order) first looks for a schedule that fits, as Moccasin does.
"""

from __future__ import annotations

import time
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.core.deadline import Deadline, cp_sat_seconds, cp_sat_solver
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import PoetIntervalsOptions
from coop.formulations.core.progress import ProgressCallback, ProgressClock
from coop.formulations.core.result import SolveResult
from coop.formulations.intervals.model import (
    first_computations_in_order,
)
from coop.formulations.intervals.slots import SlotProblem
from coop.formulations.poet.interval_model import (
    Coefficients,
    PoetIntervalModel,
    Span,
    add_hint,
    build_model,
    may_page,
    schedule_spans,
    solution_spans,
    spans_to_schedule,
)
from coop.formulations.poet.setting import (
    PoetError,
    at_least_baseline,
    best_fallback,
    check_poet_options,
    poet_setting,
    priced_result,
)
from coop.graph import Graph
from coop.schedule import Schedule, ScheduleError

#: Residency intervals per value (Moccasin's C) unless the warm start needs more.
DEFAULT_MAX_INTERVALS = PoetIntervalsOptions.max_intervals
#: Seconds to build and hint the model, per retention interval (as Moccasin's model,
#: :data:`coop.formulations.moccasin.intervals.MODEL_BUILD_S_PER_INTERVAL`, measured on 2 busy cores).
MODEL_BUILD_S_PER_INTERVAL = 4e-3

# ==================================================================== solving
def _check_interval_options(graph: Graph, budget: int, options: PoetIntervalsOptions) -> None:
    """poet's option checks and Moccasin's C, run first at every budget."""
    check_poet_options(graph, budget, options)
    max_intervals = options.max_intervals
    if isinstance(max_intervals, bool) or not isinstance(max_intervals, int) or max_intervals < 1:
        raise PoetError(f"max_intervals={max_intervals!r} must be an integer >= 1 (Moccasin's C)")


@formulation("poet", options=PoetIntervalsOptions, check_options=_check_interval_options,
             pages=lambda options: options.paging)
def poet_intervals(graph: Graph, budget: int, options: PoetIntervalsOptions) -> SolveResult:
    """POET's choices in the interval model on any graph.

    What :func:`coop.formulations.poet.milp.poet` runs above its ``max_nodes``.

    Parameters
    ----------
    graph : Graph
        The training step.
    budget : int
        The device memory budget in the graph's units, caller-owned values included.
    options : PoetIntervalsOptions
        The options; their fields follow.
    objective, device_profile, runtime_budget, remat, paging
        As :func:`coop.formulations.poet.milp.poet` takes them (checked by
        :func:`coop.formulations.poet.setting.poet_setting`).
    time_limit : float
        The wall-clock limit in seconds, warm starts included.
    threads : int
        CP-SAT's worker threads.
    hint : Any
        Schedules (or results) that compete as warm starts.
    max_intervals : int
        Moccasin's C: the intervals per value (at least 1).
    warm_start : bool
        False leaves out poet's warm starts (CP-SAT then starts from the baseline order, which may
        not fit).

    Returns
    -------
    SolveResult
        As :func:`solve_intervals` returns.

    Raises
    ------
    PoetError
        When an option is refused (:func:`coop.formulations.poet.setting.poet_setting`) or
        ``max_intervals`` is not an integer >= 1.

    References
    ----------
    Patil et al., "POET: Training Neural Networks on Tiny Devices with Integrated Rematerialization
    and Paging", ICML 2022; Bartan et al., "Moccasin: Efficient Tensor Rematerialization for Neural
    Networks", ICML 2023 (the interval model).
    """
    deadline = options.deadline
    setting = poet_setting(graph, budget, objective=options.objective, device_profile=options.device_profile,
                           runtime_budget=options.runtime_budget, remat=options.remat, paging=options.paging)
    fallback = best_fallback(setting, options.hint, deadline.remaining()) if options.warm_start else None
    return solve_intervals(setting, fallback, why="the interval model was asked for", started=deadline.started,
                           time_limit=deadline.at - deadline.started, threads=options.threads,
                           progress=options.progress, max_intervals=options.max_intervals)


def solve_intervals(setting: Any, fallback: tuple[str, Schedule] | None, *, why: str, started: float,
                    time_limit: float, threads: int, progress: ProgressCallback | None,
                    max_intervals: int = DEFAULT_MAX_INTERVALS) -> SolveResult:
    """Build the interval model around poet's best warm start ``fallback`` and solve it.

    The model is solved for what is left of ``time_limit`` (counted from ``started``), and the cheaper
    admitted schedule is returned. With no warm start, a capacity-relaxed model first looks for a
    schedule that fits (up to 3/4 of the time left), which then hints the priced model.

    Parameters
    ----------
    setting : Any
        poet's setting (:class:`coop.formulations.poet.setting.PoetSetting`).
    fallback : tuple of (str, Schedule) or None
        The best warm start, named; None: none fits.
    why : str
        The message's opening: which model runs and why.
    started : float
        ``time.perf_counter()`` when the solve began.
    time_limit : float
        Seconds from ``started`` for everything.
    threads : int
        CP-SAT's worker threads.
    max_intervals : int
        Moccasin's C: the intervals per value.

    Returns
    -------
    SolveResult
        "feasible" with the cheaper on the objective of CP-SAT's admitted schedule and the warm start
        (a restricted model: optimality not proven, the bound is the baseline's price), or "unknown"
        with no schedule when neither exists.
    """
    clock = ProgressClock(progress)
    problem = SlotProblem.build(setting.graph, setting.budget)
    coefficients = Coefficients.build(setting, problem.order)
    floor = at_least_baseline(setting, None)
    extra: dict[str, Any] = {"model": "poet-intervals", "max_intervals": max_intervals,
                             "warm_start": fallback[0] if fallback else None,
                             "warm_start_objective": setting.price(fallback[1]).value(setting.objective)
                             if fallback else None}
    words = f"{why}; ran the interval model (C={max_intervals}"
    # A model takes seconds to build and cannot be stopped once begun: none is started without the time for it.
    build_s = MODEL_BUILD_S_PER_INTERVAL * max_intervals * len(problem.order)
    if fallback is None:
        seconds = 0.75 * (started + time_limit - time.perf_counter())  # it stops as soon as the overflow is 0
        if seconds >= 2 * build_s + 0.5:
            fallback = _fit_first(setting, problem, coefficients, max_intervals, seconds, threads, clock, extra)
        else:
            extra["feasibility"] = f"not run: its model (about {build_s:.0f} s to build) needs more time"
        words += f"; no warm start fits, a capacity-relaxed model first: {extra['feasibility']}"
    if started + time_limit - time.perf_counter() < 2 * build_s + 0.5:
        return _without_model(setting, fallback, floor, extra, started, f"{words}): not built, about {build_s:.0f} s "
                              "to build and too little time left to build and solve it", clock)
    built = _shaped_model(setting, problem, coefficients, fallback, max_intervals, relax_memory=False)
    extra.update(horizon=built.horizon, intervals=sum(len(starts) for starts in built.starts.values()))
    solver = _solve(built, started + time_limit - time.perf_counter(), threads,
                    _Reporter(clock, floor, coefficients.scale), extra)
    found = None
    if solver is not None:
        # Valid for the restricted model only (floored prices): what the model proved, not what poet proves.
        extra["restricted_bound"] = (sum(coefficients.compute.values()) + max(0.0, solver.BestObjectiveBound())
                                     ) / coefficients.scale
        found = spans_to_schedule(problem, solution_spans(solver, built))
        if not setting.admits(found):  # never hand out what the simulator or a budget rejects
            extra["cp_sat_rejected"] = "its schedule failed poet's check (simulator, budgets)"
            found = None
    candidates = ([("interval model", found)] if found is not None else []) + ([fallback] if fallback else [])
    admitted = [(setting.price(s).value(setting.objective), name, s) for name, s in candidates]
    wall = time.perf_counter() - started
    words += f", {built.horizon} slots): CP-SAT {extra['cp_sat_status']}"
    if not admitted:
        return SolveResult("poet", "unknown", bound=floor, wall_s=wall, extra=extra,
                           message=f"{words}, and neither it nor a warm start found a schedule within budget "
                                   f"{setting.budget}; raise the budget or the time limit")
    value, name, schedule = min(admitted, key=lambda item: (item[0], item[1] != "interval model"))
    clock.report(value, floor, "poet intervals: done", final=True)
    message = (f"{words}; the best schedule came from the {name}; a restricted model (C intervals per value, "
               "these slots): optimality not proven, the bound is the baseline's price")
    return priced_result(setting, schedule, "feasible", floor, wall, message, {**extra, "source": name})


def _without_model(setting: Any, fallback: tuple[str, Schedule] | None, floor: float | None, extra: dict[str, Any],
                   started: float, words: str, clock: ProgressClock) -> SolveResult:
    """The result where the priced model was not built in time: the warm start, or no schedule (nothing proven)."""
    wall = time.perf_counter() - started
    extra["cp_sat_status"] = "NOT_RUN (no time to build the model)"
    if fallback is None:
        return SolveResult("poet", "unknown", bound=floor, wall_s=wall, extra=extra,
                           message=f"no schedule found within the time limit: {words}; no warm start fits the budget "
                                   f"{setting.budget}; raise the time limit or the budget")
    value = setting.price(fallback[1]).value(setting.objective)
    clock.report(value, floor, "poet intervals: done", final=True)
    result = priced_result(setting, fallback[1], "feasible", floor, wall,
                           f"{words}; the schedule is the {fallback[0]} warm start", {**extra, "source": fallback[0]})
    result.fallback = (f"the interval model was not built ({words}); the schedule is the {fallback[0]} warm start, a "
                       "last resort: a longer time_limit would let CP-SAT search")
    return result


def _shaped_model(setting: Any, problem: SlotProblem, coefficients: Coefficients,
                  start: tuple[str, Schedule] | None, max_intervals: int, relax_memory: bool) -> PoetIntervalModel:
    """The model sized around ``start`` (else the baseline order): C intervals per value (more where the start
    needs them), its slots plus a slack, first computes in order where it keeps them; hinted with it."""
    spans, slots = _warm_spans(setting.graph, problem, start)
    per_node = {v: max(len(spans[v]), max_intervals) if _may_repeat(setting, problem, v) else 1 for v in problem.order}
    horizon = slots + 1 + len(problem.order) // 10 + 2
    keep_order = setting.graph.has_backward and first_computations_in_order(spans, problem.order)
    built = build_model(problem, coefficients, horizon, per_node, setting, keep_order, relax_memory)
    add_hint(built, spans, problem)
    return built


def _fit_first(setting: Any, problem: SlotProblem, coefficients: Coefficients, max_intervals: int, seconds: float,
               threads: int, clock: ProgressClock, extra: dict[str, Any]) -> tuple[str, Schedule] | None:
    """Minimise the overflow over the budget from the baseline order; a schedule if it reaches 0 and passes."""
    built = _shaped_model(setting, problem, coefficients, None, max_intervals, relax_memory=True)
    phase: dict[str, Any] = {}
    solver = _solve(built, seconds, threads, None, phase)
    least = None if solver is None else setting.budget + solver.Value(built.overflow)
    extra["feasibility"] = (f"CP-SAT {phase['cp_sat_status']} in {phase['cp_sat_wall_s']} s"
                            + ("" if least is None else f", least peak reached {least}"))
    if solver is None or least is None or least > setting.budget:
        return None
    schedule = spans_to_schedule(problem, solution_spans(solver, built))
    if not setting.admits(schedule):
        return None
    clock.report(setting.price(schedule).value(setting.objective), None, "poet intervals: a schedule that fits")
    return "interval model's capacity-relaxed phase", schedule


def _may_repeat(setting: Any, problem: SlotProblem, v: int) -> bool:
    """Whether v may have more than one residency interval (a recomputation or a page-in)."""
    return (setting.remat and problem.recomputable[v]) or may_page(setting, problem, v)


def _warm_spans(graph: Graph, problem: SlotProblem, fallback: tuple[str, Schedule] | None
                ) -> tuple[dict[int, list[Span]], int]:
    """The warm start's spans, or the baseline order's (a hint that may not fit) when there is none."""
    if fallback is not None:
        try:
            converted = schedule_spans(graph, fallback[1])
        except ScheduleError:
            converted = None
        if converted is not None:
            return converted
    converted = schedule_spans(graph, Schedule.from_order(problem.order))
    assert converted is not None  # the baseline order pages nothing
    return converted


class _Reporter(cp_model.CpSolverSolutionCallback):
    """Forwards CP-SAT's incumbents to coop's progress callback, in the objective's unit."""

    def __init__(self, clock: ProgressClock, floor: float, scale: float) -> None:
        super().__init__()
        self.clock, self.floor, self.scale = clock, floor, scale

    def on_solution_callback(self) -> None:
        self.clock.report(self.floor + self.ObjectiveValue() / self.scale, self.floor, "poet intervals: cp-sat")


def _solve(built: PoetIntervalModel, seconds: float, threads: int, reporter: _Reporter | None,
           extra: dict[str, Any]) -> cp_model.CpSolver | None:
    """Solve for ``seconds`` less a reserve (CP-SAT overruns its limit a little; extraction follows); the
    solver holding a solution, or None. Records CP-SAT's status and wall time in ``extra``."""
    until = Deadline.after(max(seconds, 0.0))
    if cp_sat_seconds(until, least=0.0) < 0.2:
        extra.update(cp_sat_status="NOT_RUN (no time left)", cp_sat_wall_s=0.0)
        return None
    # Probing took 3 of 10 s of presolve on captured GPT-2 (407 nodes, 2 workers) before CP-SAT loaded the warm
    # start's complete hint; without it presolve takes 0.3 s (Moccasin turns it off on free orders for the same reason).
    solver = cp_sat_solver(until, threads, seed=0, parameters={"cp_model_probing_level": 0})
    tic = time.perf_counter()
    status = solver.Solve(built.model, reporter)
    extra.update(cp_sat_status=solver.StatusName(status), cp_sat_wall_s=round(time.perf_counter() - tic, 3))
    return solver if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
