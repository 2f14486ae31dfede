"""POET: rematerialization and paging to a slower tier, for energy or time, on a device profile.

Patil, Jain, Dutta, Stoica, Gonzalez, "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022. A value may be recomputed (Checkmate) or
written out to a slower memory tier and read back before its next use; the solver trades one
against the other by their energy or time on a device (:mod:`coop.device_profiles`).

The model is Checkmate's MILP (:mod:`coop.formulations.checkmate.milp`, built by the same code,
:func:`coop.formulations.stages.model.build_stage_model`, through its
:class:`~coop.formulations.stages.model.ModelExtension` hook) over frontier-advancing stages,
with POET's paging variables (section 3 of the paper, the same names):

* ``R[t,i]`` compute i in stage t; ``S_RAM[t,i]`` (Checkmate's ``S``) i on the device at the start
  of stage t; ``FREE`` and ``U`` as in Checkmate, with the memory budget on the device tier only;
* ``S_SD[t,i]`` i on the slow tier at the start of stage t;
* ``M_out[t,i]`` / ``M_in[t,i]`` page i out / in between stage t and stage t+1.

Constraints: ``M_out <= R + S_RAM`` (only a device copy is paged out) and it keeps i on the device
to the end of stage t (a FREE hazard); ``S_RAM[t+1,i] <= R[t,i] + S_RAM[t,i] + M_in[t,i]``;
``M_in <= S_SD``; ``S_SD[t+1,i] <= S_SD[t,i] + M_out[t,i] - M_in[t,i]``. Where coop differs from
the published model, to match coop's one simulator (:func:`coop.schedule.simulate`, contract 2)
exactly: a page moves a value (``S_RAM + S_SD <= 1``; a value paged back in and out again pays the
page-out again; recomputing a paged-out value drops its host copy, ``S_SD[t+1,i] <= 1 - R[t,i] +
M_out[t,i]``); paging happens between stages (page-outs, then page-ins, after stage t's last
compute, none before the stage of an extra output), so a page-in counts against the budget from
the start of the next stage, as in POET. Caller-owned values (inputs, parameters) stay on the
device: POET too keeps parameters out of paging. Only values on an accelerator are paged
(:meth:`coop.graph.Graph.pageable`): a host value of a CUDA step (a 0-d CPU scalar, an RNG seed) gets no
paging variables, as the validator refuses paging it.

Objective (``objective="energy"``, POET's): ``sum R compute_j + sum M_in pagein_j + sum M_out
pageout_j``; or ``"time"``: the same with seconds. ``runtime_budget`` (a factor of the baseline
compute time) bounds compute plus paging time (POET's published solver counts compute only).
The extracted schedule is re-simulated; the reported peak is the simulator's and the energy and
time are :func:`price_schedule`'s, the one place a schedule is priced on a profile.

Warm start and fallback: Checkmate's model without paging (remat only, the same objective) is
solved first and hints the full model; the answer is the best of the full model, the remat-only
model and :func:`coop.formulations.heuristics.warm_start.best_warm_start`, so poet is never worse than
remat-only at the same budget and objective; with paging the candidates include a paging-only
heuristic (:mod:`coop.formulations.heuristics.paging`), a fitting incumbent below the least budget
recomputation alone reaches. The T x T model has about 5 T^2 / 2 binaries: above ``max_nodes``
(:data:`DEFAULT_MAX_NODES`) computed nodes it is not built; :mod:`coop.formulations.poet.intervals` runs
instead (POET's choices in a Moccasin-style interval model, C residency intervals per value that start
with a compute or a page-in, hinted with the best warm start) and the message says which model ran and
why; its status is ``feasible`` with the baseline's price as the bound, never ``optimal``.
"""

from __future__ import annotations

import dataclasses

from coop.formulations.core.deadline import Deadline, DeadlinePassed
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import PoetOptions
from coop.formulations.core.progress import Progress, ProgressCallback
from coop.formulations.core.result import SolveResult
from coop.formulations.milp.backends import LinearModel, MilpSolution, solve_milp
from coop.formulations.poet.intervals import solve_intervals
from coop.formulations.poet.setting import (
    DEFAULT_DEVICE_PROFILE,
    OBJECTIVES,
    NodePrice,
    Objective,
    PoetError,
    PoetSetting,
    SchedulePrice,
    at_least_baseline,
    best_fallback,
    check_poet_options,
    node_price,
    poet_setting,
    price_schedule,
    priced_result,
)
from coop.formulations.stages.model import (
    Entry,
    StageProblem,
    StageVariables,
    build_stage_model,
    latest_possible_reads,
    project,
)
from coop.formulations.stages.solution import schedule_from_stages, stages_from_solution
from coop.graph import Graph
from coop.schedule import Schedule

