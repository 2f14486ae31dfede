"""Greedy eviction with in-place computes (coop.formulations.monet.greedy): MONeT's warm start below the
out-of-place floor, checked against hand-counted bytes and the simulator's independent legality rules."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.formulations.heuristics.fast_schedules import REBUILD_SIZE_PENALTIES, greedy_eviction_schedule
from coop.formulations.monet.greedy import in_place_greedy_schedule, in_place_options
from coop.formulations.monet.warm import fixed_impl_graph, lightest_choices
from coop.graph import Graph
from coop.schedule import simulate, validate
from tests.bruteforce import optimal_cost
from tests.strategies import random_graphs


def _chain() -> Graph:
    """x (caller-owned, 10 B) -> a (100 B) -> b (100 B, may overwrite a) -> c (100 B, may overwrite b) -> d
    (5 B, the output)."""
    inplace = lambda over: {"name": "inplace", "cost": 1, "mem": 100, "inplace_of": over}
    return Graph.model_validate({"name": "chain", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 100, "cost": 1},
        {"id": 2, "name": "b", "inputs": [1], "mem": 100, "cost": 1, "impls": [inplace(1)]},
        {"id": 3, "name": "c", "inputs": [2], "mem": 100, "cost": 1, "impls": [inplace(2)]},
        {"id": 4, "name": "d", "inputs": [3], "mem": 5, "cost": 1}], "outputs": [4]})


def test_in_place_greedy_fits_where_out_of_place_cannot() -> None:
    graph = _chain()
    # out of place, b's step holds x + a + b = 210 B; in place every step holds x + one 100 B value (+ d's 5 B)
    assert min_budget(graph.remat_only()) == 210
    assert greedy_eviction_schedule(graph.remat_only(), 209) is None
    choices = lightest_choices(graph, exact=True)
    fixed = fixed_impl_graph(graph, choices)
    options = in_place_options(graph, fixed, choices, exact=True)
    assert {v: [o.over for o in opts] for v, opts in options.items()} == {2: [1], 3: [2]}
    schedule = in_place_greedy_schedule(fixed, 115, choices, options)
    assert schedule is not None
    assert [(s.op, s.node, s.impl) for s in schedule.steps if s.op == "compute"] == [
        ("compute", 1, None), ("compute", 2, "inplace"), ("compute", 3, "inplace"), ("compute", 4, None)]
    assert simulate(graph, schedule).peak == 115  # x + c + d at d's step: 10 + 100 + 5


def _chain_read_again() -> tuple[dict, Graph, dict, Graph, dict]:
    """The chain with e (5 B) reading a again at the end: (its dict, graph, lightest choices, fixed graph, options)."""
    data = _chain().model_dump()
    data["nodes"] = [*data["nodes"], {"id": 5, "name": "e", "inputs": [1, 4], "mem": 5, "cost": 1}]
    data["outputs"] = [5]
    data.pop("order")
    graph = Graph.model_validate(data)
    choices = lightest_choices(graph, exact=True)
    fixed = fixed_impl_graph(graph, choices)
    return data, graph, choices, fixed, in_place_options(graph, fixed, choices, exact=True)


def test_an_input_read_later_is_not_overwritten() -> None:
    """a is read again by e after b: b must not run in place, so 115 B no longer fits (x + a + b = 210)."""
    _, graph, choices, fixed, options = _chain_read_again()
    assert in_place_greedy_schedule(fixed, 115, choices, options) is None
    schedule = in_place_greedy_schedule(fixed, 215, choices, options)
    assert schedule is not None
    impls = {s.node: s.impl for s in schedule.steps if s.op == "compute"}
    assert impls[2] is None and impls[3] == "inplace"  # c may overwrite b (read by nothing else)
    sim = simulate(graph, schedule)  # legal: the simulator refuses a read of a used-up instance
    assert sim.peak <= 215


def test_a_forward_input_read_later_is_overwritten_when_out_of_place_would_have_to_evict() -> None:
    """At 120 B, b out of place needs x + a + b = 210 B: b runs over a instead (a is then as good as evicted) and a
    is rebuilt from x for e; e's step holds x + a + d + e = 10 + 100 + 5 + 5 = 120 B (hand-counted)."""
    data, graph, choices, fixed, options = _chain_read_again()
    schedule = in_place_greedy_schedule(fixed, 120, choices, options)
    assert schedule is not None
    assert [(s.node, s.impl) for s in schedule.steps if s.op == "compute"] == [
        (1, None), (2, "inplace"), (3, "inplace"), (4, None), (1, None), (5, None)]
    sim = simulate(graph, schedule)  # legal: the simulator refuses a read of a used-up instance
    assert sim.peak == 120 and sim.recomputations == 1
    # a backward value (a gradient) read later is never overwritten: its rebuild would rerun the backward above it
    backward = Graph.model_validate({**data, "nodes": [{**n, "kind": "backward"} if n["id"] == 1 else n
                                                       for n in data["nodes"]]})
    fixed = fixed_impl_graph(backward, choices)
    assert in_place_greedy_schedule(fixed, 120, choices, in_place_options(backward, fixed, choices, exact=True)) is None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=10, with_impls=True, with_extras=False), fraction=st.floats(0.0, 1.0),
       penalty=st.sampled_from(REBUILD_SIZE_PENALTIES))
