"""Benchmark: MONeT's headline row, one third of the baseline peak, with 120 s per solve.

MONeT (Shah, Wu, Chandrashekaran, Goyal, Yu, ICLR 2021) published its overheads at about one third of
PyTorch's peak (ResNet-50 +11.95 %, UNet +11.5 %, MobileNet +8.7 %, VGG-16 +9.1 %, measured GPU time,
with a 24-hour solver limit). bench_monet gives every cell 30 s; this row gives moccasin (checkpointing
only, on ``graph.remat_only()``) and then monet (hinted with moccasin's schedule, as bench_monet does)
120 s each on the same captured models, so the row shows what a longer limit buys. Overheads are coop's
predicted extra compute (analytic costs), comparable with the published ones only in trend. A budget
below a graph's proven floor (``min_budget``) is reported infeasible without a solve.

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_monet_third``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from benchmarks.bench_monet import PUBLISHED_OVERHEAD_PERCENT, VARIANTS, capture_graph, model_specs, run_variants
from coop.budget import baseline_peak

#: Seconds per solve.
TIME_LIMIT = 120.0


def run(quick: bool = False) -> dict[str, Any]:
    """One row per (model, variant) at one third of the baseline peak."""
    rows: list[dict[str, Any]] = []
    limit = 5.0 if quick else TIME_LIMIT
    variants = [v for v in VARIANTS if v[1] in ("moccasin", "monet") and not v[2]]
    for name, (published_key, builder) in model_specs(quick).items():
        graph, _, _ = capture_graph(builder())
        budget = math.ceil(baseline_peak(graph) / 3)
        rows += run_variants(graph, budget, variants, limit, {
            "model": name, "budget": "1/3", "time_limit_s": limit,
            "published_monet_overhead_percent": PUBLISHED_OVERHEAD_PERCENT.get(published_key)})
    notes = (f"{limit:g} s per solve, 2 threads; monet is hinted with the moccasin row's schedule. Overheads are "
             "predicted (analytic costs); MONeT's are measured GPU time at about 1/3 of PyTorch's peak.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
