"""Moccasin's published table (Bartan et al., ICML 2023) against coop's moccasin formulation.

Budget = ceil(m x baseline peak), TDI = (cost - baseline cost) / baseline cost. The published
figures are the best of the paper's Checkmate and Moccasin columns (16 cores); ours run on the
machine at hand with ``threads`` CP-SAT workers and ``time_limit`` seconds per row, with the
formulation's defaults: first computations kept in the baseline order on the training graphs
(Checkmate's restriction), free on the random layered graphs -- ``order``.

The published TDI are rounded to one decimal (the paper's repository prints them with
``"{:.1%}"``): ``reached`` compares at that precision, ``strictly_le_published`` against the
printed number itself. Where the two differ, paper_table_proof compares with the unrounded value:
it proves that no schedule of the space both published columns search costs less than ours.

    python -m benchmarks.paper_table [time_limit]
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from coop.budget import baseline_peak
from coop.formulations.moccasin.intervals import moccasin
from coop.graph_files import load_graph
from coop.schedule import relative_overhead

GRAPHS_DIR = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"

#: (label, file, m, published TDI in %)
PUBLISHED: list[tuple[str, str, float, float]] = [
    ("random_layered n250", "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json", 0.9, 0.9),
    ("random_layered n250", "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json", 0.8, 4.9),
    ("random_layered n1000", "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json", 0.9, 0.7),
    ("random_layered n1000", "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json", 0.8, 3.4),
    ("fcn_8_vgg train", "fcn_8_vgg_32_416_608_3_train_nx.json", 0.9, 0.0),
    ("fcn_8_vgg train", "fcn_8_vgg_32_416_608_3_train_nx.json", 0.8, 0.1),
    ("ResNet50 train", "ResNet50_256_224_224_3_train_nx.json", 0.9, 0.1),
    ("ResNet50 train", "ResNet50_256_224_224_3_train_nx.json", 0.8, 0.3),
]


def run(time_limit: float = 60.0, threads: int = 2, graphs_dir: Path = GRAPHS_DIR) -> dict[str, Any]:
    """Solve every row of the published table; one dict per row, reached or not."""
    rows = []
    for label, file_name, m, published in PUBLISHED:
        graph = load_graph(graphs_dir / file_name)
        budget = math.ceil(m * baseline_peak(graph))
        started = time.perf_counter()
        result = moccasin(graph, budget, time_limit=time_limit, threads=threads)
        wall = time.perf_counter() - started
        sim = result.simulation
        tdi = 100 * sim.overhead if sim is not None else None
        rows.append(
            {
                "graph": label,
                "m": m,
                "budget": budget,
                "status": result.status,
                "TDI": tdi,
                "wall_s": wall,
                "peak": sim.peak if sim is not None else None,
                "gap": result.gap,
                "warm_start": result.extra.get("warm_start"),
                "warm_TDI": _warm_tdi(result, graph.baseline_cost),
                "published_TDI": published,
                "order": "kept" if graph.has_backward else "free",
                # at the published precision (one decimal), and strictly (no rounding)
                "reached": tdi is not None and round(tdi, 1) <= published,
                "strictly_le_published": tdi is not None and tdi <= published,
            }
        )
    notes = ("published_TDI is printed with one decimal ({:.1%} in the paper's repository): reached = TDI rounded "
             "to one decimal <= published_TDI; strictly_le_published = TDI <= the printed number. Rows where these "
             "differ are compared with the unrounded published values in paper_table_proof.")
    return {"rows": rows, "notes": notes}


def _warm_tdi(result: Any, baseline_cost: float) -> float | None:
    cost = result.extra.get("warm_start_cost")
    return None if cost is None else 100 * relative_overhead(cost - baseline_cost, baseline_cost)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| graph | m | budget | status | TDI % | warm-start TDI % | gap % | wall s | peak | published TDI % | reached |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        gap = None if r["gap"] is None else 100 * r["gap"]
        lines.append(
            f"| {r['graph']} | {r['m']} | {r['budget']} | {r['status']} | {pct(r['TDI'])} | {pct(r['warm_TDI'])} | "
            f"{pct(gap)} | {r['wall_s']:.1f} | {r['peak']} | {r['published_TDI']} | {'yes' if r['reached'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    time_limit = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    print(markdown(run(time_limit)["rows"]))


if __name__ == "__main__":
    main()
