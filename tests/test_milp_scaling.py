"""A MIP backend's claims hold on a captured step, whose compute costs are seconds (1e-7 to 1e-4).

``tests/data/mlp_dropout_step.json`` is ``coop.capture`` of Linear(64, 256)-ReLU-Dropout-Linear(256, 256)-ReLU-
Linear(256, 10) on a batch of 32 with a mean-square loss (34 nodes, analytic costs). With the objective passed to
the solvers in seconds, SCIP called a schedule 39.5 % over the step "optimal" after 4 s and HiGHS one 28.4 % over
after 42 s, where chen-greedy's schedule, inside Checkmate's space, costs 9.6 % (2026-12-01).

The oracle is that schedule: a proven lower bound (an optimum's cost included) can never exceed the cost of a
schedule in hand, whatever the status the solver ends with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from coop.formulations.checkmate.milp import checkmate
from coop.formulations.heuristics.baselines import chen_greedy
from coop.graph_files import load_graph
from coop.schedule import validate

GRAPH = Path(__file__).parent / "data" / "mlp_dropout_step.json"
BUDGET = 745_245  # 0.95 of the step's peak, less the allocator's page rounding (what coop.plan solved for)


def test_scip_proves_no_bound_above_a_schedule_in_hand() -> None:
    """SCIP, the backend that made its wrong claim fastest (in 4 s)."""
    graph = load_graph(GRAPH)
    in_hand = chen_greedy(graph, BUDGET)
    assert in_hand.schedule is not None and in_hand.simulation.peak <= BUDGET
    validate(graph, in_hand.schedule)
    result = checkmate(graph, BUDGET, solver="scip", time_limit=6)
    assert result.bound is not None and result.bound <= in_hand.simulation.cost * (1 + 1e-9), (result.status,
                                                                                               result.message)
    if result.status == "optimal":
        assert result.simulation.cost <= in_hand.simulation.cost * (1 + 1e-9)


@pytest.mark.slow
def test_highs_proves_the_optimum_no_costlier_than_a_schedule_in_hand() -> None:
    """HiGHS through OR-Tools reports no incumbent when stopped at a time limit; it proves its optimum in 20-45 s."""
    graph = load_graph(GRAPH)
    in_hand = chen_greedy(graph, BUDGET)
    result = checkmate(graph, BUDGET, solver="highs", time_limit=120)
    assert result.status == "optimal", result.message
    validate(graph, result.schedule)
    assert result.simulation.peak <= BUDGET
    assert result.simulation.cost <= in_hand.simulation.cost * (1 + 1e-9)
