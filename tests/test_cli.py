"""The ``coop`` command: info, solve, validate, plot, capture, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import coop.formulations
from coop.budget import min_budget
from coop.cli import main
from coop.formulations import Formulation
from coop.formulations.core.options import BaselineOptions, SolverOptions
from coop.formulations.core.result import SolveResult
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.schedule import Schedule, simulate

N250 = "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json"
RESNET50_TRAIN = "ResNet50_256_224_224_3_train_nx.json"
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- helpers
def small_graph() -> Graph:
    """A forward/backward chain with a parameter and an input; ids deliberately not 0..n-1."""
    nodes = [
        {"id": 10, "name": "x", "mem": 4, "cost": 0, "kind": "input"},
        {"id": 11, "name": "w", "mem": 2, "cost": 0, "kind": "param"},
        {"id": 20, "name": "a", "inputs": [10, 11], "mem": 8, "cost": 1.0},
        {"id": 21, "name": "b", "inputs": [20], "mem": 8, "cost": 1.0},
        {"id": 22, "name": "c", "inputs": [21], "mem": 8, "cost": 1.0},
        {"id": 23, "name": "loss", "inputs": [22], "mem": 1, "cost": 1.0},
        {"id": 30, "name": "gc", "inputs": [23, 21], "mem": 8, "cost": 2.0, "kind": "backward"},
        {"id": 31, "name": "gb", "inputs": [30, 20], "mem": 8, "cost": 2.0, "kind": "backward"},
        {"id": 32, "name": "gw", "inputs": [31, 10], "mem": 2, "cost": 2.0, "kind": "backward"},
    ]
    return Graph.model_validate({"name": "small", "nodes": nodes, "outputs": [23, 32], "meta": {"mem_unit": "bytes"}})


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.json"
    small_graph().save(path)
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit status, stdout, stderr)."""
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return status, captured.out, captured.err


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("coop: note:")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("coop: error: "), stderr
    return lines[0]


def order_schedule(graph: Graph, budget: int) -> SolveResult:
    """A stand-in formulation: the baseline order (what store-all does), so the CLI can be tested alone."""
    schedule = Schedule.from_order(graph.order)
    return SolveResult("order", "heuristic", schedule, simulate(graph, schedule), objective=graph.baseline_cost)


def nothing_found(graph: Graph, budget: int, *, time_limit: float | None = None) -> SolveResult:
    return SolveResult("nothing", "unknown", message=f"stopped at {time_limit} s")


@dataclass(frozen=True, kw_only=True)
class TimeLimitOnly(SolverOptions):
    """The options of the stand-in that reads only a time limit."""

    uses: ClassVar[frozenset[str]] = frozenset({"time_limit"})


