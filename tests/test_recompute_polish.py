"""Dropping needless recomputations (coop.formulations.heuristics.recompute_polish): hand-counted peaks and costs, and
random graphs and schedules checked by the validator."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.formulations.heuristics.recompute_polish import drop_needless_recomputations
from coop.graph import Graph
from coop.schedule import Schedule, Step, simulate, validate
from tests.strategies import random_graphs, random_schedules

X, A, B, D, C = 0, 1, 2, 3, 4


def diamond() -> Graph:
    """x (the batch, 0 B) -> a (10 B, cost 5) -> b (10 B) -> d (10 B); c (5 B) reads a and d. Output c."""
    nodes = [
        {"id": X, "name": "x", "kind": "input", "mem": 0, "cost": 0, "recomputable": False},
        {"id": A, "name": "a", "inputs": [X], "mem": 10, "cost": 5},
        {"id": B, "name": "b", "inputs": [A], "mem": 10, "cost": 1},
        {"id": D, "name": "d", "inputs": [B], "mem": 10, "cost": 1},
        {"id": C, "name": "c", "inputs": [A, D], "mem": 5, "cost": 1},
    ]
    return Graph.model_validate({"name": "diamond", "nodes": nodes, "outputs": [C], "order": [A, B, D, C]})


def compute(node: int) -> Step:
    return Step(op="compute", node=node)


#: a freed after b and recomputed for c. Peaks, counted by hand: a 10, b 20, d 20 (b, d), a again 20 (d, a),
#: c 25 (d, a, c). Cost 5 + 1 + 1 + 5 + 1 = 13.
RECOMPUTING = Schedule(steps=(compute(A), compute(B), Step(op="free", node=A), compute(D), compute(A), compute(C)))
#: a kept: d's step holds a, b, d = 30; c's a, d, c = 25. Cost 8.
KEPT = Schedule(steps=(compute(A), compute(B), compute(D), compute(C)))


def test_a_recomputation_the_budget_needs_stays() -> None:
    graph = diamond()
    assert (simulate(graph, RECOMPUTING).peak, simulate(graph, RECOMPUTING).cost) == (25, 13)
    polished, sim = drop_needless_recomputations(graph, 29, RECOMPUTING, 5.0)
    assert polished == RECOMPUTING and (sim.peak, sim.cost) == (25, 13)


def test_a_recomputation_the_budget_does_not_need_goes_with_its_free() -> None:
    graph = diamond()
    polished, sim = drop_needless_recomputations(graph, 30, RECOMPUTING, 5.0)
    assert polished == KEPT and (sim.peak, sim.cost) == (30, 8)


def test_no_time_means_the_schedule_unchanged() -> None:
    graph = diamond()
    polished, sim = drop_needless_recomputations(graph, 30, RECOMPUTING, 0.0)
    assert polished == RECOMPUTING and sim.cost == 13


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), with_impls=st.booleans())
def test_random_schedules_stay_legal_within_budget_and_never_cost_more(data: st.DataObject, with_impls: bool) -> None:
    graph = data.draw(random_graphs(max_nodes=10, with_impls=with_impls))
    schedule = data.draw(random_schedules(graph, page_caller_owned=False))
    before = simulate(graph, schedule)
    budget = before.peak + data.draw(st.integers(0, 20))
    polished, sim = drop_needless_recomputations(graph, budget, schedule, 5.0)
    verdict = validate(graph, polished, budget)
    assert verdict.ok, verdict.reason
    assert sim.cost <= before.cost and sim.peak <= budget
    assert (sim.cost < before.cost) == (polished != schedule)
    assert sim.recomputations <= before.recomputations
