"""coop compare: static and online methods side by side; sweep configs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from coop.budget import baseline_peak, min_budget
from coop.compare import break_even_steps, compare, simulate_report
from coop.config import ConfigError, load_config, parse_config
from coop.graph import Graph
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
    assert below and all(r["status"] == "infeasible" and "least feasible" in r["message"] for r in below)
    for row in report.rows:
        if row["fits"]:
            assert row["peak"] <= row["budget"]
            assert row["arena_peak"] >= row["peak"]
        if row["kind"] == "static" and row["status"] not in ("infeasible", "skipped"):
            assert row["solve_s"] >= 0
    store_all = next(r for r in report.rows if r["method"] == "store-all" and r["budget_spec"] == "100%")
    schedule = Schedule.from_order(graph.order)
    assert store_all["peak"] == simulate(graph, schedule).peak == baseline_peak(graph)
    assert store_all["overhead"] == 0 and store_all["fits"]


def test_break_even_needs_seconds_and_is_consistent() -> None:
    graph = _training_graph()
    report = compare(graph, ["100%"], formulations=["store-all"], policies=["dtr"])
    row = next(r for r in report.rows if r["method"] == "store-all")
    online = next(r for r in report.rows if r["method"] == "dtr")
    expected = break_even_steps(row["solve_s"], row["step_s"], online["step_s"])
    assert row["break_even_vs_dtr"] == expected
    assert row["step_s"] == pytest.approx(graph.baseline_cost)
    units = compare(_training_graph(cost_unit="profiled units"), ["100%"], ["store-all"], ["dtr"])
    assert all(r.get("break_even_vs_dtr") is None for r in units.rows)
    assert any("not time" in note for note in units.notes)


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
    assert len(rows) == len(report.rows) and {"method", "overhead", "arena_peak"} <= set(rows[0])
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
