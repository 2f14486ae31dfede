"""Benchmark: POET (Patil et al., ICML 2022) on its own published graphs and device profiles.

For every graph of ``graphs/poet/`` (POET's layer graphs of five models, costed by
POET's code for m0, m4, a72 and a72nocache) and the profiles of :data:`FULL_PROFILES` (any profile of
``coop/configs/devices/`` with ``run(profiles=...)``; a graph is re-costed for a profile it was not exported for by POET's
runtime model, runtime = FLOPs / FLOP/s, from the a72 export), at POET's published budgets
(resnet18_cifar: 737,719 B with runtime budget 1.5 on m4; 3,000,000 B with 7.6 on a72) and a sweep
of fractions of the baseline peak, it solves three ways with the same MILP and objective
(energy): ``poet`` (recompute and page), ``remat-only`` (``paging=False``, Checkmate with POET's
objective) and ``paging-only`` (``remat=False``, Capuchin-style). Each row: energy (J), runtime
(compute + paging, s), recomputations, page-ins and page-outs, solve time and gap.

Beside them, on every cell, ``published model, CBC``: POET's published MILP re-implemented from the
paper (:mod:`benchmarks.poet_published`, PuLP + CBC, the published semantics: its runtime budget
counts compute only, its slow-tier copy persists, a page-out needs the value resident at the stage's
start) at the same time limit, its solution converted to a coop schedule, validated and priced by
coop's device-profile model like the other rows (``published_objective_j``: the model's own
objective; it is lower than ``energy_j`` only where the published model reuses a slow-tier copy that
coop pays to page out again). The notes count the cells where poet's energy is no higher.

``--quick`` runs poet_linear and poet_transformer on m4 and a72 at two budgets with a 10 s limit.

Run: ``.venv/bin/python -m benchmarks.bench_poet [--quick] [--time-limit 120] [--models linear,vgg16_cifar]
[--fractions 0.6] [--no-published]``
or ``python benchmarks/run_all.py --only bench_poet [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from coop.budget import baseline_peak, min_budget
from coop.device_profiles import load_device_profile
from coop.formulations.poet.milp import poet
from coop.graph import Graph
from coop.graph_files import load_graph

try:  # run as ``python -m benchmarks.bench_poet`` or by run_all with the repository root on sys.path
    from benchmarks.poet_published import solve_published
except ImportError:  # run as a script from benchmarks/
    from poet_published import solve_published  # type: ignore[no-redef]

GRAPH_DIR = Path(__file__).resolve().parents[1] / "graphs" / "poet"
MODELS = ("linear", "transformer", "vgg16_cifar", "resnet18_cifar", "resnet18")
EXPORTED = ("m0", "m4", "a72", "a72nocache")  # the platforms POET's code costed the graphs for
FRACTIONS = (0.9, 0.6, 0.4)
#: The full run: POET's four exported platforms and one data-centre GPU (the others are re-costed the same way).
FULL_PROFILES = (*EXPORTED, "a100-pcie4")
#: POET's README examples: (model, platform, budget bytes, runtime budget factor).
PUBLISHED = (("resnet18_cifar", "m4", 737_719, 1.5), ("resnet18_cifar", "a72", 3_000_000, 7.6))
#: remat-only and paging-only run first: their schedules are poet's hints, so poet is never worse than either row.
METHODS = {"remat-only": {"paging": False}, "paging-only": {"remat": False}, "poet": {}}
PUBLISHED_METHOD = "published model, CBC"
#: The full run solves the published model at POET's published budgets and 0.6 x peak (every cell would add
#: about a third to the run); ``--quick`` and ``run(published_on=None)`` solve it on every cell.
PUBLISHED_ON = ("published", "0.6 x peak")


def graph_for(model: str, profile_name: str, graph_dir: Path = GRAPH_DIR) -> Graph:
    """POET's export for this platform, or the a72 export re-costed: runtime = FLOPs / the profile's FLOP/s."""
    if profile_name in EXPORTED:
        return load_graph(graph_dir / f"poet_{model}_{profile_name}_b1.json")
    graph = load_graph(graph_dir / f"poet_{model}_a72_b1.json")
    ratio = load_device_profile("a72").flops_per_s / load_device_profile(profile_name).flops_per_s
    nodes = [node.model_copy(update={"cost": node.cost * ratio}) for node in graph.nodes]
    return graph.model_copy(update={"nodes": tuple(nodes), "name": f"poet_{model}_{profile_name}_b1 (re-costed)"})


def budgets(graph: Graph, model: str, profile_name: str, fractions: tuple[float, ...]) -> list[tuple[str, int, float | None]]:
    """(label, bytes, runtime budget) at POET's published budgets and the sweep, at or above min_budget."""
    chosen = [("published", b, r) for m, p, b, r in PUBLISHED if m == model and p == profile_name]
    peak, least = baseline_peak(graph), min_budget(graph)
    chosen += [(f"{f:g} x peak", math.ceil(f * peak), None) for f in fractions if math.ceil(f * peak) >= least]
    return chosen


