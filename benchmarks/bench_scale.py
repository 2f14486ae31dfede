"""Planning a 7B-class training step on this machine: capture on meta, solve at half the peak (issue 27).

Llama-2-7B's shape (hidden 4096, 32 heads, 32 key/value heads, MLP width 11008, vocabulary 32000, bfloat16
parameters, batch 1, sequence 4096) at 8, 16 and 32 layers, built on the meta device (no weights) and captured
for CUDA (:mod:`coop.graph_capture.meta`); each step is then planned at 50 % of its baseline peak by:

* ``chen-sqrt`` and ``chen-greedy``: Chen et al.'s segment checkpointing (the segments baseline);
* ``per-layer``: every decoder layer checkpointed, as Hugging Face's ``gradient_checkpointing_enable()`` does
  (:mod:`coop.formulations.blocks.per_layer`: HiRemate's per-layer baseline);
* ``blocks``: coop's repeated-block formulation (:mod:`coop.formulations.blocks.formulation`: the decoder layers solved once
  per budget share, composed, polished), ``BLOCKS_TIME`` seconds;
* ``moccasin``: the flat Moccasin model over every node, ``MOCCASIN_TIME`` seconds;
* ``moccasin`` with ``REFERENCE_TIME`` (30 minutes: issue 27's reference) on every step where ``blocks``'s
  overhead exceeds ``CLAIM_POINTS``: issue 27 asks for blocks within 1 percentage point of the best of the
  reference, Chen's segments and per-layer checkpointing, and no schedule's overhead is below 0 %, so where blocks
  is at most 1 % the claim holds whatever the reference finds, and the 30 minutes are spent only where they can
  decide it.

Columns: ``nodes``, ``capture_s`` (build + capture), ``max_rss_gib`` (this process's peak resident memory after the
capture, from ``resource.getrusage``), then per method ``status``, ``overhead_pct`` (predicted recompute cost over
the baseline step, for the schedule returned even where it does not fit), ``bound_pct`` (the solver's proven lower
bound on the overhead, CP-SAT's best bound, where it reports one), ``peak`` (the simulator's, bytes),
``valid`` (:func:`coop.schedule.validate` at the budget: legal and within it), ``fits`` (valid and its peak within
the budget) and ``solve_s`` (wall).

``quick=True``: 4, 6 layers of a 256-wide model at sequence 512, 20 s solves (a test-sized run).

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_scale [--quick]``.
"""

from __future__ import annotations

import math
import resource
import time
from typing import Any

from coop.budget import baseline_peak
from coop.errors import CoopError
from coop.formulations.core.registry import solve
from coop.graph_capture import capture
from coop.schedule import validate
from coop.zoo import model_from_zoo

#: Llama-2-7B's shape, but for the layer count.
SHAPE_7B = {"hidden": 4096, "heads": 32, "kv_heads": 32, "intermediate": 11008, "vocab": 32000, "batch": 1,
            "seq": 4096, "dtype": "bfloat16"}
QUICK_SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 4, "intermediate": 688, "vocab": 1000, "batch": 1, "seq": 512,
               "dtype": "bfloat16"}
LAYERS = (8, 16, 32)
QUICK_LAYERS = (4, 6)  # at 2 layers the logits dominate: nothing fits half the peak
FRACTION = 0.5
BLOCKS_TIME = 240.0
MOCCASIN_TIME = 240.0
REFERENCE_TIME = 1800.0
CLAIM_POINTS = 1.0
QUICK_TIME = 20.0
THREADS = 2


def captured(layers: int, shape: dict[str, Any]) -> tuple[Any, float]:
    """The step's Graph (meta build, captured for CUDA) and the seconds build + capture took."""
    started = time.perf_counter()
    model, batch, loss_fn = model_from_zoo("llama", {"layers": layers, **shape}, meta=True)
    graph = capture(model, batch, loss_fn=loss_fn, device="cuda").graph
    return graph, time.perf_counter() - started


def methods(quick: bool) -> list[tuple[str, dict[str, Any]]]:
    """(formulation, options) of the compared methods."""
    blocks, moccasin = (QUICK_TIME, QUICK_TIME) if quick else (BLOCKS_TIME, MOCCASIN_TIME)
    return [("chen-sqrt", {}), ("chen-greedy", {}), ("per-layer", {}),
            ("blocks", {"time_limit": blocks, "threads": THREADS}),
            ("moccasin", {"time_limit": moccasin, "threads": THREADS})]


