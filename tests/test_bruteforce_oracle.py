"""Checkmate, Moccasin and the baselines against an independent brute-force oracle (tests/bruteforce.py).

The oracle searches every compute/free sequence of a tiny graph (at most 6 drawn computed nodes,
plus the extra outputs of multi-output ops) under contract 2's semantics, written without the
simulator. It answers in three nested schedule spaces, and each formulation is compared with the
space its own claim speaks about:

* ``"all"``, every legal schedule. Nothing may beat it: no formulation's schedule costs less at a
  budget, none fits below its least peak (the least feasible budget), and ``coop.min_budget`` (the
  proven lower bound) never exceeds that least peak.
* ``"staged"``, Checkmate's frontier-advancing stages over ``graph.order``. Its space is a strict
  subset of all schedules: first computations follow the order, each stage recomputes earlier
  nodes at most once each and in order, and nothing runs after the last stage, so an output that
  was freed cannot be rebuilt at the end (:func:`test_spaces_differ_on_a_hand_counted_graph`
  shows a graph where the true optimum, the in-order optimum and Checkmate's differ). Checkmate's
  proven optimum therefore equals the staged brute force, not the unrestricted one, and Checkmate
  is infeasible exactly below the staged least peak.
* ``"in_order"``, first computations in the baseline order. Moccasin's ``optimal`` (docstring of
  ``coop.formulations.moccasin.intervals.moccasin``) claims that no schedule of this space costs less; its
  schedule may still come from a warm start outside the space (the true optimum at most), so the
  check is ``all-optimum <= cost <= in_order-optimum``, which is equality whenever the two
  optima agree (most drawn graphs).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.formulations import BASELINES, solve
from coop.formulations.core.result import SolveResult
from coop.formulations.core.solving_order import solving_graph
from coop.graph import Graph
from coop.schedule import Schedule, Step, simulate, validate
from tests.bruteforce import (
    SPACES,
    Found,
    least_peak,
    least_peak_schedule,
    optimal_cost,
    optimal_schedule,
    store_all_peak,
)
from tests.strategies import random_graphs

#: Generous: a 6-node Checkmate MILP is proven optimal in well under a second; a timeout fails.
SOLVER_LIMIT = {"time_limit": 30.0, "threads": 1}
ORACLE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOLVERS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TINY = random_graphs(max_nodes=6)


def _schedule(found: Found) -> Schedule:
    return Schedule(steps=tuple(Step(op=op, node=node) for op, node in found.steps))


def _graph(nodes: list[dict], outputs: tuple[int, ...] = ()) -> Graph:
    return Graph.model_validate({"name": "hand", "nodes": nodes, "outputs": list(outputs)})


# -------------------------------------------------------------------- the oracle, by hand
def test_diamond_needs_all_three_values_at_once() -> None:
    # x -> y, x -> z, (y, z) -> join; every value 10 except join (1), every cost 1.
    # z (or y) is computed while x and the other are resident: 10 + 10 + 10 = 30 in any order;
    # recomputing x does not help (it must be resident again next to y and z). min_budget only
    # sees single steps: join's 10 + 10 + 1 = 21.
    graph = _graph([
        {"id": 0, "name": "x", "mem": 10, "cost": 1},
        {"id": 1, "name": "y", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "z", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 3, "name": "join", "inputs": [1, 2], "mem": 1, "cost": 1},
    ])
    assert store_all_peak(graph) == 30 and min_budget(graph) == 21
    for space in SPACES:
        assert least_peak(graph, space) == 30
        assert optimal_cost(graph, 30, space) == 4.0  # each node once
        assert optimal_cost(graph, 29, space) is None


def test_recomputing_the_expensive_activation_is_the_only_way_down() -> None:
    # a (10 B, cost 5) -> b (10 B, cost 1) -> c (10 B, cost 1) -> g (0 B, cost 1), g also reads a.
    # Baseline: at c's step a (kept for g), b (read) and c are resident: 30. At 20, a cannot sit
    # next to b and c, so it is freed after b and recomputed before g: 5 + 1 + 1 + 5 + 1 = 13.
    # Below 20 nothing fits: b's own step holds a and b.
    graph = _graph([
        {"id": 0, "name": "a", "mem": 10, "cost": 5},
        {"id": 1, "name": "b", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "c", "inputs": [1], "mem": 10, "cost": 1},
        {"id": 3, "name": "g", "inputs": [2, 0], "mem": 0, "cost": 1, "kind": "backward"},
    ])
    assert store_all_peak(graph) == 30 and min_budget(graph) == 20
    for space in SPACES:
        assert least_peak(graph, space) == 20
        assert optimal_cost(graph, 30, space) == 8.0
        assert optimal_cost(graph, 29, space) == 13.0
        assert optimal_cost(graph, 20, space) == 13.0
        assert optimal_cost(graph, 19, space) is None


def _output_rebuilt_at_the_end() -> Graph:
    """a (5 B, an output) is first in the order; b (5 B) -> c (5 B) do not read it."""
    return _graph([
        {"id": 0, "name": "a", "mem": 5, "cost": 1},
        {"id": 1, "name": "b", "mem": 5, "cost": 1},
        {"id": 2, "name": "c", "inputs": [1], "mem": 5, "cost": 1, "kind": "backward"},
    ], outputs=(0,))


def test_spaces_differ_on_a_hand_counted_graph() -> None:
    graph = _output_rebuilt_at_the_end()
    # Baseline order a, b, c: a (kept: an output) + b + c at c's step = 15; min_budget = c's step
    # (b + c = 10) vs the outputs at the end (a = 5): 10.
    assert store_all_peak(graph) == 15 and min_budget(graph) == 10
    # all: b, c (10), free both, a: peak 10, cost 3.
    # in_order: a, b (10), free a, c (b + c = 10), a again: peak 10, cost 4.
    # staged: nothing runs after c's stage, so a stays resident through c: 15; at 10 none fits.
    assert [least_peak(graph, space) for space in ("all", "in_order", "staged")] == [10, 10, 15]
    assert [optimal_cost(graph, 10, space) for space in ("all", "in_order", "staged")] == [3.0, 4.0, None]
    assert [optimal_cost(graph, 15, space) for space in ("all", "in_order", "staged")] == [3.0, 3.0, 3.0]


def test_checkmate_and_moccasin_on_the_hand_counted_spaces() -> None:
    graph = _output_rebuilt_at_the_end()
    checkmate = solve(graph, 10, "checkmate", **SOLVER_LIMIT)
    assert checkmate.status == "infeasible" and checkmate.schedule is None  # staged least peak is 15
    at_15 = solve(graph, 15, "checkmate", **SOLVER_LIMIT)
    assert at_15.status == "optimal" and at_15.simulation.cost == 3.0
    for keep_order, order, expected in ((True, "captured", 4.0), (False, "captured", 3.0), (True, "auto", 3.0)):
        # in the captured order a must come first and be rebuilt (in_order: 4); the deferred order computes the
        # output a last, where nothing else is resident (the "all" space's optimum, 3)
        moccasin = solve(graph, 10, "moccasin", keep_order=keep_order, order=order, **SOLVER_LIMIT)
        assert moccasin.status == "optimal", moccasin.message
        assert validate(graph, moccasin.schedule, 10).ok
        assert moccasin.simulation.cost == expected, (keep_order, order)


def test_an_extra_output_exists_from_its_ops_first_compute() -> None:
    # x (input, 1 B) -> p (4 B, workspace 2 holding its extra output e, 2 B) -> q (3 B) reads p;
    # g reads q and e. Step p: 1 + 4 + 2 = 7. Step q: x + p + e + q = 1 + 4 + 2 + 3 = 10, and no
    # schedule avoids it (q reads p, e exists from p's first compute and cannot be rebuilt).
    # A single step's reads and output are at most x + p + q = 8; min_budget also counts e at q's step
    # (q comes after p, and g, which depends on q, reads e): 10, the least peak.
    graph = _graph([
        {"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"},
        {"id": 1, "name": "p", "inputs": [0], "mem": 4, "cost": 2, "workspace": 2},
        {"id": 2, "name": "e", "inputs": [1], "mem": 2, "cost": 0, "output_of": 1, "recomputable": False},
        {"id": 3, "name": "q", "inputs": [1], "mem": 3, "cost": 1},
        {"id": 4, "name": "g", "inputs": [3, 2], "mem": 1, "cost": 1, "kind": "backward"},
    ])
    assert store_all_peak(graph) == 10 and min_budget(graph) == 10
    for space in SPACES:
        assert least_peak(graph, space) == 10
        assert optimal_cost(graph, 10, space) == 4.0
    for name in ("checkmate", "moccasin"):
        result = solve(graph, 9, name, **SOLVER_LIMIT)
        assert result.schedule is None and result.status == "infeasible", name


# -------------------------------------------------------------------- the oracle against the simulator
@ORACLE
@given(TINY)
def test_oracle_schedules_are_legal_and_recount_to_the_same_numbers(graph: Graph) -> None:
    peaks = [least_peak_schedule(graph, space) for space in SPACES]
    assert min_budget(graph) <= peaks[0].peak <= peaks[1].peak <= peaks[2].peak <= store_all_peak(graph)
    assert store_all_peak(graph) == baseline_peak(graph)
    for found in peaks:
        verdict = validate(graph, _schedule(found), found.peak)
        # The simulator frees at last use, the oracle where it chose: never more, and no less
        # than the least peak of all schedules.
        assert verdict.ok, verdict.reason
        assert peaks[0].peak <= verdict.peak <= found.peak and verdict.cost == found.cost
    cheapest = optimal_schedule(graph, peaks[0].peak)
    assert cheapest is not None and cheapest.cost <= peaks[0].cost
    assert validate(graph, _schedule(cheapest), peaks[0].peak).ok


# -------------------------------------------------------------------- formulations against the oracle
def _check_fits(graph: Graph, result: SolveResult, budget: int) -> float:
    assert result.schedule is not None, result.message
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert result.simulation.cost == verdict.cost and result.simulation.peak == verdict.peak
    return verdict.cost


def _budget_between(graph: Graph, fraction: float) -> int:
    least, peak = least_peak(graph), baseline_peak(graph)
    return least + math.floor(fraction * (peak - least))


@SOLVERS
@given(graph=TINY, fraction=st.floats(0.0, 1.0))
def test_checkmate_proves_the_staged_optimum(graph: Graph, fraction: float) -> None:
    budget = _budget_between(graph, fraction)
    staged = optimal_cost(graph, budget, "staged")
    result = solve(graph, budget, "checkmate", **SOLVER_LIMIT)
    if staged is None:  # below the staged least peak, above the true one: out of Checkmate's space
        assert result.status == "infeasible" and result.schedule is None, result.message
        return
    assert result.status == "optimal", result.message  # a timeout on 6 nodes fails here
    assert _check_fits(graph, result, budget) == staged
    assert result.objective == staged and result.bound == pytest.approx(staged)
    assert staged >= optimal_cost(graph, budget, "all")


@SOLVERS
@given(graph=TINY, fraction=st.floats(0.0, 1.0))
def test_moccasin_never_beats_the_optimum_and_is_exact_when_optimal(graph: Graph, fraction: float) -> None:
    budget = _budget_between(graph, fraction)
    optimum = optimal_cost(graph, budget, "all")
    # moccasin's claims speak of first computations in the order it solved in (the captured order, or the
    # deferred one where that lowers the store-all peak): the in-order oracle searches that order
    in_order = optimal_cost(solving_graph(graph)[0], budget, "in_order")
    result = solve(graph, budget, "moccasin", **SOLVER_LIMIT)
    if in_order is None:  # the in-order space has nothing: infeasible, or a cheaper out-of-order warm start
        if result.schedule is None:
            assert result.status == "infeasible", result.message
            return
    else:
        assert result.status == "optimal", result.message  # tiny graphs are proven within the limit
    cost = _check_fits(graph, result, budget)
    assert optimum is not None and cost >= optimum
    if result.status == "optimal":
        assert in_order is None or cost <= in_order


@SOLVERS
@given(graph=random_graphs(max_nodes=6, with_backward=False), fraction=st.floats(0.0, 1.0))
def test_moccasin_with_a_free_order_is_exact_between_the_spaces(graph: Graph, fraction: float) -> None:
    # No backward part: moccasin frees the first-computation order (keep_order defaults to False).
    budget = _budget_between(graph, fraction)
    optimum = optimal_cost(graph, budget, "all")
    in_order = optimal_cost(graph, budget, "in_order")
    result = solve(graph, budget, "moccasin", **SOLVER_LIMIT)
    assert result.status == "optimal", result.message
    cost = _check_fits(graph, result, budget)
    assert optimum is not None and optimum <= cost
    assert in_order is None or cost <= in_order


#: Every formulation over a Graph alone (pytorch-mincut needs a captured model).
GRAPH_FORMULATIONS = (*BASELINES, "checkmate", "checkmate-lp", "moccasin", "auto")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=TINY)
def test_nothing_fits_below_the_least_peak_of_all_schedules(graph: Graph) -> None:
    budget = least_peak(graph) - 1
    assert budget < baseline_peak(graph)
    for name in GRAPH_FORMULATIONS:
        # Moccasin gets a short limit: its feasibility proof (test_moccasin_proves_infeasibility_of_a_tiny_graph)
        # may not finish in it on a loaded machine; what must hold for every formulation is that nothing is found.
        options = {} if name in BASELINES else MOCCASIN_BELOW if name == "moccasin" else SOLVER_LIMIT
        result = solve(graph, budget, name, **options)
        assert result.status not in ("optimal", "feasible"), (name, result.status)
        if result.schedule is not None:  # a baseline's schedule, reported as not fitting
            assert name in BASELINES and result.extra.get("fits") is False, name
            assert simulate(graph, result.schedule).peak > budget, name
        if name == "checkmate":
            assert result.status == "infeasible", result.message


MOCCASIN_BELOW = {"time_limit": 1.0, "threads": 1}


def _eight_nodes_least_peak_57() -> Graph:
    """Drawn by hypothesis: the true least peak is 57 (brute force, all three spaces)."""
    nodes = [
        {"id": 32, "name": "fwd3", "mem": 15, "cost": 0, "workspace": 13},
        {"id": 64, "name": "fwd3.extra", "inputs": [32], "mem": 13, "cost": 0, "output_of": 32, "recomputable": False},
        {"id": 63, "name": "fwd0", "mem": 17, "cost": 0},
        {"id": 54, "name": "fwd1", "inputs": [63], "mem": 19, "cost": 0},
        {"id": 13, "name": "fwd2", "inputs": [63, 54], "mem": 16, "cost": 0},
        {"id": 47, "name": "fwd4", "inputs": [13], "mem": 4, "cost": 4, "workspace": 9},
        {"id": 65, "name": "fwd4.extra", "inputs": [47], "mem": 4, "cost": 0, "output_of": 47, "recomputable": False},
        {"id": 22, "name": "bwd0", "inputs": [47], "mem": 18, "cost": 7, "kind": "backward"},
    ]
    return _graph(nodes, outputs=(54, 22, 13))


def test_checkmate_proves_infeasibility_of_a_tiny_graph() -> None:
    graph = _eight_nodes_least_peak_57()
    assert [least_peak(graph, space) for space in SPACES] == [57, 57, 57] and min_budget(graph) == 53
    result = solve(graph, 56, "checkmate", **SOLVER_LIMIT)
    assert result.status == "infeasible", result.message
    assert solve(graph, 57, "checkmate", **SOLVER_LIMIT).status == "optimal"


def test_moccasin_proves_infeasibility_of_a_tiny_graph() -> None:
    # Its capacity-relaxed model (minimise overflow) alone ran 30 s without a proof here; the
    # feasibility question with the hard capacity settles it well within the limit.
    result = solve(_eight_nodes_least_peak_57(), 56, "moccasin", time_limit=5.0, threads=1)
    assert result.status == "infeasible" and result.schedule is None, result.message
    assert result.wall_s < 5.0
    assert "first computations in graph.order" in result.message and "least peak 57" in result.message
