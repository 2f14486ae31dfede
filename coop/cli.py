"""The ``coop`` command: capture, info, solve, validate and plot.

Every command is a small function over the shared ground floor (coop.graph, coop.schedule,
coop.budget, coop.formulations); none re-implements memory accounting. Every command takes
``--json`` for machine-readable output on stdout. Errors are one line on stderr,
``coop: error: ...``, never a traceback:

- exit 0: success (a schedule within the budget, a valid schedule);
- exit 1: a negative verdict (no schedule within the budget, an invalid schedule);
- exit 2: bad input (unreadable or malformed graph, unknown formulation, bad budget syntax);
- exit 3: a bug in coop (set ``COOP_DEBUG=1`` to see its traceback).

This module is the entry point (:func:`main`) and the graph commands (info, solve); the Typer app and what
the commands share are :mod:`coop.cli_app`, the other commands :mod:`coop.cli_commands`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from coop.budget import baseline_peak, format_memory, parse_budget, store_all_fits
from coop.cli_app import (
    EXIT_BUG,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERDICT,
    GraphArg,
    JsonFlag,
    VerdictFailure,
    app,
    check_time_limit,
    console,
    emit_json,
    fmt,
    graph_info,
    key_value_table,
    percent,
    print_info,
)
from coop.cli_commands import capture, compare_command, load_schedule_for, plot, simulate_command, validate_command
from coop.errors import BudgetError, CoopError, InfeasibleError
from coop.formulations import FORMULATIONS, formulation_options, registered
from coop.formulations import solve as run_formulation
from coop.formulations.core.progress import Progress, ProgressCallback, stderr_progress
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.schedule import schedule_to_json, simulate


def _usage_error_types() -> tuple[type[Exception], ...]:
    """Usage errors of the command-line parser: typer's own (it vendors click lately) and click's."""
    types: list[type[Exception]] = []
    if hasattr(typer, "TyperException"):
        types.append(typer.TyperException)
    try:
        import click
    except ImportError:
        pass
    else:
        types.append(click.ClickException)
    return tuple(types)


_USAGE_ERRORS = _usage_error_types()
_ABORTS: tuple[type[BaseException], ...] = (typer.Abort, KeyboardInterrupt)


# ============================================================================ entry point
def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script passes it to sys.exit)."""
    command = typer.main.get_command(app)
    try:
        with warnings.catch_warnings():  # a warning is one line too, not Python's two (message and source line)
            warnings.showwarning = _note_in_one_line
            status = command.main(args=argv, prog_name="coop", standalone_mode=False)
    except VerdictFailure as exc:
        return _fail(str(exc), EXIT_VERDICT)
    except CoopError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except ValidationError as exc:
        error = exc.errors()[0]
        return _fail(f"malformed input: {error['msg']} at {'.'.join(map(str, error['loc']))}", EXIT_USAGE)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}", EXIT_USAGE)
    except _ABORTS:
        return _fail("interrupted", 130)
    except _USAGE_ERRORS as exc:  # unknown option, missing argument; `coop` alone shows the help
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message())  # type: ignore[attr-defined]
            return EXIT_OK
        return _fail(f"{exc.format_message()} (see coop --help)", EXIT_USAGE)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - the last line of defence against a traceback
        if os.environ.get("COOP_DEBUG"):
            traceback.print_exc()
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set COOP_DEBUG=1 for the traceback)", EXIT_BUG)
    return int(status or 0)


def _note_in_one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    print(f"coop: note: {' '.join(str(message).split())}", file=sys.stderr, flush=True)


