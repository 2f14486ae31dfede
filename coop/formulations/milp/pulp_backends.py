"""The PuLP backends of :func:`coop.formulations.milp.backends.solve_milp`: CBC (bundled; its bound parsed
from its log, rounded down, and a watchdog on its time limit), Gurobi and CPLEX where installed and licensed.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from decimal import Decimal, InvalidOperation
from functools import reduce
from pathlib import Path
from typing import Any

from coop.errors import SolverError
from coop.formulations.core.solver_output import solver_output
from coop.formulations.milp.model import LEAST_SOLVE_S, LinearModel, MilpSolution


def solve_pulp(model: LinearModel, name: str, time_limit: float, threads: int, verbose: bool) -> MilpSolution:
    """Solve ``model`` with a PuLP backend (CBC, Gurobi or CPLEX) within ``time_limit``.

    Parameters
    ----------
    name : str
        "cbc", "gurobi" or "cplex".
    time_limit : float
        Seconds, building and reading back the PuLP model included.
    threads : int
        The solver's threads.
    verbose : bool
        The solver's log on stderr (else discarded).

    Returns
    -------
    MilpSolution
        The backend's answer (``unknown`` when even the model could not be built in time).
    """
    import pulp

    started = _clock()
    deadline = started + time_limit
    if time_limit - _PULP_IO_S_PER_NONZERO * model.nonzeros < LEAST_SOLVE_S:  # not even the PuLP model in time
        return MilpSolution(status="unknown", message=f"{name}: time limit reached while building the model")
    options = _cbc_settings(model) if name == "cbc" else ()
    built = _pulp_problem(pulp, model, deadline)
    if built is None:
        return MilpSolution(status="unknown", message=(
            f"{name}: time limit reached while building the model (the PuLP model would not have been built and "
            f"written in the {time_limit:.0f} s left)"))
    problem, variables = built
    # Writing the PuLP model as MPS and reading the solution back count against the limit too: as much again as a
    # share of the time building it took (the same Python work per nonzero, slowed alike by a loaded machine)
    solver_deadline = deadline - _PULP_IO_PER_BUILD_S * (_clock() - started)
    log = _run_pulp(pulp, problem, name, solver_deadline, threads, verbose, bool(model.hint), options)
    if isinstance(log, MilpSolution):
        return log
    solution = _pulp_solution(pulp, problem, variables, model, name, log)
    if solution.status == "unknown" and ("Stopped on time" in log or _clock() >= solver_deadline):
        solution.message = f"{name}: no solution within the time limit (status {pulp.LpStatus[problem.status]})"
    return solution


def _pulp_problem(pulp: Any, model: LinearModel,
                  deadline: float = math.inf) -> tuple[Any, list[Any]] | None:
    """The model as a PuLP problem, and its variables in
    the model's order (hint values set); None as soon as the rows built so far show that building them all and
    writing them out (:data:`_PULP_IO_PER_BUILD_S`) would end past ``deadline`` (a ``_clock`` reading)."""
    build_started = _clock()
    problem = pulp.LpProblem("coop", pulp.LpMinimize)
    variables = []
    for index, (kind, lo, hi) in enumerate(zip(model.kinds, model.lower, model.upper)):
        category = {"binary": pulp.LpBinary, "integer": pulp.LpInteger}.get(kind, pulp.LpContinuous)
        lo_hi = {} if kind == "binary" else {"lowBound": lo, "upBound": hi}
        variable = problem.add_variable(f"x{index}", cat=category, **lo_hi)
        if kind == "binary" and (lo, hi) != (0.0, 1.0):  # PuLP sets binaries to [0, 1]: keep a fixing
            variable.lowBound, variable.upBound = lo, hi
        variables.append(variable)
    problem += pulp.LpAffineExpression([(variables[v], c) for v, c in model.objective])
    rows = len(model.rows)
    for index, (terms, sense, rhs) in enumerate(model.rows, start=1):
        expr = pulp.LpAffineExpression([(variables[v], c) for v, c in terms])
        problem += {"<=": expr <= rhs, ">=": expr >= rhs, "==": expr == rhs}[sense]
        if index % _ROWS_PER_CHECK == 0:
            projected = (_clock() - build_started) * rows / index * (1 + _PULP_IO_PER_BUILD_S)
            if build_started + projected > deadline:
                return None
    for var, value in model.hint.items():
        variables[var].setInitialValue(value)
    return problem, variables


def _run_pulp(pulp: Any, problem: Any, name: str, deadline: float, threads: int, verbose: bool, warm: bool,
              options: tuple[str, ...]) -> str | MilpSolution:
    """Solve ``problem`` in place until ``deadline`` (perf_counter); returns the solver's log, or the
    MilpSolution to report when no solve could be made (no time left, CBC overran and was stopped)."""
    time_limit = deadline - _clock()
    if time_limit < LEAST_SOLVE_S:
        return MilpSolution(status="unknown", message=f"{name}: time limit reached while building the model")
    with tempfile.TemporaryDirectory(prefix="coop-cbc-") as folder:
        log_path = os.path.join(folder, "solver.log")
        with warnings.catch_warnings():
            # PuLP 3.3 flags its bundled CBC as deprecated for 4.0; it is still the one shipped.
            warnings.simplefilter("ignore", DeprecationWarning)
            backend = _pulp_backend(pulp, name, time_limit, threads, verbose, warm, log_path, folder, options)
        solver_started = _clock()
        try:
            with solver_output(verbose):  # CBC writes to its log file; Gurobi and CPLEX to stdout
                problem.solve(backend)
        except pulp.PulpSolverError as exc:
            if name == "cbc" and _clock() - solver_started >= time_limit:
                return MilpSolution(status="unknown", message=(
                    f"cbc: no solution within the time limit (its root LP or preprocessing ran past its own "
                    f"{_cbc_seconds(time_limit):.0f} s limit and it was stopped at the deadline, {time_limit:.0f} s)"))
            raise SolverError(f"{name} failed to run: {str(exc).splitlines()[0]}") from None
        log = Path(log_path).read_text() if os.path.exists(log_path) else ""
    if verbose and log:
        print(log, file=sys.stderr, end="" if log.endswith("\n") else "\n", flush=True)
    return log


def _pulp_solution(pulp: Any, problem: Any, variables: list[Any], model: LinearModel, name: str,
                   log: str) -> MilpSolution:
    """The answer of a solved PuLP problem in the model's units; for CBC stopped early, the bound
    its log proves."""
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
        # One float lower (the log prints it rounded); CBC's bound may also lag behind its last incumbent.
        bound = min(math.nextafter(bound, -math.inf), objective)
    return MilpSolution(status=status, values=values, objective=objective, bound=bound)


#: CBC checks its -sec limit only between phases: a large model's root LP can run minutes past it.
#: CBC's own limit is this much (at most a tenth of the time) short of the deadline; a watchdog interrupts it at the
#: deadline and kills it ``_CBC_KILL_S`` later, so an overrunning CBC costs at most that past the limit.
_CBC_GRACE_S = 2.0
_CBC_KILL_S = 2
#: The least seconds per nonzero of building the PuLP model, writing it as MPS and reading the solution back (a
#: 1.1M-nonzero Checkmate model, quiet machine): a limit below it is not worth starting.
_PULP_IO_S_PER_NONZERO = 8e-6
#: Writing the MPS file and reading the solution back, per second of building the PuLP model. ResNet-50's Checkmate
#: model at 0.8 of its peak (2,265,559 nonzeros, load average 5.7 on 2 cores): built in 33.5 s (14.8 us per
#: nonzero), written in 19.5 s (ratio 0.58); the rest is the read-back. With a fixed 8 us per nonzero in its place,
#: `checkmate` at a 30 s limit took 38.1 s and at 45 s 51.7 s there.
_PULP_IO_PER_BUILD_S = 0.7
#: How often (in rows) building the PuLP model checks that it will end in time.
_ROWS_PER_CHECK = 2000
#: The clock of the deadlines above (tests substitute a fake one).
_clock = time.perf_counter


def _cbc_settings(model: LinearModel) -> tuple[str, ...]:
    """What CBC 2.10 (PuLP's bundled one) needs to answer exactly: its options. Each was found by bench_fuzz on a
    Checkmate model costed in seconds.

    * Its pre-processing claimed "optimal" for a schedule dearer than store-all's (it fixed
      variables wrongly; seed 7, graph 39), and "infeasible" when its time limit interrupted it
      (seed 5, graph 158), as in coin-or/Cbc issues 466, 737, 740: it is turned off.
    * Its absolute tolerances suit objectives near 1, not extra costs of 1e-4 seconds (also 30x faster on graph
      298): every backend gets a non-integral objective divided by its largest coefficient
      (:func:`coop.formulations.milp.backends.solve_milp`).
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
        return ("preprocess off", f"increment {0.9999 * step:g}")
    return ("preprocess off", "increment 0")


