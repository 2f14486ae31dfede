"""Warm starts for the static solvers from the online eviction engine.

An online policy (DTR, DTE, Coop) run over the Graph with random ops kept (no RNG replay) yields
a legal static schedule. Handing the cheapest one that fits to a solver as its hint means a static
plan is never worse than what online eviction reaches on the same graph and budget; the solver
then improves on it. This lives in the planner because formulations never import the runtime.
"""

from __future__ import annotations

from coop.errors import CoopError
from coop.graph import Graph
from coop.runtime.online_sim import simulate_online
from coop.runtime.policies import POLICIES
from coop.schedule import Schedule, validate


def online_hint(graph: Graph, budget: int, policies: tuple[str, ...] | None = None) -> Schedule | None:
    """The cheapest schedule any online policy finds within ``budget`` (validated), or None."""
    best: tuple[float, Schedule] | None = None
    for policy in policies or tuple(POLICIES):
        try:
            result = simulate_online(graph, budget, policy, replay_random=False)
        except CoopError:
            continue
        if result.schedule is None:
            continue
        check = validate(graph, result.schedule, budget)
        if check.ok and check.cost is not None and (best is None or check.cost < best[0]):
            best = (check.cost, result.schedule)
    return best[1] if best else None
