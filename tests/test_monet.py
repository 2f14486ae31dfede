"""MONeT (Shah et al. 2021) against independent oracles.

* The brute force of tests/bruteforce.py (``optimal_impl_schedule``, written from contract 2 alone)
  over Checkmate's stages with implementations: monet's proven optimum equals it on tiny random
  DAGs with random implementations (alternative costs and workspaces, compact masks read through
  optional values, in-place execution, inexact implementations).
* Hand-counted bytes: on a graph with a compact mask, recomputation alone never fits below 31
  units and monet fits 22.
* Checkmate and Moccasin (remat only) at the same budget: monet never costs more.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.formulations import solve
from coop.formulations.core.solving_order import solving_graph
from coop.formulations.ladder.auto import choose_formulation
from coop.graph import Graph
from coop.schedule import validate
from tests.bruteforce import least_impl_peak, least_peak, optimal_impl_schedule, without_impls
from tests.test_impls import mask_graph  # x -> relu -> head -> relu_bwd, which may read relu's 1-unit mask

SOLVER = {"time_limit": 30.0, "threads": 1}
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------------- random graphs with implementations
@st.composite
def impl_graphs(draw: st.DrawFn) -> Graph:
    """A tiny training-shaped DAG (input, 1-3 forward ops, a backward chain) with random implementations:
    an alternative (other cost and workspace), in place over an input of the same size, and for a
    backward op a compact optional mask of a forward value it reads (sometimes inexact)."""
    nodes: list[dict[str, Any]] = [{"id": 0, "name": "x", "kind": "input", "mem": draw(st.integers(0, 4)), "cost": 0}]
    forward = list(range(1, draw(st.integers(1, 3)) + 1))
    for i in forward:
        inputs = draw(st.lists(st.sampled_from([0, *range(1, i)]), min_size=1, max_size=2, unique=True))
        nodes.append({"id": i, "name": f"f{i}", "inputs": inputs, "mem": draw(st.integers(1, 6)),
                      "cost": float(draw(st.integers(1, 4))), "recomputable": draw(st.sampled_from([True, True, False]))})
    backward = list(range(len(nodes), len(nodes) + draw(st.integers(1, 2))))
    previous = forward[-1]
    for b in backward:
        reads = draw(st.lists(st.sampled_from(forward), max_size=2, unique=True))
        inputs = list(dict.fromkeys([previous, *reads]))
        nodes.append({"id": b, "name": f"b{b}", "kind": "backward", "inputs": inputs, "mem": draw(st.integers(1, 6)),
                      "cost": float(draw(st.integers(1, 4)))})
        previous = b
    next_id = len(nodes)
    for node in list(nodes[1:]):
        impls: list[dict[str, Any]] = []
        if draw(st.booleans()):
            impls.append({"name": "alt", "cost": float(draw(st.integers(0, 5))), "mem": node["mem"],
                          "workspace": draw(st.integers(0, 3))})
        computed_inputs = [i for i in node["inputs"] if i != 0]
        if computed_inputs and draw(st.booleans()):
            target = draw(st.sampled_from(computed_inputs))
            node["mem"] = nodes[target]["mem"]
            for impl in impls:
                impl["mem"] = node["mem"]
            impls.append({"name": "inplace", "cost": node["cost"], "mem": node["mem"], "inplace_of": target})
        masked = [i for i in node["inputs"] if i in forward]
        if node.get("kind") == "backward" and masked and draw(st.booleans()) and next_id < 12:
            source = draw(st.sampled_from(masked))
            nodes.append({"id": next_id, "name": f"mask{source}", "inputs": [source], "mem": 1,
                          "cost": float(draw(st.integers(0, 2))), "optional": True})
            impls.append({"name": "mask", "cost": float(draw(st.integers(1, 5))), "mem": node["mem"],
                          "inputs": [next_id if i == source else i for i in node["inputs"]],
                          "exact": draw(st.booleans()), "tolerance": 1e-6})
            next_id += 1
        node["impls"] = impls
    return Graph.model_validate({"name": "random-impls", "nodes": nodes, "outputs": [previous]})


def _budget(graph: Graph, data: st.DataObject, exact: bool = False) -> int:
    low = least_impl_peak(solving_graph(graph)[0], "staged", exact=exact)
    # Half the draws at the tightest budget, where every byte the model miscounts matters.
    return data.draw(st.one_of(st.just(low), st.integers(low, max(low, baseline_peak(graph)))), label="budget")


@PROPERTY
@given(graph=impl_graphs(), data=st.data())
def test_monet_optimum_equals_the_staged_brute_force(graph: Graph, data: st.DataObject) -> None:
    budget = _budget(graph, data)
    # monet's stages follow the order it solves in (the deferred one where that lowers the store-all peak)
    expected = optimal_impl_schedule(solving_graph(graph)[0], budget, "staged")
    assert expected is not None  # the budget is at least the staged least peak
    result = solve(graph, budget, "monet", **SOLVER)
    assert result.status == "optimal", result.message
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert verdict.cost == pytest.approx(expected.cost)
    # Nothing beats the unrestricted brute force either.
    assert verdict.cost >= optimal_impl_schedule(graph, budget, "all").cost - 1e-9


@PROPERTY
@given(graph=impl_graphs(), data=st.data())
def test_exact_plans_never_choose_an_inexact_implementation(graph: Graph, data: st.DataObject) -> None:
    budget = _budget(graph, data, exact=True)
    result = solve(graph, budget, "monet", exact=True, **SOLVER)
    assert result.status == "optimal", result.message
    assert validate(graph, result.schedule, budget).ok
    chosen = [graph.node(s.node).implementation(s.impl) for s in result.schedule.steps if s.impl]
    assert all(impl.exact for impl in chosen)
    assert result.extra["inexact_implementations"] == []
    expected = optimal_impl_schedule(solving_graph(graph)[0], budget, "staged", exact=True)
    assert result.simulation.cost == pytest.approx(expected.cost)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=impl_graphs(), data=st.data())
def test_monet_never_costs_more_than_checkmate_or_moccasin(graph: Graph, data: st.DataObject) -> None:
    remat = without_impls(graph)
    budget = data.draw(st.integers(least_peak(remat, "staged"), baseline_peak(remat)), label="budget")
    monet = solve(graph, budget, "monet", **SOLVER)
    assert validate(graph, monet.schedule, budget).ok
    for name in ("checkmate", "moccasin"):
        other = solve(remat, budget, name, **SOLVER)
        assert other.schedule is not None and validate(remat, other.schedule, budget).ok
        assert monet.simulation.cost <= other.simulation.cost + 1e-9, name


# -------------------------------------------------------------------- hand-counted
def test_a_compact_mask_reaches_below_what_recomputation_alone_reaches() -> None:
    graph = mask_graph()
    # Recomputation alone: relu_bwd's step holds x10 + relu10 + head1 + out10 = 31 in every schedule.
    assert least_peak(without_impls(graph), "all") == 31
    # With the mask: relu 20; mask 10+10+1 = 21; head 10+10+1+1 = 22 (relu's last read); relu_bwd 10+1+1+10 = 22.
    assert least_impl_peak(graph, "all") == 22
    result = solve(graph, 22, "monet", **SOLVER)
    assert result.status == "optimal"
    verdict = validate(graph, result.schedule, 22)
    assert verdict.ok and verdict.peak == 22 and verdict.cost == 1 + 1 + 1 + 2
    assert result.extra["implementations"] == ["4:from_mask"]
    for name in ("checkmate", "moccasin"):  # remat only: no schedule at 30
        other = solve(graph, 30, name, **SOLVER)
        assert other.schedule is None or not validate(graph, other.schedule, 30).ok
    assert solve(graph, 21, "monet", **SOLVER).status == "infeasible"


def test_exact_true_forbids_the_only_way_below_the_remat_peak() -> None:
    data = mask_graph().model_dump()
    data["nodes"][4]["impls"][0]["exact"] = False
    graph = Graph.model_validate(data)
    assert solve(graph, 22, "monet", **SOLVER).extra["inexact_implementations"] == ["4:from_mask"]
    assert solve(graph, 22, "monet", exact=True, **SOLVER).status == "infeasible"


def test_in_place_saves_the_input_copy() -> None:
    # x -> a -> b (in place over a) -> c; out of place b's step holds 10 + 10 + 10 = 30, in place 10 + 10 = 20.
    graph = Graph.model_validate({"name": "inplace", "outputs": [3], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "b", "inputs": [1], "mem": 10, "cost": 1,
         "impls": [{"name": "inplace", "cost": 1, "mem": 10, "inplace_of": 1}]},
        {"id": 3, "name": "c", "inputs": [2], "mem": 1, "cost": 1}]})
    assert least_peak(without_impls(graph), "all") == 30
    result = solve(graph, 21, "monet", **SOLVER)
    assert result.status == "optimal" and validate(graph, result.schedule, 21).ok
    assert result.simulation.peak == 21 and result.simulation.cost == 3.0
    assert least_impl_peak(graph, "all") == 21  # c's step: x10 + b10 + c1, whatever runs in place
    assert solve(graph, 20, "monet", **SOLVER).status == "infeasible"


def test_a_solver_stopped_by_its_time_limit_keeps_the_warm_start_and_says_so() -> None:
    graph = mask_graph()
    result = solve(graph, 31, "monet", time_limit=1e-3, threads=1)  # 0 is refused (issue 40): the least limit
    assert result.status == "feasible" and result.schedule is not None
    assert validate(graph, result.schedule, 31).ok and "warm start" in result.message


def test_monet_is_registered_and_refuses_unknown_options() -> None:
    with pytest.raises(CoopError, match="formulation 'monet' has no option 'exactly'"):
        solve(mask_graph(), 22, "monet", exactly=True)


def test_auto_picks_monet_only_where_recomputation_alone_falls_short() -> None:
    graph = mask_graph()
    assert choose_formulation(graph, 31) == "store-all"
    assert choose_formulation(graph, 25) == "monet"  # below the remat-only least peak (31)
    assert choose_formulation(without_impls(graph), 25) != "monet"
    result = solve(graph, 25, "auto", **SOLVER)
    assert result.extra["auto"] == "monet" and validate(graph, result.schedule, 25).ok


@PROPERTY
@given(graph=impl_graphs())
def test_min_budget_never_exceeds_the_least_peak_with_implementations(graph: Graph) -> None:
    """min_budget is a proven lower bound with masks and in-place too: at most the brute-force least peak
    over every schedule (contract 3); an earlier version counted default inputs and refused monet's budgets."""
    assert min_budget(graph) <= least_impl_peak(graph, "all")


def test_min_budget_of_the_mask_graph_is_its_least_peak() -> None:
    graph = mask_graph()
    assert min_budget(graph) == least_impl_peak(graph, "all") == 22  # x 10 + head 1 + mask 1 + relu_bwd 10