#: Above this many computed nodes the T x T model (about 5 T^2 / 2 binaries and Checkmate's FREE
#: rows) is not built: poet runs the interval model of coop.formulations.poet.intervals and says so.
DEFAULT_MAX_NODES = PoetOptions.max_nodes
#: The solver sees the objective scaled so that the baseline schedule scores this (joules of a
#: microcontroller are 1e-5: CBC's absolute tolerances would swallow them).
OBJECTIVE_SCALE = 1e4


# -------------------------------------------------------------------- the paging variables
class _Paging:
    """POET's S_SD, M_in and M_out added to Checkmate's model (a ModelExtension)."""

    def __init__(self, prices: list[NodePrice], objective: Objective, scale: float, pageable: list[bool]) -> None:
        self.prices, self.objective, self.scale = prices, objective, scale
        self.pageable = pageable  # per position: Graph.pageable (a host value of an accelerator step is not)
        self.SSD: dict[tuple[int, int], int] = {}    # S_SD[t,i]: on the slow tier at the start of stage t
        self.MOUT: dict[tuple[int, int], int] = {}   # M_out[t,i]: paged out after stage t
        self.MIN: dict[tuple[int, int], int] = {}    # M_in[t,i]: paged in after stage t

    def add_variables(self, model: LinearModel, problem: StageProblem, R: list[list[Entry]], S: list[list[Entry]]) -> None:
        T = problem.size
        last_use = latest_possible_reads(problem.users, problem.recomputable, problem.outputs)
        for i in range(T):
            if problem.mem[i] == 0 or not self.pageable[i]:
                continue  # paging nothing only costs latency; a host value is never paged (M_out, M_in fixed to 0)
            needed_until = T if i in problem.outputs else last_use[i]
            for t in range(i, min(needed_until, T - 1)):  # page out after stage t: useful if read in a later stage
                if not problem.extra_output[t + 1]:
                    self.MOUT[t, i] = model.add_var(f"M_out[{t},{i}]")
                if any((u, i) in self.MOUT for u in range(i, t)) and S[t][i] is not False:
                    self.SSD[t, i] = model.add_var(f"S_SD[{t},{i}]")
                    if not problem.extra_output[t + 1] and S[t + 1][i] is not False:
                        self.MIN[t, i] = model.add_var(f"M_in[{t},{i}]")
            t = T - 1  # the last boundary: only page-ins, of graph outputs
            if i in problem.outputs and i < t and any((u, i) in self.MOUT for u in range(i, t)):
                self.SSD[t, i] = model.add_var(f"S_SD[{t},{i}]")
                self.MIN[t, i] = model.add_var(f"M_in[{t},{i}]")
        self._add_rows(model, problem, R, S)
        for (t, i), var in self.MOUT.items():
            model.objective.append((var, self.prices[i].pageout(self.objective) * self.scale))
        for (t, i), var in self.MIN.items():
            model.objective.append((var, self.prices[i].pagein(self.objective) * self.scale))

    def _add_rows(self, model: LinearModel, problem: StageProblem, R: list[list[Entry]], S: list[list[Entry]]) -> None:
        for (t, i), out in self.MOUT.items():
            # M_out <= R[t,i] + S_RAM[t,i]; a value paged out is not on the device next stage.
            _row(model, [(out, 1.0), (R[t][i], -1.0), (S[t][i] if i < t else False, -1.0)], "<=", 0.0)
            _row(model, [(out, 1.0), (S[t + 1][i], 1.0)], "<=", 1.0)
        for (t, i), ssd in self.SSD.items():
            # On the slow tier only after a page-out that no page-in undid, and never on both tiers.
            terms: list[tuple[Entry, float]] = [(ssd, 1.0), (S[t][i], 1.0)]
            _row(model, terms, "<=", 1.0)
            previous = [(self.SSD.get((t - 1, i), False), -1.0), (self.MOUT.get((t - 1, i), False), -1.0),
                        (self.MIN.get((t - 1, i), False), 1.0)]
            _row(model, [(ssd, 1.0)] + previous, "<=", 0.0)
            # Recomputing a paged-out value drops its host copy (unless it is paged out again).
            _row(model, [(ssd, 1.0), (R[t - 1][i], 1.0), (self.MOUT.get((t - 1, i), False), -1.0)], "<=", 1.0)
        for (t, i), page_in in self.MIN.items():
            _row(model, [(page_in, 1.0), (self.SSD[t, i], -1.0)], "<=", 0.0)  # M_in <= S_SD
            _row(model, [(page_in, 1.0), (R[t][i], 1.0)], "<=", 1.0)         # no page-in of a dropped copy

    def retention_sources(self, t: int, i: int) -> list[int]:
        return [self.MIN[t, i]] if (t, i) in self.MIN else []

    def kept_to_stage_end(self, t: int, i: int) -> list[int]:
        return [self.MOUT[t, i]] if (t, i) in self.MOUT else []

    def boundaries(self, values: list[float], size: int) -> list[tuple[list[int], list[int]]]:
        """Per stage: (positions paged out, positions paged in) after it, in position order."""
        result: list[tuple[list[int], list[int]]] = [([], []) for _ in range(size)]
        for (t, i), var in sorted(self.MOUT.items()):
            if values[var] > 0.5:
                result[t][0].append(i)
        for (t, i), var in sorted(self.MIN.items()):
            if values[var] > 0.5:
                result[t][1].append(i)
        return result


