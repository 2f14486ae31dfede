"""The baseline schedules: legal everywhere, honest about fitting, and better than store-all."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.formulations import BASELINES, solve
from coop.formulations.baselines import checkpoint_all, chen_greedy, chen_sqrt, store_all
from coop.graph import Graph, load_graph
from coop.schedule import Schedule, simulate, validate
from tests.strategies import random_graphs

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPLIT_BASELINES = ("checkpoint-all", "chen-sqrt", "chen-greedy")


def _budget_between_min_and_baseline(data: st.DataObject, graph: Graph) -> int:
    low, high = min_budget(graph), max(min_budget(graph), baseline_peak(graph))
    return data.draw(st.integers(max(1, low), max(1, high)))


@PROPERTY
@given(st.data())
def test_every_baseline_validates_and_reports_fits_honestly(data: st.DataObject) -> None:
    graph = data.draw(random_graphs())
    budget = _budget_between_min_and_baseline(data, graph)
    for name in BASELINES:
        result = solve(graph, budget, name)
        assert result.status == "heuristic" and result.schedule is not None
        verdict = validate(graph, result.schedule)
        assert verdict.ok, f"{name}: {verdict.reason}"
        sim = simulate(graph, result.schedule)
        assert result.simulation is not None and result.simulation.peak == sim.peak
        assert result.extra["fits"] == (sim.peak <= budget)
        if result.extra["fits"]:
            assert validate(graph, result.schedule, budget).ok
        else:
            assert str(budget) in result.message


@PROPERTY
@given(st.data())
def test_baselines_never_recompute_what_cannot_be_recomputed(data: st.DataObject) -> None:
    graph = data.draw(random_graphs())
    budget = baseline_peak(graph)
    for name in BASELINES:
        steps = solve(graph, budget, name).schedule.steps  # type: ignore[union-attr]
        computes = [s.node for s in steps if s.op == "compute"]
        for node in graph.nodes:
            if not node.caller_owned and not node.recomputable:
                assert computes.count(node.id) == 1, f"{name} recomputes random op {node.id}"


@PROPERTY
@given(random_graphs(with_backward=False, max_nodes=6))
def test_split_baselines_need_a_backward(graph: Graph) -> None:
    assert store_all(graph, baseline_peak(graph)).extra["fits"]
    for name in SPLIT_BASELINES:
        with pytest.raises(CoopError, match="forward/backward split"):
            solve(graph, baseline_peak(graph), name)


@PROPERTY
@given(random_graphs())
def test_store_all_is_the_baseline(graph: Graph) -> None:
    result = store_all(graph, baseline_peak(graph))
    assert result.schedule == Schedule.from_order(graph.order)
    assert result.simulation.peak == baseline_peak(graph) and result.simulation.overhead == 0.0  # type: ignore[union-attr]
    assert result.extra["fits"]


@PROPERTY
@given(st.data())
def test_chen_greedy_cost_does_not_grow_with_the_budget(data: st.DataObject) -> None:
    # Cheapest-that-fits over a fixed grid: a larger budget only adds fitting candidates.
    graph = data.draw(random_graphs())
    low = _budget_between_min_and_baseline(data, graph)
    high = data.draw(st.integers(low, low + 50))
    at_low, at_high = chen_greedy(graph, low), chen_greedy(graph, high)
    if at_low.extra["fits"]:
        assert at_high.extra["fits"]
        assert at_high.simulation.cost <= at_low.simulation.cost  # type: ignore[union-attr]


def test_checkpoint_all_frees_recomputed_values_at_once() -> None:
    # x -> f1 -> f2 -> loss; the backward g1 reads f2 and g2 reads f1.
    graph = Graph.model_validate({"name": "chain", "nodes": [
        {"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"},
        {"id": 1, "name": "f1", "mem": 10, "cost": 1, "inputs": [0]},
        {"id": 2, "name": "f2", "mem": 10, "cost": 1, "inputs": [1]},
        {"id": 3, "name": "loss", "mem": 1, "cost": 1, "inputs": [2]},
        {"id": 4, "name": "g1", "mem": 10, "cost": 1, "inputs": [3, 2], "kind": "backward"},
        {"id": 5, "name": "g2", "mem": 10, "cost": 1, "inputs": [4, 1], "kind": "backward"},
    ]})
    steps = [(s.op, s.node) for s in checkpoint_all(graph, 100).schedule.steps]  # type: ignore[union-attr]
    assert steps == [
        ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("free", 2), ("free", 3),  # forward
        ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3),  # g1 reads loss and f2
        ("compute", 4), ("free", 2), ("free", 3),
        ("compute", 1), ("compute", 5), ("free", 1),  # g2 reads f1
    ]
    assert checkpoint_all(graph, 100).simulation.peak < store_all(graph, 100).simulation.peak  # type: ignore[union-attr]


def test_chen_sqrt_keeps_segment_boundaries_on_a_chain() -> None:
    # A 9-node forward chain: every node is a cut vertex; sqrt(9) = 3 -> keep the 3rd, 6th, 9th.
    forward = [{"id": i, "name": f"f{i}", "mem": 4, "cost": 1, "inputs": [i - 1] if i else []} for i in range(9)]
    backward = [
        {"id": 100 + i, "name": f"g{i}", "mem": 4, "cost": 1, "kind": "backward",
         "inputs": [100 + i - 1, 8 - i] if i else [8]}
        for i in range(9)
    ]
    graph = Graph.model_validate({"name": "chain9", "nodes": forward + backward})
    result = chen_sqrt(graph, 10**6)
    assert result.extra["checkpoints"] == [2, 5, 8]
    assert validate(graph, result.schedule).ok  # type: ignore[arg-type]
    assert result.simulation.peak < store_all(graph, 10**6).simulation.peak  # type: ignore[union-attr]
    assert 0 < result.simulation.overhead < 1  # type: ignore[union-attr]


def test_unknown_greedy_grid_is_rejected() -> None:
    graph = Graph.model_validate({"name": "g", "nodes": [
        {"id": 0, "name": "f", "mem": 1, "cost": 1},
        {"id": 1, "name": "g", "mem": 1, "cost": 1, "inputs": [0], "kind": "backward"},
    ]})
    with pytest.raises(CoopError, match="grid_size"):
        chen_greedy(graph, 10, grid_size=0)


TRAIN_GRAPHS = [
    "VGG16_256_224_224_3_train_nx.json",
    "fcn_8_vgg_32_416_608_3_train_nx.json",
    "MobileNet_512_224_224_3_train_nx.json",
    "ResNet50_256_224_224_3_train_nx.json",
]


@pytest.mark.parametrize("filename", TRAIN_GRAPHS)
def test_baselines_on_checkmate_graphs(moccasin_dir: Path, filename: str) -> None:
    graph = load_graph(moccasin_dir / filename)
    base = baseline_peak(graph)
    budget = int(0.9 * base)
    peaks = {}
    for name in BASELINES:
        result = solve(graph, budget, name)
        assert validate(graph, result.schedule).ok  # type: ignore[arg-type]
        peaks[name] = result.simulation.peak  # type: ignore[union-attr]
    assert peaks["store-all"] == base
    assert peaks["chen-sqrt"] < base and peaks["chen-greedy"] < base
    assert peaks["checkpoint-all"] <= min(peaks["chen-sqrt"], peaks["chen-greedy"])
    assert solve(graph, budget, "chen-greedy").extra["fits"]
