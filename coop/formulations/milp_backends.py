"""Solver plumbing for 0-1 linear programs: one small model, several backends.

A formulation builds a :class:`LinearModel` (variables, linear constraints, a linear objective
to minimise, optional hint values) once; :func:`solve_milp` hands it to the chosen backend and
:func:`solve_lp_relaxation` solves its continuous relaxation. Backends:

* ``cbc``: PuLP's bundled CBC (command line; bound parsed from its log, rounded down);
* ``scip``, ``highs``: OR-Tools' ``pywraplp`` (never ``highspy``: it clashes with OR-Tools);
* ``cp-sat``: OR-Tools' CP-SAT; every constraint coefficient must be an integer;
* ``gurobi``, ``cplex``: through PuLP when the user has them installed and licensed.

Statuses follow :data:`coop.formulations.result.SolveStatus`: ``optimal`` only when proven,
``feasible`` when stopped with an incumbent, ``infeasible`` when proven, ``unknown`` otherwise.
A bound is a proven lower bound or None, never an estimate.

Solvers' own logs never reach stdout, which carries coop's output (``coop solve --json``): they
are discarded, or sent to stderr with ``verbose=True``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import reduce
from pathlib import Path
from typing import Any, Literal

from coop.errors import SolverError
from coop.formulations.progress import ProgressCallback, ProgressClock

VarKind = Literal["binary", "integer", "continuous"]
Sense = Literal["<=", ">=", "=="]
Terms = list[tuple[int, float]]

MILP_SOLVERS = ("cbc", "scip", "highs", "cp-sat", "gurobi", "cplex")


@dataclass
class LinearModel:
    """A minimisation problem: ``min c.x`` subject to ``a.x (<=|>=|==) b`` and variable bounds."""

    kinds: list[VarKind] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows: list[tuple[Terms, Sense, float]] = field(default_factory=list)
    objective: Terms = field(default_factory=list)
    objective_constant: float = 0.0
    hint: dict[int, float] = field(default_factory=dict)

    @property
    def num_vars(self) -> int:
        return len(self.kinds)

    def add_var(self, name: str, kind: VarKind = "binary", lower: float = 0.0, upper: float = 1.0) -> int:
        """A new variable; returns its index."""
        self.kinds.append(kind)
        self.lower.append(lower)
        self.upper.append(upper)
        self.names.append(name)
        return len(self.kinds) - 1

    def add_row(self, terms: Terms, sense: Sense, rhs: float) -> None:
        """The constraint ``sum(coef * x[var]) sense rhs`` (terms on one variable are merged)."""
        merged: dict[int, float] = {}
        for var, coef in terms:
            merged[var] = merged.get(var, 0.0) + coef
        self.rows.append(([(v, c) for v, c in merged.items() if c != 0], sense, rhs))

    @property
    def nonzeros(self) -> int:
        """Constraint coefficients: what loading the model into a solver costs time in proportion to."""
        return sum(len(terms) for terms, _, _ in self.rows)


@dataclass
class MilpSolution:
    """A backend's answer: status, variable values (None without a solution), objective and bound."""

    status: str
    values: list[float] | None = None
    objective: float | None = None
    bound: float | None = None
    wall_s: float = 0.0
    message: str = ""


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
    model : LinearModel
        The MILP.
    solver : str
        The backend, one of :data:`MILP_SOLVERS` (case and ``_`` / ``-`` are not told apart;
        "cpsat" is "cp-sat").
    time_limit : float
        Seconds; at most 0 reports "unknown" without solving.
    threads : int
        Worker threads.
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
    if time_limit <= 0:
        result = MilpSolution(status="unknown", message=f"{name}: time limit reached while building the model")
    elif name == "cp-sat":
        result = _solve_cp_sat(model, time_limit, threads, clock, verbose)
    elif name in ("scip", "highs"):
        result = _solve_pywraplp(model, name.upper(), time_limit, threads, integer=True, verbose=verbose)
    else:
        result = _solve_pulp(model, name, time_limit, threads, verbose)
    result.wall_s = clock.elapsed_s
    _add_constant(result, model.objective_constant)
    if result.status == "optimal" and result.bound is None:
        result.bound = result.objective
    clock.report(result.objective, result.bound, f"{name}: {result.status}", final=True)
    return result


#: LP backends in the order tried: HiGHS' simplex first, as it solves the scaled Checkmate
#: relaxations of captured transformers where GLOP and PDLP run out of time.
LP_BACKENDS = ("HIGHS", "GLOP", "PDLP")
#: A solve is not started with less time left than loading the model takes plus this much (a
#: few milliseconds solve a tiny model; the solver gets what is left, not this).
_LEAST_SOLVE_S = 0.005
#: Loading a model through pywraplp, measured on Checkmate models of fuzzed graphs (3.6-3.9 us).
_PYWRAPLP_LOAD_S_PER_NONZERO = 4e-6


