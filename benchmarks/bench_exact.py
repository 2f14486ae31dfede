"""Moccasin against Checkmate's proven optimum on the small published training graphs.

For VGG16, VGG19 and fcn_8_vgg train at m = 0.9, 0.8, 0.7 (budget = ceil(m x baseline peak)):
Checkmate's MILP (Jain et al. 2020) with HiGHS for up to ``proof_time_limit`` seconds (the
issue's 10 minutes: at 60 s it had not proven VGG19 at 0.8 and fcn_8_vgg at 0.7), and coop's
Moccasin (Bartan et al. 2023) with ``time_limit`` seconds. A budget below :func:`coop.budget.min_budget` is infeasible for every
method and reported as such. ``within_1pct`` compares moccasin's cost with Checkmate's when
Checkmate proved its optimum.

    python -m benchmarks.bench_exact [time_limit]
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from coop.budget import baseline_peak, min_budget
from coop.formulations.checkmate.milp import checkmate
from coop.formulations.core.result import SolveResult
from coop.formulations.moccasin.intervals import moccasin
from coop.graph import Graph
from coop.graph_files import load_graph

GRAPHS_DIR = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"

GRAPHS: list[tuple[str, str]] = [
    ("VGG16 train", "VGG16_256_224_224_3_train_nx.json"),
    ("VGG19 train", "VGG19_256_224_224_3_train_nx.json"),
    ("fcn_8_vgg train", "fcn_8_vgg_32_416_608_3_train_nx.json"),
]
FRACTIONS = (0.9, 0.8, 0.7)


def _timed(function: Any, *args: Any, **kwargs: Any) -> tuple[SolveResult, float]:
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def _tdi(result: SolveResult) -> float | None:
    return None if result.simulation is None else 100 * result.simulation.overhead


def _row(label: str, graph: Graph, m: float, time_limit: float, proof_time_limit: float, threads: int
         ) -> dict[str, Any]:
    budget = math.ceil(m * baseline_peak(graph))
    least = min_budget(graph)
    row: dict[str, Any] = {"graph": label, "m": m, "budget": budget, "min_budget": least}
    if budget < least:
        row.update({"checkmate_status": "infeasible", "moccasin_status": "infeasible", "within_1pct": None,
                    "note": f"below min_budget {least}: infeasible for every method"})
        return row
    exact, exact_s = _timed(checkmate, graph, budget, solver="highs", time_limit=proof_time_limit,
                             threads=threads)
    ours, ours_s = _timed(moccasin, graph, budget, time_limit=time_limit, threads=threads)
    within = None
    if exact.status == "optimal" and exact.simulation is not None and ours.simulation is not None:
        within = ours.simulation.cost <= 1.01 * exact.simulation.cost
    row.update({
        "checkmate_status": exact.status, "checkmate_TDI": _tdi(exact), "checkmate_s": exact_s,
        "moccasin_status": ours.status, "moccasin_TDI": _tdi(ours), "moccasin_s": ours_s,
        "moccasin_bound_valid": ours.bound is not None, "moccasin_warm_start": ours.extra.get("warm_start"),
        "cost_ratio": (ours.simulation.cost / exact.simulation.cost
                       if ours.simulation is not None and exact.simulation is not None else None),
        "within_1pct": within,
    })
    return row


def run(time_limit: float = 60.0, proof_time_limit: float = 600.0, threads: int = 2, graphs_dir: Path = GRAPHS_DIR
        ) -> list[dict[str, Any]]:
    """One dict per (graph, m): both methods' status, TDI % and wall time, and whether moccasin's
    cost is within 1% of Checkmate's proven optimum."""
    rows = []
    for label, file_name in GRAPHS:
        graph = load_graph(graphs_dir / file_name)
        for m in FRACTIONS:
            rows.append(_row(label, graph, m, time_limit, proof_time_limit, threads))
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def show(value: Any, digits: int = 2) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = ["| graph | m | budget | checkmate | TDI % | s | moccasin | TDI % | s | within 1% |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['graph']} | {r['m']} | {r['budget']} | {r['checkmate_status']} | {show(r.get('checkmate_TDI'))} | "
            f"{show(r.get('checkmate_s'), 1)} | {r['moccasin_status']} | {show(r.get('moccasin_TDI'))} | "
            f"{show(r.get('moccasin_s'), 1)} | {show(r['within_1pct']) if 'note' not in r else r['note']} |"
        )
    return "\n".join(lines)


def main() -> None:
    time_limit = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    print(markdown(run(time_limit)))


if __name__ == "__main__":
    main()
