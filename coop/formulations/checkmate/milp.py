"""Checkmate: optimal tensor rematerialization as a MILP, and its two-phase LP rounding.

Jain, Jain, Paranjape, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate:
Breaking the Memory Wall with Optimal Tensor Rematerialization", MLSys 2020.

The schedule is split into T frontier-advancing stages, T = the number of computed nodes and
position t = the t-th node of ``prompt_order(graph)``. Stage t computes node t (``R[t,t] = 1``) and may
recompute earlier nodes; nothing later is touched (``R`` lower triangular, ``S`` strictly so).
Variables (section 4 of the paper, the same names below):

* ``R[t,i]`` -- node i is (re)computed in stage t;
* ``S[t,i]`` -- node i is retained in memory from stage t-1 into stage t;
* ``FREE[t,i,k]`` -- node i is freed right after computing node k in stage t (i an input of k,
  or k itself); linearised from the paper's hazards: k is computed, i is not retained into stage
  t+1, and no later user of i is computed in stage t;
* ``U[t,k]`` -- memory in use while node k is computed in stage t (resident values + k's output).

Constraints: ``R[t,k] <= R[t,i] + S[t,i]`` for every input i of k; ``S[t+1,i] <= R[t,i] +
S[t,i]``; ``U[t,k] + workspace[k] * R[t,k] <= budget - caller-owned bytes``; graph outputs are
retained after the last stage; nodes with ``recomputable=False`` are computed in their own stage
only. Objective: ``sum R[t,i] * cost[i]``.

The model is built by :func:`coop.formulations.stages.model.build_stage_model` (the stage model
POET extends with paging and MONeT with implementations); this module solves it, bounds its cost
(:func:`checkmate`'s ``cost_limit``) and rounds its LP relaxation.

The MILP's memory accounting is conservative (a retained value counts through the whole stage),
so the extracted schedule is always re-simulated with :func:`coop.schedule.simulate`; the
reported peak and cost are the simulator's.

Section 5's approximation (:func:`checkmate_lp`): solve the LP relaxation, round ``S`` with
deterministic thresholds and randomised rounding, recompute on demand what ``S`` does not keep
(phase two: for a fixed ``S`` the cheapest ``R`` is forced), and keep the cheapest schedule that
the simulator says fits.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

from coop.errors import SolverError
from coop.formulations.core.deadline import Deadline, DeadlinePassed
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import CheckmateLpOptions, CheckmateOptions
from coop.formulations.core.progress import Progress
from coop.formulations.core.result import SolveResult
from coop.formulations.milp.backends import LinearModel, MilpSolution, solve_lp_relaxation, solve_milp
from coop.formulations.stages.model import (
    StageProblem,
    StageVariables,
    build_stage_model,
    project,
)
from coop.formulations.stages.solution import schedule_from_stages, stages_from_solution
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, simulate

DEFAULT_MAX_NODES = CheckmateOptions.max_nodes
#: The LP is solved at the budget, then, while no rounding fits and time remains, at these
#: fractions of the memory left after caller-owned values.
LP_BUDGET_FACTORS = (1.0, 0.9, 0.8, 0.7)
#: CP-SAT reasons over integers; beyond this many memory levels the budget is coarsened.
CP_SAT_MEMORY_LEVELS = 1 << 40

#: What Checkmate's proofs of infeasibility speak about, for messages: the frontier-advancing stages
#: and the one restriction coop adds (an extra output is taken right after its op, in a stage that
#: recomputes nothing, so that no step comes between unseen).
SEARCH_SPACE = ("Checkmate's space: frontier-advancing stages over graph.order, each extra output of a "
                "multi-output op taken in its own stage right after the op, with nothing recomputed there")


# -------------------------------------------------------------------- section 5: phase two of the LP rounding
def _stages_for_retention(problem: StageProblem, keep: Any) -> tuple[list[list[int]], list[set[int]]]:
    """Phase two of the LP rounding: for a fixed retention choice ``keep(t, i)`` the cheapest R.

    Walk the stages backwards: what stage t+1 reads from retention must be present at the end of
    stage t. Within a stage, walk positions backwards: a demanded value is retained from the
    previous stage when ``keep`` says so (or it cannot be recomputed), else recomputed here,
    which demands its own inputs. Every compute is forced, so this R is the least for that S.
    """
    size = problem.size
    computed: list[list[int]] = [[] for _ in range(size)]
    retained: list[set[int]] = [set() for _ in range(size + 1)]
    retained[size] = set(problem.outputs)
    for t in range(size - 1, -1, -1):
        demanded = set(retained[t + 1])
        stage: list[int] = []
        for k in range(t, -1, -1):
            if k != t and k not in demanded:
                continue
            if k != t and (not problem.recomputable[k] or keep(t, k)):
                retained[t].add(k)
                continue
            stage.append(k)
            demanded.update(problem.deps[k])
        computed[t] = sorted(stage)
    return computed, retained


# -------------------------------------------------------------------- entry points
def _check_size(graph: Graph, budget: int, options: CheckmateOptions | CheckmateLpOptions) -> None:
    """The option check of both Checkmate entry points (run first, at every budget)."""
    _refuse_too_large(graph, options.max_nodes)


@formulation("checkmate", options=CheckmateOptions, check_options=_check_size)
def checkmate(graph: Graph, budget: int, options: CheckmateOptions) -> SolveResult:
    """The Checkmate MILP (Jain et al. 2020, section 4) solved with ``solver``.

    ``solver``: cbc (PuLP), scip, highs, cp-sat (OR-Tools), gurobi or cplex (PuLP, when
    installed). ``memory_levels`` coarsens memory to at most that many units of the budget
    (CP-SAT defaults to 2**40: exact for any realistic graph); a coarsened model's optimum is
    reported as ``feasible``, since its proof holds for the rounded sizes only. Checkmate's space
    is the frontier-advancing schedules over ``graph.order`` whose extra outputs (of multi-output
    ops) are taken right after their op, in a stage that recomputes nothing (:data:`SEARCH_SPACE`):
    ``infeasible`` above min_budget means no such schedule fits. Options other
    than these are rejected.

    ``cost_limit`` searches only the schedules that cost at most that much (e.g. just below an
    incumbent's cost, to prove it optimal or find a cheaper one): every schedule of the space
    computes each node once in its own stage, so a node whose cost exceeds ``cost_limit`` minus
    the baseline cost is never recomputed (its R entries are fixed to 0, which shrinks the model
    a lot when the limit is tight), and the objective is bounded by the limit. ``infeasible``
    then means that no schedule of the space fits the budget at that cost; ``optimal`` still
    means optimal over the whole space (every schedule left out costs more).

    Parameters
    ----------
    graph : Graph
        The training step.
    budget : int
        The memory budget in the graph's units, caller-owned values included.
    options : CheckmateOptions
        ``solver``, ``time_limit``, ``threads``, ``progress``, ``verbose``: the MILP backend, its wall-clock limit
        (model building included), worker threads, a progress callback and the solver's log; ``deadline``: the
        solve's (made by the entry), the solver gets what is left of it once the model is built; ``max_nodes``:
        the largest graph the O(n^2) model is built for (:class:`~coop.errors.SolverError` above);
        ``memory_levels``: coarsen memory to at most this many units of the budget; ``cost_limit``: search only
        schedules that cost at most this much.

    Returns
    -------
    SolveResult
        The simulated schedule, its cost and the solver's bound; ``extra`` holds the model's size,
        the memory unit and whether it was exact.

    References
    ----------
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization",
    MLSys 2020, section 4 (the model: :func:`coop.formulations.stages.model.build_stage_model`).
    """
    solver, threads, progress, deadline = options.solver, options.threads, options.progress, options.deadline
    memory_levels, cost_limit = options.memory_levels, options.cost_limit
    if memory_levels is None and solver.lower().replace("_", "-") in ("cp-sat", "cpsat"):
        memory_levels = CP_SAT_MEMORY_LEVELS
    problem = project(graph, budget, memory_levels)
    try:
        model, variables = build_stage_model(problem, deadline=deadline)
    except DeadlinePassed as exc:
        return _not_built(graph, exc, deadline)
    if cost_limit is not None:
        _limit_cost(model, problem, variables, cost_limit)
    # Building the model counts against the time limit (seconds for a few hundred nodes); the
    # solver gets what is left, even a few milliseconds: that solves a small model.
    solution = solve_milp(model, solver, time_limit=deadline.remaining(), threads=threads, progress=progress,
                          verbose=options.verbose)
    solution.wall_s = deadline.elapsed()  # the whole solve, model building included
    return _result_from_milp(graph, budget, problem, variables, solution, solver, len(model.rows), model.num_vars,
                             cost_limit)


def _not_built(graph: Graph, stopped: DeadlinePassed, deadline: Deadline, name: str = "checkmate") -> SolveResult:
    """No schedule: the O(n^2) model was not built within the time limit (no proof of anything)."""
    return SolveResult(name, "unknown", wall_s=deadline.elapsed(),
                       message=f"no schedule found within {deadline.limit:g} s: {stopped}, so the "
                               f"{'LP relaxation' if name == 'checkmate-lp' else 'MILP'} was not solved; the model of "
                               f"{len(graph.order)} nodes needs more time (a time_limit several times longer), or try "
                               "moccasin (O(n) variables)")


def _limit_cost(model: LinearModel, problem: StageProblem, variables: StageVariables, cost_limit: float) -> None:
    """Restrict the model to schedules costing at most ``cost_limit`` (see :func:`checkmate`)."""
    extra = cost_limit - model.objective_constant  # the cost of computing every node once
    for t, row in enumerate(variables.R):
        for i in range(t):
            if not isinstance(row[i], bool) and problem.cost[i] > extra:
                model.upper[row[i]] = 0.0
    if all(float(c).is_integer() for _, c in model.objective):
        extra = math.floor(extra + 1e-9)  # integral costs: the same schedules, and an integral row (CP-SAT)
    model.add_row(list(model.objective), "<=", extra)


@formulation("checkmate-lp", options=CheckmateLpOptions, check_options=_check_size)
def checkmate_lp(graph: Graph, budget: int, options: CheckmateLpOptions) -> SolveResult:
    """Checkmate's two-phase LP rounding (Jain et al. 2020, section 5).

    Solve the LP relaxation of the MILP; round S at each deterministic threshold and with
    ``random_roundings`` randomised roundings (keep with probability S*); for each rounding
    recompute on demand (the least R for that S); simulate; return the cheapest schedule that
    fits. When none fits, the LP is solved again under a tighter budget (:data:`LP_BUDGET_FACTORS`)
    and rounded again, while the time limit allows. ``bound`` is the optimum of the LP at the
    full budget, a lower bound on every schedule's cost. Model building, every LP and every
    rounding count against ``time_limit``.

    Parameters
    ----------
    graph : Graph
        The training step.
    budget : int
        The memory budget in the graph's units, caller-owned values included.
    options : CheckmateLpOptions
        ``time_limit``, ``threads``, ``progress``: the wall-clock limit, LP worker threads and a progress callback;
        ``deadline``: the solve's (made by the entry); ``max_nodes``: the largest graph the O(n^2) model is built
        for; ``thresholds``: the deterministic rounding thresholds of S; ``random_roundings``: how many randomised
        roundings per LP; ``seed``: their seed.

    Returns
    -------
    SolveResult
        ``feasible`` with the cheapest fitting rounding and the LP's bound, or ``unknown`` /
        ``infeasible`` with the reason.

    References
    ----------
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization",
    MLSys 2020, section 5 (two-phase LP rounding).
    """
    time_limit, threads, progress, deadline = options.time_limit, options.threads, options.progress, options.deadline
    thresholds, random_roundings, seed = options.thresholds, options.random_roundings, options.seed
    started = deadline.started  # building the model and rounding count against the limit too
    rng = random.Random(seed)
    lower_bound: float | None = None
    best: tuple[Schedule, Simulation, str] | None = None
    fitting = tried = planned = 0
    lp_notes: list[str] = []
    for factor in LP_BUDGET_FACTORS:
        if lower_bound is not None and (best is not None or deadline.expired()):
            break
        # Rounding can overshoot the LP's budget; when no rounding fits, the LP is solved again
        # under a tighter budget (the schedules are still checked against the real one).
        lp_budget = graph.caller_owned_bytes + math.floor(factor * (budget - graph.caller_owned_bytes))
        problem = project(graph, lp_budget, None)
        try:
            model, variables = build_stage_model(problem, deadline=deadline)
        except DeadlinePassed as exc:
            if lower_bound is None:
                return _not_built(graph, exc, deadline, "checkmate-lp")
            break
        relaxation = solve_lp_relaxation(model, time_limit=deadline.remaining(), threads=threads)
        lp_notes.append(f"x{factor:g}: {relaxation.message}")
        if relaxation.values is None:
            if lower_bound is None:
                return _lp_failure(relaxation, model, budget, time_limit, time.perf_counter() - started)
            break  # a tighter LP that is infeasible or unsolved in time: keep what the first gave
        if lower_bound is None:
            lower_bound = relaxation.objective or 0.0  # the full-budget LP bounds every schedule
        rules = _rounding_rules(variables, relaxation.values, thresholds, random_roundings, rng, factor)
        planned += len(rules)
        for label, keep in rules:
            if tried and deadline.expired():
                break  # at least one rounding always runs: the LP solution is already paid for
            tried += 1
            computed, retained = _stages_for_retention(problem, keep)
            schedule = schedule_from_stages(problem, computed, retained)
            sim = simulate(graph, schedule)
            if sim.peak <= budget:
                fitting += 1
                if best is None or sim.cost < best[1].cost:
                    best = (schedule, sim, label)
            if progress is not None:
                progress(Progress(time.perf_counter() - started, best[1].cost if best else None, lower_bound, label))
    wall = time.perf_counter() - started
    extra = {"roundings": tried, "fitting": fitting, "lp_solver": "; ".join(lp_notes)}
    cut_short = f" (time limit: {tried} of {planned} roundings tried)" if tried < planned else ""
    if best is None:
        return SolveResult("checkmate-lp", "unknown", objective=None, bound=lower_bound, wall_s=wall, extra=extra,
                           message=f"none of the {tried} LP roundings fits the budget {budget}{cut_short}; "
                                   f"try checkmate (MILP) or chen-greedy")
    schedule, sim, label = best
    extra["rounding"] = label
    return SolveResult("checkmate-lp", "feasible", schedule=schedule, simulation=sim, objective=sim.cost,
                       bound=lower_bound, wall_s=wall, extra=extra,
                       message=f"best of {fitting}/{tried} fitting roundings ({label}){cut_short}")


def _lp_failure(relaxation: MilpSolution, model: LinearModel, budget: int, time_limit: float,
                wall: float) -> SolveResult:
    """The result when the full-budget LP relaxation gives no solution: infeasible, or unsolved in time."""
    extra = {"variables": model.num_vars, "constraints": len(model.rows), "lp_wall_s": relaxation.wall_s}
    if relaxation.status == "infeasible":
        return SolveResult("checkmate-lp", "infeasible", wall_s=wall, extra=extra,
                           message=f"LP relaxation proven infeasible: no schedule fits budget {budget} in "
                                   f"{SEARCH_SPACE}; try a larger budget or moccasin")
    return SolveResult("checkmate-lp", "unknown", wall_s=wall, extra=extra,
                       message=f"LP relaxation ({model.num_vars} variables, {len(model.rows)} constraints) not "
                               f"solved within the {time_limit:g} s time limit [{relaxation.message}]; raise "
                               f"time_limit or use chen-greedy or moccasin")


def _rounding_rules(variables: StageVariables, values: list[float], thresholds: tuple[float, ...],
                    random_roundings: int, rng: random.Random, factor: float) -> list[tuple[str, Any]]:
    """Section 5's deterministic thresholds and randomised roundings of the LP's S."""
    def retention(t: int, i: int) -> float:
        entry = variables.S[t][i]
        return float(entry) if isinstance(entry, bool) else values[entry]

    tag = "" if factor == 1 else f" (LP budget x{factor:g})"
    rules: list[tuple[str, Any]] = [(f"threshold {tau:g}{tag}", _threshold_rule(retention, tau)) for tau in thresholds]
    rules += [(f"random #{n}{tag}", _random_rule(retention, rng)) for n in range(random_roundings)]
    return rules


def _threshold_rule(retention: Any, tau: float) -> Any:
    return lambda t, i: retention(t, i) >= tau


def _random_rule(retention: Any, rng: random.Random) -> Any:
    # Each (t, i) decided once, so that repeated queries of one rounding agree.
    draws: dict[tuple[int, int], bool] = {}

    def keep(t: int, i: int) -> bool:
        if (t, i) not in draws:
            draws[(t, i)] = rng.random() < retention(t, i)
        return draws[(t, i)]

    return keep


def _refuse_too_large(graph: Graph, max_nodes: int) -> None:
    """Refuse graphs too big for an O(n^2) model."""
    if len(graph.order) > max_nodes:
        raise SolverError(
            f"graph {graph.name!r} has {len(graph.order)} computed nodes, above max_nodes={max_nodes}: "
            f"Checkmate's MILP has O(n^2) variables; use moccasin, or raise max_nodes"
        )


def _result_from_milp(graph: Graph, budget: int, problem: StageProblem, variables: StageVariables, solution: MilpSolution,
                      solver: str, num_rows: int, num_vars: int, cost_limit: float | None = None) -> SolveResult:
    extra: dict[str, Any] = {"solver": solver, "variables": num_vars, "constraints": num_rows,
                             "memory_unit": problem.unit, "memory_exact": problem.exact, "cost_limit": cost_limit}
    objective, bound = solution.objective, solution.bound
    if solution.values is None:
        status = solution.status if solution.status == "infeasible" and problem.exact else "unknown"
        message = solution.message or solution.status
        if status == "infeasible":
            at_cost = "" if cost_limit is None else f" at a cost of at most {cost_limit:g}"
            message = (f"no schedule fits budget {budget}{at_cost} in {SEARCH_SPACE} (proven by {solver}); "
                       f"try a larger budget or moccasin")
        if solution.status == "infeasible" and not problem.exact:
            message = "infeasible with memory rounded up to the coarse unit; retry with a larger memory_levels"
        return SolveResult("checkmate", status, wall_s=solution.wall_s, message=message, extra=extra)
    computed, retained = stages_from_solution(variables, solution.values, problem.size)
    schedule = schedule_from_stages(problem, computed, retained)
    sim = simulate(graph, schedule)
    extra["milp_objective"] = objective
    if sim.peak > budget:
        return SolveResult("checkmate", "unknown", wall_s=solution.wall_s, bound=bound, extra=extra,
                           message=f"the solver's schedule simulates to peak {sim.peak} > budget {budget} "
                                   f"(numerical tolerance); not returned")
    status = solution.status
    if status == "optimal" and not problem.exact:
        status, bound = "feasible", None
    if status == "optimal":
        bound = min(bound if bound is not None else sim.cost, sim.cost)
    return SolveResult("checkmate", status, schedule=schedule, simulation=sim, objective=sim.cost, bound=bound,
                       wall_s=solution.wall_s, extra=extra, message=solution.message)


__all__ = ["checkmate", "checkmate_lp"]