def _least_useful_seconds(model: LinearModel, load_s_per_nonzero: float) -> float:
    """Below this many seconds left, starting a solve is pointless: loading the model alone takes longer."""
    return _LEAST_SOLVE_S + load_s_per_nonzero * model.nonzeros


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
    threads : int
        Worker threads.
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


def _nowhere_or_stderr(verbose: bool) -> int:
    """A new file descriptor: stderr's when ``verbose``, else /dev/null's."""
    return os.dup(2) if verbose else os.open(os.devnull, os.O_WRONLY)


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers, so that what a solver printf'd lands where it was meant to."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to speak to (e.g. Windows): nothing buffered there
        pass


class _StdoutGuard:
    """Descriptor 1 redirected while any solver runs (threads may overlap), restored after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: int | None = None

    def enter(self, verbose: bool) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            try:
                sys.stdout.flush()
                _flush_c_stdio()
                self.saved = os.dup(1)
                target = _nowhere_or_stderr(verbose)
                os.dup2(target, 1)
                os.close(target)
            except (OSError, ValueError, AttributeError):  # no descriptor 1 (a closed or replaced stdout): nothing to guard
                self.saved = None

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.saved is not None:
                _flush_c_stdio()
                os.dup2(self.saved, 1)
                os.close(self.saved)
                self.saved = None


_STDOUT_GUARD = _StdoutGuard()


@contextlib.contextmanager
def _solver_output(verbose: bool) -> Iterator[None]:
    """Keep a native solver's output off stdout while it runs: to stderr when ``verbose``, else discarded.

    HiGHS prints its banner through OR-Tools whatever the options say, and SCIP and CP-SAT log to
    file descriptor 1 from C++: only redirecting the descriptor keeps ``coop solve --json``'s
    stdout pure JSON.
    """
    _STDOUT_GUARD.enter(verbose)
    try:
        yield
    finally:
        _STDOUT_GUARD.leave()


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
    with _solver_output(verbose):
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
                  verbose: bool) -> MilpSolution:
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
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.log_search_progress = verbose
    # CP-SAT's log goes through a Python callback to stderr: stdout carries coop's own output.
    solver.parameters.log_to_stdout = False
    if verbose:
        solver.log_callback = lambda line: print(line, file=sys.stderr, flush=True)

    class _Reporter(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            constant = model.objective_constant
            clock.report(self.objective_value + constant, self.best_objective_bound + constant, "cp-sat: new incumbent")

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


# -------------------------------------------------------------------- PuLP (CBC, Gurobi, CPLEX)
def _solve_pulp(model: LinearModel, name: str, time_limit: float, threads: int, verbose: bool) -> MilpSolution:
    import pulp

    started = time.perf_counter()
    if time_limit - _PULP_IO_S_PER_NONZERO * model.nonzeros < _LEAST_SOLVE_S:  # not even the PuLP model in time
        return MilpSolution(status="unknown", message=f"{name}: time limit reached while building the model")
    objective_scale, options = _cbc_settings(model) if name == "cbc" else (1.0, ())
    problem, variables = _pulp_problem(pulp, model, objective_scale)
    # Building the PuLP model, writing it as MPS and reading the solution back take seconds on
    # large models (about 8 us per nonzero, measured on a 1.1M-nonzero Checkmate model): they
    # count against the limit.
    deadline = started + time_limit - _PULP_IO_S_PER_NONZERO * model.nonzeros
    log = _run_pulp(pulp, problem, name, deadline, threads, verbose, bool(model.hint), options)
    if isinstance(log, MilpSolution):
        return log
    return _pulp_solution(pulp, problem, variables, model, name, log, objective_scale)


def _pulp_problem(pulp: Any, model: LinearModel, objective_scale: float) -> tuple[Any, list[Any]]:
    """The model as a PuLP problem (objective divided by ``objective_scale``), and its variables in
    the model's order (hint values set)."""
    problem = pulp.LpProblem("coop", pulp.LpMinimize)
    variables = []
    for index, (kind, lo, hi) in enumerate(zip(model.kinds, model.lower, model.upper)):
        category = {"binary": pulp.LpBinary, "integer": pulp.LpInteger}.get(kind, pulp.LpContinuous)
        lo_hi = {} if kind == "binary" else {"lowBound": lo, "upBound": hi}
        variable = problem.add_variable(f"x{index}", cat=category, **lo_hi)
        if kind == "binary" and (lo, hi) != (0.0, 1.0):  # PuLP sets binaries to [0, 1]: keep a fixing
            variable.lowBound, variable.upBound = lo, hi
        variables.append(variable)
    problem += pulp.LpAffineExpression([(variables[v], c / objective_scale) for v, c in model.objective])
    for terms, sense, rhs in model.rows:
        expr = pulp.LpAffineExpression([(variables[v], c) for v, c in terms])
        problem += {"<=": expr <= rhs, ">=": expr >= rhs, "==": expr == rhs}[sense]
    for var, value in model.hint.items():
        variables[var].setInitialValue(value)
    return problem, variables


