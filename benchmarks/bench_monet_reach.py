"""Benchmark: the least budget each formulation reaches on the captured models, monet against recomputation alone.

MONeT (Shah, Wu, Chandrashekaran, Goyal, Yu, "Memory Optimization for Deep Networks", ICLR 2021) claims that
choosing implementations lets budgets go below what checkpointing alone reaches. The least budget any
remat-only schedule fits is NP-hard to find: it lies between the remat-only graph's proven floor
(``min_budget(graph.remat_only())``) and the budgets schedules are found at. This benchmark measures, per
model of bench_monet:

* ``remat floor``: the proven lower bound of every schedule without implementations (nothing fits below);
* ``remat constructions``: the least budget checkpoint-all, Chen's schedules and greedy eviction reach
  (coop.formulations.ladder.constructed_budget on the remat-only graph, by bisection);
* ``moccasin reach``: the least budget at which Moccasin (remat-only graph, its warm starts included) returns
  a schedule within the time limit, by bisection between the remat floor and the constructions;
* ``monet reach``: the same for monet on the graph with implementations, between its own floor and the
  constructions;

with every probe (budget, status, peak) so a reader sees where each failed. Where monet's reach is above the
remat floor (so no proof separates them), Moccasin is given ``LONG_FACTOR`` times the probe limit at monet's reach. A budget below a graph's floor
is infeasible by proof and not solved. "Reach" is what a solver found within its limit: an upper bound on
the least feasible budget, not a proof, except where monet's reach lies below the remat floor.

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_monet_reach``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks.bench_monet import capture_graph, model_specs, remat_reach
from coop.budget import baseline_peak, min_budget
from coop.formulations import solve
from coop.graph import Graph

#: Seconds per probe (one solve).
TIME_LIMIT = 30.0
#: Where monet's reach lies above the remat floor, Moccasin gets this many times the probe limit at monet's reach.
LONG_FACTOR = 4
#: Bisection stops when the bracket is narrower than this fraction of the baseline peak.
RESOLUTION = 0.005


def run(quick: bool = False) -> dict[str, Any]:
    """One row per (model, formulation): its floor, its reach and the probes that found it."""
    limit = 4.0 if quick else TIME_LIMIT
    rows: list[dict[str, Any]] = []
    for name, (_, builder) in model_specs(quick).items():
        graph, _, _ = capture_graph(builder())
        peak0 = baseline_peak(graph)
        remat_floor = min_budget(graph.remat_only())
        constructions = remat_reach(graph)
        common = {"model": name, "remat_floor": round(remat_floor / peak0, 4),
                  "remat_constructions": round(constructions / peak0, 4)}
        reached: dict[str, int] = {}
        for formulation, target in (("moccasin", graph.remat_only()), ("monet", graph)):
            found, reached[formulation] = _reach(target, formulation, constructions, peak0, limit)
            row = common | {"formulation": formulation} | found
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        monet_row = rows[-1]
        monet_row["monet_below_moccasin_reach"] = reached["monet"] < reached["moccasin"]
        monet_row["monet_below_remat_floor"] = reached["monet"] < remat_floor
        if monet_row["monet_below_moccasin_reach"] and not monet_row["monet_below_remat_floor"]:
            monet_row["moccasin_at_monet_reach"] = _moccasin_check(graph, reached["monet"], peak0, LONG_FACTOR * limit)
    notes = (f"{limit:g} s per probe, 2 threads; fractions of each model's baseline peak (store-all, captured order); "
             f"bisection to {RESOLUTION:g} of it. 'reach': the lowest peak of a schedule a probe returned (the "
             "constructions' when no probe found lower); 'failed above': the highest probed budget at which the "
             "formulation returned nothing ('infeasible' = proven, 'unknown' = nothing found in time). monet reaching "
             "below 'remat floor' is proven to be out of reach of recomputation alone; above it, only of what the "
             f"remat-only methods find: 'moccasin_at_monet_reach' gives Moccasin {LONG_FACTOR} x {limit:g} s there.")
    return {"rows": rows, "notes": notes}


def _reach(graph: Graph, formulation: str, start: int, peak0: int, limit: float) -> tuple[dict[str, Any], int]:
    """Bisect between ``graph``'s floor and ``start`` (a budget the constructions fit) for the least budget at which
    ``formulation`` returns a fitting schedule within ``limit`` seconds: the row's fields and that budget (bytes)."""
    floor = min_budget(graph)
    low, high, best = floor - 1, start, start
    probes: list[str] = []
    failed_above: tuple[int, str] | None = None
    started = time.perf_counter()
    while high - low > RESOLUTION * peak0:
        budget = (low + high) // 2
        result = solve(graph, budget, formulation, time_limit=limit, threads=2)
        sim = result.simulation
        if sim is not None and sim.peak <= budget:
            best = min(best, sim.peak)
            high = min(budget, sim.peak)
            probes.append(f"{budget / peak0:.4f}: {result.status} {sim.peak / peak0:.4f} +{100 * sim.overhead:.1f}%")
        else:
            low = budget
            if failed_above is None or budget > failed_above[0]:
                failed_above = (budget, result.status)
            probes.append(f"{budget / peak0:.4f}: {result.status}")
    return {"floor": round(floor / peak0, 4), "reach": round(best / peak0, 4),
            "failed_above": None if failed_above is None else round(failed_above[0] / peak0, 4),
            "failed_status": None if failed_above is None else failed_above[1],
            "probes": "; ".join(probes), "wall_s": round(time.perf_counter() - started, 1)}, best


def _moccasin_check(graph: Graph, budget: int, peak0: int, limit: float) -> str:
    """Moccasin on the remat-only graph at ``budget`` (monet's reach), with a longer limit."""
    result = solve(graph.remat_only(), budget, "moccasin", time_limit=limit, threads=2)
    sim = result.simulation
    found = f" {sim.peak / peak0:.4f} +{100 * sim.overhead:.1f}%" if sim is not None and sim.peak <= budget else ""
    return f"{result.status}{found} in {result.wall_s:.0f} s"


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
