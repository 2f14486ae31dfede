"""PyTorch's min-cut partitioner as a formulation: every split is a legal schedule of our Graph."""

from __future__ import annotations

import pytest
import torch

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError, SolverError
from coop.formulations.heuristics.pytorch_mincut import (
    DEFAULT_MEMORY_BUDGETS,
    TANGENT_NAME,
    aot_style_joint,
    partition,
    pytorch_mincut,
    split_to_schedule,
)
from coop.graph import Graph, Node
from coop.graph_capture import capture
from coop.schedule import validate
from tests.models import build

KNOBS = (1.0, 0.5, 0.2, 0.0)


@pytest.fixture(scope="module")
def transformer():
    model, batch, loss_fn = build("transformer", layers=2, hidden=16, seq=8)
    return capture(model, batch, loss_fn)


@pytest.fixture(scope="module")
def cnn():
    model, batch, loss_fn = build("cnn")  # BatchNorm: buffers, multi-output ops
    return capture(model, batch, loss_fn)


def test_joint_has_the_aot_layout(cnn) -> None:
    joint = aot_style_joint(cnn)
    placeholders = [n.name for n in joint.module.graph.nodes if n.op == "placeholder"]
    assert placeholders[:-1] == [f"primals_{i}" for i in range(1, len(cnn.placeholders) + 1)]
    assert placeholders[-1] == TANGENT_NAME
    assert joint.num_fwd_outputs == 1 + len(cnn.buffer_names)
    assert not any(n.target is torch.ops.aten.ones_like.default for n in joint.module.graph.nodes)
    # every node but the placeholders and the seed keeps its captured name
    captured_names = {n.name for n in cnn.module.graph.nodes if n.op not in ("placeholder", "output")}
    joint_names = {n.name for n in joint.module.graph.nodes if n.op not in ("placeholder", "output")}
    assert joint_names == captured_names - {joint.seed_name}


@pytest.mark.parametrize("which", ["transformer", "cnn"])
def test_every_split_is_a_legal_schedule_matching_the_modules(which, request) -> None:
    captured = request.getfixturevalue(which)
    graph = captured.graph
    for knob in KNOBS:
        joint = aot_style_joint(captured)
        forward_module, backward_module = partition(joint, knob)
        plan = split_to_schedule(graph, captured, joint, forward_module, backward_module, knob)
        verdict = validate(graph, plan.schedule)
        assert verdict.ok, (knob, verdict.reason)
        assert verdict.peak == plan.simulation.peak
        # the schedule's forward is exactly the forward module's storage-producing nodes, in order
        expected_forward = [
            captured.owner_of[n.name] for n in forward_module.graph.nodes
            if n.op == "call_function" and captured.fx_names[captured.owner_of[n.name]][0] == n.name
            and not graph.node(captured.owner_of[n.name]).caller_owned
        ]
        steps = [s.node for s in plan.schedule.steps]
        assert steps[: len(expected_forward)] == expected_forward
        # what the backward reads from the forward is the saved set, or kept non-recomputables
        assert set(plan.saved_nodes) <= set(expected_forward)
        assert plan.simulation.recomputations >= len(set(plan.recomputed_nodes))


def test_budget_at_baseline_peak_fits(transformer) -> None:
    graph = transformer.graph
    budget = baseline_peak(graph)
    result = pytorch_mincut(graph, budget, captured=transformer, memory_budgets=KNOBS)
    assert result.status == "heuristic"
    assert result.extra["fits"] is True and result.message == ""
    assert validate(graph, result.schedule, budget).ok
    assert 0.0 <= result.extra["memory_budget"] <= 1.0


def test_sweep_reports_every_knob_and_the_cheapest_fit_wins(transformer) -> None:
    graph = transformer.graph
    budget = baseline_peak(graph)
    result = pytorch_mincut(graph, budget, captured=transformer)
    sweep = result.extra["sweep"]
    assert [row["memory_budget"] for row in sweep] == list(DEFAULT_MEMORY_BUDGETS)
    for row in sweep:
        assert row["peak"] >= min_budget(graph) and row["cost"] >= graph.baseline_cost * (1 - 1e-9)
    fitting = [row for row in sweep if row["peak"] <= budget]
    assert result.simulation.cost == min(row["cost"] for row in fitting)
    # a smaller knob saves fewer bytes than the default 1.0 (not a peak bound, but it does shrink the saved set)
    assert sweep[-1]["saved_bytes"] < sweep[0]["saved_bytes"]


def test_unreachable_budget_returns_lowest_peak_with_fits_false(transformer) -> None:
    graph = transformer.graph
    budget = min_budget(graph)
    result = pytorch_mincut(graph, budget, captured=transformer, memory_budgets=KNOBS)
    lowest = min(row["peak"] for row in result.extra["sweep"])
    assert lowest > budget  # this tiny transformer's sweep never reaches min_budget
    assert result.simulation.peak == lowest
    assert result.extra["fits"] is False
    assert "no activation_memory_budget" in result.message and "\n" not in result.message


def test_imported_graph_gives_one_line_error() -> None:
    graph = Graph(name="imported", nodes=(Node(id=0, name="a", mem=4, cost=1.0), Node(id=1, name="b", inputs=(0,), mem=4, cost=1.0)))
    with pytest.raises(CoopError, match="pytorch-mincut needs a captured model") as info:
        pytorch_mincut(graph, 100)
    assert "\n" not in str(info.value)


def test_captured_of_another_graph_is_refused(transformer, cnn) -> None:
    with pytest.raises(CoopError, match="not the graph of this captured model"):
        pytorch_mincut(cnn.graph, baseline_peak(cnn.graph), captured=transformer, memory_budgets=(1.0,))


@pytest.mark.parametrize("knobs", [(), (1.5,), (-0.1, 0.5)])
def test_knob_outside_unit_interval_is_refused(transformer, knobs) -> None:
    with pytest.raises(CoopError, match="pytorch-mincut"):
        pytorch_mincut(transformer.graph, baseline_peak(transformer.graph), captured=transformer, memory_budgets=knobs)


def test_a_module_that_does_not_line_up_fails_loudly(transformer) -> None:
    joint = aot_style_joint(transformer)
    forward_module, backward_module = partition(joint, 1.0)
    victim = next(n for n in forward_module.graph.nodes if n.target is torch.ops.aten.mm.default
                  or n.target is torch.ops.aten.addmm.default)
    victim.target = torch.ops.aten.bmm.default
    with pytest.raises(SolverError, match="does not line up"):
        split_to_schedule(transformer.graph, transformer, joint, forward_module, backward_module, 1.0)


@pytest.mark.parametrize("which", ["transformer", "cnn"])
def test_splits_replay_exactly_within_their_predicted_peak(which) -> None:
    from coop.runtime.executor import Executor
    from coop.runtime.meter import MemoryMeter

    model, batch, loss_fn = build(which, **({"layers": 2, "hidden": 16, "seq": 8} if which == "transformer" else {}))
    captured = capture(model, batch, loss_fn)
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(3)
    reference = captured.run(model, *batch)
    for knob in (1.0, 0.3, 0.0):  # 0.0 recomputes the whole forward, random ops kept from it
        joint = aot_style_joint(captured)
        plan = split_to_schedule(captured.graph, captured, joint, *partition(joint, knob), knob)
        torch.manual_seed(3)
        with MemoryMeter() as meter:
            meter.track(*flat, *captured.constants())
            outputs = Executor(captured, plan.schedule).run_flat(flat)
        assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True)), knob
        assert meter.peak_bytes <= plan.simulation.peak, (knob, meter.peak_op)  # no slack: an upper bound