def _fail(message: str, code: int) -> int:
    # One line, whatever the exception carried: the contract of every coop error.
    print(f"coop: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code


# ============================================================================ info
@app.command()
def info(graph_path: GraphArg, json_output: JsonFlag = False) -> None:
    """Size, baseline peak and cost, min_budget (the proven lower bound), the constructed budget, largest values."""
    graph = load_graph(graph_path)
    facts = graph_info(graph)
    if json_output:
        emit_json(facts)
        return
    print_info(graph, facts)


# ============================================================================ solve
@app.command()
def solve(
    graph_path: GraphArg,
    budget: Annotated[str, typer.Option("--budget", "-b", help="'6GiB', '750MB', '132156' (graph units), '90%' or 0.9.")],
    formulation: Annotated[str, typer.Option("--formulation", "-f", help=f"One of: {', '.join(FORMULATIONS)}.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the schedule JSON here.")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="Solver time limit in seconds.")] = None,
    solver: Annotated[str | None, typer.Option("--solver", help="Backend solver, where a formulation offers several.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="Solver worker threads.")] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--quiet", help="Report incumbent, bound, time "
                                                  "and auto's rungs on stderr (default: when stderr is a terminal).")]
    = None,
    objective: Annotated[str | None, typer.Option("--objective", help="poet: minimise 'energy' (J) or 'time' (s) "
                                                  "on the device profile.")] = None,
    device_profile: Annotated[str | None, typer.Option("--device-profile", help="poet: a device profile name "
                                                       "(m0, m4, a72, a100-pcie4, ...) or a .toml file.")] = None,
    runtime_budget: Annotated[float | None, typer.Option("--runtime-budget", help="poet: compute + paging time at "
                                                         "most this factor (>= 1) of the baseline compute time.")]
    = None,
    json_output: JsonFlag = False,
) -> None:
    """Solve for a schedule within BUDGET; exit 0 only when one was found."""
    check_time_limit(time_limit)
    graph = load_graph(graph_path)
    spec = registered(formulation)  # an unknown name refused here, with the choices
    budget_units = _parse_budget_or_verdict(budget, graph)
    try:
        spec.function()  # its module and solver imported now
    except ImportError as exc:  # a formulation whose solver or module is not installed
        raise CoopError(f"formulation {formulation!r} is not available in this install: {exc}") from None
    takes = formulation_options(formulation)
    options: dict[str, Any] = {"time_limit": time_limit, "threads": threads, "solver": solver, "objective": objective,
                               "device_profile": device_profile, "runtime_budget": runtime_budget}
    if note := store_all_fits(budget_units, graph):  # not an error: said, then solved as asked
        print(f"coop: note: {note}", file=sys.stderr)
    show_progress = sys.stderr.isatty() if progress is None else progress
    reports_progress = "progress" in takes
    spinner = show_progress and not reports_progress and not json_output and sys.stderr.isatty()
    try:
        with contextlib.ExitStack() as stack:
            if show_progress and reports_progress:
                options["progress"] = stack.enter_context(_solve_progress(formulation, time_limit))
            elif spinner:
                stack.enter_context(Console(stderr=True).status(f"solving with {formulation} ..."))
            result = run_formulation(graph, budget_units, formulation, **options)
    except InfeasibleError as exc:
        raise VerdictFailure(str(exc)) from None
    report = _solve_report(graph, result, budget_units, formulation, output, time_limit)
    if note:
        report["note"] = note
    if json_output:
        emit_json(report)
    else:
        _print_solve(graph, report)
    if not report["ok"]:
        raise VerdictFailure(report["reason"])


#: Seconds without a report after which `--progress` says the solve is still running.
HEARTBEAT_S = 10.0


@contextlib.contextmanager
def _solve_progress(formulation: str, time_limit: float | None, *, heartbeat_s: float = HEARTBEAT_S,
                    stream: Any = None) -> Iterator[ProgressCallback]:
    """The progress reporter of `coop solve --progress`: one line on stderr per report (at most one a second),
    stamped with the seconds since the solve began on the command's own clock (a formulation's rungs and warm
    starts each count their own time from 0), a first line as the solve starts, and a line every ``heartbeat_s``
    seconds without a report (a warm start or a model being built reports nothing for minutes); auto's rungs always."""
    started = time.perf_counter()
    printed = stderr_progress(stream)
    lock = threading.Lock()
    last = [started]
    done = threading.Event()

    def elapsed() -> float:
        return time.perf_counter() - started

    def report(progress: Progress) -> None:
        with lock:
            last[0] = time.perf_counter()
            printed(dataclasses.replace(progress, elapsed_s=elapsed()))

    def beat() -> None:
        while not done.wait(min(1.0, heartbeat_s)):
            with lock:
                if time.perf_counter() - last[0] < heartbeat_s:
                    continue
                last[0] = time.perf_counter()
            print(f"{elapsed():8.1f}s  {formulation}: still solving", file=stream or sys.stderr, flush=True)

    limit = "no time limit given" if time_limit is None else f"time limit {time_limit:g} s"
    print(f"{0.0:8.1f}s  {formulation}: solving ({limit})", file=stream or sys.stderr, flush=True)
    thread = threading.Thread(target=beat, name="coop-progress", daemon=True)
    thread.start()
    try:
        yield report
    finally:
        done.set()
        thread.join()


