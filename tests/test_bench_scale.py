"""benchmarks/bench_scale.py's rule for issue 27's 30-minute reference: run once per step, only where blocks is above
1 %: with fakes for the capture and the solves, so the rule is checked without the 50-minute benchmark."""

from __future__ import annotations

from typing import Any

import pytest

from tests.benchmark_module import load_benchmark

bench = load_benchmark("bench_scale")


class _FakeGraph:
    nodes = range(10)


@pytest.mark.parametrize(("blocks_pct", "references"), [(1.464, 1), (1.0, 0), (0.842, 0), (None, 1)])
def test_the_30_minute_reference_runs_once_where_blocks_is_above_one_point(
        monkeypatch: pytest.MonkeyPatch, blocks_pct: float | None, references: int) -> None:
    solved: list[tuple[str, Any]] = []

    def row_of(label: str, graph: Any, formulation: str, options: dict[str, Any], budget: int) -> dict[str, Any]:
        solved.append((formulation, options.get("time_limit")))
        overhead = blocks_pct if formulation == "blocks" else 5.0
        return {"model": label, "method": formulation, "status": "feasible", "overhead_pct": overhead}

    monkeypatch.setattr(bench, "LAYERS", (8, 16))
    monkeypatch.setattr(bench, "captured", lambda layers, shape: (_FakeGraph(), 0.0))
    monkeypatch.setattr(bench, "baseline_peak", lambda graph: 1000)
    monkeypatch.setattr(bench, "row_of", row_of)
    rows = bench.run()["rows"]
    per_step = ["chen-sqrt", "chen-greedy", "per-layer", "blocks", "moccasin"] + ["moccasin"] * references
    assert [formulation for formulation, _ in solved] == per_step * 2
    assert [limit for _, limit in solved].count(bench.REFERENCE_TIME) == 2 * references
    assert len(rows) == len(solved) and all(row["budget"] == 500 for row in rows)
    solved.clear()
    bench.run(reference=False)  # --no-reference: never
    assert [formulation for formulation, _ in solved] == per_step[:5] * 2