def _row(model: LinearModel, terms: list[tuple[Entry, float]], sense: str, rhs: float) -> None:
    """A row over entries that may be constants (True/False fixed by the stage structure)."""
    live: list[tuple[int, float]] = []
    for entry, coef in terms:
        if isinstance(entry, bool):
            rhs -= coef * entry
        else:
            live.append((entry, coef))
    if live:
        model.add_row(live, sense, rhs)  # type: ignore[arg-type]
    elif (sense == "<=" and rhs < -1e-9) or (sense == ">=" and rhs > 1e-9):
        raise AssertionError("a constant row that never holds")  # the stage structure rules this out


# -------------------------------------------------------------------- entry point
@formulation("poet", options=PoetOptions, check_options=check_poet_options, pages=lambda options: options.paging)
def poet(graph: Graph, budget: int, options: PoetOptions) -> SolveResult:
    """POET's MILP (Patil et al. 2022): recompute or page to the device profile's slower tier.

    ``objective``: ``"energy"`` (joules) or ``"time"`` (seconds, paging included) on
    ``device_profile`` (a shipped name, a .toml path or a DeviceProfile; default
    :data:`DEFAULT_DEVICE_PROFILE`). ``runtime_budget``: a factor (>= 1) of the baseline compute
    time that compute plus paging time must stay within. ``remat=False`` forbids recomputation
    (paging only, as Capuchin), ``paging=False`` forbids paging (remat only, Checkmate with POET's
    objective). ``solver``: a :mod:`~coop.formulations.milp.backends` name (cbc, highs, scip, ...).
    ``max_nodes``: the largest graph the T x T model is built for (see the module docstring).
    ``captured`` is accepted (the common options) and unused. The result's ``objective`` and
    ``bound`` are in the objective's unit; ``price`` is the schedule's price (energy, time,
    page-ins and -outs, paged bytes; ``extra`` splits it into compute and paging).

    Parameters
    ----------
    graph : Graph
        The training step.
    budget : int
        The device memory budget in the graph's units, caller-owned values included.
    options : PoetOptions
        ``objective``, ``device_profile``, ``runtime_budget``, ``remat``, ``paging``: what is minimised on which
        device, under which runtime budget, with which moves (above); ``solver``, ``time_limit``, ``threads``,
        ``progress``, ``verbose``: the MILP backend, the wall-clock limit (warm starts included), worker threads, a
        progress callback and the solver's log; ``hint``: schedules (or results) that compete as warm starts;
        ``captured``: unused; ``max_nodes``: the largest graph the T x T model is built for; ``deadline``: the
        solve's (made by the entry), the models get what is left of it.

    Returns
    -------
    SolveResult
        The best admitted schedule, priced on the profile.

    References
    ----------
    Patil et al., "POET: Training Neural Networks on Tiny Devices with Integrated Rematerialization
    and Paging", ICML 2022, section 3; the stages are Checkmate's (Jain et al., MLSys 2020, section 4).
    """
    deadline, threads, progress, max_nodes = options.deadline, options.threads, options.progress, options.max_nodes
    setting = poet_setting(graph, budget, objective=options.objective, device_profile=options.device_profile,
                           runtime_budget=options.runtime_budget, remat=options.remat, paging=options.paging)
    fallback = best_fallback(setting, options.hint, deadline.remaining())
    if len(graph.order) > max_nodes:
        return _too_large(setting, fallback, max_nodes, deadline.started, deadline.at - deadline.started, threads,
                          progress)
    # the warm starts ran inside the limit: the models get what is left of it
    result = _solve_models(setting, options.solver, deadline.remaining(), threads, progress, options.verbose,
                           fallback)
    result.wall_s = deadline.elapsed()
    return result


