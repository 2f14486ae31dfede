"""Drop recomputations a schedule no longer needs: keep the earlier instance resident where the budget allows.

A solver stopped by its time limit often leaves slack: a choice made late (an implementation that runs in
place, a value freed earlier) lowers the memory around a recomputation that an earlier choice needed. This
pass walks a legal schedule's recomputations, costliest first, and removes each one whose value can stay
resident from its previous computation instead: the recompute step goes, and so does the explicit ``free``
of that value between the two computations. The one simulator (:func:`coop.schedule.simulate`) judges every
trial under the schedule's own semantics (implementations, in-place computes, paging), so a removal stands
only where the schedule stays legal, fits the budget and costs less. It is the "drop redundant
recomputation" move of the local search in :mod:`coop.formulations.heuristics.fast_schedules`, on schedules that carry
implementation choices, which that search (over plain slot sequences) cannot read.

References
----------
Shah et al., "Memory Optimization for Deep Networks", ICLR 2021 (schedules with implementation choices);
Bartan et al., "Moccasin", ICML 2023 (retention intervals: a value kept from one computation to its next use).
"""

from __future__ import annotations

import time

from coop.graph import Graph
from coop.schedule import Schedule, ScheduleError, Simulation, Step, simulate


def drop_needless_recomputations(graph: Graph, budget: int, schedule: Schedule,
                                 deadline_s: float) -> tuple[Schedule, Simulation]:
    """``schedule`` with every recomputation removed that the budget lets the earlier instance replace.

    Parameters
    ----------
    graph : Graph
        The graph the schedule is for (implementations included).
    budget : int
        The peak the result must stay within, in graph units.
    schedule : Schedule
        A legal schedule within ``budget``.
    deadline_s : float
        Seconds this pass may take; it stops after the trial running when they are spent.

    Returns
    -------
    tuple of Schedule and Simulation
        The polished schedule and its simulation (``schedule`` itself where no removal helps), never costlier
        and never above ``budget``.
    """
    ends_at = time.perf_counter() + deadline_s
    steps = list(schedule.steps)
    current = simulate(graph, schedule)
    tried: set[tuple[int, int]] = set()  # (node, how many earlier computes of it): a trial that failed
    while time.perf_counter() < ends_at:
        removal = _next_removal(graph, budget, steps, current, tried, ends_at)
        if removal is None:
            break
        steps, current = removal
    return Schedule(steps=tuple(steps)), current


def _next_removal(graph: Graph, budget: int, steps: list[Step], current: Simulation, tried: set[tuple[int, int]],
                  ends_at: float) -> tuple[list[Step], Simulation] | None:
    """The first recomputation (costliest first) whose removal keeps the schedule legal, within budget and cheaper."""
    for index in _recomputations_by_cost(graph, steps):
        if time.perf_counter() >= ends_at:
            return None
        node = steps[index].node
        key = (node, sum(1 for s in steps[:index] if s.op == "compute" and s.node == node))
        if key in tried:
            continue
        trial = _without(steps, index)
        try:
            sim = simulate(graph, Schedule(steps=tuple(trial)))
        except ScheduleError:
            sim = None
        if sim is not None and sim.peak <= budget and sim.cost < current.cost:
            return trial, sim
        tried.add(key)
    return None


def _recomputations_by_cost(graph: Graph, steps: list[Step]) -> list[int]:
    """Indices of the compute steps of a value computed before, costliest first."""
    seen: set[int] = set()
    found: list[tuple[float, int]] = []
    for index, step in enumerate(steps):
        if step.op != "compute":
            continue
        if step.node in seen:
            node = graph.node(step.node)
            impl = node.implementation(step.impl) if step.impl else None
            found.append((-(impl.cost if impl is not None else node.cost), index))
        seen.add(step.node)
    return [index for _, index in sorted(found)]


def _without(steps: list[Step], index: int) -> list[Step]:
    """``steps`` less the compute at ``index`` and the explicit frees of its value since its previous compute."""
    node = steps[index].node
    previous = max(i for i in range(index) if steps[i].op == "compute" and steps[i].node == node)
    return [s for i, s in enumerate(steps)
            if i != index and not (previous < i < index and s.op == "free" and s.node == node)]


__all__ = ["drop_needless_recomputations"]
