"""Benchmark: POET (Patil et al., ICML 2022) on its own published graphs and device profiles.

For every graph of ``../shared/graphs/poet/`` (POET's layer graphs of five models, costed by
POET's code for m0, m4, a72 and a72nocache) and the profiles of :data:`FULL_PROFILES` (any profile of
``coop/configs/devices/`` with ``run(profiles=...)``; a graph is re-costed for a profile it was not exported for by POET's
runtime model, runtime = FLOPs / FLOP/s, from the a72 export), at POET's published budgets
(resnet18_cifar: 737,719 B with runtime budget 1.5 on m4; 3,000,000 B with 7.6 on a72) and a sweep
of fractions of the baseline peak, it solves three ways with the same MILP and objective
(energy): ``poet`` (recompute and page), ``remat-only`` (``paging=False``, Checkmate with POET's
objective) and ``paging-only`` (``remat=False``, Capuchin-style). Each row: energy (J), runtime
(compute + paging, s), recomputations, page-ins and page-outs, solve time and gap.

``--quick`` runs poet_linear and poet_transformer on m4 and a72 at two budgets with a 10 s limit.

Run: ``.venv/bin/python -m benchmarks.bench_poet [--quick] [--time-limit 120] [--models linear,vgg16_cifar]``
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
from coop.formulations.poet import poet
from coop.graph import Graph
from coop.graph_files import load_graph

GRAPH_DIR = Path(__file__).resolve().parents[2] / "shared" / "graphs" / "poet"
MODELS = ("linear", "transformer", "vgg16_cifar", "resnet18_cifar", "resnet18")
EXPORTED = ("m0", "m4", "a72", "a72nocache")  # the platforms POET's code costed the graphs for
FRACTIONS = (0.9, 0.6, 0.4)
#: The full run: POET's four exported platforms and one data-centre GPU (the others are re-costed the same way).
FULL_PROFILES = (*EXPORTED, "a100-pcie4")
#: POET's README examples: (model, platform, budget bytes, runtime budget factor).
PUBLISHED = (("resnet18_cifar", "m4", 737_719, 1.5), ("resnet18_cifar", "a72", 3_000_000, 7.6))
#: remat-only and paging-only run first: their schedules are poet's hints, so poet is never worse than either row.
METHODS = {"remat-only": {"paging": False}, "paging-only": {"remat": False}, "poet": {}}


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
    extra = result.extra
    return {"graph": graph.name, "nodes": len(graph.order), "profile": profile_name, "budget": label,
            "budget_bytes": budget, "runtime_budget": runtime_budget, "method": method, "status": result.status,
            "energy_j": extra.get("energy_j"), "time_s": extra.get("time_s"),
            "recomputations": extra.get("recomputations"), "page_ins": extra.get("page_ins"),
            "page_outs": extra.get("page_outs"), "solve_s": round(result.wall_s, 2),
            "gap": None if result.gap is None else round(result.gap, 4)}, result.schedule


def run(quick: bool = False, models: tuple[str, ...] | None = None, profiles: tuple[str, ...] | None = None,
        fractions: tuple[float, ...] | None = None, time_limit: float | None = None, threads: int = 2,
        graph_dir: Path = GRAPH_DIR) -> dict[str, Any]:
    """One row per (graph, profile, budget, method)."""
    if not graph_dir.is_dir():
        return {"rows": [], "notes": f"skipped: POET's graphs not found at {graph_dir}"}
    models = models or (("linear", "transformer") if quick else MODELS)
    profiles = profiles or (("m4", "a72") if quick else FULL_PROFILES)
    fractions = fractions or ((0.9, 0.6) if quick else FRACTIONS)
    time_limit = time_limit or (10.0 if quick else 20.0)
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
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    notes = (f"Energy objective, CBC, {time_limit:g} s per solve, {threads} threads. poet <= min(remat-only, "
             "paging-only) holds wherever all three are optimal (the three share one model: remat-only and "
             "paging-only fix variables of it). Re-costed graphs: runtime = FLOPs / the profile's FLOP/s from the a72 "
             "export (POET's runtime model); GPU profiles price compute and paging at board power (see their TOML).")
    return {"rows": rows, "notes": notes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=lambda s: tuple(s.split(",")))
    parser.add_argument("--profiles", type=lambda s: tuple(s.split(",")))
    parser.add_argument("--time-limit", type=float)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    out = run(quick=args.quick, models=args.models, profiles=args.profiles, time_limit=args.time_limit,
              threads=args.threads)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
