"""MONeT's interval model (coop/formulations/monet/interval_model.py, driven by monet/intervals.py) against independent oracles.

* Compute once (``recompute=False``, MONeT's "implementation choice only" ablation): the model contains
  every schedule that computes each node once with first computations in the baseline order, and its
  optimum equals :func:`compute_once_optimum`, a brute force over implementations, optional values'
  positions and in-place written here from contract 2 alone.
* With recomputation the model is restricted (C intervals, a bounded horizon): every schedule it returns
  validates and costs at least the unrestricted brute-force optimum of tests/bruteforce.py, and where
  recomputation alone fits it never costs more than moccasin on the remat-only graph.
* Hand-counted bytes on a compact mask and an in-place activation; a 300-node graph beyond the stage
  MILP reaches a budget below the proven min_budget of recomputation alone.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.formulations import solve
from coop.formulations.monet.warm import apply_in_place
from coop.graph import Graph
from coop.schedule import Schedule, Step, simulate, validate
from tests.bruteforce import least_impl_peak, least_peak, optimal_cost, optimal_impl_schedule, without_impls
from tests.test_monet import impl_graphs, mask_graph

INTERVALS = {"model": "intervals", "time_limit": 20.0, "threads": 1}
PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------------- an independent compute-once oracle
def _peak_of(graph: Graph, sequence: list[tuple[int, Any]]) -> int | None:
    """Contract 2's peak of computing ``sequence`` (node, implementation) once each, freeing at last use;
    None when illegal (an input not yet computed or already consumed in place)."""
    owned = sum(n.mem for n in graph.nodes if n.kind in ("input", "param", "buffer"))
    position = {node: j for j, (node, _) in enumerate(sequence)}
    reads = {j: graph.node(node).reads(impl) for j, (node, impl) in enumerate(sequence)}
    last = {j: j for j in range(len(sequence))}
    consumed_at: dict[int, int] = {}
    for j, (node, impl) in enumerate(sequence):
        for source in reads[j]:
            if graph.node(source).kind in ("input", "param", "buffer"):
                continue
            if source not in position or position[source] > j:
                return None
            last[position[source]] = max(last[position[source]], j)
        if impl is not None and impl.inplace_of is not None:
            consumed_at[position[impl.inplace_of]] = j
    end = len(sequence) - 1
    for j, (node, _) in enumerate(sequence):
        if node in graph.outputs:
            if j in consumed_at:
                return None  # an output consumed in place is gone at the end
            last[j] = end
        if j in consumed_at and last[j] > consumed_at[j]:
            return None  # read after it was overwritten
    peak = 0
    for step, (node, impl) in enumerate(sequence):
        memory = owned + (impl or graph.node(node)).workspace
        for j, (value, made) in enumerate(sequence):
            size = (made or graph.node(value)).mem
            if j in consumed_at:  # its bytes move to the consumer at the consuming step
                alive = j <= step < consumed_at[j]
            else:
                alive = j <= step <= last[j]
            memory += size if alive else 0
        peak = max(peak, memory)
    return peak


def compute_once_optimum(graph: Graph, budget: int) -> float | None:
    """The least cost of a schedule that computes every regular node once (in ``graph.order``), any subset of
    the optional values once each wherever they fit, with any implementation: exhaustive."""
    optional = [n.id for n in graph.nodes if n.optional]
    best = None
    for chosen in itertools.chain.from_iterable(itertools.permutations(optional, k) for k in range(len(optional) + 1)):
        for slots in itertools.product(range(len(graph.order) + 1), repeat=len(chosen)):
            order = list(graph.order)
            for value, slot in sorted(zip(chosen, slots), key=lambda x: -x[1]):
                order.insert(slot, value)
            impls = [[None, *graph.node(v).impls] for v in order]
            for picked in itertools.product(*impls):
                sequence = list(zip(order, picked))
                peak = _peak_of(graph, sequence)
                if peak is not None and peak <= budget:
                    cost = sum((impl or graph.node(v)).cost for v, impl in sequence)
                    best = cost if best is None else min(best, cost)
    return best


# -------------------------------------------------------------------- properties
@PROPERTY
@given(graph=impl_graphs(), data=st.data())
def test_compute_once_optimum_equals_the_brute_force(graph: Graph, data: st.DataObject) -> None:
    budget = data.draw(st.integers(min_budget(graph), baseline_peak(graph) + 2), label="budget")
    expected = compute_once_optimum(graph, budget)
    result = solve(graph, budget, "monet", recompute=False, **INTERVALS)
    if expected is None:
        assert result.schedule is None and result.status == "infeasible", result.message
        return
    assert result.status == "optimal", result.message
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert verdict.cost == pytest.approx(expected)
    assert result.simulation.recomputations == 0


@PROPERTY
@given(graph=impl_graphs(), data=st.data())
def test_interval_model_validates_and_is_bounded_by_the_brute_force(graph: Graph, data: st.DataObject) -> None:
    low = least_impl_peak(graph, "all")
    budget = data.draw(st.one_of(st.just(low), st.integers(low, max(low, baseline_peak(graph)))), label="budget")
    result = solve(graph, budget, "monet", **INTERVALS)
    assert result.status != "infeasible"  # a schedule exists at this budget (the brute force found one)
    remat = without_impls(graph)
    if budget >= least_peak(remat, "in_order"):  # recomputation alone fits: monet starts from moccasin's
        assert result.schedule is not None, result.message
        moccasin = solve(remat, budget, "moccasin", time_limit=20.0, threads=1)
        assert result.simulation.cost <= moccasin.simulation.cost + 1e-9
    if result.schedule is not None:
        verdict = validate(graph, result.schedule, budget)
        assert verdict.ok, verdict.reason
        assert verdict.cost >= optimal_impl_schedule(graph, budget, "all").cost - 1e-9
        if graph.has_impls:
            assert result.status == "feasible"  # a restricted model proves nothing
        elif result.status == "optimal":  # no implementations: moccasin's own proof, over first computes in order
            assert verdict.cost == pytest.approx(optimal_cost(without_impls(graph), budget, "in_order"))


# -------------------------------------------------------------------- hand-counted
def test_the_interval_model_reaches_the_mask_graphs_least_peak() -> None:
    graph = mask_graph()  # recomputation alone needs 31; with relu_bwd reading the mask, 22 (tests/test_monet.py)
    result = solve(graph, 22, "monet", **INTERVALS)
    verdict = validate(graph, result.schedule, 22)
    assert verdict.ok and verdict.peak == 22 and verdict.cost == 1 + 1 + 1 + 2
    assert result.extra["implementations"] == ["4:from_mask"]


def inplace_chain() -> Graph:
    return Graph.model_validate({"name": "inplace", "outputs": [3], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "b", "inputs": [1], "mem": 10, "cost": 1,
         "impls": [{"name": "inplace", "cost": 1, "mem": 10, "inplace_of": 1}]},
        {"id": 3, "name": "c", "inputs": [2], "mem": 1, "cost": 1}]})


def test_in_place_conversion_saves_the_overwritten_copy() -> None:
    graph = inplace_chain()
    # Out of place, b's step holds x 10 + a 10 + b 10 = 30; in place x 10 + b 10 = 20, and c's step 21.
    converted = apply_in_place(graph, Schedule.from_order(graph.order), exact=False)
    assert converted.steps[1] == Step(op="compute", node=2, impl="inplace")
    assert simulate(graph, converted).peak == 21
    result = solve(graph, 21, "monet", **INTERVALS)
    assert validate(graph, result.schedule, 21).ok and result.simulation.cost == 3.0


def _masked_chain(depth: int) -> Graph:
    """A training-shaped chain: forward f_k = relu(f_{k-1}) (1000 units), backward g_k (1000 units) reads g_{k+1}
    and f_k, or f_k's 1-unit mask (optional, cost 1) at one extra unit of cost. Recomputation alone needs
    x 1 + g_{k+1} 1000 + f_k 1000 + g_k 1000 at a backward step; the masks need about 2000 + depth."""
    nodes: list[dict[str, Any]] = [{"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0}]
    for k in range(1, depth + 1):
        nodes.append({"id": k, "name": f"f{k}", "inputs": [k - 1], "mem": 1000, "cost": 2})
    masks = {k: 2 * depth + k for k in range(1, depth + 1)}
    previous = depth
    for k in range(depth, 0, -1):
        g = 2 * depth + 1 - k
        inputs = [previous, k] if previous != k else [k]
        impl_inputs = [masks[k] if i == k else i for i in inputs]
        nodes.append({"id": g, "name": f"g{k}", "kind": "backward", "inputs": inputs, "mem": 1000, "cost": 2,
                      "impls": [{"name": "from_mask", "cost": 3, "mem": 1000, "inputs": impl_inputs}]})
        previous = g
    for k, m in masks.items():
        nodes.append({"id": m, "name": f"mask{k}", "inputs": [k], "mem": 1, "cost": 1, "optional": True})
    return Graph.model_validate({"name": f"masked-chain-{depth}", "nodes": nodes, "outputs": [previous]})


def test_a_graph_beyond_the_stage_milp_reaches_below_what_recomputation_alone_can() -> None:
    graph = _masked_chain(100)  # 300 positions: the interval model
    below = min_budget(graph.remat_only()) - 1  # proven: no remat-only schedule fits
    assert below == 3000 and min_budget(graph) <= 2200
    result = solve(graph, below, "monet", time_limit=8.0, threads=1)
    assert result.extra["model"] == "intervals"
    verdict = validate(graph, result.schedule, below)
    assert verdict.ok, verdict.reason
    assert result.extra["implementations"]  # only the masks make it fit
