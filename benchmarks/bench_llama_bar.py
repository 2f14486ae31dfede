"""Issue 27's flat-solver bar: the 32-layer Llama-style step at 50 % and 30 % of its peak within 120 s.

The issue measured moccasin on a 32-layer Llama-style step (the zoo's Llama: hidden 256, 4 heads, 2 key/value
heads, MLP 512, vocabulary 1000, batch 8, sequence 512, float32; 4,536 nodes then, 4,312 as captured today) at 10.1 %
predicted overhead at 50 % of its baseline peak in 120 s, and asks the repeated-block solver for that or better
there, and the same or better at 30 %. Each budget is planned by:

* ``blocks`` (:mod:`coop.formulations.blocks.formulation`) and flat ``moccasin``, ``TIME_LIMIT`` seconds each, 2 threads;
* ``chen-greedy``: Chen et al.'s segments (the baseline).

Columns as :mod:`bench_scale` (``overhead_pct`` the predicted recompute cost over the baseline step, analytic costs;
``valid``/``fits`` by :func:`coop.schedule.validate`). ``quick=True``: 8 layers, 20 s solves.

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_llama_bar [--quick]``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import row_of

from coop.budget import baseline_peak
from coop.graph_capture import capture
from coop.zoo import build

SHAPE = {"hidden": 256, "heads": 4, "batch": 8, "seq": 512, "vocab": 1000}
LAYERS, QUICK_LAYERS = 32, 8
FRACTIONS = (0.5, 0.3)
TIME_LIMIT, QUICK_TIME = 120.0, 20.0
THREADS = 2
#: the issue's bar at 0.5 (moccasin's result when it was filed)
BAR_PCT = 10.1


def run(quick: bool = False) -> dict[str, Any]:
    layers = QUICK_LAYERS if quick else LAYERS
    seconds = QUICK_TIME if quick else TIME_LIMIT
    started = time.perf_counter()
    model, batch, loss_fn = build("llama", layers=layers, **SHAPE)
    graph = capture(model, batch, loss_fn=loss_fn).graph
    capture_s = time.perf_counter() - started
    label = f"llama {layers}x{SHAPE['hidden']} b{SHAPE['batch']} s{SHAPE['seq']}"
    rows = []
    for fraction in FRACTIONS:
        budget = math.ceil(fraction * baseline_peak(graph))
        for formulation, options in (("blocks", {"time_limit": seconds, "threads": THREADS}),
                                     ("moccasin", {"time_limit": seconds, "threads": THREADS}),
                                     ("chen-greedy", {})):
            row = row_of(label, graph, formulation, options, budget)
            rows.append({"fraction": fraction, **row, "nodes": len(graph.nodes), "capture_s": round(capture_s, 1),
                         "budget": budget})
            print(f"bench_llama_bar: {label} {fraction} {formulation}: {row.get('status')} "
                  f"{row.get('overhead_pct')} % in {row.get('solve_s')} s", flush=True)
    notes = (f"{label}, captured on CPU with its weights; {THREADS} solver threads, {seconds:.0f} s per solve. "
             f"Issue 27's bar: blocks <= {BAR_PCT} % at 0.5 in < 120 s, and no worse at 0.3.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