@pytest.fixture
def stand_in_formulations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the stand-ins next to the real formulations (the CLI looks them up at call time)."""
    monkeypatch.setitem(coop.formulations.FORMULATIONS, "order", Formulation("tests.test_cli:order_schedule", BaselineOptions))
    monkeypatch.setitem(coop.formulations.FORMULATIONS, "nothing", Formulation("tests.test_cli:nothing_found", TimeLimitOnly))


# ---------------------------------------------------------------------------- info
def test_info_json_reports_published_baselines(moccasin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["info", moccasin_dir / N250, "--json"], capsys)
    facts = json.loads(out)
    assert status == 0
    assert (facts["nodes"], facts["edges"]) == (250, 944)
    assert facts["baseline_peak"] == 146840
    assert facts["baseline_cost"] == 125569
    assert facts["min_budget"] == min_budget(load_graph(moccasin_dir / N250))
    status, out, _ = run(["info", "--json", moccasin_dir / RESNET50_TRAIN], capsys)
    assert status == 0
    assert json.loads(out)["baseline_peak"] == 38059356160


def test_info_table_names_the_largest_value(graph_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["info", graph_file], capsys)
    assert status == 0
    assert "baseline peak" in out and "min budget (lower bound)" in out and "constructed budget (upper bound)" in out
    status, out, _ = run(["info", graph_file, "--json"], capsys)
    facts = json.loads(out)
    assert facts["min_budget"] <= facts["constructed_budget"] <= facts["baseline_peak"]
    assert facts["kinds"] == {"backward": 3, "forward": 4, "input": 1, "param": 1}
    assert facts["largest"][0]["mem"] == 8


# ---------------------------------------------------------------------------- solve and validate
def test_solve_writes_contract_schedule_that_validates(
    graph_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], stand_in_formulations: None
) -> None:
    out_file = tmp_path / "out" / "schedule.json"
    status, out, _ = run(["solve", graph_file, "--budget", "100%", "-f", "order", "-o", out_file, "--json"], capsys)
    assert status == 0
    report = json.loads(out)
    assert report["ok"] and report["output"] == str(out_file)
    document = json.loads(out_file.read_text())
    graph = small_graph()
    assert document["format"] == "coop.schedule/1"
    assert document["graph"] == {"name": "small", "sha256": graph.sha256}
    assert [step["node"] for step in document["steps"]] == list(graph.order)
    assert {step["node"] for step in document["steps"]} == {20, 21, 22, 23, 30, 31, 32}
    assert document["predicted"]["peak"] == simulate(graph, Schedule.from_order(graph.order)).peak
    assert set(document["solver"]) == {"status", "wall_s", "objective", "bound", "gap"}
    status, out, _ = run(["validate", graph_file, out_file, "--json"], capsys)
    verdict = json.loads(out)
    assert status == 0 and verdict["ok"] and verdict["predicted_matches"]


def test_solve_store_all_on_published_graph(moccasin_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("coop.formulations.heuristics.baselines", reason="the baselines module is not written yet")
    out_file = tmp_path / "store_all.json"
    graph_path = moccasin_dir / N250
    status, _, _ = run(["solve", graph_path, "--budget", "146840", "-f", "store-all", "-o", out_file], capsys)
    assert status == 0
    document = json.loads(out_file.read_text())
    graph = load_graph(graph_path)
    assert {step["node"] for step in document["steps"] if step["op"] == "compute"} == set(graph.order)
    assert document["predicted"]["peak"] <= 146840
    status, out, _ = run(["validate", graph_path, out_file], capsys)
    assert status == 0 and "valid" in out


def test_budget_below_minimum_names_it(graph_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       stand_in_formulations: None) -> None:
    least = min_budget(small_graph())
    out_file = tmp_path / "never.json"
    status, _, err = run(["solve", graph_file, "--budget", least - 1, "-f", "order", "-o", out_file], capsys)
    line = one_error_line(err)
    assert status == 1
    assert str(least) in line and "below min_budget" in line and f"use at least {least}" in line
    assert not out_file.exists()


def test_budget_above_minimum_not_met_reports_best_peak(graph_file: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        stand_in_formulations: None) -> None:
    graph = small_graph()
    peak = simulate(graph, Schedule.from_order(graph.order)).peak
    budget = min_budget(graph)
    assert budget < peak  # the stand-in cannot meet it: the baseline order is all it knows
    out_file = tmp_path / "never.json"
    status, _, err = run(["solve", graph_file, "--budget", budget, "-f", "order", "-o", out_file], capsys)
    assert status == 1
    line = one_error_line(err)  # no proof (the stand-in only knows one order): not called infeasible
    assert line.startswith(f"coop: error: no schedule found within 0 s by order under the budget {budget} B"), line
    assert f"the best peak reached is {peak} B" in line and "infeasible" not in line
    assert not out_file.exists()


def test_solver_without_schedule_and_unknown_option(graph_file: Path, capsys: pytest.CaptureFixture[str],
                                                    stand_in_formulations: None) -> None:
    status, out, err = run(["solve", graph_file, "-b", "100%", "-f", "nothing", "--time-limit", "3", "--threads", "2",
                            "--json"], capsys)
    assert status == 1
    assert "no schedule found" in one_error_line(err) and "stopped at 3.0 s" in err
    assert json.loads(out)["ok"] is False  # --threads is a common option: one with no use for it leaves it unused
    # An option that is not common and that the formulation does not take is refused, not dropped.
    status, out, err = run(["solve", graph_file, "-b", "100%", "-f", "nothing", "--solver", "highs"], capsys)
    assert status == 2
    assert "formulation 'nothing' has no option 'solver'" in one_error_line(err)


def test_unknown_formulation_and_bad_budget_are_usage_errors(graph_file: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["solve", graph_file, "-b", "90%", "-f", "no-such-method"], capsys)
    assert status == 2 and "store-all" in one_error_line(err)
    status, _, err = run(["solve", graph_file, "-b", "lots", "-f", "store-all"], capsys)
    assert status == 2 and "'lots'" in one_error_line(err)


def test_validate_rejects_illegal_schedule_with_step(graph_file: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     stand_in_formulations: None) -> None:
    good = tmp_path / "good.json"
    assert run(["solve", graph_file, "-b", "100%", "-f", "order", "-o", good], capsys)[0] == 0
    document = json.loads(good.read_text())
    document["steps"].insert(0, {"op": "free", "node": 21})  # free a value that was never computed
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    status, out, err = run(["validate", graph_file, bad, "--json"], capsys)
    assert status == 1
    verdict = json.loads(out)
    assert verdict["ok"] is False and verdict["step"] == 0
    assert "step 0" in one_error_line(err)
    status, _, err = run(["validate", graph_file, good, "--budget", "1"], capsys)
    assert status == 1 and "exceeds the budget" in one_error_line(err)


def test_validate_refuses_schedule_of_another_graph(graph_file: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    stand_in_formulations: None) -> None:
    schedule_file = tmp_path / "s.json"
    assert run(["solve", graph_file, "-b", "100%", "-f", "order", "-o", schedule_file], capsys)[0] == 0
    other = small_graph().model_dump()
    other["nodes"][2]["cost"] = 5.0  # same shape, different costs: a different graph
    other_file = tmp_path / "other.json"
    Graph.model_validate(other).save(other_file)
    status, _, err = run(["validate", other_file, schedule_file], capsys)
    assert status == 2
    assert "was made for graph 'small'" in one_error_line(err)


def test_plot_writes_png(graph_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         stand_in_formulations: None) -> None:
    schedule_file = tmp_path / "s.json"
    assert run(["solve", graph_file, "-b", "100%", "-f", "order", "-o", schedule_file], capsys)[0] == 0
    image = tmp_path / "plots" / "memory.png"
    status, out, _ = run(["plot", graph_file, schedule_file, schedule_file, "-o", image, "--json"], capsys)
    assert status == 0
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(json.loads(out)["peaks"]) == {"order", "order (2)"}


# ---------------------------------------------------------------------------- bad input
def test_malformed_graph_names_the_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = small_graph().to_dict()
    del data["nodes"][3]["mem"]  # node 21
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    status, _, err = run(["info", broken], capsys)
    assert status == 2
    line = one_error_line(err)
    assert "node 21" in line and "mem" in line
    not_json = tmp_path / "not.json"
    not_json.write_text("{nodes: ")
    status, _, err = run(["info", not_json], capsys)
    assert status == 2 and "not JSON" in one_error_line(err)


def test_capture_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["capture", "-o", tmp_path / "g.json"], capsys)
    assert status == 2 and "exactly one model" in one_error_line(err)
    status, _, err = run(["capture", "missing.py:make", "-o", tmp_path / "g.json"], capsys)
    assert status == 2 and "missing.py does not exist" in one_error_line(err)
    factory = tmp_path / "factory.py"
    factory.write_text("def make():\n    return 42\n")
    status, _, err = run(["capture", f"{factory}:make", "-o", tmp_path / "g.json"], capsys)
    assert status == 2 and "must return (model, batch)" in one_error_line(err)


def test_capture_zoo_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture_module = pytest.importorskip("coop.graph_capture")
    if not hasattr(capture_module, "capture"):
        pytest.skip("coop.graph_capture.capture is not written yet")
    out_file = tmp_path / "mlp.json"
    status, out, _ = run(["capture", "--model", "mlp", "--layers", "2", "--hidden", "16", "--batch", "4",
                          "-o", out_file, "--json"], capsys)
    assert status == 0
    facts = json.loads(out)
    graph = load_graph(out_file)
    assert facts["nodes"] == len(graph.nodes) and graph.has_backward


@pytest.mark.parametrize(
    "argv",
    [
        ["info"],
        ["info", "/no/such/graph.json"],
        ["solve", "/no/such/graph.json", "-b", "90%", "-f", "store-all"],
        ["no-such-command"],
        ["info", "--no-such-option"],
    ],
)
def test_console_entry_prints_one_line_and_no_traceback(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "coop", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    one_error_line(done.stderr)


def test_python_m_coop_cli_knows_every_command() -> None:
    """``python -m coop.cli`` runs its main only after every command is registered (simulate and compare
    were registered after the ``__main__`` block once, so they were unknown there): its help lists every command."""
    done = subprocess.run([sys.executable, "-m", "coop.cli", "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    listed = {line.strip("│ ").split(" ")[0] for line in done.stdout.splitlines() if line.startswith("│ ")}
    assert {"info", "solve", "validate", "plot", "capture", "simulate", "compare"} <= listed, done.stdout


def test_capture_with_alternatives_feeds_monet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`coop capture --alternatives` records MONeT's implementations: the zoo CNN's two ReLUs give two optional
    1-byte-per-element masks (a ReLU output of 4 x 8 x 16 x 16 float32 = 32,768 B -> 8,192 B), and
    `coop solve --formulation monet` reads them; without the flag the graph has none."""
    plain, with_alternatives = tmp_path / "cnn.json", tmp_path / "cnn_alt.json"
    assert run(["capture", "--model", "cnn", "-o", plain], capsys)[0] == 0
    assert run(["capture", "--model", "cnn", "--alternatives", "-o", with_alternatives], capsys)[0] == 0
    assert not load_graph(plain).has_impls
    graph = load_graph(with_alternatives)
    # (the other optional value is a convolution backward's weight gradient, coop.graph_capture.alternatives.conv)
    masks = [graph.node(v) for v in graph.optional_ids if graph.node(v).name.startswith("mask_")]
    assert len(masks) == 2 and all(mask.mem == 8192 for mask in masks)
    status, out, _ = run(["solve", with_alternatives, "-b", "95%", "-f", "monet", "--time-limit", "3", "--json"], capsys)
    assert status == 0, out
    assert json.loads(out)["formulation"] == "monet"
