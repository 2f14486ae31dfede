"""Late outputs: a schedule near the memory floor, made by computing some of a step's outputs last.

Checkpoint-all (Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016, its limit; Jain et al.,
"Checkmate", MLSys 2020, the maximal-recomputation baseline) keeps no forward value, so its peak is usually a
single backward step near the input (a ResNet stem's convolution and normalization backward: three full-resolution
maps). Yet every graph output it computed earlier (the gradients of the layers the backward passed first) is still
resident there: an output stays to the end. Where the budget lies within those bytes of
:func:`coop.budget.min_budget`, no baseline fits (ResNet at 0.7 of its compiled step, issue 41: the floor
2,240,168 B, the budget 2,246,305 B, checkpoint-all 2,252,468 B).

:func:`late_outputs_schedule` repairs such a schedule: while its peak exceeds the budget, the largest
recomputable output resident at the peak step (not an extra output of a multi-output op, which is made only
at its op's first compute) is freed after its last read and computed again after everything else, with the
ancestors it needs recomputed just in time in graph order (each ending at its last read) from what is resident
at the end. Rematerializing a value at any later point is Checkmate's space (Jain et al. 2020); placing the
output last is Sethi's observation that evaluation order alone changes the storage a computation needs
(SIAM J. Comput. 1975). Every trial is judged by the one simulator, :func:`coop.schedule.simulate`.

:func:`near_floor_schedule` applies it to checkpoint-all in the solvers' deferred order
(:func:`coop.formulations.core.solving_order.solving_graph`), then in the captured order, and returns the first
that fits. Its
schedules recompute a lot (checkpoint-all's O(n^2) steps); the ladder hands them to Moccasin as a warm start,
whose local search makes them cheaper within the budget.
"""

from __future__ import annotations

from coop.errors import CoopError, ScheduleError
from coop.formulations.core.deadline import Deadline
from coop.formulations.core.solving_order import solving_graph
from coop.formulations.heuristics.baselines import checkpoint_all
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, Step, simulate


def movable_outputs(graph: Graph) -> frozenset[int]:
    """The graph outputs that a schedule may free and compute again later.

    Returns
    -------
    frozenset of int
        ``graph``'s outputs that are recomputable, not caller-owned, neither an extra output nor an op with extra outputs
        (an extra output comes into being only at its op's first compute).
    """
    with_extras = {node.output_of for node in graph.nodes if node.output_of is not None}
    return frozenset(v for v in graph.outputs if (node := graph.node(v)).recomputable and not node.caller_owned
                     and node.output_of is None and v not in with_extras)


def with_late_outputs(graph: Graph, base: Schedule, late: frozenset[int] | set[int]) -> Schedule:
    """``base`` with the outputs ``late`` freed after their last read and computed again at the end.

    Computes of a late output that nothing in ``base`` reads afterwards are dropped; ``base``'s own frees of them
    too. The appended part computes, in graph order, every late output and each ancestor that is recomputable and
    not resident at the end (caller-owned values and the other outputs are); a value not recomputable is read
    from its instance in ``base`` (the simulator says whether it is still resident).

    Parameters
    ----------
    base : Schedule
        A legal schedule of ``graph``.
    late : set of int
        Outputs of :func:`movable_outputs`.

    Returns
    -------
    Schedule
        The rewritten schedule (not checked here).
    """
    steps = base.steps
    last_read: dict[int, int] = {}
    for index, step in enumerate(steps):
        if step.op == "compute":
            for source in set(graph.node(step.node).inputs) & late:
                last_read[source] = index
    rewritten: list[Step] = []
    for index, step in enumerate(steps):
        if step.node in late and (step.op == "free" or (step.op == "compute" and last_read.get(step.node, -1) < index)):
            continue
        rewritten.append(step)
        if step.op == "compute":
            rewritten.extend(Step(op="free", node=source) for source in sorted(set(graph.node(step.node).inputs) & late)
                             if last_read[source] == index)
    resident = set(graph.caller_owned_ids) | (set(graph.outputs) - set(late))
    needed: set[int] = set()
    stack = list(late)
    while stack:
        value = stack.pop()
        if value in needed:
            continue
        needed.add(value)
        stack.extend(source for source in graph.node(value).inputs
                     if source not in resident and source not in needed and graph.node(source).recomputable)
    position = {v: k for k, v in enumerate(graph.order)}
    tail = [Step(op="compute", node=v) for v in sorted(needed, key=position.__getitem__)]
    return Schedule(steps=(*rewritten, *tail))


def late_outputs_schedule(graph: Graph, budget: int, base: Schedule,
                          deadline: Deadline | None = None) -> tuple[Schedule, Simulation] | None:
    """``base`` with outputs moved to the end, one at a time, until its peak fits ``budget`` (module docstring).

    Parameters
    ----------
    budget : int
        The budget in graph units.
    base : Schedule
        A legal schedule of ``graph`` (checkpoint-all's, typically).
    deadline : Deadline or None
        Give up (None) once it passes.

    Returns
    -------
    tuple of Schedule and Simulation, or None
        The first rewrite whose simulated peak fits, with its simulation; None when no movable output is
        resident at the peak step (or the deadline passes) before it fits.
    """
    movable = movable_outputs(graph)
    late: set[int] = set()
    refused: set[int] = set()
    schedule, simulation = base, simulate(graph, base)
    while simulation.peak > budget:
        if deadline is not None and deadline.expired():
            return None
        peak = simulation.peak_step
        candidates = [instance.node for instance in simulation.instances
                      if instance.node in movable and instance.node not in late | refused
                      and instance.computed_at < peak and any(a <= peak <= b for a, b in instance.device)]
        if not candidates:
            return None
        chosen = max(candidates, key=lambda v: (graph.node(v).mem, -v))
        trial = with_late_outputs(graph, base, frozenset(late | {chosen}))
        try:
            trial_simulation = simulate(graph, trial)
        except ScheduleError:  # a value its rebuild reads is gone by the end
            refused.add(chosen)
            continue
        late.add(chosen)
        schedule, simulation = trial, trial_simulation
    return schedule, simulation


def near_floor_schedule(graph: Graph, budget: int,
                        deadline: Deadline | None = None) -> tuple[Schedule, Simulation] | None:
    """Checkpoint-all's schedule repaired by :func:`late_outputs_schedule` until it fits ``budget``: in the solvers'
    deferred order first where that order differs (its peak is lower: ResNet's compiled step, 2,252,468 B against
    2,777,984 B in the captured order), then in the captured order.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    deadline : Deadline or None
        No further attempt starts once it passes.

    Returns
    -------
    tuple of Schedule and Simulation, or None
        The schedule and its simulation; None where neither fits, where checkpoint-all fits unchanged (the
        baseline then serves) or where the graph has no backward part.
    """
    deferred = solving_graph(graph)[0]
    for ordered in (graph,) if deferred is graph else (deferred, graph):
        if deadline is not None and deadline.expired():
            break
        try:
            base = checkpoint_all(ordered, budget).schedule
        except CoopError:  # no forward/backward split
            return None
        found = None if base is None else late_outputs_schedule(graph, budget, base, deadline)
        if found is not None and found[0] is not base:  # checkpoint-all itself fitting is the baseline's to offer
            return found
    return None
