"""The ``coop`` commands beyond the graph's own: validate, plot, capture, simulate and compare.

Each is a function whose docstring is its help text; :mod:`coop.cli` registers them on the app, after
``info`` and ``solve`` (the order of ``coop --help``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from coop.budget import format_memory, parse_budget
from coop.cli_app import (
    GraphArg,
    JsonFlag,
    MemoryVizOption,
    VerdictFailure,
    check_time_limit,
    console,
    emit_json,
    fmt,
    graph_info,
    key_value_table,
    percent,
    print_info,
)
from coop.compare import compare, run_sweep, simulate_report
from coop.config import load_config
from coop.errors import CoopError, ScheduleError
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.memory_viz import write_memory_viz
from coop.schedule import Schedule, check_schedule_nodes, load_schedule, simulate, validate


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
        emit_json(report)
    else:
        _print_validation(graph, report)
    if not verdict.ok:
        raise VerdictFailure(f"invalid schedule {schedule_path}: {verdict.reason}")


def _print_validation(graph: Graph, report: dict[str, Any]) -> None:
    verdict = "[green]valid[/green]" if report["ok"] else f"[red]invalid[/red]: {report['reason']}"
    rows = [("verdict", verdict), ("steps", str(report["steps"])), ("budget", format_memory(report["budget"], graph))]
    if report["peak"] is not None:
        rows += [("peak", format_memory(report["peak"], graph)), ("cost", f"{report['cost']:.6g}"),
                 ("overhead (TDI)", percent(report["overhead"]))]
    if report["predicted_matches"] is False:
        rows.append(("note", f"the file predicted peak {report['predicted_peak']}, the simulator says {report['peak']}"))
    console.print(key_value_table(f"schedule {report['schedule']} on {graph.name}", rows))


# ============================================================================ plot
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
        emit_json({"output": str(output), "budget": budget_units, "peaks": peaks})
    else:
        console.print(f"wrote {output}: " + ", ".join(f"{k} peak {format_memory(v, graph)}" for k, v in peaks.items()))


def _unique_label(label: str, taken: dict[str, Any]) -> str:
    candidate, suffix = label, 2
    while candidate in taken:
        candidate, suffix = f"{label} ({suffix})", suffix + 1
    return candidate


# ============================================================================ capture
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
        emit_json(facts)
    else:
        console.print(f"wrote {output}")
        print_info(graph, facts)




# ============================================================================ simulate / compare
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
        emit_json(report)
    else:
        rows = [(key, fmt(value) if isinstance(value, float) else str(value)) for key, value in report.items()
                if not isinstance(value, (list, dict))]
        console.print(key_value_table(f"{policy} on {graph_path.name}", rows))
    if report.get("status") != "ok":
        raise VerdictFailure(f"{policy} at budget {report.get('budget')}: {report.get('status')} "
                             f"{report.get('message', '')}".strip())


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
    check_time_limit(time_limit)
    show_progress = sys.stderr.isatty() and not json_output
    if config is not None:
        if graph_path is not None or model is not None:
            raise CoopError("coop compare takes one source: GRAPH, --model NAME or --config FILE")
        reports = run_sweep(load_config(config), progress=show_progress, output_dir=output_dir)
        if json_output:
            emit_json({"reports": [r.to_dict() for r in reports]})
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
        emit_json(report.to_dict())
    else:
        print(report.to_markdown())


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]

