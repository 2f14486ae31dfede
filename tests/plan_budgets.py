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


def held_budget(model: Any, batch: tuple, loss_fn: Any, formulation: str) -> int:
    """The least budget at which ``formulation``'s own plan of ``model`` is kept as it is: the larger of
    its peak with the generator states it saves and what its step holds on CPU (``step_footprint``: kernels' scratch included, which an
    unprofiled graph does not predict), both taken from a plan at an unbounded budget."""
    import coop

    plan = coop.plan(model, 10**12, batch, loss_fn=loss_fn, formulation=formulation)
    accepted = plan.predicted_peak + saved_generator_bytes(plan.graph, plan.schedule)
    return max(plan.step_footprint or 0, accepted)