def row(graph: Graph, profile_name: str, label: str, budget: int, runtime_budget: float | None, method: str,
        time_limit: float, threads: int, hint: list[Any] | None = None) -> tuple[dict[str, Any], Any]:
    """One row and the schedule it found (None when none)."""
    result = poet(graph, budget, device_profile=profile_name, runtime_budget=runtime_budget, time_limit=time_limit,
                  threads=threads, hint=hint or None, **METHODS[method])
    price = result.price
    return {"graph": graph.name, "nodes": len(graph.order), "profile": profile_name, "budget": label,
            "budget_bytes": budget, "runtime_budget": runtime_budget, "method": method, "status": result.status,
            "energy_j": price and price.energy_j, "time_s": price and price.time_s,
            "recomputations": result.extra.get("recomputations"), "page_ins": price and price.page_ins,
            "page_outs": price and price.page_outs, "solve_s": round(result.wall_s, 2),
            "gap": None if result.gap is None else round(result.gap, 4)}, result.schedule


def published_row(graph: Graph, profile_name: str, label: str, budget: int, runtime_budget: float | None,
                  time_limit: float, threads: int) -> dict[str, Any]:
    """The published model's row (benchmarks.poet_published), in the columns of :func:`row`."""
    result = solve_published(graph, budget, profile_name, runtime_budget=runtime_budget, time_limit=time_limit,
                             threads=threads)
    return {"graph": graph.name, "nodes": len(graph.order), "profile": profile_name, "budget": label,
            "budget_bytes": budget, "runtime_budget": runtime_budget, "method": PUBLISHED_METHOD,
            "status": result.status, "energy_j": result.energy_j, "time_s": result.time_s,
            "recomputations": result.recomputations, "page_ins": result.page_ins, "page_outs": result.page_outs,
            "solve_s": round(result.wall_s, 2), "gap": None if result.gap is None else round(result.gap, 4),
            "build_s": round(result.build_s, 2), "published_objective_j": result.objective, "note": result.message or None}


def mark_poet_le_subsets(cell: list[dict[str, Any]]) -> None:
    """On the poet row of one cell: whether its energy is at most remat-only's and paging-only's, compared exactly
    (no tolerance, no rounding; a subset that found nothing does not count against it)."""
    *subsets, ours = cell
    found = [r["energy_j"] for r in subsets if r["energy_j"] is not None]
    ours["poet_le_subsets"] = None if ours["energy_j"] is None else all(ours["energy_j"] <= e for e in found)


def poet_le_subsets(rows: list[dict[str, Any]]) -> str:
    """The check line: in how many cells poet's energy is at most min(remat-only, paging-only)."""
    marked = [r["poet_le_subsets"] for r in rows if r["method"] == "poet"]
    return (f"poet <= min(remat-only, paging-only), exactly, in {sum(m is True for m in marked)} of {len(marked)} "
            f"cells ({sum(m is None for m in marked)} where poet found no schedule).")