def _parse_budget_or_verdict(spec: str, graph: Graph) -> int:
    """Budget syntax errors are bad input (exit 2); a budget below min_budget is a verdict (exit 1)."""
    parse_budget(spec, graph, check=False)
    try:
        return parse_budget(spec, graph)
    except BudgetError as exc:
        raise VerdictFailure(str(exc)) from None


def _solve_report(graph: Graph, result: Any, budget: int, formulation: str, output: Path | None,
                  time_limit: float | None) -> dict[str, Any]:
    """Simulate the result's schedule (the one simulator decides), write it when it fits, and summarise; a result
    without a schedule within the budget is "infeasible" only with a proof, else "no schedule found within N s"
    (:func:`~coop.formulations.ladder.auto.no_schedule_error`'s words)."""
    from coop.formulations.ladder.auto import no_schedule_error  # lazy: the ladder loads only when a solve is reported

    report: dict[str, Any] = {
        "graph": graph.name,
        "formulation": formulation,
        "budget": budget,
        "baseline_peak": baseline_peak(graph),
        "solver": result.solver_json(),
        "message": result.message,
        "output": None,
    }
    if result.schedule is None:
        detail = f" ({result.message})" if result.message else ""
        reason = (f"infeasible for {formulation}: proven that no schedule fits{detail}" if result.status == "infeasible"
                  else f"{no_schedule_error(graph, budget, result, time_limit)}{detail}")
        report.update(ok=False, reason=reason)
        return report
    document = schedule_to_json(graph, result.schedule, budget=budget, formulation=formulation,
                                solver=result.solver_json())
    sim = simulate(graph, result.schedule)
    report["predicted"] = document["predicted"]
    report["steps"] = len(result.schedule)
    report["recomputations"] = sim.recomputations
    if result.price is not None:  # poet: the schedule priced on its device profile
        report["price"] = result.price.to_dict()
    if sim.peak > budget:
        report.update(ok=False, reason=str(no_schedule_error(graph, budget, result, time_limit)))
        return report
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(document, indent=1) + "\n")
        report["output"] = str(output)
    report.update(ok=True, reason="")
    return report


def _print_solve(graph: Graph, report: dict[str, Any]) -> None:
    solver = report["solver"]
    rows = [("budget", format_memory(report["budget"], graph)), ("status", str(solver["status"]))]
    if "predicted" in report:
        predicted = report["predicted"]
        rows += [
            ("peak", (f"{format_memory(predicted['peak'], graph)}  = {percent(predicted['peak'] / report['budget'])} "
                     f"of the budget, {percent(predicted['peak'] / report['baseline_peak'])} of the baseline peak")),
            ("cost", f"{predicted['cost']:.6g} (baseline {predicted['baseline_cost']:.6g})"),
            ("overhead (TDI)", percent(predicted["overhead"])),
            ("steps / recomputations", f"{report['steps']} / {report['recomputations']}"),
        ]
    if "price" in report:
        price = report["price"]
        rows += [(f"energy / time on {price['device_profile']}", f"{price['energy_j']:.6g} J / {price['time_s']:.6g} s"),
                 ("page-ins / page-outs", (f"{price['page_ins']} / {price['page_outs']} "
                                           f"({format_memory(price['paged_bytes'], graph)} moved)"))]
    rows += [
        ("objective / bound", f"{fmt(solver['objective'])} / {fmt(solver['bound'])}"),
        ("gap", percent(solver["gap"])),
        ("wall time", f"{solver['wall_s']:.3f} s"),
    ]
    if report["message"]:
        rows.append(("message", report["message"]))
    if report["output"]:
        rows.append(("schedule", report["output"]))
    console.print(key_value_table(f"{report['formulation']} on {graph.name}", rows))


# The other commands (coop.cli_commands), registered after info and solve: the order of coop --help.
app.command(name="validate")(validate_command)
app.command()(plot)
app.command()(capture)
app.command(name="simulate")(simulate_command)
app.command(name="compare")(compare_command)



__all__ = ["EXIT_BUG", "EXIT_OK", "EXIT_USAGE", "EXIT_VERDICT", "VerdictFailure", "app", "capture", "compare_command",
           "graph_info", "info", "load_schedule_for", "main", "plot", "simulate_command", "solve", "validate_command"]


if __name__ == "__main__":  # pragma: no cover  (after every command is registered)
    sys.exit(main())
