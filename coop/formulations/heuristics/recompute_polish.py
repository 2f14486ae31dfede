"""Drop recomputations a schedule no longer needs: keep the earlier instance resident where the budget allows.

The one pass that does this in coop (:func:`drop_needless`), used by MONeT's polish (on schedules with
implementation choices, frees and paging: :func:`drop_needless_recomputations`) and by the local search of
:mod:`coop.formulations.heuristics.fast_schedules` (on plain compute sequences, thousands of times a second).

A solver stopped by its time limit often leaves slack: a choice made late (an implementation that runs in
place, a value freed earlier) lowers the memory around a recomputation that an earlier choice needed. The pass
walks a legal schedule's recomputations, costliest first, and removes each one whose value can stay resident
from its previous computation instead: the recompute step goes, and so does the explicit ``free`` of that value
between the two computations. A judge (the one simulator, :func:`coop.schedule.simulate`, or for a compute-only
sequence its exact profile, :func:`~coop.formulations.heuristics.sequence_profile.sequence_profile`) decides
every trial, so a removal stands only where the schedule stays legal, fits the budget and costs less. On a
compute-only sequence a screened sweep goes first: one profile, then per recomputation a conservative check
(the previous instance kept alive adds its bytes to the steps between its end and the dropped compute, nothing
elsewhere), the drops it admits taken at once and judged once; the exact trials then try what it refused.

References
----------
Shah et al., "Memory Optimization for Deep Networks", ICLR 2021 (schedules with implementation choices);
Bartan et al., "Moccasin", ICML 2023 (retention intervals: a value kept from one computation to its next use).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from coop.formulations.heuristics.sequence_profile import SequenceTables, sequence_profile
from coop.graph import Graph
from coop.schedule import Schedule, ScheduleError, Simulation, Step, simulate

#: A judge of a trial: its (peak, cost) where it is legal, else None.
Judge = Callable[[list[Step]], "tuple[int, float] | None"]


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
    best: list[Simulation] = [simulate(graph, schedule)]  # the cheapest within budget judged: the last kept

    def judge(steps: list[Step]) -> tuple[int, float] | None:
        if len(steps) == len(schedule.steps):
            sim = best[0]  # the schedule itself: simulated above
        else:
            try:
                sim = simulate(graph, Schedule(steps=tuple(steps)))
            except ScheduleError:
                return None
            if sim.peak <= budget and sim.cost < best[-1].cost:
                best[1:] = [sim]
        return sim.peak, sim.cost

    steps = drop_needless(graph, budget, list(schedule.steps), judge, ends_at)
    if len(steps) == len(schedule.steps):
        return schedule, best[0]
    return Schedule(steps=tuple(steps)), best[-1]


def drop_needless(graph: Graph, budget: int, steps: list[Step], judge: Judge, ends_at: float,
                  tables: SequenceTables | None = None, trials: bool = True) -> list[Step]:
    """``steps`` with every recomputation removed that the budget lets the earlier instance replace.

    Parameters
    ----------
    budget : int
        The peak the result must stay within, in graph units.
    steps : list of Step
        A legal schedule's steps within ``budget``.
    judge : Judge
        (peak, cost) of a trial, None where it is illegal.
    ends_at : float
        ``time.perf_counter()`` at which the pass stops (after the trial running).
    tables : SequenceTables or None
        Where ``steps`` are plain computes of this problem's sequence: the screened sweep goes first.
    trials : bool
        Whether the exact trials follow (the local search's inner loop, thousands of calls a second, takes the
        sweep alone: on ResNet-50 at 5 s the trials there cost more iterations than they save).

    Returns
    -------
    list of Step
        The steps left (``steps`` itself where no removal helps), never costlier and never above ``budget``.
    """
    current = judge(steps)
    if current is None:
        return steps
    if tables is not None and time.perf_counter() < ends_at:
        swept = _screened_sweep(graph, budget, tables, [s.node for s in steps], ends_at)
        if len(swept) < len(steps):
            trial = Schedule.from_order(swept).steps
            judged = judge(list(trial))
            if judged is not None and judged[0] <= budget:
                steps, current = list(trial), judged
    tried: set[tuple[int, int]] = set()  # (node, how many earlier computes of it): a trial that failed
    while trials and time.perf_counter() < ends_at:
        removal = _next_removal(graph, budget, steps, current, judge, tried, ends_at)
        if removal is None:
            break
        steps, current = removal
    return steps


def _screened_sweep(graph: Graph, budget: int, tables: SequenceTables, sequence: list[int], ends_at: float
                    ) -> list[int]:
    """Recomputations removed one at a time, costliest first, while a conservative check on one profile admits it.

    Dropping the recompute of v at position j keeps v's previous instance alive until the dropped one's last read,
    which adds v's bytes to the steps between the previous instance's end and j (and nothing elsewhere: the dropped
    compute's inputs can only die earlier). A drop is taken when those steps stay within the budget."""
    sim = sequence_profile(tables, sequence)
    memory = sim.memory
    alive: dict[int, list[list[int]]] = {}  # node -> [computed_at, end, mem] of its instances, in order
    for k, v in enumerate(sequence):
        alive.setdefault(v, []).append([k, sim.end[k], tables.mem[v]])
    dropped: set[int] = set()
    for j in sorted(recompute_positions(sequence), key=lambda j: -graph.node(sequence[j]).cost):
        if time.perf_counter() >= ends_at:
            break
        instances = alive[sequence[j]]
        at = next(k for k, instance in enumerate(instances) if instance[0] == j)
        previous, this = instances[at - 1], instances[at]
        first, size = previous[1] + 1, previous[2]
        if first < j:
            if max(memory[first:j]) + size > budget:
                continue
            memory[first:j] = [m + size for m in memory[first:j]]
        previous[1] = max(previous[1], this[1])
        del instances[at]
        dropped.add(j)
    return [v for j, v in enumerate(sequence) if j not in dropped] if dropped else sequence


def recompute_positions(sequence: list[int]) -> list[int]:
    """Positions of the computes of a value computed before.

    Parameters
    ----------
    sequence : list of int
        A compute sequence (node ids).

    Returns
    -------
    list of int
        The positions of its recomputations, in order.
    """
    seen: set[int] = set()
    positions = []
    for j, v in enumerate(sequence):
        if v in seen:
            positions.append(j)
        seen.add(v)
    return positions


def _next_removal(graph: Graph, budget: int, steps: list[Step], current: tuple[int, float], judge: Judge,
                  tried: set[tuple[int, int]], ends_at: float) -> tuple[list[Step], tuple[int, float]] | None:
    """The first recomputation (costliest first) whose removal keeps the schedule legal, within budget and cheaper."""
    for index in _recomputations_by_cost(graph, steps):
        if time.perf_counter() >= ends_at:
            return None
        node = steps[index].node
        key = (node, sum(1 for s in steps[:index] if s.op == "compute" and s.node == node))
        if key in tried:
            continue
        trial = _without(steps, index)
        judged = judge(trial)
        if judged is not None and judged[0] <= budget and judged[1] < current[1]:
            return trial, judged
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


__all__ = ["Judge", "drop_needless", "drop_needless_recomputations", "recompute_positions"]
