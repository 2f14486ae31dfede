"""The ``coop`` command: capture, info, solve, validate and plot.

Every command is a small function over the shared ground floor (coop.graph, coop.schedule,
coop.budget, coop.formulations); none re-implements memory accounting. Every command takes
``--json`` for machine-readable output on stdout. Errors are one line on stderr,
``coop: error: ...``, never a traceback:

- exit 0: success (a schedule within the budget, a valid schedule);
- exit 1: a negative verdict (no schedule within the budget, an invalid schedule);
- exit 2: bad input (unreadable or malformed graph, unknown formulation, bad budget syntax);
- exit 3: a bug in coop (set ``COOP_DEBUG=1`` to see its traceback).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
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
from rich.table import Table

from coop.budget import baseline_peak, format_memory, min_budget, parse_budget, store_all_fits
from coop.compare import compare, run_sweep, simulate_report
from coop.config import load_config
from coop.errors import BudgetError, CoopError, InfeasibleError, ScheduleError
from coop.formulations import FORMULATIONS, formulation_options, registered
from coop.formulations import solve as run_formulation
from coop.formulations.constructed_budget import constructed_budget
from coop.formulations.progress import Progress, ProgressCallback, stderr_progress
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.memory_viz import write_memory_viz
from coop.schedule import Schedule, check_schedule_nodes, load_schedule, schedule_to_json, simulate, validate

EXIT_OK = 0
EXIT_VERDICT = 1  # the command ran and its answer is "no": not within budget, not valid
EXIT_USAGE = 2  # bad input
EXIT_BUG = 3

app = typer.Typer(
    name="coop",
    help="Plan memory-bounded training steps: capture a graph, solve for a schedule, validate and plot it.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
GraphArg = Annotated[Path, typer.Argument(metavar="GRAPH", help="Graph file: coop JSON or a networkx node-link file.")]
MemoryVizOption = Annotated[Path | None, typer.Option("--memory-viz", help="Also write the predicted timeline as a "
                                                      "PyTorch memory snapshot (.pickle) for pytorch.org/memory_viz.")]


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


class VerdictFailure(Exception):
    """A command whose answer is negative: one line on stderr, exit 1."""


def _print_version(value: bool) -> None:
    if value:  # coop.__version__ (the installed distribution's metadata): the package is loaded with its modules
        print(f"coop {sys.modules['coop'].__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", help="Print coop's version and exit.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    """Plan memory-bounded training steps: capture a graph, solve for a schedule, validate and plot it."""


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


def _emit_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _key_value_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


# ============================================================================ info
def graph_info(graph: Graph, top: int = 5) -> dict[str, Any]:
    """The facts `coop info` reports, as a JSON-ready dict."""
    peak = baseline_peak(graph)
    least = min_budget(graph)
    constructed = constructed_budget(graph)  # never fails: the baseline order fits its own peak
    largest = sorted(graph.nodes, key=lambda n: (-n.mem, n.id))[:top]
    return {
        "name": graph.name,
        "sha256": graph.sha256,
        "nodes": len(graph.nodes),
        "edges": graph.num_edges,
        "outputs": len(graph.outputs),
        "baseline_peak": peak,
        "baseline_cost": graph.baseline_cost,
        "min_budget": least,
        "min_budget_fraction": least / peak if peak else None,
        "constructed_budget": constructed.budget,
        "constructed_budget_fraction": constructed.budget / peak if peak else None,
        "constructed_budget_source": constructed.source,
        "caller_owned": graph.caller_owned_bytes,
        "units": {"mem": graph.meta.get("mem_unit", "bytes"), "cost": graph.meta.get("cost_unit", "unknown")},
        "kinds": dict(sorted(collections.Counter(n.kind for n in graph.nodes).items())),
        "largest": [{"id": n.id, "name": n.name, "op": n.op, "kind": n.kind, "mem": n.mem} for n in largest],
    }


@app.command()
def info(graph_path: GraphArg, json_output: JsonFlag = False) -> None:
    """Size, baseline peak and cost, min_budget (the proven lower bound), the constructed budget, largest values."""
    graph = load_graph(graph_path)
    facts = graph_info(graph)
    if json_output:
        _emit_json(facts)
        return
    _print_info(graph, facts)


def _constructed_row(facts: dict[str, Any], graph: Graph) -> str:
    return (f"{format_memory(facts['constructed_budget'], graph)}  = {_percent(facts['constructed_budget_fraction'])} "
            f"of the baseline peak ({facts['constructed_budget_source']})")


def _print_info(graph: Graph, facts: dict[str, Any]) -> None:
    kinds = ", ".join(f"{kind} {count}" for kind, count in facts["kinds"].items())
    rows = [
        ("nodes / edges", f"{facts['nodes']} / {facts['edges']}"),
        ("kinds", kinds),
        ("outputs", str(facts["outputs"])),
        ("units", f"memory: {facts['units']['mem']}, cost: {facts['units']['cost']}"),
        ("baseline peak", format_memory(facts["baseline_peak"], graph)),
        ("baseline cost", f"{facts['baseline_cost']:.6g}"),
        ("min budget (lower bound)", (f"{format_memory(facts['min_budget'], graph)}  "
                                     f"= {_percent(facts['min_budget_fraction'])} of the baseline peak")),
        ("constructed budget (upper bound)", _constructed_row(facts, graph)),
        ("caller-owned", format_memory(facts["caller_owned"], graph)),
        ("sha256", facts["sha256"][:16] + "..."),
    ]
    console.print(_key_value_table(f"graph {graph.name}", rows))
    largest = Table(title="largest values", title_justify="left")
    for column in ("id", "name", "kind", "mem"):
        largest.add_column(column, justify="right" if column in ("id", "mem") else "left")
    for entry in facts["largest"]:
        largest.add_row(str(entry["id"]), entry["name"], entry["kind"], format_memory(entry["mem"], graph))
    console.print(largest)


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
    _check_time_limit(time_limit)
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
    report = _solve_report(graph, result, budget_units, formulation, output)
    if note:
        report["note"] = note
    if json_output:
        _emit_json(report)
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


def _check_time_limit(seconds: float | None) -> None:
    """A solver time limit is a positive, finite number of seconds (NaN or -1 would mean no limit or none)."""
    if seconds is not None and not (0 < seconds < math.inf):
        raise CoopError(f"--time-limit {seconds} is not a positive number of seconds: give e.g. --time-limit 60")


def _parse_budget_or_verdict(spec: str, graph: Graph) -> int:
    """Budget syntax errors are bad input (exit 2); a budget below min_budget is a verdict (exit 1)."""
    parse_budget(spec, graph, check=False)
    try:
        return parse_budget(spec, graph)
    except BudgetError as exc:
        raise VerdictFailure(str(exc)) from None


def _solve_report(graph: Graph, result: Any, budget: int, formulation: str, output: Path | None) -> dict[str, Any]:
    """Simulate the result's schedule (the one simulator decides), write it when it fits, and summarise."""
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
        found = "proven that no schedule fits" if result.status == "infeasible" else f"no schedule found, status {result.status}"
        report.update(ok=False, reason=f"infeasible for {formulation}: {found}{detail}")
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
        report.update(ok=False, reason=f"infeasible for {formulation}: best peak reached {sim.peak} > budget {budget}")
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
            ("peak", (f"{format_memory(predicted['peak'], graph)}  = {_percent(predicted['peak'] / report['budget'])} "
                     f"of the budget, {_percent(predicted['peak'] / report['baseline_peak'])} of the baseline peak")),
            ("cost", f"{predicted['cost']:.6g} (baseline {predicted['baseline_cost']:.6g})"),
            ("overhead (TDI)", _percent(predicted["overhead"])),
            ("steps / recomputations", f"{report['steps']} / {report['recomputations']}"),
        ]
    if "price" in report:
        price = report["price"]
        rows += [(f"energy / time on {price['device_profile']}", f"{price['energy_j']:.6g} J / {price['time_s']:.6g} s"),
                 ("page-ins / page-outs", (f"{price['page_ins']} / {price['page_outs']} "
                                           f"({format_memory(price['paged_bytes'], graph)} moved)"))]
    rows += [
        ("objective / bound", f"{_fmt(solver['objective'])} / {_fmt(solver['bound'])}"),
        ("gap", _percent(solver["gap"])),
        ("wall time", f"{solver['wall_s']:.3f} s"),
    ]
    if report["message"]:
        rows.append(("message", report["message"]))
    if report["output"]:
        rows.append(("schedule", report["output"]))
    console.print(_key_value_table(f"{report['formulation']} on {graph.name}", rows))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


