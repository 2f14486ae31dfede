"""Solver plumbing for 0-1 linear programs: one small model, several backends.

A formulation builds a :class:`LinearModel` (variables, linear constraints, a linear objective
to minimise, optional hint values) once; :func:`solve_milp` hands it to the chosen backend and
:func:`solve_lp_relaxation` solves its continuous relaxation. Backends:

* ``cbc``: PuLP's bundled CBC (command line; bound parsed from its log, rounded down);
* ``scip``, ``highs``: OR-Tools' ``pywraplp`` (never ``highspy``: it clashes with OR-Tools);
* ``cp-sat``: OR-Tools' CP-SAT; every constraint coefficient must be an integer;
* ``gurobi``, ``cplex``: through PuLP when the user has them installed and licensed.

Statuses follow :data:`coop.formulations.core.result.SolveStatus`: ``optimal`` only when proven,
``feasible`` when stopped with an incumbent, ``infeasible`` when proven, ``unknown`` otherwise.
A bound is a proven lower bound or None, never an estimate.

Solvers' own logs never reach stdout, which carries coop's output (``coop solve --json``): they
are discarded, or sent to stderr with ``verbose=True``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

from coop.errors import SolverError
from coop.formulations.core.deadline import cp_sat_with_limit
from coop.formulations.core.progress import ProgressCallback, ProgressClock
from coop.formulations.core.solver_output import solver_output
from coop.formulations.milp.model import LEAST_SOLVE_S, MILP_SOLVERS, LinearModel, MilpSolution
from coop.formulations.milp.pulp_backends import solve_pulp


def solve_milp(
    model: LinearModel,
    solver: str = "cbc",
    *,
    time_limit: float = 60.0,
    threads: int = 2,
    progress: ProgressCallback | None = None,
    verbose: bool = False,
) -> MilpSolution:
    """Solve the model with one backend; ``time_limit`` in seconds, ``threads`` worker threads.

    Parameters
    ----------
    solver : str
        The backend, one of :data:`MILP_SOLVERS` (case and ``_`` / ``-`` are not told apart;
        "cpsat" is "cp-sat").
    time_limit : float
        Seconds; at most 0 reports "unknown" without solving.
    progress : ProgressCallback or None
        Told (through a ProgressClock) the model's size, CP-SAT's progress while it solves, and the
        final objective, bound and status.
    verbose : bool
        Let the backend print its log.

    Returns
    -------
    MilpSolution
        The status, values, objective and bound (the model's objective constant added; an optimal
        solution's bound is its objective when the backend gives none) and the wall time.

    Raises
    ------
    SolverError
        When ``solver`` names no backend.
    """
    name = solver.lower().replace("_", "-")
    if name == "cpsat":
        name = "cp-sat"
    if name not in MILP_SOLVERS:
        raise SolverError(f"unknown MILP solver {solver!r}: choose one of {', '.join(MILP_SOLVERS)}")
    clock = ProgressClock(progress)
    clock.report(message=f"{name}: {model.num_vars} variables, {len(model.rows)} constraints")
    scaled, objective_scale = _objective_scaled(model)
    if time_limit <= 0:
        result = MilpSolution(status="unknown", message=f"{name}: time limit reached while building the model")
    elif name == "cp-sat":
        result = _solve_cp_sat(scaled, time_limit, threads, clock, verbose, objective_scale,
                               model.objective_constant)
    elif name in ("scip", "highs"):
        result = _solve_pywraplp(scaled, name.upper(), time_limit, threads, integer=True, verbose=verbose)
    else:
        result = solve_pulp(scaled, name, time_limit, threads, verbose)
    result.wall_s = clock.elapsed_s
    if result.objective is not None:
        result.objective *= objective_scale
    if result.bound is not None:
        result.bound *= objective_scale
    _add_constant(result, model.objective_constant)
    if result.status == "optimal" and result.bound is None:
        result.bound = result.objective
    clock.report(result.objective, result.bound, f"{name}: {result.status}", final=True)
    return result


def _objective_scaled(model: LinearModel) -> tuple[LinearModel, float]:
    """The model with its objective divided by its largest absolute coefficient (constant dropped), and that factor.

    Formulations price compute in seconds: a captured step's costs are 1e-7 to 1e-4, the magnitude of a MIP
    solver's own tolerances (HiGHS' dual feasibility tolerance is 1e-7), so the solver's relaxations round
    reduced costs to zero and prune with wrong bounds. On a 34-node MLP step's Checkmate model HiGHS returned
    "optimal" at 28.4 % overhead where the optimum (proven once the objective was rescaled, and found by CBC) is
    9.6 %; CBC, which already divided its own objective so, stopped at a 5.7 % gap after 28 s on that optimum. The
    optimum and the solution are the same after the scaling; the objective and bound a backend returns are
    multiplied back.
    """
    largest = max((abs(c) for _, c in model.objective), default=0.0)
    if largest == 0.0 or all(float(c).is_integer() for _, c in model.objective):
        # integral costs (hand-built graphs, CP-SAT's own models) are far from the tolerances, and CBC and CP-SAT
        # use their integrality (:func:`coop.formulations.milp.pulp_backends._cbc_settings`)
        return dataclasses.replace(model, objective_constant=0.0), 1.0
    scaled = dataclasses.replace(model, objective=[(v, c / largest) for v, c in model.objective],
                                 objective_constant=0.0)
    return scaled, largest


#: LP backends in the order tried: HiGHS' simplex first, as it solves the scaled Checkmate
#: relaxations of captured transformers where GLOP and PDLP run out of time.
LP_BACKENDS = ("HIGHS", "GLOP", "PDLP")
#: Loading a model through pywraplp, measured on Checkmate models of fuzzed graphs (3.6-3.9 us).
_PYWRAPLP_LOAD_S_PER_NONZERO = 4e-6


def _least_useful_seconds(model: LinearModel, load_s_per_nonzero: float) -> float:
    """Below this many seconds left, starting a solve is pointless: loading the model alone takes longer."""
    return LEAST_SOLVE_S + load_s_per_nonzero * model.nonzeros


def solve_lp_relaxation(
    model: LinearModel,
    *,
    time_limit: float = 60.0,
    threads: int = 2,
    backends: tuple[str, ...] = LP_BACKENDS,
    verbose: bool = False,
) -> MilpSolution:
    """The continuous relaxation (integrality dropped), rescaled, tried with each backend in turn.

    Memory rows carry bytes (~1e6) and the objective seconds (~1e-6): unscaled, simplex codes
    stall or give up (HiGHS returned "unknown" on a captured transformer). The model is solved
    in scaled form (:func:`_scaled_for_lp`: bounded continuous columns to [0, 1], each row and
    the objective divided by their largest coefficient), which is exact: the values and objective
    returned are mapped back.

    Parameters
    ----------
    model : LinearModel
        The MILP whose relaxation is solved.
    time_limit : float
        Seconds shared by the backends; a backend is not started when too little is left.
    backends : tuple of str
        The pywraplp backends to try, in order.
    verbose : bool
        Let the backends print their logs.

    Returns
    -------
    MilpSolution
        The first backend's that proves optimality (values and objective mapped back, bound equal
        to the objective) or infeasibility; otherwise status ``unknown``. The message lists each
        attempt (an optimal one: the last).
    """
    start = time.perf_counter()
    scaled, column_scale, objective_scale = _scaled_for_lp(model)
    attempts: list[str] = []
    result = MilpSolution(status="unknown")
    least_useful = _least_useful_seconds(scaled, _PYWRAPLP_LOAD_S_PER_NONZERO)
    for backend in backends:
        remaining = time_limit - (time.perf_counter() - start)
        if remaining < least_useful:
            attempts.append(f"{backend} not started (time limit)")
            continue
        result = _solve_pywraplp(scaled, backend, remaining, threads, integer=False, verbose=verbose)
        attempts.append(f"{backend}: {result.status}" + (f" ({result.message})" if result.message else ""))
        if result.status in ("optimal", "infeasible"):
            break
    if result.status != "optimal":
        result = MilpSolution(status="infeasible" if result.status == "infeasible" else "unknown",
                              message="; ".join(attempts))
    else:
        assert result.values is not None and result.objective is not None
        result.values = [value * scale for value, scale in zip(result.values, column_scale)]
        result.objective *= objective_scale
        result.bound = result.objective
        result.message = attempts[-1]
    result.wall_s = time.perf_counter() - start
    _add_constant(result, model.objective_constant)
    return result


def _scaled_for_lp(model: LinearModel) -> tuple[LinearModel, list[float], float]:
    """An equivalent LP with sane magnitudes, and the scales that map its solution back.

    A continuous variable with upper bound u > 1 becomes x' = x / u in [0, 1]; then each row and
    the objective are divided by their largest absolute coefficient. Returns the scaled model,
    the per-variable factor (x = factor * x') and the objective factor.
    """
    column_scale = [
        upper if kind == "continuous" and math.isfinite(upper) and upper > 1 else 1.0
        for kind, upper in zip(model.kinds, model.upper)
    ]
    scaled = LinearModel(
        kinds=["continuous"] * model.num_vars,
        lower=[lo / scale for lo, scale in zip(model.lower, column_scale)],
        upper=[hi / scale for hi, scale in zip(model.upper, column_scale)],
        names=list(model.names),
    )
    for terms, sense, rhs in model.rows:
        column_scaled = [(v, c * column_scale[v]) for v, c in terms]
        largest = max((abs(c) for _, c in column_scaled), default=0.0) or 1.0
        scaled.rows.append(([(v, c / largest) for v, c in column_scaled], sense, rhs / largest))
    objective_scale = max((abs(c) for _, c in model.objective), default=0.0) or 1.0
    scaled.objective = [(v, c * column_scale[v] / objective_scale) for v, c in model.objective]
    return scaled, column_scale, objective_scale


def _add_constant(result: MilpSolution, constant: float) -> None:
    """Backends see the objective without its constant term; add it back."""
    if result.objective is not None:
        result.objective += constant
    if result.bound is not None:
        result.bound += constant


# -------------------------------------------------------------------- OR-Tools pywraplp
def _solve_pywraplp(model: LinearModel, backend: str, time_limit: float, threads: int, *, integer: bool,
                    verbose: bool) -> MilpSolution:
    """One pywraplp solve, its native output kept off stdout (see :func:`_solver_output`)."""
    with solver_output(verbose):
        return _solve_pywraplp_here(model, backend, time_limit, threads, integer=integer, verbose=verbose)


def _solve_pywraplp_here(model: LinearModel, backend: str, time_limit: float, threads: int, *, integer: bool,
                         verbose: bool) -> MilpSolution:
    from ortools.linear_solver import pywraplp

    started = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise SolverError(f"OR-Tools was built without {backend}; choose another solver (cbc, scip, highs, cp-sat)")
    if verbose:
        solver.EnableOutput()
    infinity = solver.infinity()
    variables = []
    for kind, lo, hi, name in zip(model.kinds, model.lower, model.upper, model.names):
        if integer and kind != "continuous":
            variables.append(solver.IntVar(lo, hi, name))
        else:
            variables.append(solver.NumVar(lo, hi, name))
    for terms, sense, rhs in model.rows:
        lo, hi = {"<=": (-infinity, rhs), ">=": (rhs, infinity), "==": (rhs, rhs)}[sense]
        row = solver.RowConstraint(lo, hi, "")
        for var, coef in terms:
            row.SetCoefficient(variables[var], coef)
    objective = solver.Objective()
    for var, coef in model.objective:
        objective.SetCoefficient(variables[var], objective.GetCoefficient(variables[var]) + coef)
    objective.SetMinimization()
    # OR-Tools 9.15's HiGHS crashes the process (SIGSEGV) on any SetHint: HiGHS solves without one.
    if integer and model.hint and backend.upper() != "HIGHS":
        solver.SetHint([variables[v] for v in model.hint], list(model.hint.values()))
    # Loading a large model through the wrapper takes seconds: they count against the limit too.
    left = time_limit - (time.perf_counter() - started)
    solver.SetTimeLimit(max(1, int(left * 1000)))
    if threads > 1:
        solver.SetNumThreads(threads)
    code = solver.Solve()
    status = {
        pywraplp.Solver.OPTIMAL: "optimal",
        pywraplp.Solver.FEASIBLE: "feasible",
        pywraplp.Solver.INFEASIBLE: "infeasible",
    }.get(code, "unknown")
    if status not in ("optimal", "feasible"):
        return MilpSolution(status=status, message=f"{backend} returned status {code}")
    values = [v.solution_value() for v in variables]
    value = objective.Value()
    bound: float | None = None
    if integer:
        best = objective.BestBound()
        bound = best if math.isfinite(best) else None
    if status == "optimal":
        bound = value
    return MilpSolution(status=status, values=values, objective=value, bound=bound)


# -------------------------------------------------------------------- CP-SAT
def _solve_cp_sat(model: LinearModel, time_limit: float, threads: int, clock: ProgressClock,
                  verbose: bool, objective_scale: float = 1.0, constant: float = 0.0) -> MilpSolution:
    """CP-SAT on ``model``; progress reports its incumbents as ``objective * objective_scale + constant``."""
    from ortools.sat.python import cp_model

    cp = cp_model.CpModel()
    variables = []
    for kind, lo, hi, name in zip(model.kinds, model.lower, model.upper, model.names):
        if kind == "binary":
            variables.append(cp.new_bool_var(name))
            if hi < 1 or lo > 0:  # a binary fixed by its bounds (e.g. checkmate's cost_limit)
                cp.add(variables[-1] == (1 if lo > 0 else 0))
        else:
            if lo != int(lo) or hi != int(hi):
                raise SolverError(f"cp-sat needs integer bounds; variable {name} has [{lo}, {hi}]")
            variables.append(cp.new_int_var(int(lo), int(hi), name))
    for terms, sense, rhs in model.rows:
        if any(c != int(c) for _, c in terms) or rhs != int(rhs):
            raise SolverError("cp-sat needs integer constraint coefficients; scale the model to integers first")
        expr = sum(int(c) * variables[v] for v, c in terms)
        if sense == "<=":
            cp.add(expr <= int(rhs))
        elif sense == ">=":
            cp.add(expr >= int(rhs))
        else:
            cp.add(expr == int(rhs))
    cp.minimize(sum(c * variables[v] for v, c in model.objective))
    for var, value in model.hint.items():
        cp.add_hint(variables[var], round(value))
    # CP-SAT's log goes through a Python callback to stderr: stdout carries coop's own output.
    solver = cp_sat_with_limit(time_limit, threads, parameters={"log_search_progress": verbose,
                                                                 "log_to_stdout": False})
    if verbose:
        solver.log_callback = lambda line: print(line, file=sys.stderr, flush=True)

    class _Reporter(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            clock.report(self.objective_value * objective_scale + constant,
                         self.best_objective_bound * objective_scale + constant, "cp-sat: new incumbent")

    code = solver.solve(cp, _Reporter())
    status = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
    }.get(code, "unknown")
    if status not in ("optimal", "feasible"):
        return MilpSolution(status=status, message=f"cp-sat returned {solver.status_name(code)}")
    values = [float(solver.value(v)) for v in variables]
    return MilpSolution(status=status, values=values, objective=solver.objective_value,
                        bound=solver.best_objective_bound)


__all__ = ["LP_BACKENDS", "MILP_SOLVERS", "LinearModel", "MilpSolution", "solve_lp_relaxation", "solve_milp"]
