"""A paging-only heuristic: page out the idle value that frees the most at the peak, until it fits.

Capuchin-style swapping (Peng et al., "Capuchin: Tensor-based GPU Memory Management for Deep
Learning", ASPLOS 2020) on a static schedule: starting from the baseline order, while the one
simulator (:func:`coop.schedule.simulate`) finds the peak above the budget, take the values that
are resident on the device at the peak step without being read there, and page out the one with the
most bytes x idle steps right after its last read before the peak, paging it back in right before
its next read (or at the end, for a graph output). POET (Patil et al., ICML 2022) compares against
such paging-only schedules; here it gives the poet MILP a fitting incumbent where recomputation
alone cannot reach the budget, in milliseconds instead of a branch-and-bound search.

Caller-owned values (inputs, parameters), extra outputs of multi-output ops (poet keeps them on the
device) and host values of an accelerator step (:meth:`coop.graph.Graph.pageable`: a 0-d CPU scalar, an
RNG seed; the validator refuses paging them) are never paged. Returns None when no value can be paged at
the peak step.
"""

from __future__ import annotations

from coop.formulations.core.deadline import Deadline
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, Step, prompt_order, simulate

#: Paging moves tried per computed node before giving up.
MOVES_PER_NODE = 4


def paging_schedule(graph: Graph, budget: int, start: Schedule | None = None,
                    deadline: Deadline | None = None) -> Schedule | None:
    """A schedule of ``start`` (default: the baseline order) with page-outs and page-ins that fits ``budget``.

    See the module docstring for the move taken at each round.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    start : Schedule or None
        The schedule to add paging to; None: the computes of ``prompt_order(graph)``.
    deadline : Deadline or None
        Give up (None) once it passes: each move simulates the whole schedule (6.9 s in all on a 340-node
        training chain with 2 busy cores).

    Returns
    -------
    Schedule or None
        The first schedule whose simulated peak fits; None when no value can be paged at the peak
        step, or after ``MOVES_PER_NODE`` moves per computed node.

    References
    ----------
    Peng et al., "Capuchin: Tensor-based GPU Memory Management for Deep Learning", ASPLOS 2020.
    """
    schedule = start if start is not None else Schedule.from_order(prompt_order(graph))
    for _ in range(MOVES_PER_NODE * max(1, len(graph.order))):
        sim = simulate(graph, schedule)
        if sim.peak <= budget:
            return schedule
        if deadline is not None and deadline.expired():
            return None
        move = _best_move(graph, schedule, sim)
        if move is None:
            return None
        node, out_at, in_at = move
        steps = list(schedule.steps)
        steps.insert(in_at, Step(op="page_in", node=node))
        steps.insert(out_at, Step(op="page_out", node=node))
        schedule = Schedule(steps=tuple(steps))
    return None


def _best_move(graph: Graph, schedule: Schedule, sim: Simulation) -> tuple[int, int, int] | None:
    """(node, page-out position, page-in position) of the most bytes x idle steps at the peak step."""
    peak = sim.peak_step
    reads = _reads_by_node(graph, schedule)
    outputs = set(graph.outputs)
    best: tuple[int, tuple[int, int, int]] | None = None
    for instance in sim.instances:
        node = graph.node(instance.node)
        if node.caller_owned or node.output_of is not None or instance.computed_at == peak or not graph.pageable(node.id):
            continue
        if not any(lo <= peak <= hi for lo, hi in instance.device):
            continue
        lifetime = [k for k in reads.get(node.id, []) if instance.computed_at < k <= instance.end]
        if peak in lifetime:
            continue  # read at the peak: it must be there
        before = max((k for k in lifetime if k < peak), default=instance.computed_at)
        after = min((k for k in lifetime if k > peak), default=None)
        if after is None:
            if node.id not in outputs or instance.end != len(schedule.steps) - 1:
                continue  # freed without a later read: nothing to page back
            after = len(schedule.steps)  # a graph output: back on the device at the end
        if any(s.node == node.id and s.op != "compute" for s in schedule.steps[before + 1:after]):
            continue  # already paged or freed in this window
        score = instance.mem * (after - before)
        if best is None or score > best[0]:
            best = (score, (node.id, before + 1, after))
    return None if best is None else best[1]


def _reads_by_node(graph: Graph, schedule: Schedule) -> dict[int, list[int]]:
    """For each node, the steps whose compute reads it (by the implementation the step names)."""
    reads: dict[int, list[int]] = {}
    for k, step in enumerate(schedule.steps):
        if step.op != "compute":
            continue
        node = graph.node(step.node)
        for source in node.reads(node.implementation(step.impl)):
            reads.setdefault(source, []).append(k)
    return reads


__all__ = ["paging_schedule"]