def _too_large(setting: PoetSetting, fallback: tuple[str, Schedule] | None, max_nodes: int, started: float,
               time_limit: float, threads: int, progress: ProgressCallback | None) -> SolveResult:
    """Above max_nodes: the interval model of :mod:`coop.formulations.poet.intervals`, hinted with the warm start."""
    size = len(setting.graph.order)
    why = (f"graph {setting.graph.name!r} has {size} computed nodes, above max_nodes={max_nodes}: POET's T x T model "
           f"(about {5 * size * size // 2} binaries) is not built (raise max_nodes to build it)")
    return solve_intervals(setting, fallback, why=why, started=started, time_limit=time_limit, threads=threads,
                           progress=progress)


def _solve_models(setting: PoetSetting, solver: str, time_limit: float, threads: int, progress: ProgressCallback | None,
                  verbose: bool, fallback: tuple[str, Schedule] | None) -> SolveResult:
    """Remat-only model first (a hint and a floor), then the full model; the best admitted schedule wins."""
    until = Deadline.after(time_limit)
    problem, prices, scale = _priced_problem(setting)
    candidates: list[tuple[str, Schedule]] = [fallback] if fallback else []
    notes: list[str] = []
    first_hint: dict[str, float] = {}
    if setting.remat and setting.paging:  # the remat-only model: the full model's hint
        remat_only = dataclasses.replace(setting, paging=False)
        try:
            model, variables, extension = _model(remat_only, problem, prices, scale, until)
        except DeadlinePassed as exc:
            return _not_built(setting, candidates, exc)
        solution = solve_milp(model, solver, time_limit=until.remaining() / 3, threads=threads, verbose=verbose)
        notes.append(f"remat-only model: {solution.status}")
        if solution.values is not None:
            first_hint = {model.names[v]: value for v, value in enumerate(solution.values)}
            candidates.append(("remat-only model", _extract(problem, variables, extension, solution.values)))
    try:
        model, variables, extension = _model(setting, problem, prices, scale, until)
    except DeadlinePassed as exc:
        return _not_built(setting, candidates, exc)
    if first_hint:  # (milp_backends drops it for HiGHS, where OR-Tools 9.15 crashes on SetHint)
        model.hint = {v: min(max(first_hint.get(name, 0.0), model.lower[v]), model.upper[v])
                      for v, name in enumerate(model.names)}
        for v, kind in enumerate(model.kinds):
            if kind != "continuous":
                model.hint[v] = float(round(model.hint[v]))
    solution = solve_milp(model, solver, time_limit=until.remaining(), threads=threads,
                          progress=_unscaled(progress, scale), verbose=verbose)
    notes.append(f"full model: {solution.status}")
    if solution.values is not None:
        candidates.insert(0, ("milp", _extract(problem, variables, extension, solution.values)))
    admitted = [(setting.price(s).value(setting.objective), n, s) for n, s in candidates if setting.admits(s)]
    return _final(setting, solution, scale, admitted, model, "; ".join(notes))


def _not_built(setting: PoetSetting, candidates: list[tuple[str, Schedule]], stopped: DeadlinePassed) -> SolveResult:
    """The MILP was not built in time: the best admitted warm start, or no schedule (nothing proven either way)."""
    admitted = [(setting.price(s).value(setting.objective), n, s) for n, s in candidates if setting.admits(s)]
    return _final(setting, MilpSolution(status="unknown", message=str(stopped)), 1.0, admitted, LinearModel(),
                  f"{stopped}")


