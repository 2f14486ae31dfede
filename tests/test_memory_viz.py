"""The predicted timeline as a PyTorch memory snapshot (issue 28, item 4): the file opens with torch's own
``torch.cuda._memory_viz`` helpers (on CPU), and the most bytes live over its trace, counted here from the trace
entries alone, is the plan's predicted peak, and on a hand-made graph the peak counted by hand."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from torch.cuda import _memory_viz

import coop
from coop.cli import main
from coop.graph import Graph
from coop.memory_viz import memory_viz_snapshot
from coop.schedule import Schedule, Step
from coop.zoo import build


def live_bytes_over_the_trace(trace: list[dict[str, Any]]) -> tuple[int, int, dict[int, int]]:
    """(the most bytes live, the bytes live at the end, address -> size of what is live at the end), counted from
    the entries: ``alloc`` adds its size, ``free_completed`` takes it away; each free names a live allocation."""
    live: dict[int, int] = {}
    peak = 0
    for entry in trace:
        if entry["action"] == "alloc":
            assert entry["addr"] not in live, entry
            live[entry["addr"]] = entry["size"]
            peak = max(peak, sum(live.values()))
        elif entry["action"] == "free_completed":
            assert live.pop(entry["addr"]) == entry["size"], entry
    return peak, sum(live.values()), live


def read_with_torch(snapshot: dict[str, Any]) -> None:
    """Every helper of torch.cuda._memory_viz that reads a snapshot without a GPU (and without downloading
    flamegraph.pl): they raise on a malformed one (segsum checks that the blocks add up to each segment)."""
    assert "total_reserved" in _memory_viz.segsum(snapshot)
    assert "entries" in _memory_viz.trace(snapshot)
    assert _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    assert _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        assert "snapshot.pickle" in html


def test_a_plan_exports_its_predicted_step_and_its_trace_peaks_at_the_predicted_peak(tmp_path: Path) -> None:
    model, batch, loss_fn = build("transformer", batch=4)
    plan = coop.plan(model, 0.8, batch, loss_fn=loss_fn, formulation="chen-greedy")
    assert plan.simulation.recomputations > 0  # a timeline with recomputations, not the baseline's
    path = tmp_path / "plan.pickle"
    plan.export_memory_viz(path)
    snapshot = pickle.loads(path.read_bytes())
    read_with_torch(snapshot)
    assert len(snapshot["device_traces"]) == 1 and len(snapshot["segments"]) == 1  # a CPU step: one device
    trace = snapshot["device_traces"][0]
    peak, at_end, resident = live_bytes_over_the_trace(trace)
    assert peak == plan.predicted_peak
    segment = snapshot["segments"][0]
    active = {block["address"]: block["size"] for block in segment["blocks"] if block["state"] == "active_allocated"}
    assert active == resident and sum(active.values()) == at_end  # the segments are the trace's end state
    assert sum(block["size"] for block in segment["blocks"]) == segment["total_size"] >= peak
    allocs = [entry for entry in trace if entry["action"] == "alloc"]
    for entry in allocs:  # the step's op, then the value: its node id and name
        step, value = entry["frames"]
        node = plan.graph.node(value["line"])
        assert value["name"].endswith(f" {node.name}") and value["filename"] == plan.graph.name
        assert step["filename"] == "step" and 0 <= step["line"] < len(plan.executor.schedule)
    computes = [entry for entry in allocs if entry["frames"][0]["name"].startswith("compute")]
    assert len(computes) > len(plan.graph.order) - len(plan.graph.caller_owned_ids)  # recomputations included
    assert any("(aten.addmm.default)" in entry["frames"][0]["name"] for entry in computes)


def tiny_graph() -> Graph:
    """x (input, 10 B) -> a (100 B) -> b (20 B) -> c (output, 1 B); b's workspace 7 B; c also reads a."""
    return Graph.model_validate({
        "name": "tiny",
        "nodes": [
            {"id": 0, "name": "x", "mem": 10, "cost": 0, "kind": "input"},
            {"id": 1, "name": "a", "mem": 100, "cost": 1, "inputs": [0]},
            {"id": 2, "name": "b", "mem": 20, "cost": 1, "inputs": [1], "workspace": 7},
            {"id": 3, "name": "c", "mem": 1, "cost": 1, "inputs": [1, 2], "kind": "backward"},
        ],
        "outputs": [3],
        "meta": {"mem_unit": "bytes"},
    })