def _pulp_backend(pulp: Any, name: str, time_limit: float, threads: int, verbose: bool, warm: bool,
                  log_path: str, folder: str, options: tuple[str, ...] = ()) -> Any:
    if name == "cbc":
        bundled = pulp.PULP_CBC_CMD(msg=False).path
        watchdog = _cbc_watchdog(folder, bundled, time_limit)
        if watchdog is None:
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, threads=threads, warmStart=warm,
                                     logPath=log_path, options=list(options))
        return pulp.COIN_CMD(path=watchdog, msg=False, timeLimit=_cbc_seconds(time_limit), threads=threads,
                             warmStart=warm, logPath=log_path, options=list(options))
    candidates = {"gurobi": ("GUROBI", "GUROBI_CMD"), "cplex": ("CPLEX_PY", "CPLEX_CMD")}[name]
    for class_name in candidates:
        backend = getattr(pulp, class_name)(msg=verbose, timeLimit=time_limit, threads=threads, warmStart=warm)
        if backend.available():
            return backend
    raise SolverError(f"{name} is not available (not installed or not licensed); use cbc, scip, highs or cp-sat")


def _cbc_seconds(time_limit: float) -> float:
    """CBC's own ``-sec`` limit under the watchdog: ``time_limit`` less the grace (at most a tenth of it)."""
    return time_limit - min(_CBC_GRACE_S, 0.1 * time_limit)


def _cbc_watchdog(folder: str, cbc_path: str, hard_limit: float) -> str | None:
    """A script that runs CBC under coreutils' ``timeout`` (SIGINT at ``hard_limit``, SIGKILL ``_CBC_KILL_S`` later).

    ``--preserve-status`` keeps CBC's own exit code, so an interrupted CBC that still writes its
    incumbent is read as usual. None where ``timeout`` is missing (CBC then runs unguarded).
    """
    timeout = shutil.which("timeout")
    if timeout is None or os.name != "posix":
        return None
    script = Path(folder) / "cbc-watchdog"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(timeout)} --preserve-status -k {_CBC_KILL_S} -s INT {hard_limit:.1f} '
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