def _final(setting: PoetSetting, solution: MilpSolution, scale: float, admitted: list[tuple[float, str, Schedule]],
           model: LinearModel, notes: str) -> SolveResult:
    extra = {"variables": model.num_vars, "constraints": len(model.rows), "models": notes,
             "milp_status": solution.status,
             "milp_objective": None if solution.objective is None else solution.objective / scale}
    milp_bound = None if solution.bound is None else solution.bound / scale
    bound = at_least_baseline(setting, milp_bound)
    if not admitted:
        status = "infeasible" if solution.status == "infeasible" else "unknown"
        what = ("no schedule of POET's space (frontier-advancing stages with paging between them) fits budget "
                f"{setting.budget}" if status == "infeasible" else f"no schedule found in time ({notes})")
        return SolveResult("poet", status, bound=bound, wall_s=solution.wall_s, extra=extra,
                           message=f"{what}; try a larger budget or time_limit")
    value, name, schedule = min(admitted, key=lambda item: (item[0], item[1] != "milp"))
    status = "optimal" if solution.status == "optimal" else "feasible"
    if milp_bound is not None and value < milp_bound - 1e-9 * max(1.0, abs(milp_bound)):
        # a warm start outside POET's stage space beats what the MILP proved for that space: its proof
        # says nothing about the schedule returned, so only the baseline's price bounds it
        status, bound = "feasible", at_least_baseline(setting, None)
        notes += f"; the {name} beats the MILP's bound {milp_bound:.6g} (it lies outside POET's stage space)"
    elif status == "optimal" and bound is not None:
        bound = min(bound, value)
    message = f"{solution.status} ({notes})" + ("" if name == "milp" else f"; the best schedule came from the {name}")
    return priced_result(setting, schedule, status, bound, solution.wall_s, message, {**extra, "source": name})


def _priced_problem(setting: PoetSetting) -> tuple[StageProblem, list[NodePrice], float]:
    """Checkmate's projection (exact memory units), the prices per position, and the objective scale."""
    problem = project(setting.graph, setting.budget, None)
    prices = [node_price(c, setting.graph.node(i).mem, setting.profile) for i, c in zip(problem.ids, problem.cost)]
    baseline = sum(p.compute(setting.objective) for p in prices)
    scale = OBJECTIVE_SCALE / baseline if baseline > 0 else 1.0
    return problem, prices, scale


def _model(setting: PoetSetting, problem: StageProblem, prices: list[NodePrice],
           scale: float, deadline: Deadline | None = None) -> tuple[LinearModel, StageVariables, _Paging | None]:
    """Checkmate's model with POET's objective, paging variables and runtime budget (built until ``deadline``)."""
    priced = dataclasses.replace(problem, cost=tuple(p.compute(setting.objective) * scale for p in prices))
    pageable = [setting.graph.pageable(i) for i in problem.ids]
    extension = _Paging(prices, setting.objective, scale, pageable) if setting.paging else None
    model, variables = build_stage_model(priced, extension, deadline=deadline)
    if not setting.remat:
        for t, row in enumerate(variables.R):
            for i in range(t):
                if not isinstance(row[i], bool):
                    model.upper[row[i]] = 0.0
    if setting.runtime_budget is not None:
        _add_runtime_budget(model, problem, prices, variables, extension, setting.runtime_budget)
    return model, variables, extension


def _add_runtime_budget(model: LinearModel, problem: StageProblem, prices: list[NodePrice], variables: StageVariables,
                        extension: _Paging | None, factor: float) -> None:
    """sum R compute_s + sum M_in pagein_s + sum M_out pageout_s <= factor x baseline compute time."""
    terms: list[tuple[Entry, float]] = [(variables.R[t][i], prices[i].compute_s)
                                        for t in range(problem.size) for i in range(t + 1)]
    if extension is not None:
        terms += [(v, prices[i].pageout_s) for (_, i), v in extension.MOUT.items()]
        terms += [(v, prices[i].pagein_s) for (_, i), v in extension.MIN.items()]
    baseline = sum(p.compute_s for p in prices)
    _row(model, terms, "<=", factor * baseline * (1 + 1e-9))


def _extract(problem: StageProblem, variables: StageVariables, extension: _Paging | None, values: list[float]) -> Schedule:
    computed, retained = stages_from_solution(variables, values, problem.size)
    boundaries = extension.boundaries(values, problem.size) if extension is not None else None
    return schedule_from_stages(problem, computed, retained, boundaries)


def _unscaled(progress: ProgressCallback | None, scale: float) -> ProgressCallback | None:
    """The caller's callback, fed objectives in the objective's own unit."""
    if progress is None:
        return None

    def report(event: Progress) -> None:
        progress(dataclasses.replace(
            event, incumbent=None if event.incumbent is None else event.incumbent / scale,
            bound=None if event.bound is None else event.bound / scale))

    return report


__all__ = ["DEFAULT_DEVICE_PROFILE", "DEFAULT_MAX_NODES", "OBJECTIVES", "OBJECTIVE_SCALE", "NodePrice", "Objective",
           "PoetError", "SchedulePrice", "node_price", "poet", "price_schedule"]
