"""Benchmark: what a CPU step holds against its budget, by a meter that is not coop's (issue 22).

Every zoo model at the sizes of tests/test_arena_budget.py, planned at 0.6 of its baseline peak three ways:
the ordinary replay of an unprofiled capture (kernels' internal scratch unknown to the graph: the plan
measures its step and, where it holds more than the budget, re-solves with the scratch measured on its own
replay, else warns), the ordinary replay of a profiled capture
(each op's scratch measured on the real step and counted as its workspace), and the arena replay. Each row:
the peak bytes one step holds by the independent meter of tests/independent_meter.py (the CPU allocator's
events through torch.profiler plus the storages that exist before the step), its ratio to the budget, the
plan's own ``step_footprint`` / ``arena_footprint``, whether it warned, and whether an unprofiled plan was
re-solved with the scratch its first plan's replay measured. Ratios above 1 are what a user
would see where the re-solve does not help (the plan warns then); every row should stay at or below 1.

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_held``.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import torch

import coop
from coop.budget import parse_budget
from coop.zoo import ZOO_NAMES, build
from tests.held_sizes import FRACTION, SIZES
from tests.independent_meter import HeldBytes

#: (row label, plan options)
REPLAYS: tuple[tuple[str, dict[str, bool]], ...] = (
    ("ordinary, unprofiled", {}),
    ("ordinary, profiled", {"profile": True}),
    ("arena", {"arena": True}),
)


def row(name: str, label: str, options: dict[str, bool]) -> dict[str, Any]:
    size, time_limit = SIZES[name]
    model, batch, loss_fn = build(name, **size)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = coop.plan(model, FRACTION, batch, loss_fn=loss_fn, time_limit=time_limit, **options)
    # the fraction of the graph it was read on: the profiled capture, else the plain one (a re-solved plan holds a
    # graph with its measured scratch, whose baseline peak is higher)
    read_on = plan.captured.graph if options.get("profile") else coop.capture(model, batch, loss_fn).graph
    budget = parse_budget(FRACTION, read_on)
    program = plan.executor.arena_program
    held_peaks = []
    for _ in range(2):  # an arena plan's first step allocates its buffers; the second finds them
        buffers = [*program.buffers.values()] if program is not None else []
        held = [*model.parameters(), *model.buffers(), *batch, *plan.captured.constants(), *buffers]
        with HeldBytes(held) as meter:
            plan.step(*batch)
        model.zero_grad(set_to_none=True)
        held_peaks.append(meter.peak_bytes)
    footprint = plan.arena_footprint if program is not None else plan.step_footprint
    return {"model": name, "replay": label, "threads": torch.get_num_threads(), "formulation": plan.formulation,
            "budget": budget, "predicted_peak": plan.predicted_peak, "plan_footprint": footprint,
            "held_peak": max(held_peaks), "held_vs_budget": round(max(held_peaks) / budget, 4),
            "warned": any("above the budget" in str(w.message) for w in caught),
            "re_solved": "re-solved with the scratch" in plan.note,
            "wall_s": round(time.perf_counter() - started, 1)}


def run(quick: bool = False) -> dict[str, Any]:
    """One row per (zoo model, replay)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        names = ("cnn", "gpt2") if quick else ZOO_NAMES
        rows = [row(name, label, options) for name in names for label, options in REPLAYS]
    finally:
        torch.set_num_threads(threads)
    over = [f"{r['model']} {r['replay']}" for r in rows if r["held_vs_budget"] > 1]
    notes = (f"{FRACTION} of each model's baseline peak, 2 threads, the larger of two steps. held_peak: the "
             "independent meter (CPU allocator events + storages held before the step). Rows "
             f"above the budget: {', '.join(over) or 'none'}; re-solved with measured scratch: "
             f"{', '.join(r['model'] for r in rows if r['re_solved']) or 'none'}.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
