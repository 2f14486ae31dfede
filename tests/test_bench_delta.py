"""The DELTA benchmark (benchmarks/bench_delta.py) on a tiny captured transformer: its rows' shape, their invariants,
and its delta-vs-best verdicts recomputed from the rows (issue 26).

The schedules are checked by :func:`coop.schedule.validate` (the benchmark's column, recomputed here for the
delta rows); the verdicts and the notes' counts are recomputed from the rows' raw overheads, so a verdict
that rounded, or a count that disagreed with its table, fails here.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from coop.budget import baseline_peak
from coop.device_profiles import load_device_profile
from coop.graph import Graph
from coop.online.delta_sim import simulate_delta
from coop.schedule import validate
from tests.benchmark_module import load_benchmark

FRACTIONS = (0.9, 0.6, 0.4, 0.3)
SLOW = (0.6,)
STATUSES = {"ok", "oom", "thrashed"}
COLUMNS = {"model", "costs", "fraction", "budget", "policy", "profile", "status", "overhead", "overhead_pct",
           "recomputed_cost", "exposed_copy_s", "swaps", "swapped_bytes", "host_peak", "evictions", "wall_s",
           "schedule_valid"}
VERDICT = {"best_recompute_only", "delta_le_best", "margin_pct", "only_delta_finishes", "coop_gap_pct"}


bench = load_benchmark("bench_delta")


@pytest.fixture(scope="module")
def graph() -> Graph:
    """The zoo's transformer at 2 x 64, batch 4, sequence 64 (195 nodes, dropout draws replayed; no transformers
    import): delta swaps, loses and finishes alone in its cells, so every verdict value occurs."""
    from coop.graph_capture import capture
    from coop.zoo import build

    model, batch, loss_fn = build("transformer", layers=2, hidden=64, batch=4, seq=64)
    return capture(model, batch, loss_fn).graph


@pytest.fixture(scope="module")
def rows(graph: Graph) -> list[dict[str, Any]]:
    return (bench.sweep("tiny", graph, "analytic", fractions=FRACTIONS, slow_fractions=SLOW)
            + bench.sweep("tiny", bench.a100_timed(graph), "a100", fractions=FRACTIONS))


def test_every_cell_runs_every_policy_at_one_arena_size(graph: Graph, rows: list[dict[str, Any]]) -> None:
    peak = baseline_peak(graph)
    for costs in ("analytic", "a100"):
        for fraction in FRACTIONS:
            cell = [r for r in rows if r["costs"] == costs and r["fraction"] == fraction]
            expected = ["dtr", "dtr-eq", "dte", "coop", "delta"] + (["delta"] if costs == "analytic" and fraction in SLOW
                                                                   else [])
            assert [r["policy"] for r in cell] == expected
            assert {r["budget"] for r in cell} == {round(fraction * peak)}
            assert [r["profile"] for r in cell if r["policy"] == "delta"] == (
                ["a100-pcie4", "a72"] if len(expected) == 6 else ["a100-pcie4"])
    for row in rows:
        assert COLUMNS <= set(row) and row["status"] in STATUSES
        assert (VERDICT <= set(row)) == (row["policy"] == "delta")


def test_ok_rows_are_valid_and_their_numbers_add_up(graph: Graph, rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["schedule_valid"] is True for r in ok)
    for row in ok:
        assert row["overhead"] >= 0 and row["recomputed_cost"] >= 0 and row["exposed_copy_s"] >= 0
        assert row["overhead"] == pytest.approx((row["recomputed_cost"] + row["exposed_copy_s"]) / row["baseline_cost"],
                                                rel=1e-9, abs=1e-12)
        assert row["overhead_pct"] == 100 * row["overhead"]
        if row["policy"] != "delta":
            assert row["exposed_copy_s"] == row["swapped_bytes"] == row["host_peak"] == row["swaps"] == 0
    swapped = [r for r in ok if r["policy"] == "delta" and r["swaps"]]
    assert swapped, "no ok delta row swapped anything: the host-memory checks would be vacuous"
    for row in swapped:
        assert 0 <= row["forced_swaps"] <= row["swaps"] and row["swap_price_pct"] > 0
        # every swapped value sits on the host at least once, so the peak holds at least the average swap
        assert row["swapped_bytes"] / row["swaps"] <= row["host_peak"] <= row["swapped_bytes"]
        # the exposed copy covers at least the page-outs, which the compute waits for
        link = load_device_profile(row["profile"])
        pageouts = row["swaps"] * link.pageout_latency_s + row["swapped_bytes"] / link.pageout_bytes_per_s
        assert row["exposed_copy_s"] >= pageouts * (1 - 1e-9)


def test_a_delta_row_is_the_run_it_reports(graph: Graph, rows: list[dict[str, Any]]) -> None:
    row = next(r for r in rows if r["policy"] == "delta" and r["costs"] == "analytic" and r["swaps"])
    again = simulate_delta(graph, row["budget"], row["profile"])
    assert (again.status, again.overhead, again.swaps, again.host_peak) == (
        row["status"], row["overhead"], row["swaps"], row["host_peak"])
    assert validate(graph.with_random_replay(), again.schedule, row["budget"]).ok


def test_the_verdicts_are_recomputed_from_the_rows(rows: list[dict[str, Any]]) -> None:
    verdicts = [r["delta_le_best"] for r in rows if r["policy"] == "delta"]
    assert {True, False, None} <= set(verdicts) and any(r.get("only_delta_finishes") for r in rows)
    for delta in (r for r in rows if r["policy"] == "delta"):
        others = [r for r in rows if r["costs"] == delta["costs"] and r["fraction"] == delta["fraction"]
                  and r["policy"] in bench.RECOMPUTE_ONLY]
        assert len(others) == len(bench.RECOMPUTE_ONLY)
        finished = [r["overhead"] for r in others if r["status"] == "ok"]
        delta_ok = delta["status"] == "ok"
        expected = delta_ok and all(delta["overhead"] <= overhead for overhead in finished)
        assert delta["delta_le_best"] is (None if not delta_ok and not finished else expected)
        assert delta["only_delta_finishes"] is (delta_ok and not finished)
        if delta_ok and finished:
            assert delta["margin_pct"] == 100 * (min(finished) - delta["overhead"])
            assert delta["best_recompute_only"].endswith(f" {100 * min(finished):.4g}%")


def test_the_verdict_compares_exactly() -> None:
    def row(policy: str, status: str, overhead: float) -> dict[str, Any]:
        return {"policy": policy, "status": status, "overhead": overhead, "overhead_pct": 100 * overhead}

    others = [row("dtr", "ok", 0.3), row("coop", "ok", 0.1), row("dte", "oom", 0.0)]
    tie = bench.verdict(row("delta", "ok", 0.1), others)
    assert tie["delta_le_best"] is True and tie["best_recompute_only"] == "coop 10%" and tie["coop_gap_pct"] == 0
    just_above = math.nextafter(0.1, 1.0)  # equal to 0.1 at any printed precision
    assert bench.verdict(row("delta", "ok", just_above), others)["delta_le_best"] is False
    assert bench.verdict(row("delta", "oom", 0.0), others)["delta_le_best"] is False
    failing = [row("dtr", "oom", 0.2), row("coop", "thrashed", 10.0)]
    alone = bench.verdict(row("delta", "ok", 5.0), failing)
    assert alone["delta_le_best"] is True and alone["only_delta_finishes"] is True
    assert alone["best_recompute_only"] == "none finishes" and alone["margin_pct"] is None
    assert bench.verdict(row("delta", "thrashed", 10.0), failing)["delta_le_best"] is None


def test_the_notes_count_what_the_rows_show(rows: list[dict[str, Any]]) -> None:
    text = "\n".join(bench.summary(rows))
    blocks = dict(re.findall(r"\*\*(\w+) costs, a100-pcie4\*\*(.*?)(?=\n\n|\Z)", text, re.DOTALL))
    assert set(blocks) == {"analytic", "a100"}
    for costs, block in blocks.items():
        claim = [r for r in rows if r["policy"] == "delta" and r["costs"] == costs and r["profile"] == "a100-pcie4"
                 and r["fraction"] in bench.CLAIM_FRACTIONS]
        compared = [r for r in claim if r["delta_le_best"] is not None]
        counted = re.search(r"in (\d+) of (\d+) cells", block)
        assert counted is not None
        assert (int(counted[1]), int(counted[2])) == (sum(r["delta_le_best"] is True for r in compared), len(compared))
        listed = re.findall(r"^- exception tiny ([\d.]+):", block, re.MULTILINE)
        assert sorted(map(float, listed)) == sorted(r["fraction"] for r in claim if r["delta_le_best"] is False)
        only = re.search(r"only delta finishes .*?: (\d+) of (\d+) cells", block)
        assert only is not None
        cell_rows = [r for r in rows if r["policy"] == "delta" and r["costs"] == costs and r["profile"] == "a100-pcie4"]
        assert (int(only[1]), int(only[2])) == (sum(r["only_delta_finishes"] for r in cell_rows),
                                                sum(r["best_recompute_only"] == "none finishes" for r in cell_rows))


def test_re_timing_keeps_the_graph_and_shortens_its_step(graph: Graph) -> None:
    timed = bench.a100_timed(graph)
    assert [(n.id, n.mem, n.inputs, n.kind) for n in timed.nodes] == [(n.id, n.mem, n.inputs, n.kind) for n in graph.nodes]
    flops = graph.meta["node_flops"]
    rate = load_device_profile("a100-pcie4").flops_per_s
    for before, after in zip(graph.nodes, timed.nodes, strict=True):
        assert int(flops.get(str(before.id), 0)) / rate <= after.cost * (1 + 1e-12) and after.cost <= before.cost
    assert graph.baseline_cost / timed.baseline_cost > 50
    bare = Graph.model_validate(graph.model_dump() | {"meta": {}})
    with pytest.raises(ValueError, match="not an analytic capture"):
        bench.a100_timed(bare)