def _run_pulp(pulp: Any, problem: Any, name: str, deadline: float, threads: int, verbose: bool, warm: bool,
              options: tuple[str, ...]) -> str | MilpSolution:
    """Solve ``problem`` in place until ``deadline`` (perf_counter); returns the solver's log, or the
    MilpSolution to report when no solve could be made (no time left, CBC overran and was stopped)."""
    time_limit = deadline - time.perf_counter()
    if time_limit < _LEAST_SOLVE_S:
        return MilpSolution(status="unknown", message=f"{name}: time limit reached while building the model")
    with tempfile.TemporaryDirectory(prefix="coop-cbc-") as folder:
        log_path = os.path.join(folder, "solver.log")
        with warnings.catch_warnings():
            # PuLP 3.3 flags its bundled CBC as deprecated for 4.0; it is still the one shipped.
            warnings.simplefilter("ignore", DeprecationWarning)
            backend = _pulp_backend(pulp, name, time_limit, threads, verbose, warm, log_path, folder, options)
        solver_started = time.perf_counter()
        try:
            with _solver_output(verbose):  # CBC writes to its log file; Gurobi and CPLEX to stdout
                problem.solve(backend)
        except pulp.PulpSolverError as exc:
            if name == "cbc" and time.perf_counter() - solver_started >= time_limit + _CBC_GRACE_S:
                return MilpSolution(status="unknown", message=(
                    f"cbc: no solution within the time limit (it overran {time_limit:.0f} s in its root LP or "
                    f"preprocessing and was stopped {_CBC_GRACE_S:.0f} s later)"))
            raise SolverError(f"{name} failed to run: {str(exc).splitlines()[0]}") from None
        log = Path(log_path).read_text() if os.path.exists(log_path) else ""
    if verbose and log:
        print(log, file=sys.stderr, end="" if log.endswith("\n") else "\n", flush=True)
    return log


def _pulp_solution(pulp: Any, problem: Any, variables: list[Any], model: LinearModel, name: str, log: str,
                   objective_scale: float) -> MilpSolution:
    """The answer of a solved PuLP problem in the model's units; for CBC stopped early, the bound
    its log proves (CBC saw the objective divided by ``objective_scale``)."""
    has_solution = problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if problem.status == pulp.LpStatusInfeasible:
        return MilpSolution(status="infeasible", message=f"{name}: proven infeasible")
    if not has_solution:
        return MilpSolution(status="unknown", message=f"{name}: no solution ({pulp.LpStatus[problem.status]})")
    values = [v.varValue if v.varValue is not None else 0.0 for v in variables]
    objective = math.fsum(c * values[v] for v, c in model.objective)
    proven = problem.sol_status == pulp.LpSolutionOptimal and "Stopped on time" not in log
    status = "optimal" if proven else "feasible"
    bound = objective if proven else _cbc_bound(log)
    if bound is not None and not proven:
        # Back to the model's units, one float lower (the product rounds); CBC's bound may also
        # lag behind its last incumbent.
        bound = min(math.nextafter(bound * objective_scale, -math.inf), objective)
    return MilpSolution(status=status, values=values, objective=objective, bound=bound)


#: CBC checks its -sec limit only between phases: a large model's root LP can run minutes past it.
#: A watchdog interrupts it this long after the limit, and kills it a few seconds later.
_CBC_GRACE_S = 2.0
_PULP_IO_S_PER_NONZERO = 8e-6


def _cbc_settings(model: LinearModel) -> tuple[float, tuple[str, ...]]:
    """What CBC 2.10 (PuLP's bundled one) needs to answer exactly: the factor its objective is
    divided by, and its options. Each was found by bench_fuzz on a Checkmate model costed in seconds.

    * Its pre-processing claimed "optimal" for a schedule dearer than store-all's (it fixed
      variables wrongly; seed 7, graph 39), and "infeasible" when its time limit interrupted it
      (seed 5, graph 158), as in coin-or/Cbc issues 466, 737, 740: it is turned off.
    * Its absolute tolerances suit objectives near 1, not extra costs of 1e-4 seconds: a
      non-integral objective is divided by its largest coefficient (also 30x faster on graph 298).
    * It prunes every node that cannot beat the incumbent by its cutoff increment, 1e-5 by
      default: it called a schedule optimal that was 9e-6 dearer than the optimum (seed 5, graph
      153). The increment is 0, or, when every objective term is an integer coefficient on an
      integer variable (objective values are then multiples of the coefficients' gcd, what CBC
      itself assumes when it detects this), just under that gcd.
    """
    coefficients = [c for _, c in model.objective if c]
    integral = all(float(c).is_integer() and model.kinds[v] != "continuous" for v, c in model.objective if c)
    if coefficients and integral:
        step = reduce(math.gcd, (abs(int(c)) for c in coefficients))
        return 1.0, ("preprocess off", f"increment {0.9999 * step:g}")
    scale = max((abs(c) for c in coefficients), default=1.0)
    return scale, ("preprocess off", "increment 0")


