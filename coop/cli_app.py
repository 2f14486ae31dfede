"""The ``coop`` command's Typer app and what its commands share: exit codes, argument types, the console,
the verdict failure, JSON and table output, and the facts and page of ``coop info`` (which ``coop capture``
prints too).

The entry point and the graph commands are :mod:`coop.cli`, the other commands :mod:`coop.cli_commands`.
"""

from __future__ import annotations

import collections
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from coop.budget import baseline_peak, format_memory, min_budget
from coop.errors import CoopError
from coop.formulations.ladder.constructed_budget import constructed_budget
from coop.graph import Graph

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


def emit_json(payload: dict[str, Any]) -> None:
    """Print ``payload`` as indented JSON on stdout (what ``--json`` prints)."""
    print(json.dumps(payload, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def percent(value: float | None) -> str:
    """A fraction as a percentage with two decimals; ``-`` for None."""
    return "-" if value is None else f"{100 * value:.2f}%"


def key_value_table(title: str, rows: list[tuple[str, str]]) -> Table:
    """A two-column table without a header: a bold key beside its value."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


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


def constructed_row(facts: dict[str, Any], graph: Graph) -> str:
    """``coop info``'s constructed-budget line: the budget, its share of the peak and where it comes from."""
    return (f"{format_memory(facts['constructed_budget'], graph)}  = {percent(facts['constructed_budget_fraction'])} "
            f"of the baseline peak ({facts['constructed_budget_source']})")


def print_info(graph: Graph, facts: dict[str, Any]) -> None:
    """``coop info``'s page for a graph, from its facts."""
    kinds = ", ".join(f"{kind} {count}" for kind, count in facts["kinds"].items())
    rows = [
        ("nodes / edges", f"{facts['nodes']} / {facts['edges']}"),
        ("kinds", kinds),
        ("outputs", str(facts["outputs"])),
        ("units", f"memory: {facts['units']['mem']}, cost: {facts['units']['cost']}"),
        ("baseline peak", format_memory(facts["baseline_peak"], graph)),
        ("baseline cost", f"{facts['baseline_cost']:.6g}"),
        ("min budget (lower bound)", (f"{format_memory(facts['min_budget'], graph)}  "
                                     f"= {percent(facts['min_budget_fraction'])} of the baseline peak")),
        ("constructed budget (upper bound)", constructed_row(facts, graph)),
        ("caller-owned", format_memory(facts["caller_owned"], graph)),
        ("sha256", facts["sha256"][:16] + "..."),
    ]
    console.print(key_value_table(f"graph {graph.name}", rows))
    largest = Table(title="largest values", title_justify="left")
    for column in ("id", "name", "kind", "mem"):
        largest.add_column(column, justify="right" if column in ("id", "mem") else "left")
    for entry in facts["largest"]:
        largest.add_row(str(entry["id"]), entry["name"], entry["kind"], format_memory(entry["mem"], graph))
    console.print(largest)


def check_time_limit(seconds: float | None) -> None:
    """A solver time limit is a positive, finite number of seconds (NaN or -1 would mean no limit or none)."""
    if seconds is not None and not (0 < seconds < math.inf):
        raise CoopError(f"--time-limit {seconds} is not a positive number of seconds: give e.g. --time-limit 60")


def fmt(value: float | None) -> str:
    """A number in six significant digits; ``-`` for None."""
    return "-" if value is None else f"{value:.6g}"
