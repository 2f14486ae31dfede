"""Cross-check of the two exact formulations on small random graphs.

Checkmate's MILP (Jain et al. 2020) searches the frontier-advancing schedules over
``graph.order`` (stage t computes node t and recomputes earlier nodes, each at most once, in
order); Moccasin's CP-SAT model (Bartan et al. 2023) searches every schedule whose first
computations follow ``graph.order``, a superset. So a proven Moccasin optimum is never above any
Checkmate schedule, and Moccasin may find schedules where Checkmate proves none exists. When both
prove optimality and moccasin's schedule keeps the baseline order of first computations, we
assert equal costs: on graphs of up to 10 nodes a 150-example probe never found them apart (a
failure here is worth a look: a bug, or a graph where the order of a stage's recomputations
matters).
Moccasin must be at most every baseline that fits, Checkmate at most every one inside its order,
and every schedule must pass the one validator.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.formulations import BASELINES, solve
from coop.formulations.checkmate.milp import checkmate
from coop.formulations.moccasin.intervals import moccasin
from coop.graph import Graph
from coop.schedule import Schedule, validate
from tests.strategies import random_graphs
from tests.tiers import check, examples

LIMIT = {"time_limit": 10.0, "threads": 1}


def _budget(graph: Graph, fraction: float) -> int:
    return max(min_budget(graph), math.ceil(fraction * baseline_peak(graph)))


def _first_computes_follow_order(graph: Graph, schedule: Schedule) -> bool:
    """Whether the schedule's first computations follow ``graph.order``. Moccasin keeps that
    order unless its best warm start (e.g. checkpoint-all) breaks it; its proof then covers every
    order, and its optimum may lie outside Checkmate's space, below Checkmate's optimum."""
    firsts = list(dict.fromkeys(step.node for step in schedule.steps if step.op == "compute"))
    return firsts == list(graph.order)


def _fitting_baselines(graph: Graph, budget: int) -> dict[str, tuple[float, bool]]:
    """Cost of each baseline that fits, and whether its first computations follow graph.order
    (checkpoint-all, for one, may compute a forward value later than the baseline order does)."""
    fitting = {}
    for name in BASELINES:
        try:
            result = solve(graph, budget, name)
        except CoopError:  # a baseline that refuses the graph or budget is simply not compared
            result = None
        if result is not None and result.schedule is not None and validate(graph, result.schedule, budget).ok:
            fitting[name] = (result.simulation.cost, _first_computes_follow_order(graph, result.schedule))
    return fitting


def _checkmate_and_moccasin_agree_when_both_prove_optimality(graph: Graph, fraction: float) -> None:
    budget = _budget(graph, fraction)
    exact = checkmate(graph, budget, solver="highs", **LIMIT)
    ours = moccasin(graph, budget, max_intervals=max(2, len(graph.order)), **LIMIT)
    for result in (exact, ours):
        if result.schedule is not None:
            verdict = validate(graph, result.schedule, budget)
            assert verdict.ok, f"{result.formulation}: {verdict.reason}"
            assert result.simulation.cost == pytest.approx(verdict.cost)
    if exact.status == "optimal" and ours.status == "optimal" and _first_computes_follow_order(graph, ours.schedule):
        # Same space: moccasin's proven optimum lies among the schedules Checkmate searches.
        assert ours.simulation.cost == pytest.approx(exact.simulation.cost)
    if ours.status == "optimal" and exact.schedule is not None:
        # Checkmate's schedules lie inside moccasin's space: a proven moccasin optimum is no worse.
        assert ours.simulation.cost <= exact.simulation.cost + 1e-9
    if ours.status == "infeasible":
        assert exact.schedule is None
    for name, (cost, in_order) in _fitting_baselines(graph, budget).items():
        if ours.found:  # moccasin starts from the best baseline that fits: never worse than any
            assert ours.simulation.cost <= cost + 1e-9, f"moccasin above baseline {name}"
        if exact.status == "optimal" and in_order:  # only baselines inside Checkmate's order
            assert exact.simulation.cost <= cost + 1e-9, f"checkmate above baseline {name}"


#: 25 graphs in the slow tier, 10 in the fast one (tests/tiers.py)
@examples(10, 25)
def test_checkmate_and_moccasin_agree_when_both_prove_optimality(examples: int) -> None:
    check(_checkmate_and_moccasin_agree_when_both_prove_optimality, examples,
          settings(deadline=None, suppress_health_check=[HealthCheck.too_slow]),
          graph=random_graphs(max_nodes=10), fraction=st.sampled_from([0.5, 0.7, 0.85]))


def test_restricted_optimum_is_not_called_optimal() -> None:
    """A chain whose backward pass needs a forward value twice: with one interval per node and no
    proof model, CP-SAT's optimum of the restricted model must not be reported as optimal."""
    nodes = [{"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0.0}]
    n = 6
    for i in range(1, n + 1):
        nodes.append({"id": i, "name": f"f{i}", "inputs": [i - 1], "mem": 4, "cost": float(i)})
    previous = n
    for j, i in enumerate(range(n, 0, -1)):
        node_id = n + 1 + j
        inputs = [previous] if previous == i else [previous, i]
        nodes.append({"id": node_id, "name": f"b{i}", "kind": "backward", "inputs": inputs, "mem": 4, "cost": 1.0})
        previous = node_id
    graph = Graph.model_validate({"name": "chain", "nodes": nodes, "outputs": [previous]})
    budget = math.ceil(0.6 * baseline_peak(graph))
    restricted = moccasin(graph, budget, max_intervals=1, prove=False, lp_warm_start=False, extra_slots=0, **LIMIT)
    assert restricted.status != "optimal"
    proven = moccasin(graph, budget, **LIMIT)
    assert proven.status == "optimal"
    assert validate(graph, proven.schedule, budget).ok
    if restricted.found:
        assert proven.simulation.cost <= restricted.simulation.cost + 1e-9
        assert restricted.extra["restricted_bound"] is not None and restricted.bound is None


def _value_needed_by_a_later_recomputation() -> Graph:
    """fwd3 reads fwd1 (free to keep: 0 bytes, costly to recompute); bwd3 reads fwd3 at the end.

    Under budget 1, fwd3 must be dropped while fwd0 lives and recomputed for bwd3, which needs
    fwd1 retained until then. Found by the property test above (hypothesis seed 1): Checkmate's
    MILP had fixed S[t, fwd1] = 0 after fwd1's last direct reader and reported 2.0 as optimal."""
    def node(node_id: int, name: str, inputs: list[int], mem: int, cost: float, kind: str = "forward") -> dict:
        return {"id": node_id, "name": name, "inputs": inputs, "mem": mem, "cost": cost, "kind": kind}

    nodes = [node(0, "input0", [], 0, 0.0, "input"), node(1, "fwd0", [], 1, 0.0), node(2, "fwd1", [], 0, 1.0),
             node(3, "fwd2", [], 0, 0.0), node(4, "fwd3", [2], 1, 0.0), node(5, "fwd4", [1], 0, 0.0),
             node(6, "bwd0", [5], 0, 0.0, "backward"), node(7, "bwd1", [6], 0, 0.0, "backward"),
             node(8, "bwd2", [7], 0, 0.0, "backward"), node(9, "bwd3", [8, 4], 0, 0.0, "backward")]
    return Graph.model_validate({"name": "later-recomputation", "nodes": nodes, "order": list(range(1, 10))})


def test_checkmate_retains_a_value_a_later_recomputation_needs() -> None:
    graph = _value_needed_by_a_later_recomputation()
    budget = 1
    assert min_budget(graph) == budget
    # In Checkmate's own space: fwd1 kept, fwd0 and fwd3 recomputed (free) in the stages of fwd4, bwd3.
    in_stages = Schedule.from_order([1, 2, 3, 4, 1, 5, 6, 7, 8, 4, 9])
    verdict = validate(graph, in_stages, budget)
    assert verdict.ok and verdict.cost == graph.baseline_cost == 1.0
    ours = moccasin(graph, budget, **LIMIT)
    assert ours.status == "optimal" and ours.simulation.cost == 1.0
    exact = checkmate(graph, budget, solver="highs", **LIMIT)
    assert exact.status == "optimal" and exact.simulation.cost == 1.0
