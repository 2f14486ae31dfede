"""The least budget at which ``coop.plan`` accepts a given schedule, for tests that pin a budget to one.

A CPU step that recomputes random ops also holds the generator states its replay saves
(:func:`coop.runtime.executor.saved_generator_bytes`), which the simulator does not count: the planner keeps
the schedule's live peak that much below the budget, so a test that wants a baseline's own schedule at the
tightest budget adds them.
"""

from __future__ import annotations

from typing import Any

from coop.formulations import solve
from coop.graph import Graph
from coop.runtime.executor import saved_generator_bytes
from coop.schedule import simulate


def accepted_budget(graph: Graph, formulation: str, **options: Any) -> int:
    """The simulated peak of ``formulation``'s schedule (a baseline: the same at any budget) on the graph the
    planner solves on (random draws recomputable), plus the generator states its replay saves."""
    replayed = graph.with_random_replay()
    schedule = solve(replayed, 10**15, formulation, **options).schedule
    return simulate(replayed, schedule).peak + saved_generator_bytes(replayed, schedule)
