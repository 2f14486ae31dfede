"""The constructed budget (an upper bound found by construction), and the greedy eviction heuristic behind it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from coop.budget import min_budget
from coop.formulations.heuristics.baselines import checkpoint_all
from coop.formulations.heuristics.fast_schedules import greedy_eviction_schedule
from coop.formulations.ladder.constructed_budget import constructed_budget
from coop.graph import Graph
from coop.schedule import simulate, validate
from tests.strategies import random_graphs


def _random_op_rebuilt_late() -> Graph:
    """x -> r (random: never recomputed) -> a -> b -> c; the backward reads c, then a again."""
    return Graph.model_validate({"name": "late-rebuild", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0},
        {"id": 1, "name": "r", "inputs": [0], "mem": 1, "cost": 1, "recomputable": False},
        {"id": 2, "name": "a", "inputs": [1], "mem": 10, "cost": 1},
        {"id": 3, "name": "b", "inputs": [2], "mem": 10, "cost": 1},
        {"id": 4, "name": "c", "inputs": [3], "mem": 10, "cost": 1},
        {"id": 5, "name": "g1", "inputs": [4], "mem": 1, "cost": 1, "kind": "backward"},
        {"id": 6, "name": "g2", "inputs": [5, 2], "mem": 1, "cost": 1, "kind": "backward"},
    ], "outputs": [6]})


def test_greedy_eviction_keeps_a_random_value_while_a_rebuild_may_read_it() -> None:
    graph = _random_op_rebuilt_late()
    schedule = greedy_eviction_schedule(graph, 22)  # a must be evicted at c, and rebuilt from r for g2
    assert schedule is not None
    verdict = validate(graph, schedule, 22)
    assert verdict.ok, verdict.reason
    assert simulate(graph, schedule).recomputations == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=10))
def test_the_constructed_budget_is_fitted_and_bracketed_by_the_bounds(graph: Graph) -> None:
    constructed = constructed_budget(graph)
    assert constructed.lower_bound == min_budget(graph) <= constructed.budget
    verdict = validate(graph, constructed.schedule, constructed.budget)
    assert verdict.ok, verdict.reason
    assert verdict.peak == constructed.budget
    assert constructed.budget <= simulate(graph, checkpoint_all(graph, constructed.budget).schedule).peak
    assert constructed.gap >= 0
