"""The deferred solving order (coop.formulations.core.solving_order) and the chain moves of peak shaving
(coop.formulations.heuristics.fast_schedules), against hand-counted bytes and the brute force of tests/bruteforce.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from coop.budget import baseline_peak
from coop.errors import CoopError
from coop.formulations import solve
from coop.formulations.core.solving_order import deferred_order, solving_graph
from coop.formulations.heuristics.fast_schedules import peak_shaving_schedule
from coop.graph import Graph
from coop.schedule import Schedule, simulate, validate
from tests.bruteforce import optimal_cost
from tests.strategies import random_graphs


def _classifier_head() -> Graph:
    """x (input, 2 B) -> a (10 B) -> f (1 B, the flattened features); backward: g1 (1 B) reads f, w (50 B, the
    weight gradient, an output) reads g1 and f, g2 (10 B) reads g1 and a, g3 (10 B, an output) reads g2.
    Captured order a, f, g1, w, g2, g3: w is made early and held through g2 and g3, as a training step makes a
    fully connected layer's weight gradient."""
    nodes = [
        {"id": 0, "name": "x", "kind": "input", "mem": 2, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "f", "inputs": [1], "mem": 1, "cost": 1},
        {"id": 3, "name": "g1", "inputs": [2], "mem": 1, "cost": 1, "kind": "backward"},
        {"id": 4, "name": "w", "inputs": [3, 2], "mem": 50, "cost": 5, "kind": "backward"},
        {"id": 5, "name": "g2", "inputs": [3, 1], "mem": 10, "cost": 1, "kind": "backward"},
        {"id": 6, "name": "g3", "inputs": [5], "mem": 10, "cost": 1, "kind": "backward"},
    ]
    return Graph.model_validate({"name": "head", "nodes": nodes, "outputs": [4, 6]})


def test_the_weight_gradient_is_deferred_to_the_end() -> None:
    graph = _classifier_head()
    # captured: at g2 the resident values are x 2 + a 10 + g1 1 + w 50 + g2 10 = 73 (f died at w)
    assert baseline_peak(graph) == 73
    assert deferred_order(graph) == (1, 2, 3, 5, 6, 4)
    # deferred: at w, x 2 + f 1 + g1 1 + g3 10 + w 50 = 64; at g2, x 2 + a 10 + f 1 + g1 1 + g2 10 = 24
    reordered, name = solving_graph(graph)
    assert name.startswith("deferred")
    assert simulate(graph, Schedule.from_order(reordered.order)).peak == 64


def test_moccasin_fits_without_recomputation_where_the_captured_order_must_recompute() -> None:
    graph = _classifier_head()
    # at 64 B the captured order must compute w, free it and compute it again at the end (cost 10 + 5);
    # computing w last needs no recomputation (cost 10): the brute force over every schedule agrees
    assert optimal_cost(graph, 64, "all") == 10.0
    assert optimal_cost(graph, 64, "in_order") == 15.0
    captured = solve(graph, 64, "moccasin", order="captured", time_limit=20)
    deferred = solve(graph, 64, "moccasin", time_limit=20)
    assert captured.status == deferred.status == "optimal"
    assert captured.simulation.cost == 15.0 and deferred.simulation.cost == 10.0
    assert deferred.extra["order"].startswith("deferred")
    assert validate(graph, deferred.schedule, 64).ok  # a schedule of the reordered graph is one of the graph


def test_an_unknown_order_is_refused_in_one_line() -> None:
    with pytest.raises(CoopError, match="order 'backwards' is unknown: choose auto, captured, deferred"):
        solve(_classifier_head(), 64, "moccasin", order="backwards")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=12))
def test_the_deferred_order_is_an_order_of_the_graph(graph: Graph) -> None:
    order = deferred_order(graph)
    assert sorted(order) == sorted(graph.order)
    Graph.model_validate(graph.model_dump() | {"order": order})  # topological: the Graph's own check
    draws = [v for v in graph.order if v in graph.random_draws]
    assert [v for v in order if v in graph.random_draws] == draws
    reordered, _ = solving_graph(graph)
    # the solver is handed the deferred order only where it lowers the store-all peak
    assert baseline_peak(reordered) <= baseline_peak(graph)


def _conv_bn_relu() -> Graph:
    """x (input, 1 B) -> c (10 B, cost 10) -> b (10 B) -> r (10 B) -> y (1 B, cost 10); backward gy (12 B) reads
    y, h (1 B) reads gy, gr (1 B) reads h and r, gb (1 B, the output) reads gr and c: a convolution, its batch
    norm and ReLU, whose ReLU output is read again late in the backward."""
    nodes = [
        {"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0},
        {"id": 1, "name": "c", "inputs": [0], "mem": 10, "cost": 10},
        {"id": 2, "name": "b", "inputs": [1], "mem": 10, "cost": 1},
        {"id": 3, "name": "r", "inputs": [2], "mem": 10, "cost": 1},
        {"id": 4, "name": "y", "inputs": [3], "mem": 1, "cost": 10},
        {"id": 5, "name": "gy", "inputs": [4], "mem": 12, "cost": 1, "kind": "backward"},
        {"id": 6, "name": "h", "inputs": [5], "mem": 1, "cost": 1, "kind": "backward"},
        {"id": 7, "name": "gr", "inputs": [6, 3], "mem": 1, "cost": 1, "kind": "backward"},
        {"id": 8, "name": "gb", "inputs": [7, 1], "mem": 1, "cost": 1, "kind": "backward"},
    ]
    return Graph.model_validate({"name": "conv-bn-relu", "nodes": nodes, "outputs": [8]})


def test_peak_shaving_rebuilds_a_chain_from_the_kept_convolution() -> None:
    graph = _conv_bn_relu()
    # store-all: at gy x 1 + c 10 + r 10 + y 1 + gy 12 = 34; the forward's r step holds x + c + b + r = 31
    assert baseline_peak(graph) == 34
    # at 32 B: recomputing r alone keeps b alive over gy (34 again); recomputing c costs 10; rebuilding b and r
    # from the resident c right before gr costs 2, and its r step holds x + c + h + b + r = 32
    assert optimal_cost(graph, 32, "all") == 26.0 + 2.0
    schedule = peak_shaving_schedule(graph, 32)
    assert schedule is not None
    sim = simulate(graph, schedule)
    assert sim.peak <= 32 and sim.cost == 28.0


def test_an_infeasibility_proof_names_the_order_it_speaks_of() -> None:
    graph = _classifier_head()
    # no schedule in any order fits 63 B, one fits 64 B (brute force): both orders' proofs must say which order
    assert optimal_cost(graph, 63, "all") is None and optimal_cost(graph, 64, "all") is not None
    deferred = solve(graph, 63, "moccasin", time_limit=20)
    captured = solve(graph, 63, "moccasin", order="captured", time_limit=20)
    assert deferred.status == captured.status == "infeasible"
    assert "first computations in the deferred order" in deferred.message
    assert "first computations in graph.order" in captured.message