def test_greedy_schedules_are_legal_and_fit_with_every_rebuild_size_penalty(graph: Graph, fraction: float,
                                                                             penalty: float) -> None:
    """Whatever the score, a schedule the greedy returns is legal under the simulator's rules and fits."""
    low, high = min_budget(graph), baseline_peak(graph)
    budget = low + int(fraction * max(0, high - low))
    remat = greedy_eviction_schedule(graph.remat_only(), budget, penalty)
    if remat is not None:
        assert validate(graph.remat_only(), remat, budget).ok
    choices = lightest_choices(graph, exact=False)
    fixed = fixed_impl_graph(graph, choices)
    schedule = in_place_greedy_schedule(fixed, budget, choices, in_place_options(graph, fixed, choices, False),
                                        penalty)
    if schedule is not None:
        verdict = validate(graph, schedule, budget)
        assert verdict.ok, verdict.reason


def test_the_rebuild_size_penalty_keeps_a_mask_whose_rebuild_needs_its_large_input() -> None:
    """x (1 B) -> a (10 B, cost 20) -> b (10 B) -> m (2 B, a mask of b) and p (3 B, b pooled); backward: g (10 B)
    reads p, h (10 B) reads g and m, k (1 B, the output) reads h and a. At 24 B, p's step must free 2 B of
    a + b + m + p = 25 (+ x): DTR's score frees the cheap mask m, whose rebuild at h needs b and so a back next to
    g: stuck. Keeping m and freeing a (rebuilt from x for k) fits: x + g + m + h = 23 at h."""
    graph = Graph.model_validate({"name": "mask", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 20},
        {"id": 2, "name": "b", "inputs": [1], "mem": 10, "cost": 5},
        {"id": 3, "name": "m", "inputs": [2], "mem": 2, "cost": 1},
        {"id": 4, "name": "p", "inputs": [2], "mem": 3, "cost": 1},
        {"id": 5, "name": "g", "inputs": [4], "mem": 10, "cost": 1, "kind": "backward"},
        {"id": 6, "name": "h", "inputs": [5, 3], "mem": 10, "cost": 1, "kind": "backward"},
        {"id": 7, "name": "k", "inputs": [6, 1], "mem": 1, "cost": 1, "kind": "backward"}], "outputs": [7]})
    assert optimal_cost(graph, 24, "all") == 30.0 + 20.0  # every node once, a twice (brute force)
    assert greedy_eviction_schedule(graph, 24) is None
    penalised = greedy_eviction_schedule(graph, 24, REBUILD_SIZE_PENALTIES[-1])
    assert penalised is not None
    sim = simulate(graph, penalised)
    assert sim.peak <= 24 and sim.cost == 50.0