def test_a_recomputing_schedule_of_a_hand_made_graph_peaks_where_counted_by_hand() -> None:
    """compute a, compute b, free a, compute a again, compute c: by hand, x is always there (10); step 1 holds
    x + a + b + b's workspace = 137, the most; step 3 holds x + b + a = 130; step 4 x + a + b + c = 131."""
    graph = tiny_graph()
    schedule = Schedule(steps=(Step(op="compute", node=1), Step(op="compute", node=2), Step(op="free", node=1),
                               Step(op="compute", node=1), Step(op="compute", node=3)))
    snapshot = pickle.loads(pickle.dumps(memory_viz_snapshot(graph, schedule)))
    read_with_torch(snapshot)
    trace = snapshot["device_traces"][0]
    peak, at_end, _ = live_bytes_over_the_trace(trace)
    assert (peak, at_end) == (137, 10 + 1)  # the input and the output stay
    allocated = [(entry["size"], entry["frames"][0]["name"]) for entry in trace if entry["action"] == "alloc"]
    assert allocated == [(10, "caller-owned input x (resident before the step)"), (100, "compute a"),
                         (20, "compute b"), (7, "workspace of compute b"), (100, "compute a"),
                         (1, "compute c")]
    freed = [(entry["size"], entry["frames"][0]["name"]) for entry in trace if entry["action"] == "free_completed"]
    assert freed == [(100, "free a"), (7, "end of compute b"), (20, "after compute c: last use of b"),
                     (100, "after compute c: last use of a")]


def run(argv: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return status, captured.out


def test_coop_validate_and_coop_simulate_write_the_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tiny_graph()
    graph_path = tmp_path / "tiny.json"
    graph.save(graph_path)
    schedule_path = tmp_path / "schedule.json"
    assert run(["solve", graph_path, "--budget", "1.0", "-f", "store-all", "-o", schedule_path], capsys)[0] == 0
    status, out = run(["validate", graph_path, schedule_path, "--memory-viz", tmp_path / "validate.pickle", "--json"],
                      capsys)
    report = json.loads(out)
    assert status == 0 and report["memory_viz"] == str(tmp_path / "validate.pickle")
    snapshot = pickle.loads((tmp_path / "validate.pickle").read_bytes())
    read_with_torch(snapshot)
    assert live_bytes_over_the_trace(snapshot["device_traces"][0])[0] == report["peak"] == 10 + 100 + 20 + 7

    status, out = run(["simulate", graph_path, "--policy", "coop", "--budget", "1.0", "--memory-viz",
                       tmp_path / "online.pickle", "--json"], capsys)
    assert status == 0 and json.loads(out)["memory_viz"] == str(tmp_path / "online.pickle")
    snapshot = pickle.loads((tmp_path / "online.pickle").read_bytes())
    read_with_torch(snapshot)
    assert live_bytes_over_the_trace(snapshot["device_traces"][0])[0] == 137  # the online run kept everything


def test_a_dynamic_plan_has_no_timeline_to_export(tmp_path: Path) -> None:
    model, batch, loss_fn = build("mlp")
    # 1.5 x the peak, room for its generator states (above the peak a budget is bytes: a fraction is at most 1.0)
    above_the_peak = -(-3 * coop.baseline_peak(coop.capture(model, batch, loss_fn).graph) // 2)
    plan = coop.plan(model, above_the_peak, batch, loss_fn=loss_fn, formulation="dynamic")
    with pytest.raises(coop.CoopError, match="predicts no memory timeline; export one from a plan made with a static"):
        plan.export_memory_viz(tmp_path / "dynamic.pickle")


def test_the_snapshot_is_plain_python_data() -> None:
    """The exporter writes builtins only: the file unpickles where coop (and torch) are not installed."""
    snapshot = memory_viz_snapshot(tiny_graph(), Schedule.from_order(tiny_graph().order))
    modules = {module for module in ("coop", "torch", "numpy") if module.encode() in pickle.dumps(snapshot)}
    assert modules == set()
