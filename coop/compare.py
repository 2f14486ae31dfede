"""Static formulations and online eviction policies side by side on one graph (``coop compare``).

For each budget (contract 3 specs, parsed by :func:`coop.budget.parse_budget`) this runs every
registered static formulation (:data:`coop.formulations.FORMULATIONS`: the baselines always, the
solvers when registered) and every online policy (:mod:`coop.online.policies`) and reports one
row per (method, budget): status, live peak (the most bytes resident at once), arena peak (the
highest address used, fragmentation included: the packed placement of the schedule's lifetimes
(the lower of best fit and greedy by size) for static plans, :mod:`coop.runtime.placement`; the online arena's high-water mark for policies), compute
overhead, solve or eviction-search latency, and for static methods the break-even number of
training steps versus each online policy.

One rule decides ``fits`` for both kinds: the arena peak is within the budget. An online policy
runs in an arena of exactly the budget's bytes, so it fits when it finishes; a static plan fits
when the packed placement of its values needs no more than the budget, so a plan whose live
bytes fit but whose frees leave holes too small for the next value is "fragmented", not a fit.

Break-even: a static plan pays its solve latency once and then ``baseline_cost x (1 + overhead)``
per step; an online policy pays ``baseline_cost x (1 + overhead) + search_s`` every step. The
static plan is repaid after ``solve_s / (online per-step - static per-step)`` steps. This needs the
graph's cost in seconds (captured graphs); for graphs whose cost unit is not time (the published
Checkmate graphs count profiled units) the break-even is left empty and the report says why.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coop.budget import baseline_peak, below_min_budget, min_budget, parse_budget
from coop.config import SweepConfig
from coop.device_profiles import load_device_profile
from coop.errors import CoopError
from coop.formulations import BASELINES, FORMULATIONS, solve
from coop.graph import Graph
from coop.memory_viz import write_memory_viz
from coop.online.delta import DELTA, delta_profile
from coop.online.delta_sim import simulate_delta
from coop.online.online_sim import OnlineResult, simulate_online
from coop.online.policies import POLICIES
from coop.runtime.placement import ARENA_ROUNDS, next_live_budget, packed_placement

#: Registry names that are not static plans (an online fallback registered as a formulation).
ONLINE_FORMULATION_NAMES = frozenset({"dynamic", "online"})

#: How ``fits`` is decided, stated in every report.
FITS_NOTE = ("fits: the arena peak (highest address used, fragmentation included) is within the budget, for static "
             "plans (packed placement of the schedule's values: the lower of best fit and greedy by size) and online policies (which run in an arena of the "
             "budget's size) alike; 'fragmented': the live peak fits but the placement does not")

#: The methods that may page a value out (POET's formulation, DELTA's policy): their budgets meet the bound of paged
#: schedules (:func:`coop.budget.min_budget` with ``paging=True``).
PAGING_METHODS = frozenset({"poet", DELTA})
#: The columns delta's rows add (its swaps, priced on the device profile).
DELTA_COLUMNS = ("swapped_bytes", "recomputed_cost", "exposed_copy_s", "host_peak")

#: The columns of every row, in table order.
COLUMNS = (
    "method", "kind", "budget_spec", "budget", "fraction", "status", "fits", "live_peak", "arena_peak", "overhead",
    "solve_s", "search_s", "step_s", "message",
)


@dataclass
class CompareReport:
    """All rows of one comparison; ``notes`` explain empty columns (e.g. no break-even)."""

    graph: str
    cost_unit: str
    baseline_peak: int
    min_budget: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        extra = sorted({k for row in self.rows for k in row if k not in COLUMNS})
        return list(COLUMNS[:-1]) + extra + ["message"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "cost_unit": self.cost_unit,
            "baseline_peak": self.baseline_peak,
            "min_budget": self.min_budget,
            "rows": [{k: _jsonable(v) for k, v in row.items()} for row in self.rows],
            "notes": self.notes,
        }

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns)
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: _csv_value(row.get(k)) for k in self.columns})
        return path

    def to_markdown(self) -> str:
        """A GitHub table of the main columns, then the notes."""
        break_even = [c for c in self.columns if c.startswith("break_even_vs_")]
        priced = [c for c in ("energy_j", "paged_bytes", *DELTA_COLUMNS) if c in self.columns]  # poet and delta rows
        columns = ["method", "kind", "budget_spec", "status", "fits", "live_peak", "arena_peak", "overhead", *priced,
                   "solve_s", "search_s", *break_even]
        lines = [
            (f"**{self.graph}**: baseline peak {self.baseline_peak}, min_budget (lower bound) {self.min_budget}, "
             f"cost unit {self.cost_unit}"),
            "",
            "| " + " | ".join(c.replace("break_even_vs_", "break-even vs ") for c in columns) + " |",
            "|" + "|".join("---" for _ in columns) + "|",
        ]
        for row in self.rows:
            lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path) -> Path:
        """PNG: compute overhead against budget (fraction of the baseline peak), one line per method."""
        from coop.viz import plot_overhead_vs_budget  # lazy: matplotlib is loaded only to plot

        points = [{"method": row["method"], "budget": row["fraction"],
                   "overhead": row["overhead"] if row["fits"] else None} for row in self.rows]
        online = {row["method"] for row in self.rows if row["kind"] == "online"}
        return plot_overhead_vs_budget(points, path, title=f"{self.graph}: overhead vs budget",
                                       xlabel="budget (fraction of the baseline peak)", dashed=online)


def simulate_report(graph: Graph, policy: str, budget: str | int | float,  # noqa: PYI041 (int: graph units)
                    device_profile: str | None = None, *, memory_viz: str | Path | None = None,
                    compact: bool = False) -> dict[str, Any]:
    """``coop simulate``: one online policy on one graph and budget, as a JSON-ready dict.

    Parameters
    ----------
    graph : Graph
        The graph whose baseline order is run.
    policy : str
        The online eviction policy's name (:func:`coop.online.online_sim.simulate_online`).
    budget : str or int or float
        The budget, in any form :func:`coop.budget.parse_budget` reads (an int is graph units).
    device_profile : str or None
        The device profile whose host link prices ``delta``'s swaps (required by delta, refused by the others).
    memory_viz : str or Path or None
        Also write the run's schedule, simulated by the one simulator on the graph with its random draws
        replayable, as a PyTorch memory snapshot there (:func:`coop.memory_viz.write_memory_viz`), when the run
        finished; ``report["memory_viz"]`` names the file.
    compact : bool
        Close the arena's gaps where no eviction makes a contiguous room, as the dynamic fallback does
        (:func:`coop.online.online_sim.simulate_online`); off, the address model is binding.

    Returns
    -------
    dict of str to Any
        The graph's name, the policy, the budget in graph units, ``min_budget`` and ``baseline_peak``, then either
        the online run's result with ``ok``, or, for a budget below :func:`coop.budget.min_budget`, status
        "infeasible" and the message (reported, not raised).

    Raises
    ------
    BudgetError
        When the budget cannot be parsed.
    DeviceProfileError
        For delta without a device profile, or an unknown one.
    CoopError
        For a device profile given to a policy that does not page.
    """
    _check_online(policy, device_profile)
    budget_units = parse_budget(budget, graph, check=False)
    # the bound of the graph the engines run (random draws replayed); DELTA, given a device profile, swaps
    bounded, paging = graph.with_random_replay(), device_profile is not None
    least = min_budget(bounded, paging=paging)
    report: dict[str, Any] = {
        "graph": graph.name,
        "policy": policy,
        "budget": budget_units,
        "min_budget": least,
        "baseline_peak": baseline_peak(graph),
    }
    if below := below_min_budget(budget_units, bounded, paging=paging):
        return report | {"status": "infeasible", "message": below}
    result = _simulate(graph, budget_units, policy, device_profile, compact)
    if memory_viz is not None and result.schedule is not None:  # the online engines' schedules replay random draws
        write_memory_viz(memory_viz, graph.with_random_replay(), result.schedule)
        report["memory_viz"] = str(memory_viz)
    return report | result.to_dict() | {"ok": result.status == "ok"}


def _check_online(policy: str, device_profile: str | None) -> None:
    """One line for an unknown policy, delta without a profile, or a profile given to a policy that does not page."""
    if policy == DELTA:
        delta_profile(device_profile)
    elif policy not in POLICIES:
        raise CoopError(f"unknown eviction policy {policy!r}: choose one of {', '.join([*POLICIES, DELTA])}")
    elif device_profile is not None:
        raise CoopError(f"policy {policy!r} only recomputes, so a device profile prices nothing: drop it, or use "
                        f"--policy {DELTA} (swaps priced on the profile)")


def _simulate(graph: Graph, budget: int, policy: str, device_profile: str | None,
              compact: bool = False) -> OnlineResult:
    if policy == DELTA:
        return simulate_delta(graph, budget, device_profile, compact=compact)
    return simulate_online(graph, budget, policy, compact=compact)


def compare(
    graph: Graph,
    budgets: Sequence[str | int | float],
    formulations: Iterable[str] | None = None,
    policies: Iterable[str] | None = None,
    time_limit: float = 10.0,
    progress: bool = False,
    *,
    solver_options: dict[str, dict[str, Any]] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    device_profile: str | None = None,
) -> CompareReport:
    """Run the static formulations and online policies on ``graph`` at every budget.

    A formulation that raises a CoopError on this graph (e.g. a baseline that needs a forward/backward split)
    gets a "skipped" row with the reason; a budget below :func:`coop.budget.min_budget` gets "infeasible" rows.
    Static formulations run on ``graph.with_random_replay()`` (random draws recomputable, as the executor
    replays them).

    Parameters
    ----------
    budgets : sequence of str or int or float
        The budgets, each in any form :func:`coop.budget.parse_budget` reads; at least one.
    formulations : iterable of str or None
        Static formulations by name; None: all registered ones, except that by default ``monet`` runs only on
        graphs with implementations (elsewhere it is moccasin's search again) and ``poet`` only with a
        ``device_profile``.
    policies : iterable of str or None
        Online eviction policies by name; None: all of them (``delta`` only with a ``device_profile``).
    time_limit : float
        Seconds, passed to formulations that take one.
    progress : bool
        Show a rich progress bar.
    solver_options : dict of str to dict or None
        Per-formulation keyword options, by formulation name.
    on_row : callable or None
        Called with each row as it is made.
    device_profile : str or None
        A device profile (name or .toml path) that prices ``poet``'s paging and ``delta``'s swaps; their rows show
        energy and paged bytes (poet), swapped bytes, recomputed cost, exposed copy time and host peak (delta).

    Returns
    -------
    CompareReport
        One row per budget and method, with the break-even steps of static plans against online policies.

    Raises
    ------
    CoopError
        For an unknown formulation or policy, or no budget.
    DeviceProfileError
        For an unknown device profile or one whose file cannot be read.
    BudgetError
        When a budget cannot be parsed.
    """
    formulation_names = _formulation_names(formulations, graph, device_profile)
    if device_profile is not None:
        load_device_profile(device_profile)  # an unknown name or a bad file: one line before any solve
        solver_options = {**(solver_options or {})}
        solver_options["poet"] = {"device_profile": device_profile, **solver_options.get("poet", {})}
    policy_names = list(policies) if policies is not None else [*POLICIES, *([DELTA] if device_profile else [])]
    for name in policy_names:
        _check_online(name, device_profile if name == DELTA else None)
    if not budgets:
        raise CoopError("compare needs at least one budget (e.g. --budgets 0.9,0.7,0.5)")
    # Static plans may recompute random draws too: the executor replays them from their saved
    # generator state, as the online engine does (a no-op for graphs without torch random ops).
    static_graph = graph.with_random_replay()
    peak, least = baseline_peak(graph), min_budget(static_graph)
    cost_unit = str(graph.meta.get("cost_unit", "unknown"))
    report = CompareReport(graph.name, cost_unit, peak, least, notes=[FITS_NOTE])
    parsed = [(str(spec), parse_budget(spec, graph, check=False)) for spec in budgets]
    tasks = [(spec, units, name, "static") for spec, units in parsed for name in formulation_names]
    tasks += [(spec, units, name, "online") for spec, units in parsed for name in policy_names]
    with _progress_bar(progress, len(tasks), graph.name) as advance:
        for spec, units, name, kind in tasks:
            advance(f"{name} @ {spec}")
            # POET and DELTA may page what cannot be recomputed: the bound of paged schedules
            if below := below_min_budget(units, static_graph, paging=name in PAGING_METHODS):
                row = _row(name, kind, spec, units, peak, status="infeasible", message=below)
            elif kind == "static":
                options = {"time_limit": time_limit} | (solver_options or {}).get(name, {})
                row = _static_row(static_graph, name, spec, units, peak, options)
            else:
                row = _online_row(graph, name, spec, units, peak, device_profile)
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
    _add_break_even(report, graph, policy_names)
    return report


def run_sweep(config: SweepConfig, progress: bool = False, output_dir: str | Path | None = None) -> list[CompareReport]:
    """Every graph of a sweep config through :func:`compare`, each report written as CSV, Markdown and a plot.

    Parameters
    ----------
    config : SweepConfig
        The sweep: graphs, budgets, formulations, policies, time limit, solver options.
    progress : bool
        Show a rich progress bar per graph.
    output_dir : str or Path or None
        Where ``<graph>.csv``, ``<graph>.md`` and ``<graph>.png`` are written; None: the config's ``output_dir``.

    Returns
    -------
    list of CompareReport
        One report per graph, in config order.
    """
    reports = []
    for graph in config.load_graphs():
        report = compare(graph, config.budgets, config.formulation_names, config.policy_names, config.time_limit,
                         progress, solver_options=config.solver_options)
        reports.append(report)
        folder = Path(output_dir if output_dir is not None else config.output_dir)
        stem = _safe_name(graph.name)
        report.to_csv(folder / f"{stem}.csv")
        (folder / f"{stem}.md").write_text(report.to_markdown())
        report.plot(folder / f"{stem}.png")
    return reports


# -------------------------------------------------------------------- rows
def _formulation_names(formulations: Iterable[str] | None, graph: Graph, device_profile: str | None) -> list[str]:
    if formulations is None:
        applies = {"monet": graph.has_impls, "poet": device_profile is not None}
        return [n for n in FORMULATIONS if n not in ONLINE_FORMULATION_NAMES and applies.get(n, True)]
    names = list(formulations)
    for name in names:
        if name not in FORMULATIONS:
            raise CoopError(f"unknown formulation {name!r}: choose one of {', '.join(FORMULATIONS)}")
    return names


def _row(method: str, kind: str, spec: str, budget: int, reference_peak: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {column: None for column in COLUMNS}
    row.update(method=method, kind=kind, budget_spec=spec, budget=budget, fraction=budget / reference_peak if reference_peak else None,
               fits=False, message="")
    row.update(values)
    return row


def _static_row(graph: Graph, name: str, spec: str, budget: int, peak: int, options: dict[str, Any]) -> dict[str, Any]:
    """A static formulation aimed at the arena: solved at the budget in live bytes and, while its packed
    placement overflows the arena, solved again at a lower live budget (as ``coop.plan(arena=True)``); the
    solve time counts every round."""
    started = time.perf_counter()
    live_budget, rounds = budget, 0
    fitted = None  # the last round's result with a schedule
    while True:
        try:
            # Warm starts, the online policies' schedules among them, are collected by the solver itself
            # (coop.formulations.heuristics.warm_start), so their time counts in this solve.
            result = solve(graph, live_budget, name, **options)
        except (CoopError, ImportError) as exc:
            return _row(name, "static", spec, budget, peak, status="skipped", message=str(exc).splitlines()[0],
                        solve_s=time.perf_counter() - started)
        if result.schedule is None or result.simulation is None:
            if fitted is None:
                return _row(name, "static", spec, budget, peak, status=result.status,
                            solve_s=time.perf_counter() - started, message=result.message or "no schedule found")
            result = fitted  # the last round's schedule stands, with its verdict
            break
        fitted = result
        rounds += 1
        sim = result.simulation
        arena_peak = packed_placement(graph, result.schedule).arena_peak
        if arena_peak <= budget or sim.peak > live_budget or rounds == ARENA_ROUNDS or name in BASELINES:
            break  # fits; or a baseline / over-budget schedule that a lower budget would not change
        live_budget = next_live_budget(live_budget, sim.peak, arena_peak, budget)
        if live_budget < min_budget(graph):
            break
    solve_s = time.perf_counter() - started
    sim = result.simulation
    arena_peak = packed_placement(graph, result.schedule).arena_peak
    status, message = _static_verdict(result.status, sim.peak, arena_peak, budget)
    # POET's rows: the schedule priced on its device profile (coop.formulations.poet.milp.price_schedule).
    priced = {} if result.price is None else {"energy_j": result.price.energy_j, "paged_bytes": result.price.paged_bytes}
    return _row(name, "static", spec, budget, peak, status=status, fits=arena_peak <= budget, live_peak=sim.peak,
                arena_peak=arena_peak, overhead=sim.overhead, solve_s=solve_s,
                step_s=_step_seconds(graph, sim.overhead, 0.0), message=message or result.message, **priced)


def _static_verdict(solver_status: str, live_peak: int, arena_peak: int, budget: int) -> tuple[str, str]:
    """Status and message of a static plan under the arena rule (one line; empty: the solver's own)."""
    if live_peak > budget:
        return "over-budget", f"live peak {live_peak} exceeds the budget {budget}"
    if arena_peak > budget:
        return "fragmented", (f"live peak {live_peak} fits the budget {budget}, but placing its values (packed) "
                              f"needs an arena of {arena_peak}: raise the budget to {arena_peak}")
    return solver_status, ""


def _online_row(graph: Graph, name: str, spec: str, budget: int, peak: int,
                device_profile: str | None = None) -> dict[str, Any]:
    result = _simulate(graph, budget, name, device_profile)
    # delta's rows: its swaps priced on the device profile (coop.online.delta_sim.DeltaResult).
    swapped = {column: getattr(result, column) for column in DELTA_COLUMNS if hasattr(result, column)}
    finished = result.schedule is not None
    return _row(name, "online", spec, budget, peak, status=result.status,
                fits=finished and result.arena_peak <= budget, live_peak=result.peak,
                arena_peak=result.arena_peak, overhead=result.overhead if finished else None,
                search_s=result.search_s, step_s=_step_seconds(graph, result.overhead, result.search_s) if finished else None,
                evictions=result.evictions, fragmentation=result.fragmentation, message=result.message, **swapped)


# -------------------------------------------------------------------- break-even
def cost_is_seconds(graph: Graph) -> bool:
    """Whether the graph's node costs are seconds (captured graphs), so per-step times are real.

    Parameters
    ----------
    graph : Graph
        The graph; its ``meta["cost_unit"]`` is read.

    Returns
    -------
    bool
        True when the cost unit starts with ``"seconds"``.
    """
    return str(graph.meta.get("cost_unit", "")).startswith("seconds")


def _step_seconds(graph: Graph, overhead: float, search_s: float) -> float | None:
    if not cost_is_seconds(graph):
        return None
    return graph.baseline_cost * (1.0 + overhead) + search_s


def break_even_steps(solve_s: float, static_step_s: float, online_step_s: float) -> float:
    """Training steps after which a static plan's one-off solve is repaid (inf: never).

    The static plan costs ``solve_s + n * static_step_s`` over n steps, the online policy
    ``n * online_step_s``; the smallest n where the static plan is no more expensive.

    Parameters
    ----------
    solve_s : float
        The static plan's solve time, seconds.
    static_step_s : float
        The static plan's time per step, seconds.
    online_step_s : float
        The online policy's time per step, seconds.

    Returns
    -------
    float
        The number of steps (a whole number); 0 when the solve took no time, ``inf`` when the static plan's
        steps are not faster.
    """
    saving = online_step_s - static_step_s
    if solve_s <= 0:
        return 0.0
    if saving <= 0:
        return math.inf
    return math.ceil(solve_s / saving)


def _add_break_even(report: CompareReport, graph: Graph, policy_names: list[str]) -> None:
    if not cost_is_seconds(graph):
        report.notes.append(
            f"break-even steps are not computed: the graph's cost unit is {report.cost_unit!r}, not time, so "
            "per-step compute cannot be set against solve latency in seconds"
        )
        return
    report.notes.append(
        "break-even vs P: training steps after which the static solve latency is repaid by its lower per-step time "
        "(baseline cost x (1 + overhead), plus the policy's eviction search per step); inf = never"
    )
    online = {(r["budget"], r["method"]): r for r in report.rows if r["kind"] == "online"}
    for row in report.rows:
        if row["kind"] != "static":
            continue
        for policy in policy_names:
            other = online.get((row["budget"], policy))
            value = None
            if row["fits"] and row["step_s"] is not None and other is not None and other["step_s"] is not None:
                value = break_even_steps(row["solve_s"], row["step_s"], other["step_s"])
            row[f"break_even_vs_{policy}"] = value


# -------------------------------------------------------------------- helpers
class _NoProgress:
    def __enter__(self) -> Callable[[str], None]:
        return lambda description: None

    def __exit__(self, *exc: object) -> None:
        return None


class _RichProgress:
    """A rich bar over the sweep; each call to the advance function marks one task started."""

    def __init__(self, total: int, title: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=True)
        self.title = title
        self.total = total
        self.started = 0

    def __enter__(self) -> Callable[[str], None]:
        self.progress.start()
        self.task = self.progress.add_task(self.title, total=self.total)

        def advance(description: str) -> None:
            if self.started:
                self.progress.advance(self.task)
            self.started += 1
            self.progress.update(self.task, description=f"{self.title}: {description}")

        return advance

    def __exit__(self, *exc: object) -> None:
        self.progress.update(self.task, completed=self.total)
        self.progress.stop()


def _progress_bar(enabled: bool, total: int, title: str) -> _NoProgress | _RichProgress:
    return _RichProgress(total, title) if enabled else _NoProgress()


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "graph"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "never"
    return value


def _csv_value(value: Any) -> Any:
    return "" if value is None else _jsonable(value)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "never"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


__all__ = ["COLUMNS", "FITS_NOTE", "CompareReport", "break_even_steps", "compare", "cost_is_seconds", "run_sweep", "simulate_report"]
