"""The online fallback decides once per shape (issue 23, item 3): host time of its steps on CPU.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/run_all.py --only bench_dynamic_record [--quick]``.

Per zoo model and eviction policy, at :data:`FRACTION` of the baseline peak, one
``coop.plan(..., formulation="dynamic")``-style plan (:class:`coop.planner.DynamicPlan`) trained for
``1 + STEPS`` steps: the first runs the online engine (every eviction decided on the host) and records its
decisions as a schedule; the later ones replay that schedule with the static executor. Beside it, in the
same run, a static :class:`coop.planner.plan.Plan` of the very same schedule (what a user gets by handing
the recorded schedule to the planner). Times are ms per step: ``online_first`` the first step,
``recorded_later`` the median of the later steps, ``static_same_schedule`` the median of the static
plan's steps, measured interleaved (one recorded step, then one static step, per round) so that both see
the same machine. ``later_vs_static`` is their ratio (the bar: at most 1, up to noise); ``first_vs_later``
what deciding online costs. ``recorded_peak`` is the recorded schedule's simulated peak, ``online_peak``
the engine's (its arena's used bytes): the recorded one is never larger.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from coop import capture
from coop.budget import baseline_peak, min_budget
from coop.online.policies import POLICIES
from coop.planner import DynamicPlan
from coop.planner.plan import Plan
from coop.zoo import build

FRACTION = 0.6
STEPS = 9
QUICK_STEPS = 3
#: The zoo models every policy finishes at FRACTION (tests/test_fallback.py runs the same two).
MODELS: dict[str, dict[str, int]] = {"cnn": {}, "gpt2": {"layers": 4, "batch": 2, "seq": 128}}


def _timed_step(plan: Any, batch: tuple[torch.Tensor, ...]) -> float:
    started = time.perf_counter()
    plan.step(*batch)
    return (time.perf_counter() - started) * 1e3


def measure(name: str, policy: str, steps: int) -> dict[str, Any]:
    """One row: a dynamic plan's first and later steps beside a static plan of its recorded schedule."""
    model, batch, loss_fn = build(name, **MODELS[name])
    captured = capture(model, batch, loss_fn=loss_fn)
    graph = captured.graph
    budget = max(min_budget(graph), round(FRACTION * baseline_peak(graph)))
    dynamic = DynamicPlan(captured, model, budget, policy=policy, loss_fn=loss_fn)
    first = _timed_step(dynamic, batch)
    stats = dynamic.last_stats
    static = Plan(model, captured, stats.schedule, budget, f"recorded {policy}", loss_fn=loss_fn)
    later, same = [], []
    for _ in range(steps):
        later.append(_timed_step(dynamic, batch))
        same.append(_timed_step(static, batch))
        model.zero_grad(set_to_none=True)
    recorded_later, static_same = statistics.median(later), statistics.median(same)
    return {"model": name, "policy": policy, "budget": budget, "fraction": FRACTION,
            "evictions": stats.evictions, "recomputations": stats.recomputations,
            "recorded": dynamic.recorded is not None, "replayed_steps": dynamic.replayed_steps,
            "online_peak": stats.peak, "recorded_peak": dynamic.recorded.simulation.peak,
            "online_first_ms": round(first, 2), "recorded_later_ms": round(recorded_later, 2),
            "static_same_schedule_ms": round(static_same, 2),
            "later_vs_static": round(recorded_later / static_same, 3),
            "first_vs_later": round(first / recorded_later, 2)}


def run(quick: bool = False) -> dict[str, Any]:
    steps = QUICK_STEPS if quick else STEPS
    torch.set_num_threads(1)  # host time, least disturbed by the other core
    rows = [measure(name, policy, steps) for name in MODELS for policy in POLICIES]
    return {"rows": rows, "notes": (
        f"Each row: {steps} later steps, interleaved with {steps} steps of the static plan of the same schedule, "
        "1 intra-op thread. The recorded schedule is the online engine's executed computes (recomputations "
        "included); its simulated peak is at most the engine's used bytes because the static replay frees each "
        "value right after its last read.")}