def poet_vs_published(rows: list[dict[str, Any]]) -> str:
    """The check line: poet's energy against the published model's, per cell where the latter found a schedule."""
    cells: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["graph"], r["profile"], r["budget"]), {})[r["method"]] = r
    compared = [(c["poet"], c[PUBLISHED_METHOD]) for c in cells.values()
                if PUBLISHED_METHOD in c and "poet" in c and c[PUBLISHED_METHOD]["energy_j"] is not None
                and c[PUBLISHED_METHOD]["status"] in ("optimal", "feasible")]
    tolerance = 1e-9

    def at_most(ours: Any, theirs: float) -> bool:
        return ours is not None and ours <= theirs * (1 + tolerance) + 1e-15

    priced = sum(at_most(ours["energy_j"], theirs["energy_j"]) for ours, theirs in compared)
    own = sum(at_most(ours["energy_j"], theirs["published_objective_j"]) for ours, theirs in compared)
    optimal = sum(theirs["status"] == "optimal" for _, theirs in compared)
    return (f"poet <= published in {priced} of {len(compared)} cells where published found a schedule "
            f"(both priced by coop's profile model; {own} of {len(compared)} against the published model's own "
            f"objective; the published model proved {optimal} of them optimal).")


def run(quick: bool = False, models: tuple[str, ...] | None = None, profiles: tuple[str, ...] | None = None,
        fractions: tuple[float, ...] | None = None, time_limit: float | None = None, threads: int = 2,
        graph_dir: Path = GRAPH_DIR, published: bool = True,
        published_on: tuple[str, ...] | None = PUBLISHED_ON) -> dict[str, Any]:
    """One row per (graph, profile, budget, method); with ``published`` also the published model's row on the
    budgets labelled in ``published_on`` (None: every budget; ``--quick``: every budget)."""
    if not graph_dir.is_dir():
        return {"rows": [], "notes": f"skipped: POET's graphs not found at {graph_dir}"}
    models = models or (("linear", "transformer") if quick else MODELS)
    profiles = profiles or (("m4", "a72") if quick else FULL_PROFILES)
    fractions = fractions or ((0.9, 0.6) if quick else FRACTIONS)
    time_limit = time_limit or (10.0 if quick else 20.0)
    published_on = None if quick else published_on
    rows = []
    for model in models:
        for profile_name in profiles:
            graph = graph_for(model, profile_name, graph_dir)
            for label, budget, runtime_budget in budgets(graph, model, profile_name, fractions):
                found: list[Any] = []
                for method in METHODS:
                    hint = found if method == "poet" else None
                    result_row, schedule = row(graph, profile_name, label, budget, runtime_budget, method, time_limit,
                                               threads, hint)
                    rows.append(result_row)
                    found += [schedule] if schedule is not None else []
                    if method == "poet":
                        mark_poet_le_subsets(rows[-len(METHODS):])
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                if published and (published_on is None or label in published_on):
                    rows.append(published_row(graph, profile_name, label, budget, runtime_budget, time_limit,
                                              threads))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    notes = (f"Energy objective, CBC, {time_limit:g} s per solve, {threads} threads. " + poet_le_subsets(rows) +
             " remat-only and paging-only fix variables of poet's model, and their schedules are poet's hints. Re-costed graphs: runtime = FLOPs / the profile's FLOP/s from the a72 "
             "export (POET's runtime model); GPU profiles price compute and paging at board power (see their TOML).")
    if published:
        where = "every cell" if published_on is None else "the budgets " + ", ".join(published_on)
        notes += (f" Published model, CBC, on {where}: {time_limit:g} s for CBC (model building timed apart, included in "
                  "solve_s); published semantics, so at the published budgets its runtime budget counts compute only "
                  "while poet's counts paging too. " + poet_vs_published(rows))
    return {"rows": rows, "notes": notes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=lambda s: tuple(s.split(",")))
    parser.add_argument("--profiles", type=lambda s: tuple(s.split(",")))
    parser.add_argument("--time-limit", type=float)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fractions", type=lambda s: tuple(float(f) for f in s.split(",")))
    parser.add_argument("--no-published", action="store_true", help="skip the published model's rows")
    args = parser.parse_args(argv)
    out = run(quick=args.quick, models=args.models, profiles=args.profiles, fractions=args.fractions,
              time_limit=args.time_limit, threads=args.threads, published=not args.no_published)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