def _pulp_backend(pulp: Any, name: str, time_limit: float, threads: int, verbose: bool, warm: bool,
                  log_path: str, folder: str, options: tuple[str, ...] = ()) -> Any:
    if name == "cbc":
        bundled = pulp.PULP_CBC_CMD(msg=False).path
        watchdog = _cbc_watchdog(folder, bundled, time_limit + _CBC_GRACE_S)
        if watchdog is None:
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, threads=threads, warmStart=warm,
                                     logPath=log_path, options=list(options))
        return pulp.COIN_CMD(path=watchdog, msg=False, timeLimit=time_limit, threads=threads, warmStart=warm,
                             logPath=log_path, options=list(options))
    candidates = {"gurobi": ("GUROBI", "GUROBI_CMD"), "cplex": ("CPLEX_PY", "CPLEX_CMD")}[name]
    for class_name in candidates:
        backend = getattr(pulp, class_name)(msg=verbose, timeLimit=time_limit, threads=threads, warmStart=warm)
        if backend.available():
            return backend
    raise SolverError(f"{name} is not available (not installed or not licensed); use cbc, scip, highs or cp-sat")


def _cbc_watchdog(folder: str, cbc_path: str, hard_limit: float) -> str | None:
    """A script that runs CBC under coreutils' ``timeout`` (SIGINT at ``hard_limit``, SIGKILL 3 s later).

    ``--preserve-status`` keeps CBC's own exit code, so an interrupted CBC that still writes its
    incumbent is read as usual. None where ``timeout`` is missing (CBC then runs unguarded).
    """
    timeout = shutil.which("timeout")
    if timeout is None or os.name != "posix":
        return None
    script = Path(folder) / "cbc-watchdog"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(timeout)} --preserve-status -k 3 -s INT {hard_limit:.1f} '
                      f'{shlex.quote(cbc_path)} "$@"\n')
    script.chmod(0o755)
    return str(script)


#: CBC's search messages: "Partial search - best objective X (best possible Y), ..." (Cbc0005I, the main
#: model's end of search) and "After N nodes, ..., best possible Y (...)" (Cbc0010I, while it searches).
_CBC_BEST_POSSIBLE = re.compile(r"^Cbc00(?:05|10)I .*best possible ([-+0-9.eE]+)", re.MULTILINE)
#: The result summary: "Lower bound: Y", printed with "%.3f" (0.00095 shows as 0.001).
_CBC_LOWER_BOUND = re.compile(r"^Lower bound:\s*([-+0-9.eE]+)", re.MULTILINE)
#: CBC's "no bound yet" is about -1e50.
_CBC_NO_BOUND = 1e40


def _cbc_bound(log: str) -> float | None:
    """The lower bound CBC proved when stopped early, read from its log; None when it printed none.

    The search messages carry more digits than the summary's three decimals, so the last of them
    is preferred. A printed number is rounded; :func:`_printed_lower_bound` lowers it by half a
    unit in its last digit, so that the print can never lift the bound above what CBC proved (the
    summary's 0.001 for a proven 0.00095467587 did, above the optimum 0.000954676).
    """
    found = _CBC_BEST_POSSIBLE.findall(log) or _CBC_LOWER_BOUND.findall(log)
    if not found:
        return None
    bound = _printed_lower_bound(found[-1])
    return bound if bound is not None and abs(bound) < _CBC_NO_BOUND else None


def _printed_lower_bound(text: str) -> float | None:
    """A float no larger than any real number that prints as ``text`` (rounded to nearest at its digits).

    printf rounds to nearest, so the number printed lies within half a unit of the last digit:
    that much lower, and one float lower still (the conversion to binary rounds too), is safe.
    """
    try:
        printed = Decimal(text)
    except InvalidOperation:
        return None
    if not printed.is_finite():
        return None
    half_unit = Decimal(5).scaleb(printed.as_tuple().exponent - 1)  # type: ignore[operator]
    return math.nextafter(float(printed - half_unit), -math.inf)


__all__ = ["LP_BACKENDS", "MILP_SOLVERS", "LinearModel", "MilpSolution", "solve_lp_relaxation", "solve_milp"]
