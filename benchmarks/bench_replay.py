"""Replay benchmark: store-all replay vs eager step time, and measured vs predicted overhead at 50 %.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_replay.py`` (CPU; GPT-2 small and
ResNet-50 with random weights, nothing downloaded). Step times are medians of ``PAIRS``
alternating (eager, replay) pairs; the measured overhead is plan time / store-all time - 1.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Callable

import torch

import coop
from coop.errors import BudgetError, InfeasibleError
from coop.formulations import BASELINES, solve
from coop.schedule import simulate
from coop.zoo import _classifier_loss, build

PAIRS = 5


def _resnet50(batch: int = 2, image: int = 128) -> tuple:
    from transformers import ResNetConfig, ResNetForImageClassification

    model = ResNetForImageClassification(ResNetConfig(num_labels=10)).train()  # the default config is ResNet-50
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return model, (images, torch.randint(0, 10, (batch,), generator=generator)), _classifier_loss


def _eager_step(model: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> None:
    out = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
    (out if isinstance(out, torch.Tensor) else out.loss).backward()
    model.zero_grad(set_to_none=True)


def _timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _plan_step(plan: coop.Plan, batch: tuple) -> Callable[[], None]:
    def step() -> None:
        plan.step(*batch)
        plan.model.zero_grad(set_to_none=True)

    return step


def measure(name: str, model: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> dict:
    eager = copy.deepcopy(model)
    store_all = coop.plan(model, 1.0, batch, loss_fn=loss_fn, formulation="store-all")
    replay = _plan_step(store_all, batch)
    replay()  # warm-up both
    _eager_step(eager, batch, loss_fn)
    eager_times, replay_times = [], []
    for _ in range(PAIRS):
        eager_times.append(_timed(lambda: _eager_step(eager, batch, loss_fn)))
        replay_times.append(_timed(replay))
    row = {
        "model": name,
        "nodes": len(store_all.graph.nodes),
        "eager_s": round(statistics.median(eager_times), 4),
        "store_all_s": round(statistics.median(replay_times), 4),
    }
    row["replay_vs_eager"] = round(row["store_all_s"] / row["eager_s"], 3)
    try:
        half = coop.plan(model, 0.5, batch, loss_fn=loss_fn)
    except (BudgetError, InfeasibleError) as exc:
        # 50 % is below what any baseline (or any schedule) reaches: take the lowest peak a baseline reaches
        row["half_note"] = str(exc)
        graph = store_all.graph
        lowest = min(simulate(graph, solve(graph, 10**15, f).schedule).peak for f in BASELINES)
        half = coop.plan(model, lowest, batch, loss_fn=loss_fn)
    half_step = _plan_step(half, batch)
    half_step()
    half_s = statistics.median(_timed(half_step) for _ in range(PAIRS))
    row |= {
        "half_formulation": half.formulation,
        "half_budget_fraction": round(half.budget / half.baseline_peak, 3),
        "half_predicted_peak_fraction": round(half.predicted_peak / half.baseline_peak, 3),
        "half_predicted_overhead": round(half.predicted_overhead, 3),
        "half_measured_overhead": round(half_s / row["store_all_s"] - 1, 3),
    }
    return row


def run() -> list[dict]:
    """Rows: model, nodes, eager_s, store_all_s, replay_vs_eager, and the 50 % plan's overheads."""
    gpt2 = build("gpt2", layers=12, hidden=768, heads=12, vocab=50257, batch=1, seq=128)
    return [measure("gpt2-small (b1, s128)", *gpt2), measure("resnet50 (b2, 128px)", *_resnet50())]


if __name__ == "__main__":
    for result in run():
        print(json.dumps(result))
