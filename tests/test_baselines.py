"""The baseline schedules: legal everywhere, honest about fitting, and better than store-all."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.formulations import BASELINES, solve
from coop.formulations.heuristics.baselines import checkpoint_all, chen_greedy, chen_sqrt, store_all
from coop.graph import Graph
from coop.graph_files import load_graph
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


# -------------------------------------------------------------------- non-linear forwards
def _blocks_sharing_a_mask(blocks: int = 6) -> Graph:
    """A stack whose every block also reads one mask made from nothing (no forward input).

    The mask's edge from the virtual source bypasses every block boundary, so the only
    articulation points lie in the last block; each block's output and the
    small mask form a two-value frontier.
    """
    nodes: list[dict] = [{"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"},
                         {"id": 1, "name": "mask", "mem": 1, "cost": 1, "inputs": []},
                         {"id": 2, "name": "embed", "mem": 10, "cost": 1, "inputs": [0]}]
    previous = 2
    for b in range(blocks):
        hidden, out = 10 + 2 * b, 11 + 2 * b
        nodes.append({"id": hidden, "name": f"h{b}", "mem": 40, "cost": 1, "inputs": [previous, 1]})
        nodes.append({"id": out, "name": f"o{b}", "mem": 10, "cost": 1, "inputs": [hidden]})
        previous = out
    nodes.append({"id": 100, "name": "loss", "mem": 1, "cost": 1, "inputs": [previous]})
    gradient = 100
    for b in reversed(range(blocks)):
        hidden, out = 10 + 2 * b, 11 + 2 * b
        nodes.append({"id": 200 + 2 * b, "name": f"go{b}", "mem": 10, "cost": 1, "kind": "backward",
                      "inputs": [gradient, out]})
        nodes.append({"id": 201 + 2 * b, "name": f"gh{b}", "mem": 10, "cost": 1, "kind": "backward",
                      "inputs": [200 + 2 * b, hidden, 1]})
        gradient = 201 + 2 * b
    return Graph.model_validate({"name": "masked-stack", "nodes": nodes, "outputs": [100, gradient]})


def test_chen_cuts_a_forward_without_articulation_points() -> None:
    from coop.formulations.heuristics.baselines import _articulation_points, split_forward_backward

    graph = _blocks_sharing_a_mask()
    assert set(_articulation_points(graph, split_forward_backward(graph, "test"))) <= {20, 21, 100}  # last block
    store_peak = store_all(graph, 10**6).simulation.peak  # type: ignore[union-attr]
    for name in ("chen-sqrt", "chen-greedy"):
        result = solve(graph, 10**6 if name == "chen-sqrt" else min_budget(graph), name)
        assert validate(graph, result.schedule).ok  # type: ignore[arg-type]
        assert result.simulation.peak < store_peak, name  # type: ignore[union-attr]
        assert 1 in result.extra["checkpoints"], f"{name} must keep the mask that crosses every boundary"


def test_extra_outputs_of_forward_ops_are_taken_in_the_forward() -> None:
    # f = a two-output op; "stat" (its extra output, kind backward, not recomputable) is read
    # only by the backward. Deferring it to the backward would recompute f just to read it.
    from coop.formulations.heuristics.baselines import split_forward_backward

    graph = Graph.model_validate({"name": "extra", "nodes": [
        {"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"},
        {"id": 1, "name": "f", "mem": 50, "cost": 1, "inputs": [0]},
        {"id": 2, "name": "stat", "mem": 1, "cost": 0, "inputs": [1], "kind": "backward", "recomputable": False},
        {"id": 3, "name": "g", "mem": 5, "cost": 1, "inputs": [1]},
        {"id": 4, "name": "loss", "mem": 1, "cost": 1, "inputs": [3]},
        {"id": 5, "name": "dg", "mem": 5, "cost": 1, "inputs": [4, 2], "kind": "backward"},
    ], "outputs": [4, 5]})
    split = split_forward_backward(graph, "test")
    assert split.forward == (1, 2, 3, 4) and split.backward == (5,)
    result = chen_sqrt(graph, 10**6)
    computes = [s.node for s in result.schedule.steps if s.op == "compute"]  # type: ignore[union-attr]
    assert computes.count(1) == 1, "f is recomputed only to read its extra output"


def test_a_schedule_that_does_not_fit_says_so() -> None:
    graph = _blocks_sharing_a_mask()
    budget = min_budget(graph)
    for name in BASELINES:
        result = solve(graph, budget, name)
        assert result.schedule is not None
        if not result.extra["fits"]:
            assert result.simulation.peak > budget  # type: ignore[union-attr]
            assert str(result.simulation.peak) in result.message and str(budget) in result.message  # type: ignore[union-attr]
    assert not store_all(graph, budget).extra["fits"]


@pytest.fixture(scope="module")
def captured_transformer() -> Graph:
    """The zoo's small transformer (2 blocks, causal mask and dropout): a few hundred nodes."""
    pytest.importorskip("torch")
    from coop.graph_capture import capture
    from coop.zoo import build

    model, batch, loss_fn = build("transformer")
    return capture(model, batch, loss_fn=loss_fn).graph


def test_chen_reduces_the_peak_of_a_captured_transformer(captured_transformer: Graph) -> None:
    graph = captured_transformer
    base = baseline_peak(graph)
    assert store_all(graph, base).simulation.peak == base  # type: ignore[union-attr]
    sqrt = chen_sqrt(graph, base)
    greedy = chen_greedy(graph, min_budget(graph))  # nothing fits: the lowest peak of the sweep
    for result in (sqrt, greedy):
        assert validate(graph, result.schedule).ok  # type: ignore[arg-type]
        assert result.simulation.peak < 0.9 * base, result.formulation  # type: ignore[union-attr]
    # A budget between the two: chen-greedy finds a fitting schedule no dearer than needed.
    budget = (greedy.simulation.peak + base) // 2  # type: ignore[union-attr]
    fitting = chen_greedy(graph, budget)
    assert fitting.extra["fits"] and validate(graph, fitting.schedule, budget).ok  # type: ignore[arg-type]
    assert fitting.simulation.cost <= greedy.simulation.cost  # type: ignore[union-attr]
