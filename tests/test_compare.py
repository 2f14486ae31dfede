"""coop compare: static and online methods side by side; sweep configs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from coop.budget import baseline_peak, min_budget
from coop.compare import FITS_NOTE, break_even_steps, compare, simulate_report
from coop.config import ConfigError, load_config, parse_config
from coop.errors import CoopError
from coop.graph import Graph
from coop.online.online_sim import simulate_online
from coop.runtime.placement import best_fit_placement, exact_placement, packed_placement
from coop.schedule import Schedule, simulate

REPO = Path(__file__).resolve().parents[1]


def _training_graph(cost_unit: str = "seconds (analytic)") -> Graph:
    """A 6-layer chain with a backward pass: forward f0..f5, loss, backward b5..b0 reading f_i."""
    nodes = [{"id": 0, "name": "x", "mem": 4, "cost": 0, "kind": "input"}]
    for i in range(6):
        nodes.append({"id": 1 + i, "name": f"f{i}", "mem": 10, "cost": 1e-3, "inputs": [i], "kind": "forward"})
    nodes.append({"id": 7, "name": "loss", "mem": 1, "cost": 1e-4, "inputs": [6], "kind": "forward"})
    previous = 7
    for i in reversed(range(6)):
        node_id = 8 + (5 - i)
        inputs = [previous, 1 + i] if i else [previous, 1]
        nodes.append({"id": node_id, "name": f"b{i}", "mem": 10, "cost": 2e-3, "inputs": inputs, "kind": "backward"})
        previous = node_id
    return Graph.model_validate(
        {"name": "chain", "nodes": nodes, "outputs": [7, previous], "meta": {"cost_unit": cost_unit}}
    )


def test_compare_rows_cover_every_method_and_budget() -> None:
    graph = _training_graph()
    least = min_budget(graph)
    budgets = ["100%", 0.7, least - 1]
    report = compare(graph, budgets, formulations=["store-all", "chen-sqrt"], policies=["dtr", "coop"])
    assert len(report.rows) == len(budgets) * 4
    below = [r for r in report.rows if r["budget"] == least - 1]
    assert len(below) == 4 and all(r["status"] == "infeasible" and "below min_budget" in r["message"] for r in below)
    assert not any(r["fits"] for r in below)
    # at the baseline peak every method runs: each row has both peaks, and fits by the same arena rule
    full = [r for r in report.rows if r["budget_spec"] == "100%"]
    assert len(full) == 4 and all(r["fits"] for r in full)
    for row in full:
        assert row["live_peak"] <= row["arena_peak"] <= row["budget"]
    store_all = next(r for r in full if r["method"] == "store-all")
    schedule = Schedule.from_order(graph.order)
    assert store_all["live_peak"] == simulate(graph, schedule).peak == baseline_peak(graph)
    assert store_all["arena_peak"] == best_fit_placement(graph, schedule).arena_peak
    assert store_all["overhead"] == 0 and store_all["solve_s"] >= 0


def test_break_even_needs_seconds_and_is_consistent() -> None:
    graph = _training_graph()
    report = compare(graph, ["100%"], formulations=["store-all"], policies=["dtr"])
    row = next(r for r in report.rows if r["method"] == "store-all")
    online = next(r for r in report.rows if r["method"] == "dtr")
    # per-step seconds by hand: 6 forward x 1 ms + loss 0.1 ms + 6 backward x 2 ms, no recomputation
    # for store-all; dtr at 100 % evicts nothing, so it pays only its eviction search per step
    assert row["step_s"] == pytest.approx(6e-3 + 1e-4 + 12e-3)
    assert online["overhead"] == 0 and online["step_s"] == pytest.approx(row["step_s"] + online["search_s"])
    saving = online["step_s"] - row["step_s"]
    assert row["break_even_vs_dtr"] == (math.inf if saving <= 0 else math.ceil(row["solve_s"] / saving))
    units = compare(_training_graph(cost_unit="profiled units"), ["100%"], ["store-all"], ["dtr"])
    assert all(r.get("break_even_vs_dtr") is None for r in units.rows)
    assert any("not time" in note for note in units.notes)


def _fragmenting_graph() -> Graph:
    """x (1, caller-owned); n1 (1) from x; n2 (2) from n1, read by nobody; n3 (1) from n1; n4 (2) from x and n3.

    Store-all in the order n1, n2, n3, n4 (frees right after the last read), counted by hand:
    step 0 x + n1 = 2; step 1 x + n1 + n2 = 4 (n2 dies); step 2 x + n1 + n3 = 3 (n1 dies); step 3 x + n3 + n4 = 4.
    Blocks: x [0..3] 1 B, n1 [0..2] 1 B, n2 [1..1] 2 B, n3 [2..3] 1 B, n4 [3..3] 2 B; live peak 4.
    Best fit in order: x 0, n1 1, n2 [2, 4), n3 2, then n4 finds only n1's 1-byte hole: [3, 5), arena 5.
    Greedy by size: n2 and n4 (never live together) at [0, 2), x 2, n1 3, n3 above all three: 4, arena 5.
    An arena of 4 exists (x 0, n1 1, n2 [2, 4), n3 3, n4 [1, 3)): packing is a heuristic.
    """
    return Graph.model_validate({"name": "fragmenting", "nodes": [
        {"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"},
        {"id": 1, "name": "n1", "mem": 1, "cost": 1.0, "inputs": [0]},
        {"id": 2, "name": "n2", "mem": 2, "cost": 1.0, "inputs": [1]},
        {"id": 3, "name": "n3", "mem": 1, "cost": 1.0, "inputs": [1]},
        {"id": 4, "name": "n4", "mem": 2, "cost": 1.0, "inputs": [0, 3]},
    ], "outputs": [4], "order": [1, 2, 3, 4]})


def test_a_static_plan_whose_live_peak_fits_but_whose_arena_does_not_is_fragmented() -> None:
    graph = _fragmenting_graph()
    schedule = Schedule.from_order(graph.order)
    assert simulate(graph, schedule).peak == 4
    assert best_fit_placement(graph, schedule).arena_peak == packed_placement(graph, schedule).arena_peak == 5
    exact = exact_placement(graph, schedule, time_limit=5.0)
    assert exact.status == "optimal" and exact.arena_peak == 4
    report = compare(graph, [4, 5], formulations=["store-all"], policies=["dtr", "coop"])
    tight, roomy = (next(r for r in report.rows if r["method"] == "store-all" and r["budget"] == b) for b in (4, 5))
    assert (tight["live_peak"], tight["arena_peak"]) == (4, 5) == (roomy["live_peak"], roomy["arena_peak"])
    assert not tight["fits"] and tight["status"] == "fragmented"
    assert "needs an arena of 5" in tight["message"] and "\n" not in tight["message"]
    assert roomy["fits"] and roomy["status"] != "fragmented"
    assert FITS_NOTE in report.notes
    # online rows at the same budget: the same rule, checked against the online engine run directly
    for row in (r for r in report.rows if r["kind"] == "online"):
        run = simulate_online(graph, row["budget"], row["method"])
        assert (row["live_peak"], row["arena_peak"]) == (run.peak, run.arena_peak)
        assert row["fits"] == (run.schedule is not None and run.arena_peak <= row["budget"])
        assert run.arena_peak <= row["budget"]  # the engine's arena is the budget's size


def test_break_even_formula() -> None:
    assert break_even_steps(10.0, 1.0, 3.0) == 5
    assert break_even_steps(10.0, 1.0, 1.0) == math.inf
    assert break_even_steps(0.0, 2.0, 1.0) == 0.0
    assert break_even_steps(1.0, 1.0, 1.3) == 4  # ceil(3.33...)


def test_a_formulation_that_rejects_the_graph_is_skipped_with_its_reason() -> None:
    graph = Graph.model_validate({"name": "fwd-only", "nodes": [
        {"id": 0, "name": "a", "mem": 2, "cost": 1},
        {"id": 1, "name": "b", "mem": 2, "cost": 1, "inputs": [0]},
    ], "outputs": [1]})
    report = compare(graph, ["100%"], formulations=["chen-sqrt"], policies=[])
    (row,) = report.rows
    assert row["status"] == "skipped" and "forward/backward" in row["message"]


def test_outputs_csv_markdown_plot(tmp_path: Path) -> None:
    report = compare(_training_graph(), ["100%", "80%"], ["store-all", "checkpoint-all"], ["dte", "coop"])
    path = report.to_csv(tmp_path / "out.csv")
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(report.rows) and {"method", "overhead", "live_peak", "arena_peak"} <= set(rows[0])
    table = report.to_markdown()
    assert table.count("\n| ") == len(report.rows) + 1  # header + one line per row
    png = report.plot(tmp_path / "out.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_report_reports_infeasible_budgets() -> None:
    graph = _training_graph()
    low = simulate_report(graph, "dtr", min_budget(graph) - 1)
    assert low["status"] == "infeasible"
    ok = simulate_report(graph, "coop", "100%")
    assert ok["status"] == "ok" and ok["ok"] and ok["peak"] <= ok["budget"]


def test_shipped_configs_validate() -> None:
    for name in ("gpt2_small.toml", "checkmate_graphs.toml"):
        config = load_config(REPO / "configs" / name)
        assert config.budgets and config.time_limit > 0


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"budgets": ["90%"]}, "graphs"),
        ({"graphs": [{"path": "a.json", "zoo": "mlp"}], "budgets": ["90%"]}, "exactly one of path, glob or zoo"),
        ({"graphs": [{"zoo": "mlp"}], "budgets": ["90%"], "policies": ["lru"]}, "unknown policy 'lru'"),
        ({"graphs": [{"zoo": "mlp"}], "budgets": ["90%"], "formulations": ["magic"]}, "unknown formulation 'magic'"),
        ({"graphs": [{"zoo": "mlp"}], "budgets": ["90%"], "time_limit": -1}, "time_limit"),
        ({"graphs": [{"zoo": "mlp"}], "budgets": ["90%"], "budget": 3}, "unknown field"),
    ],
)
def test_bad_configs_give_one_line_errors(data: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        parse_config(data)
    assert "\n" not in str(info.value)


def test_bad_toml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("budgets = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    missing = tmp_path / "missing.toml"
    missing.write_text('budgets = ["90%"]\n[[graphs]]\npath = "nope.json"\n')
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(missing).graph_paths()


def test_poet_joins_compare_with_a_device_profile_and_prices_its_rows() -> None:
    """Without a profile neither poet (needs one) nor monet (the graph has no implementations) runs; with the m4
    profile poet's row at the baseline peak is store-all's compute energy: sum(cost) x FLOP/s / FLOP-per-J
    of POET's published nRF52840 figures (6,369,910.1 FLOP/s, 580,010,757.7 FLOP/J), nothing paged."""
    graph = _training_graph()
    plain = compare(graph, ["100%"], policies=[])
    assert {r["method"] for r in plain.rows}.isdisjoint({"poet", "monet"})
    priced = compare(graph, ["100%"], formulations=["store-all", "poet"], policies=[], device_profile="m4")
    poet = next(r for r in priced.rows if r["method"] == "poet")
    expected = sum(n.cost for n in graph.nodes) * 6369910.145264308 / 580010757.690879
    assert poet["energy_j"] == pytest.approx(expected, rel=1e-9) and poet["paged_bytes"] == 0
    assert "energy_j" in priced.to_markdown()


def test_an_unknown_device_profile_stops_compare_in_one_line() -> None:
    with pytest.raises(CoopError, match="unknown device profile 'nope'"):
        compare(_training_graph(), ["100%"], policies=[], device_profile="nope")
