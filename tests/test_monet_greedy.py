"""Greedy eviction with in-place computes (coop.formulations.monet_greedy): MONeT's warm start below the
out-of-place floor, checked against hand-counted bytes and the simulator's independent legality rules."""

from __future__ import annotations

from coop.budget import min_budget
from coop.formulations.heuristics import greedy_eviction_schedule
from coop.formulations.monet_greedy import in_place_greedy_schedule, in_place_options
from coop.formulations.monet_warm import fixed_impl_graph, lightest_choices
from coop.graph import Graph
from coop.schedule import simulate


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
    assert {v: o.over for v, o in options.items()} == {2: 1, 3: 2}
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
