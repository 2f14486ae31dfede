"""One rank's FSDP step of a 7B-class model planned on this machine, without the cluster (issue 27).

Llama-2-7B's shape (bench_scale's ``SHAPE_7B``: hidden 4096, 32 heads, intermediate 11008, vocab 32000,
bf16 parameters, batch 1, sequence 4096) at 8 and 32 layers, built on the meta device and sharded with
FSDP2's ``fully_shard`` (every decoder layer and the model) under ``coop.fake_cluster(WORLD_SIZE)``: a
process group of the cluster's size that runs no collective. The capture for CUDA gives one rank's Graph:
the rank's parameter shards held for the whole step, each layer's all-gather (its full parameters, freed
after their last use, gathered again where the schedule says) and reduce-scatter as nodes
(:mod:`coop.graph_capture.fsdp`). Each step is planned at 50 % of its baseline peak by Chen's greedy
segments, per-layer checkpointing, the block solver and flat moccasin (both with bench_scale's 240 s).

Columns: ``nodes``, ``capture_s`` (build, shard and capture), ``max_rss_gib`` (this process's peak so far),
``caller_owned_gib`` (the shards and the batch), ``baseline_gib`` (the program order's peak),
``overhead_pct`` (predicted recompute cost over the baseline step, analytic costs: collectives at
:data:`coop.graph_capture.fsdp.LINK_BANDWIDTH`), ``regathers`` (all-gathers the schedule runs beyond one per
layer), ``solve_s``, ``valid`` (the validator's verdict within the budget).
"""

from __future__ import annotations

import math
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_scale import BLOCKS_TIME, MOCCASIN_TIME, QUICK_SHAPE, SHAPE_7B, THREADS, solved_row
from coop.budget import baseline_peak
from coop.graph import Graph
from coop.zoo import model_from_zoo

WORLD_SIZE = 8
LAYERS = (8, 32)
QUICK_LAYERS = (4,)
QUICK_TIME = 5.0
FRACTION = 0.5
GATHER = "coop.fsdp_all_gather.default"


def sharded_capture(layers: int, shape: dict[str, Any], world_size: int) -> tuple[Graph, float]:
    """One rank's Graph of the sharded step (meta build, fake cluster, captured for CUDA) and the seconds it took."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import coop

    started = time.perf_counter()
    with coop.fake_cluster(world_size):
        mesh = init_device_mesh("cpu", (world_size,))
        model, batch, loss_fn = model_from_zoo("llama", {"layers": layers, **shape}, meta=True)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        graph = coop.capture(model, batch, loss_fn=loss_fn, device="cuda").graph
    return graph, time.perf_counter() - started


def regathers(graph: Graph, schedule: Any) -> int | None:
    """All-gathers a schedule runs beyond one per unit (None without a schedule)."""
    if schedule is None:
        return None
    counts = Counter(s.node for s in schedule.steps if s.op == "compute" and graph.node(s.node).op == GATHER)
    return sum(counts.values()) - len(counts)


def run(quick: bool = False) -> dict[str, Any]:
    shape = QUICK_SHAPE if quick else SHAPE_7B
    limit = (QUICK_TIME, QUICK_TIME) if quick else (BLOCKS_TIME, MOCCASIN_TIME)
    methods = [("chen-greedy", {}), ("per-layer", {}), ("blocks", {"time_limit": limit[0], "threads": THREADS}),
               ("moccasin", {"time_limit": limit[1], "threads": THREADS})]
    rows: list[dict[str, Any]] = []
    for layers in QUICK_LAYERS if quick else LAYERS:
        graph, capture_s = sharded_capture(layers, shape, WORLD_SIZE)
        budget = math.ceil(FRACTION * baseline_peak(graph))
        label = f"llama-7b-shape {layers} layers, rank of {WORLD_SIZE}" if not quick else f"llama {layers} quick"
        extra = {"nodes": len(graph.nodes), "capture_s": round(capture_s, 1),
                 "max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                 "caller_owned_gib": round(graph.caller_owned_bytes / 2**30, 3),
                 "baseline_gib": round(baseline_peak(graph) / 2**30, 2), "budget": budget}
        for formulation, options in methods:
            row, result = solved_row(label, graph, formulation, options, budget)
            row["regathers"] = regathers(graph, result.schedule if result is not None else None)
            print(f"bench_fsdp_scale: {label} {formulation}: {row.get('status')} {row.get('overhead_pct')} %",
                  flush=True)
            rows.append({**row, **extra})
    notes = (f"Llama-2-7B's shape ({', '.join(f'{k} {v}' for k, v in shape.items())}), built on the meta device, "
             f"every decoder layer and the model fully_shard-ed under coop.fake_cluster({WORLD_SIZE}), captured for "
             f"CUDA: one rank's step. Budget {FRACTION} of the step's baseline peak; {THREADS} solver threads. "
             "regathers: all-gathers the schedule runs beyond one per unit.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(quick=args.quick), indent=1))
