"""The oracle of ``auto``: each formulation it could have chosen, run alone, on the same graph and budget.

Shared by tests/test_auto_ladder.py (a few dozen random graphs) and benchmarks/bench_auto.py (500 random
graphs and the zoo). ``auto`` must find a schedule wherever any one of them does, and cost no more than
the cheapest of them (each alone gets the whole time limit that ``auto`` shares among its rungs).
"""

from __future__ import annotations

from dataclasses import dataclass

from coop.errors import CoopError
from coop.formulations import BASELINES, solve
from coop.graph import Graph
from coop.schedule import validate

#: What auto can choose on a graph without implementations and without a device profile.
SINGLE = (*BASELINES, "checkmate", "moccasin")


@dataclass
class Comparison:
    """auto's cost (None: nothing found) against the cheapest single formulation's, and who that was."""

    auto_cost: float | None
    best_cost: float | None
    best: str
    auto_valid: bool

    @property
    def ok(self) -> bool:
        if self.best_cost is None:
            return True  # nothing to lose to (auto may still find more)
        return self.auto_cost is not None and self.auto_valid and self.auto_cost <= self.best_cost * (1 + 1e-9) + 1e-9


def _fitting_cost(graph: Graph, budget: int, name: str, time_limit: float) -> float | None:
    try:
        result = solve(graph, budget, name, time_limit=time_limit, threads=1)
    except CoopError:
        return None
    if result.schedule is None:
        return None
    check = validate(graph, result.schedule, budget)
    return check.cost if check.ok else None


def compare_auto(graph: Graph, budget: int, time_limit: float = 10.0) -> Comparison:
    best_cost, best = None, ""
    for name in SINGLE:
        cost = _fitting_cost(graph, budget, name, time_limit)
        if cost is not None and (best_cost is None or cost < best_cost):
            best_cost, best = cost, name
    result = solve(graph, budget, "auto", time_limit=time_limit, threads=1)
    check = validate(graph, result.schedule, budget) if result.schedule is not None else None
    return Comparison(check.cost if check is not None and check.ok else None, best_cost, best,
                      check is not None and check.ok)
