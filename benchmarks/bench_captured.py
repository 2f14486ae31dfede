"""Benchmark: the peer methods on captured real models: Chen's sqrt(n) and greedy segments,
PyTorch's own min-cut partitioner (activation_memory_budget swept) and Moccasin, all on the
same captured joint step, at 70 % and 50 % of the no-remat (baseline) peak and at 1.0 x and
1.1 x the constructed budget.

The least feasible budget is not known exactly: ``min_budget`` is the proven lower bound (no
schedule fits below it) and :func:`coop.formulations.ladder.constructed_budget.constructed_budget` an
upper bound found by construction, the lowest peak of a schedule it constructs (checkpoint-all, or
greedy eviction bisected on the budget). The rows use the constructed budget, the least budget
known to be feasible; both bounds are printed. Moccasin is warm-started, as the paper does, from the schedules of the peers that fit
(pytorch-mincut and the Chen baselines, ``hint``); its CP-SAT time limit is 60 s minus the
min-cut sweep's time, so its wall time with the sweep stays within 60 s (``wall_s`` is the
solve, ``with_peers_s`` adds the sweep).

Models: GPT-2 small (12 layers, hidden 768, 12 heads, vocab 50257; batch 8, seq 512) from
coop.zoo, and ResNet-50 (batch 32, 224 x 224) built from transformers' default ResNetConfig,
which is ResNet-50 (depths 3-4-6-3, widths 256-2048): coop.zoo's resnet gives every stage the
same depth, so it cannot express ResNet-50. Capture is traced on fake tensors, so nothing of the
activation size is allocated on this machine; costs are the analytic estimate (seconds), memory
is bytes. Each row: status, whether the simulated peak fits, peak, peak / baseline peak, cost,
overhead (the simulated extra compute over the baseline cost), wall time. pytorch-mincut's
partitions do not depend on the budget and are computed once per model (``sweep_s``; its
``wall_s`` on later budgets is the selection only).

Run: ``.venv/bin/python -m benchmarks.bench_captured [--quick] [--time-limit 60]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.formulations import FORMULATIONS, solve
from coop.formulations.core.result import SolveResult
from coop.formulations.ladder.constructed_budget import constructed_budget
from coop.graph_capture import Captured, capture
from coop.zoo import build

FORMULATIONS_COMPARED = ("chen-sqrt", "chen-greedy", "pytorch-mincut", "moccasin")
BUDGETS: tuple[tuple[str, Callable[[int, int], int]], ...] = (
    ("0.7 x baseline", lambda peak, constructed: math.ceil(0.7 * peak)),
    ("0.5 x baseline", lambda peak, constructed: math.ceil(0.5 * peak)),
    ("1.1 x constructed", lambda peak, constructed: math.ceil(1.1 * constructed)),
    ("1.0 x constructed", lambda peak, constructed: constructed),
)


def _resnet50(batch: int, image: int) -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable[..., torch.Tensor]]:
    """ResNet-50 (transformers' default ResNetConfig) with random weights and a classifier loss."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_labels=1000)).train()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, 1000, (batch,), generator=generator)

    def loss_fn(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(pixel_values=images).logits, labels)

    return model, (images, labels), loss_fn


def capture_models(quick: bool = False) -> dict[str, Captured]:
    """The captured steps, full size (or small ones under ``quick``)."""
    if quick:
        gpt2 = build("gpt2", layers=2, hidden=128, heads=4, batch=2, seq=128, vocab=1024)
        resnet = build("resnet", layers=1, hidden=16, batch=4, image=64)
        specs = {"gpt2-2x128 b2 s128": gpt2, "resnet-mini b4 64px": resnet}
    else:
        gpt2 = build("gpt2", layers=12, hidden=768, heads=12, batch=8, seq=512, vocab=50257)
        specs = {"gpt2-12x768 b8 s512": gpt2, "resnet50 b32 224px": _resnet50(batch=32, image=224)}
    captured = {}
    for name, (model, batch, loss_fn) in specs.items():
        captured[name] = capture(model, batch, loss_fn)
        del model
    return captured


def _options(formulation: str, captured: Captured, time_limit: float, peers: list[SolveResult]) -> dict[str, Any]:
    if formulation == "pytorch-mincut":
        return {"captured": captured}
    if formulation == "moccasin":
        return {"time_limit": max(time_limit - _sweep_s(peers), 1.0), "hint": [p for p in peers if p.schedule is not None]}
    return {}


def _sweep_s(peers: list[SolveResult]) -> float:
    """Seconds the min-cut sweep among the peers took (Moccasin's wall time budget shares them)."""
    return sum(p.extra.get("sweep_s", 0.0) for p in peers if p.formulation == "pytorch-mincut")


def _row(model: str, captured: Captured, label: str, budget: int, formulation: str, time_limit: float,
         peers: list[SolveResult]) -> dict[str, Any]:
    """One benchmark row; a result that fits is appended to ``peers`` (Moccasin's warm starts)."""
    graph = captured.graph.with_random_replay()  # what coop.plan solves on: the executor replays random draws
    peak0 = baseline_peak(graph)
    row: dict[str, Any] = {"model": model, "nodes": len(graph.order), "budget_label": label, "budget": budget,
                           "formulation": formulation}
    if formulation not in FORMULATIONS:
        return row | {"status": "skipped", "note": f"{formulation} is not registered yet"}
    if budget < min_budget(graph):
        return row | {"status": "infeasible", "note": "below min_budget: no schedule of any method fits"}
    started = time.perf_counter()
    try:
        result = solve(graph, budget, formulation, **_options(formulation, captured, time_limit, peers))
    except CoopError as exc:
        return row | {"status": "error", "note": str(exc), "wall_s": round(time.perf_counter() - started, 2)}
    sim = result.simulation
    if sim is not None and sim.peak <= budget:
        peers.append(result)
    row |= {
        "status": result.status,
        "fits": None if sim is None else sim.peak <= budget,
        "peak": None if sim is None else sim.peak,
        "peak_vs_baseline": None if sim is None else round(sim.peak / peak0, 4),
        "cost": None if sim is None else round(sim.cost, 6),
        "overhead_percent": None if sim is None else round(100 * sim.overhead, 3),
        "gap": result.gap,
        "wall_s": round(result.wall_s, 2),
        "note": result.message,
    }
    if formulation == "moccasin":
        row["with_peers_s"] = round(result.wall_s + _sweep_s(peers), 2)
    if formulation == "pytorch-mincut":
        row["knob"] = result.extra.get("memory_budget")
        row["sweep_s"] = round(result.extra.get("sweep_s", 0.0), 2)
        row["sweep_peaks_vs_baseline"] = {
            str(s["memory_budget"]): round(s["peak"] / peak0, 3) for s in result.extra.get("sweep", [])
        }
    return row


def run(quick: bool = False, time_limit: float = 60.0,
        formulations: tuple[str, ...] = FORMULATIONS_COMPARED) -> list[dict[str, Any]]:
    """One row per (model, budget, formulation)."""
    rows = []
    for model, captured in capture_models(quick).items():
        graph = captured.graph.with_random_replay()
        peak0 = baseline_peak(graph)
        bounds = constructed_budget(graph)
        print(f"{model}: {len(graph.order)} nodes, baseline peak {peak0}, min_budget {bounds.lower_bound} "
              f"({bounds.lower_bound / peak0:.3f}), constructed budget {bounds.budget} ({bounds.budget / peak0:.3f}, "
              f"{bounds.source}), capture {captured.capture_s:.1f} s", file=sys.stderr, flush=True)
        for label, budget_of in BUDGETS:
            budget = budget_of(peak0, bounds.budget)
            peers: list[SolveResult] = []
            for formulation in formulations:
                row = _row(model, captured, label, budget, formulation, 10.0 if quick else time_limit, peers)
                rows.append(row | {"min_budget_vs_baseline": round(bounds.lower_bound / peak0, 4),
                                   "constructed_budget_vs_baseline": round(bounds.budget / peak0, 4)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, 10 s Moccasin limit")
    parser.add_argument("--time-limit", type=float, default=60.0, help="Moccasin's CP-SAT time limit per solve")
    parser.add_argument("--formulations", default=",".join(FORMULATIONS_COMPARED),
                        help="comma-separated subset of " + ", ".join(FORMULATIONS_COMPARED))
    args = parser.parse_args()
    chosen = tuple(f for f in args.formulations.split(",") if f)
    print(json.dumps(run(quick=args.quick, time_limit=args.time_limit, formulations=chosen), indent=1))


if __name__ == "__main__":
    main()