# ============================================================================ validate
def load_schedule_for(graph: Graph, path: Path) -> tuple[Schedule, dict[str, Any]]:
    """Read a schedule file and refuse it when it was made for a different graph or names nodes it lacks."""
    schedule, document = load_schedule(path)
    made_for = document.get("graph") or {}
    digest = made_for.get("sha256")
    if digest is not None and digest != graph.sha256:
        raise ScheduleError(
            f"{path} was made for graph {made_for.get('name', '?')!r} (sha256 {str(digest)[:12]}...), not for "
            f"{graph.name!r} (sha256 {graph.sha256[:12]}...): solve again for this graph"
        )
    check_schedule_nodes(graph, schedule, origin=str(path))
    return schedule, document


@app.command(name="validate")
def validate_command(
    graph_path: GraphArg,
    schedule_path: Annotated[Path, typer.Argument(metavar="SCHEDULE", help="Schedule JSON written by coop solve.")],
    budget: Annotated[str | None, typer.Option("--budget", "-b", help="Check against this budget "
                                                                      "(default: the schedule's own).")] = None,
    memory_viz: MemoryVizOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Check that a schedule is legal for a graph and within its budget; exit 1 when it is not."""
    graph = load_graph(graph_path)
    schedule, document = load_schedule_for(graph, schedule_path)
    # The file's own budget was checked by load_schedule (a positive integer or absent).
    budget_units = parse_budget(budget, graph, check=False) if budget is not None else document.get("budget")
    verdict = validate(graph, schedule, budget_units)
    report = verdict.to_dict() | {"graph": graph.name, "schedule": str(schedule_path), "steps": len(schedule)}
    predicted = (document.get("predicted") or {}).get("peak")
    report["predicted_peak"] = predicted
    report["predicted_matches"] = None if predicted is None or verdict.peak is None else predicted == verdict.peak
    if memory_viz is not None and verdict.simulation is not None:  # a legal schedule, within the budget or not
        write_memory_viz(memory_viz, graph, schedule, verdict.simulation)
        report["memory_viz"] = str(memory_viz)
    if json_output:
        _emit_json(report)
    else:
        _print_validation(graph, report)
    if not verdict.ok:
        raise VerdictFailure(f"invalid schedule {schedule_path}: {verdict.reason}")


def _print_validation(graph: Graph, report: dict[str, Any]) -> None:
    verdict = "[green]valid[/green]" if report["ok"] else f"[red]invalid[/red]: {report['reason']}"
    rows = [("verdict", verdict), ("steps", str(report["steps"])), ("budget", format_memory(report["budget"], graph))]
    if report["peak"] is not None:
        rows += [("peak", format_memory(report["peak"], graph)), ("cost", f"{report['cost']:.6g}"),
                 ("overhead (TDI)", _percent(report["overhead"]))]
    if report["predicted_matches"] is False:
        rows.append(("note", f"the file predicted peak {report['predicted_peak']}, the simulator says {report['peak']}"))
    console.print(_key_value_table(f"schedule {report['schedule']} on {graph.name}", rows))


# ============================================================================ plot
@app.command()
def plot(
    graph_path: GraphArg,
    schedule_paths: Annotated[list[Path], typer.Argument(metavar="SCHEDULE...", help="One or more schedule JSON files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Image file to write (.png, .pdf, .svg).")],
    budget: Annotated[str | None, typer.Option("--budget", "-b", help="Budget line (default: the smallest "
                                                                      "budget of the schedules).")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Plot the memory at every step of one or more schedules of a graph."""
    from coop.viz import plot_memory_timeline  # lazy: matplotlib is loaded only to plot

    graph = load_graph(graph_path)
    series: dict[str, list[int]] = {}
    budgets: list[int] = []
    for path in schedule_paths:
        schedule, document = load_schedule_for(graph, path)
        label = _unique_label(str(document.get("formulation") or path.stem), series)
        try:
            series[label] = simulate(graph, schedule).memory
        except ScheduleError as exc:  # an illegal schedule has no memory curve: the validator's verdict
            raise VerdictFailure(f"invalid schedule {path}: {exc}") from None
        if isinstance(document.get("budget"), int):
            budgets.append(document["budget"])
    # Default: the tightest budget among the schedules, the line the others are judged against.
    budget_units = parse_budget(budget, graph, check=False) if budget is not None else min(budgets, default=None)
    plot_memory_timeline(series, budget_units, output, mem_unit=graph.meta.get("mem_unit", "bytes"),
                         title=f"memory per step: {graph.name}")
    peaks = {label: max(memory) if memory else 0 for label, memory in series.items()}
    if json_output:
        _emit_json({"output": str(output), "budget": budget_units, "peaks": peaks})
    else:
        console.print(f"wrote {output}: " + ", ".join(f"{k} peak {format_memory(v, graph)}" for k, v in peaks.items()))


def _unique_label(label: str, taken: dict[str, Any]) -> str:
    candidate, suffix = label, 2
    while candidate in taken:
        candidate, suffix = f"{label} ({suffix})", suffix + 1
    return candidate


# ============================================================================ capture
@app.command()
def capture(
    target: Annotated[str | None, typer.Argument(metavar="FILE.py:FACTORY", help="FILE.py:FACTORY; FACTORY() returns (model, batch) "
                                                      "or (model, batch, loss_fn).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Graph JSON to write.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="A built-in zoo model instead of FILE.py.")] = None,
    layers: Annotated[int | None, typer.Option("--layers", min=1, help="Zoo size: layers / blocks.")] = None,
    hidden: Annotated[int | None, typer.Option("--hidden", min=1, help="Zoo size: hidden width.")] = None,
    batch: Annotated[int | None, typer.Option("--batch", min=1, help="Zoo size: batch size.")] = None,
    seq: Annotated[int | None, typer.Option("--seq", min=1, help="Zoo size: sequence length.")] = None,
    image: Annotated[int | None, typer.Option("--image", min=1, help="Zoo size: image side in pixels.")] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1, help="Zoo size: attention heads.")] = None,
    vocab: Annotated[int | None, typer.Option("--vocab", min=1, help="Zoo size: vocabulary.")] = None,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads", min=1, help="Zoo llama: key/value heads.")] = None,
    intermediate: Annotated[int | None, typer.Option("--intermediate", min=1, help="Zoo llama: MLP width.")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="Zoo: the parameters' dtype (bfloat16, float16).")] = None,
    meta: Annotated[bool, typer.Option("--meta", help="Build the zoo model on the meta device (no weights: any size "
                                       "fits this machine); needs --device.")] = False,
    device: Annotated[str | None, typer.Option("--device", help="With --meta: the device the plan will run on "
                                               "('cuda', 'cpu'), where the graph records every value.")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="Time every op on this machine for node costs.")] = False,
    alternatives: Annotated[bool, typer.Option("--alternatives", help="Record the operator implementations PyTorch "
                                               "offers (MONeT: mask backwards, in-place activations) for "
                                               "--formulation monet.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Capture one training step (forward + backward) of a model as a graph JSON file."""
    if output is None:
        raise CoopError("coop capture needs -o GRAPH.json: where to write the graph")
    if (target is None) == (model is None):
        raise CoopError("coop capture needs exactly one model: --model NAME (the zoo) or FILE.py:FACTORY")
    from coop.graph_capture import capture as capture_step  # lazy: keeps the graph commands torch-free
    from coop.zoo import model_from_factory, model_from_zoo  # lazy: keeps the graph commands torch-free

    if meta and model is None:
        raise CoopError("--meta builds a zoo model on the meta device: use it with --model NAME (a factory builds its "
                        "model itself: build it under torch.device('meta') there and pass --device)")
    if target is not None:
        module, example_batch, loss_fn = model_from_factory(target)
    else:
        given = {"layers": layers, "hidden": hidden, "batch": batch, "seq": seq, "image": image, "heads": heads,
                 "vocab": vocab, "kv_heads": kv_heads, "intermediate": intermediate, "dtype": dtype}
        size = {k: v for k, v in given.items() if v is not None}
        module, example_batch, loss_fn = model_from_zoo(str(model), size, meta=meta)
    result = capture_step(module, example_batch, loss_fn=loss_fn, profile=profile, alternatives=alternatives,
                          device=device)
    graph: Graph = result.graph
    output.parent.mkdir(parents=True, exist_ok=True)
    graph.save(output)
    facts = graph_info(graph) | {"output": str(output)}
    if json_output:
        _emit_json(facts)
    else:
        console.print(f"wrote {output}")
        _print_info(graph, facts)




# ============================================================================ simulate / compare
@app.command(name="simulate")
def simulate_command(
    graph_path: GraphArg,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Online eviction policy: dtr, dtr-eq, dte, coop or "
                                        "delta (swaps or recomputes; needs --device-profile).")],
    budget: Annotated[str, typer.Option("--budget", "-b", help="Arena size: '6GiB', '132156' (graph units), '70%' or 0.7.")],
    device_profile: Annotated[str | None, typer.Option("--device-profile", help="delta: the device profile (name or "
                                                       ".toml) whose host link prices and times its swaps.")] = None,
    memory_viz: MemoryVizOption = None,
    compact: Annotated[bool, typer.Option("--compact", help="Close the arena's gaps where no eviction makes a "
                                          "contiguous room, as the dynamic fallback does (its real addresses are the "
                                          "device allocator's); without it the address model is binding.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Run an online eviction policy over the graph in an arena of the budget's size."""
    graph = load_graph(graph_path)
    report = simulate_report(graph, policy, budget, device_profile,  # bad input (exit 2) before any budget verdict
                             memory_viz=memory_viz, compact=compact)
    if json_output:
        _emit_json(report)
    else:
        rows = [(key, _fmt(value) if isinstance(value, float) else str(value)) for key, value in report.items()
                if not isinstance(value, (list, dict))]
        console.print(_key_value_table(f"{policy} on {graph_path.name}", rows))
    if report.get("status") != "ok":
        raise VerdictFailure(f"{policy} at budget {report.get('budget')}: {report.get('status')} "
                             f"{report.get('message', '')}".strip())


@app.command(name="compare")
def compare_command(
    graph_path: Annotated[Path | None, typer.Argument(metavar="[GRAPH]", help="Graph file (or --model / --config).")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="A built-in zoo model, captured first.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A sweep config (TOML) from configs/.")] = None,
    budgets: Annotated[str, typer.Option("--budgets", help="Comma-separated budgets, e.g. 90%,70%,50%,40%.")] = "90%,70%,50%,40%",
    formulations: Annotated[str | None, typer.Option("--formulations", help="Comma-separated static formulations "
                                                     "(default: all that apply).")] = None,
    policies: Annotated[str | None, typer.Option("--policies", help="Comma-separated online policies (default: all).")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Per-solve time limit in seconds.")] = 10.0,
    csv: Annotated[Path | None, typer.Option("--csv", help="Write the rows as CSV here.")] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write overhead against budget as a PNG here.")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="With --config: where to write "
                                                    "CSV, markdown and plots.")] = None,
    device_profile: Annotated[str | None, typer.Option("--device-profile", help="Add poet (recomputation and "
                                                       "paging) and delta (online swap or recompute) priced on "
                                                       "this device profile.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Static formulations and online policies side by side at each budget, with break-even steps."""
    _check_time_limit(time_limit)
    show_progress = sys.stderr.isatty() and not json_output
    if config is not None:
        if graph_path is not None or model is not None:
            raise CoopError("coop compare takes one source: GRAPH, --model NAME or --config FILE")
        reports = run_sweep(load_config(config), progress=show_progress, output_dir=output_dir)
        if json_output:
            _emit_json({"reports": [r.to_dict() for r in reports]})
        else:
            for report in reports:
                print(report.to_markdown())
        return
    if (graph_path is None) == (model is None):
        raise CoopError("coop compare needs exactly one source: GRAPH, --model NAME or --config FILE")
    if graph_path is not None:
        graph = load_graph(graph_path)
    else:
        from coop.graph_capture import capture as capture_step  # lazy: keeps the graph commands torch-free
        from coop.zoo import model_from_zoo  # lazy: keeps the graph commands torch-free

        module, example_batch, loss_fn = model_from_zoo(str(model), {})
        graph = capture_step(module, example_batch, loss_fn=loss_fn).graph
    names = [b.strip() for b in budgets.split(",") if b.strip()]
    if not names:
        raise CoopError("--budgets is empty: give e.g. 90%,70%,50%")
    report = compare(
        graph,
        names,
        formulations=_split(formulations),
        policies=_split(policies),
        time_limit=time_limit,
        progress=show_progress,
        device_profile=device_profile,
    )
    if csv is not None:
        report.to_csv(csv)
    if plot_path is not None:
        report.plot(plot_path)
    if json_output:
        _emit_json(report.to_dict())
    else:
        print(report.to_markdown())


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


if __name__ == "__main__":  # pragma: no cover  (after every command is registered)
    sys.exit(main())
