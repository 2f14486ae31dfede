"""A time-indexed feasibility model over a slot problem: does any schedule of a space fit at all?

Moccasin's interval model (Bartan et al., ICML 2023) minimises cost; near the least peak CP-SAT
can spend its whole limit there without proving that nothing fits. This model asks the
feasibility question alone, over Checkmate-style R (compute) and S (resident) matrices without
stages (Jain et al., MLSys 2020), sized by :func:`coop.formulations.intervals.slots.sufficient_intervals`
so that INFEASIBLE is a proof for the whole space.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.core.deadline import Deadline, cp_sat_solver
from coop.formulations.intervals.model import first_computation_pairs
from coop.formulations.intervals.slots import SlotProblem, sufficient_horizon, sufficient_intervals
from coop.schedule import Schedule, Step, simulate


@dataclass
class SlotGrid:
    """A time-indexed model of the compute/free schedules of a space (Checkmate's R and S, no stages).

    ``compute[v][t]``: v is computed at slot t (one compute per slot; extra outputs take no slot);
    ``resident[v][t]``: an instance of v is alive while slot t runs (``t == horizon``: at the end);
    ``first[p][t]``: op p's first compute is at slot t (only for ops with extra outputs).
    """

    model: cp_model.CpModel
    horizon: int
    ops: list[int]
    compute: dict[int, list[Any]]
    resident: dict[int, list[Any]]
    first: dict[int, list[Any]]
    memory: list[cp_model.LinearExpr]


@dataclass
class FeasibilityCheck:
    """What the feasibility question found: CP-SAT's status, or why it was not asked."""

    status: str = "NOT_RUN"
    reason: str = ""
    horizon: int = 0
    wall_s: float = 0.0
    least_peak: int | None = None  # of the space, when proven (after an INFEASIBLE answer)
    least_peak_exact: bool = False  # a schedule at least_peak was simulated


def feasibility_horizon(problem: SlotProblem) -> tuple[dict[int, int], int]:
    """Per node the computations some fitting schedule needs at most, and the slots they fill.

    :func:`sufficient_intervals` without a cost bound: dropping computations that nothing reads
    never raises memory nor leaves the space, so if any schedule of the space fits, one within
    these limits does, and it makes at most :func:`sufficient_horizon` computations.

    Returns
    -------
    (limits, horizon) : tuple
        Per node its most computations, and the number of slots.
    """
    limits = sufficient_intervals(problem, None)
    return limits, sufficient_horizon(problem, limits, None)


def build_feasibility_model(problem: SlotProblem, keep_order: bool, horizon: int, limits: dict[int, int],
                            capacity: int | Any) -> SlotGrid:
    """A model that contains every schedule of moccasin's space with at most ``limits`` computations.

    It relaxes contract 2 only where that cannot hide a schedule (an extra output may be dropped
    as soon as its op ran; its op's workspace covers it at that step), so INFEASIBLE is a proof
    that no schedule of the space fits ``capacity`` (bytes beyond the caller-owned values). Every
    legal schedule maps onto it: slot t holds its t-th compute, ``resident`` the instances alive
    at that compute. Empty slots come only at the end (removing an empty slot changes nothing),
    and v is never recomputed while an instance of it is alive (freeing it first is the same
    memory). With ``keep_order`` first computations follow ``problem.order``; else only random
    ops' first draws do (``Graph.random_draws``), as in the interval models
    (:func:`coop.formulations.intervals.model.first_computation_pairs`).

    Parameters
    ----------
    horizon : int
        The number of slots (:func:`feasibility_horizon`).
    limits : dict
        Per node its most computations.
    capacity : int or IntVar
        Bytes beyond the caller-owned values at every step.

    Returns
    -------
    SlotGrid

    References
    ----------
    Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization", MLSys 2020
    (R and S); Bartan et al., "Moccasin: Efficient Tensor Rematerialization for Neural Networks", ICML 2023
    (one compute per slot).
    """
    model = cp_model.CpModel()
    ops = [v for v in problem.order if v not in problem.output_of]
    extras: dict[int, list[int]] = {}
    for extra, op in problem.output_of.items():
        extras.setdefault(op, []).append(extra)
    compute = {v: [model.NewBoolVar(f"R_{v}_{t}") for t in range(horizon)] for v in ops}
    resident = {v: [model.NewConstant(0)] + [model.NewBoolVar(f"S_{v}_{t}") for t in range(1, horizon + 1)]
                for v in problem.order}
    done = {v: [model.NewBoolVar(f"C_{v}_{t}") for t in range(horizon)] for v in ops}  # computed by slot t
    first = {p: [model.NewBoolVar(f"F_{p}_{t}") for t in range(horizon)] for p in extras}
    for v in ops:
        _add_node_rules(model, problem, v, compute[v], resident, done[v], limits[v])
    for p, taken in extras.items():
        model.AddExactlyOne(first[p])
        for t in range(horizon):
            model.AddImplication(first[p][t], compute[p][t])
            if t > 0:
                model.AddImplication(first[p][t], done[p][t - 1].Not())
            for e in taken:  # an extra output exists only from its op's first compute on
                model.Add(resident[e][t + 1] <= resident[e][t] + first[p][t])
    memory = []
    for t in range(horizon):
        busy = sum(compute[v][t] for v in ops)
        model.Add(busy <= 1)
        if t > 0:
            model.Add(busy <= sum(compute[v][t - 1] for v in ops))  # compacted: empty slots at the end
        used = (sum(problem.mem[v] * resident[v][t] for v in problem.order)
                + sum((problem.mem[v] + problem.workspace[v]) * compute[v][t] for v in ops))
        model.Add(used <= capacity)
        memory.append(used)
    for output in problem.outputs:
        model.Add(resident[output][horizon] == 1)
    for a, b in first_computation_pairs(problem.graph, ops, keep_order):  # a's first computation precedes b's
        model.Add(done[b][0] == 0)
        for t in range(1, horizon):
            model.AddImplication(done[b][t], done[a][t - 1])
    return SlotGrid(model, horizon, ops, compute, resident, first, memory)


def _add_node_rules(model: cp_model.CpModel, problem: SlotProblem, v: int, compute: list[Any],
                    resident: dict[int, list[Any]], done: list[Any], limit: int) -> None:
    """v is computed 1..limit times (once if not recomputable), from resident inputs, and stays
    resident only from a compute on; ``done`` marks the slots from its first compute on."""
    model.Add(sum(compute) >= 1)
    model.Add(sum(compute) <= (limit if problem.recomputable[v] else 1))
    for t, run in enumerate(compute):
        model.Add(resident[v][t + 1] <= resident[v][t] + run)
        model.AddBoolOr([run.Not(), resident[v][t].Not()])
        for u in problem.inputs[v]:
            model.AddImplication(run, resident[u][t])
        model.AddImplication(run, done[t])
        if t > 0:
            model.AddImplication(done[t - 1], done[t])
            model.Add(done[t] <= done[t - 1] + run)
        else:
            model.Add(done[0] <= run)


def grid_schedule(problem: SlotProblem, grid: SlotGrid, solver: cp_model.CpSolver) -> Schedule:
    """The solution's computes in slot order, each extra output taken right after its op's first compute.

    Parameters
    ----------
    solver : CpSolver
        Holding a solution of ``grid.model``.

    Returns
    -------
    Schedule
        Values are freed after their last use (the simulator's default).
    """
    steps: list[Step] = []
    taken: set[int] = set()
    for t in range(grid.horizon):
        for v in grid.ops:
            if solver.BooleanValue(grid.compute[v][t]):
                steps.append(Step(op="compute", node=v))
                for extra, op in problem.output_of.items():
                    if op == v and extra not in taken:
                        steps.append(Step(op="compute", node=extra))
                        taken.add(extra)
    return Schedule(steps=tuple(steps))


def space_words(problem: SlotProblem, keep_order: bool, order_words: str = "graph.order") -> str:
    """The schedules a proof speaks about, in words.

    Parameters
    ----------
    order_words : str
        Names the order first computations keep.

    Returns
    -------
    str
    """
    if keep_order:
        return f"no schedule with first computations in {order_words}"
    if len(problem.graph.random_draws & set(problem.order)) > 1:
        return "no schedule in any order (random ops drawing in graph.order)"
    return "no schedule in any order"


# ==================================================================== asking the question
#: Share of the time limit spent asking whether any schedule of the space fits, when no warm start does.
FEASIBILITY_SHARE = 0.25
#: Above this many (node, slot) cells the feasibility model is not built (it would not be a proof in time).
FEASIBILITY_MAX_CELLS = 40_000
#: Seconds to build the feasibility model, per (node, slot) cell: 30,460 cells (a 20-node attention step's proof
#: horizon of 1,523 slots) took 2.27-2.66 s on the 2-core machine of BENCHMARKS.md (2026-11-30), where the question's
#: share of a 2.5 s limit is 0.625 s: built regardless, the solve overran its limit 1.5-2.6x.
FEASIBILITY_BUILD_S_PER_CELL = 90e-6


#: CP-SAT presolve steps left out of the feasibility question: on a 20-node attention step's proof grid (30,460 cells,
#: 138,554 implications) symmetry detection ran 1.4 s and the search for clauses that are exactly-one constraints
#: 2.3 s before the search began, neither checking the limit, so a solve given 1 s returned after 4.6-4.8 s; without
#: them 1.07 s (CP-SAT 9.15, 2026-11-30). The question asks for any schedule or a proof of none within a small share
#: of the time: a presolve longer than that share answers neither.
QUESTION_PRESOLVE: dict[str, Any] = {"symmetry_level": 0, "find_clauses_that_are_exactly_one": False}


@dataclass(frozen=True)
class CpSatParameters:
    """How the caller runs CP-SAT: workers, seed and any further solver parameters by name."""

    threads: int
    seed: int
    options: dict[str, Any]

    def solver(self, seconds: float) -> cp_model.CpSolver:
        """A CP-SAT solver with these parameters and a limit of ``seconds``, without the two presolve steps that
        do not stop at it (:data:`QUESTION_PRESOLVE`; the caller's parameters still override them)."""
        return cp_sat_solver(Deadline.after(seconds), self.threads, seed=self.seed, reserve=False,
                             parameters={**QUESTION_PRESOLVE, **self.options})


def check_feasibility(problem: SlotProblem, *, keep_order: bool, share_s: float, left_s: Callable[[], float],
                      parameters: CpSatParameters) -> tuple[FeasibilityCheck, Schedule | None]:
    """Ask CP-SAT whether any schedule of the space fits the hard capacity, within ``share_s`` seconds.

    Moccasin's capacity-relaxed model (minimise overflow) can spend the whole limit without proving
    that nothing fits just below the least peak; this question, with no objective, often settles
    it in a fraction of a second. After an INFEASIBLE answer the space's least peak is sought too.

    Parameters
    ----------
    keep_order : bool
        The space: first computations in ``problem.order``, or only the random draws.
    share_s : float
        Seconds for the question.
    left_s : callable
        The time the caller has left.

    Returns
    -------
    (check, schedule) : tuple
        What CP-SAT answered and, when it found one, a schedule of the grid (the caller simulates it).
    """
    check = FeasibilityCheck()
    limits, horizon = feasibility_horizon(problem)
    check.horizon = horizon
    cells = horizon * len(problem.order)
    if cells > FEASIBILITY_MAX_CELLS:
        check.reason = (f"skipped: a proof needs {horizon} slots x {len(problem.order)} nodes, above "
                        f"{FEASIBILITY_MAX_CELLS} cells")
        return check, None
    seconds = min(share_s, left_s())
    building = cells * FEASIBILITY_BUILD_S_PER_CELL
    if seconds - building < 0.05:
        check.reason = ("skipped: no time left" if seconds < 0.05 else
                        f"skipped: building its {cells} cells takes about {building:.1f} s of the {seconds:.1f} s "
                        "it has")
        return check, None
    build_start = time.perf_counter()
    grid = build_feasibility_model(problem, keep_order, horizon, limits, problem.capacity)
    seconds = min(seconds - (time.perf_counter() - build_start), left_s())  # the build spent the question's time
    if seconds < 0.05:
        check.reason = "skipped: its model took the time it had to build"
        return check, None
    solver = parameters.solver(seconds)
    started = time.perf_counter()
    status = solver.Solve(grid.model)
    check.wall_s = time.perf_counter() - started
    check.status = solver.StatusName(status)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return check, grid_schedule(problem, grid, solver)
    if status == cp_model.INFEASIBLE:
        _find_least_peak(problem, keep_order, min(share_s - check.wall_s, left_s()), parameters, check, limits)
    return check, None


def _find_least_peak(problem: SlotProblem, keep_order: bool, seconds: float, parameters: CpSatParameters,
                     check: FeasibilityCheck, limits: dict[int, int]) -> None:
    """After INFEASIBLE: the least peak of the space, so that the message can name a budget that fits.

    The same model minimises its largest step instead (from budget + 1, which is proven). Its
    optimum is a lower bound on the least peak (the model relaxes the space); it is exact when
    the simulator confirms the solution's schedule at that peak.
    """
    owned = problem.budget - problem.capacity
    most = sum(problem.mem.values()) + max(problem.workspace.values(), default=0)
    if seconds < 0.05 or problem.capacity + 1 > most:
        return
    grid = build_feasibility_model(problem, keep_order, check.horizon, limits, most)
    model_peak = grid.model.NewIntVar(problem.capacity + 1, most, "peak")
    for used in grid.memory:
        grid.model.Add(used <= model_peak)
    grid.model.Minimize(model_peak)
    solver = parameters.solver(seconds)
    status = solver.Solve(grid.model)
    if status != cp_model.OPTIMAL:
        return
    check.least_peak = owned + int(solver.Value(model_peak))
    sim = simulate(problem.graph, grid_schedule(problem, grid, solver))
    check.least_peak_exact = sim.peak == check.least_peak
