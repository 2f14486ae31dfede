"""The structured warm start (keep convolutions, rebuild batch norm and ReLU just in time; issue 24, item 4)."""

from __future__ import annotations

import coop
from coop.formulations.heuristics.structured_warm_start import cheap_recompute_schedule
from coop.formulations.heuristics.warm_start import candidate_warm_starts
from coop.graph import Graph, Node
from coop.schedule import Schedule, simulate, validate
from tests.models import build


def _conv_bn_relu() -> Graph:
    """x -> conv -> bn -> relu -> conv2 -> loss, and a backward that reads relu, bn and conv (hand-built)."""
    def node(i: int, name: str, op: str, inputs: tuple[int, ...], mem: int, kind: str = "forward") -> Node:
        return Node(id=i, name=name, op=op, inputs=inputs, mem=mem, cost=10.0 if "convolution" in op else 1.0,
                    kind=kind)

    return Graph(nodes=(
        Node(id=0, name="x", mem=4, cost=0.0, kind="input", recomputable=False),
        node(1, "conv", "aten.convolution.default", (0,), 8),
        node(2, "bn", "aten._native_batch_norm_legit_functional.default", (1,), 8),
        node(3, "relu", "aten.relu.default", (2,), 8),
        node(4, "conv2", "aten.convolution.default", (3,), 8),
        node(5, "loss", "aten.mean.default", (4,), 1),
        node(6, "g4", "aten.ones_like.default", (5,), 8, "backward"),
        node(7, "g3", "aten.convolution_backward.default", (6, 3), 8, "backward"),
        node(8, "g2", "aten.threshold_backward.default", (7, 3), 8, "backward"),
        node(9, "g1", "aten.native_batch_norm_backward.default", (8, 1, 2), 8, "backward"),
    ), outputs=(5, 9))


def test_the_schedule_keeps_convolutions_and_rebuilds_bn_and_relu_right_before_the_backward() -> None:
    graph = _conv_bn_relu()
    schedule = cheap_recompute_schedule(graph)
    # bn and relu rebuilt before g3, both again before g2 (relu from bn), bn again before g1
    assert [s.node for s in schedule.steps] == [1, 2, 3, 4, 5, 6, 2, 3, 7, 2, 3, 8, 2, 9]
    sim = simulate(graph, schedule)
    baseline = simulate(graph, Schedule.from_order(graph.order))
    # hand-counted: store-all peaks at g3 with x, conv, bn, relu, loss, g4, g3 (4 + 8 + 8 + 8 + 1 + 8 + 8); the
    # warm start holds no bn there (x, conv, loss, g4, relu', g3 = 37), and no step holds more
    assert baseline.peak == 45 and sim.peak == 37
    assert sim.cost == baseline.cost + 5.0  # bn three times more, relu twice


def test_it_is_legal_on_a_captured_conv_net_and_a_warm_start_candidate() -> None:
    """The zoo's conv + batch norm + ReLU net at batch 32: the warm start holds 0.73 of store-all's peak."""
    model, batch, loss_fn = build("cnn", batch=32)
    graph = coop.capture(model, batch, loss_fn=loss_fn).graph
    schedule = cheap_recompute_schedule(graph)
    sim = simulate(graph, schedule)
    store_all = simulate(graph, Schedule.from_order(graph.order))
    assert sim.peak < 0.8 * store_all.peak
    computes = [s.node for s in schedule.steps]
    again = {v for v in computes if computes.count(v) > 1}
    assert again and not any("convolution" in graph.node(v).op for v in again)
    assert validate(graph, schedule, sim.peak).ok
    names = [name for name, _ in candidate_warm_starts(graph, sim.peak, lp_time_limit=0)]
    assert "cheap recompute (keep convolutions and products)" in names


def test_monet_is_offered_it_on_the_remat_only_graph_and_with_the_lightest_implementations() -> None:
    """The same net captured with implementations: at the warm start's own peak, monet's warm starts include it."""
    from coop.formulations.monet.intervals import monet_warm_starts

    model, batch, loss_fn = build("cnn", batch=32)
    graph = coop.capture(model, batch, loss_fn=loss_fn, alternatives=True).graph.with_random_replay()
    budget = simulate(graph, cheap_recompute_schedule(graph.remat_only())).peak
    found = {name: sim for name, _, sim in monet_warm_starts(graph, budget, [], False, True, 2.0, 2)}
    assert "structured (remat only)" in found and found["structured (remat only)"].peak <= budget
    assert "structured (lightest implementations)" in found