def row_of(label: str, graph: Any, formulation: str, options: dict[str, Any], budget: int) -> dict[str, Any]:
    """One method on one graph: its status, overhead, peak, time and the validator's verdict."""
    return solved_row(label, graph, formulation, options, budget)[0]


def solved_row(label: str, graph: Any, formulation: str, options: dict[str, Any],
               budget: int) -> tuple[dict[str, Any], Any]:
    """:func:`row_of`, and the solver's result (None where it raised)."""
    started = time.perf_counter()
    try:
        result = solve(graph, budget, formulation, **options)
    except CoopError as exc:
        return {"model": label, "method": formulation, "status": f"error: {str(exc).splitlines()[0]}"}, None
    wall = time.perf_counter() - started
    schedule = result.schedule
    check = validate(graph, schedule, budget) if schedule is not None else None
    return {"model": label, "method": formulation, "time_limit_s": options.get("time_limit"),
            "status": result.status,
            "overhead_pct": None if result.objective is None else round(100 * (result.objective / graph.baseline_cost - 1), 3),
            "bound_pct": None if result.bound is None else round(100 * (result.bound / graph.baseline_cost - 1), 3),
            "peak": result.simulation.peak if result.simulation is not None else None,
            "fits": check is not None and check.ok and check.peak <= budget,
            "solve_s": round(wall, 1), "valid": None if check is None else check.ok}, result


def logged_row(label: str, graph: Any, formulation: str, options: dict[str, Any], budget: int,
               extra: dict[str, Any]) -> dict[str, Any]:
    """:func:`row_of` with the step's columns (``extra``), its result printed as it comes."""
    row = row_of(label, graph, formulation, options, budget)
    print(f"bench_scale: {label} {formulation}: {row.get('status')} {row.get('overhead_pct')} %", flush=True)
    return {**row, **extra}


def needs_reference(rows: list[dict[str, Any]]) -> bool:
    """Whether the 30-minute reference can decide the 1-point claim on this step: blocks's overhead is above
    ``CLAIM_POINTS`` (at or below it, blocks is within the points of any schedule, whose overhead is >= 0)."""
    blocks = next((r for r in rows if r["method"] == "blocks"), None)
    return blocks is None or blocks.get("overhead_pct") is None or blocks["overhead_pct"] > CLAIM_POINTS


def run(quick: bool = False, reference: bool = True) -> dict[str, Any]:
    shape = QUICK_SHAPE if quick else SHAPE_7B
    rows: list[dict[str, Any]] = []
    for layers in QUICK_LAYERS if quick else LAYERS:
        graph, capture_s = captured(layers, shape)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
        budget = math.ceil(FRACTION * baseline_peak(graph))
        label = f"llama-7b-shape {layers} layers" if not quick else f"llama {layers}x{shape['hidden']}"
        extra = {"nodes": len(graph.nodes), "capture_s": round(capture_s, 1), "max_rss_gib": round(rss, 2),
                 "budget": budget}
        step_rows = [logged_row(label, graph, formulation, options, budget, extra)
                     for formulation, options in methods(quick)]
        if reference and not quick and needs_reference(step_rows):
            step_rows.append(logged_row(label, graph, "moccasin", {"time_limit": REFERENCE_TIME, "threads": THREADS},
                                        budget, extra))
        rows += step_rows
    notes = (f"Llama-2-7B's shape ({', '.join(f'{k} {v}' for k, v in shape.items())}), built on the meta device and "
             f"captured for CUDA; budget {FRACTION} of each step's baseline peak; {THREADS} solver threads. "
             "overhead_pct: predicted recompute cost over the baseline step (analytic costs). max_rss_gib: this "
             "process's peak resident memory so far (it grows with the largest graph). moccasin is the flat model with "
             f"the time limit shown; the {REFERENCE_TIME / 60:g}-minute row (issue 27's reference) runs only where blocks's "
             f"overhead exceeds {CLAIM_POINTS:g} % (below, blocks is within {CLAIM_POINTS:g} point of any schedule). "
             "bound_pct: the solver's proven lower bound on the overhead (CP-SAT's best bound), where it reports one.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-reference", action="store_true", help="skip the 30-minute moccasin reference rows")
    args = parser.parse_args()
    print(json.dumps(run(quick=args.quick, reference=not args.no_reference), indent=1))
