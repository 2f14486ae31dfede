"""The memory profile of a compute-only sequence: the local search's fast screening model.

The local search of :mod:`coop.formulations.heuristics.fast_schedules` (destroy-and-repair over compute sequences,
Shaw 1998; Pisinger and Ropke 2010) evaluates thousands of candidate sequences per second of its
budget. :func:`coop.schedule.simulate` handles every schedule (frees, paging, implementations, in-place
computes) and checks legality step by step; on captured ResNet-50 (1,250 steps) one call takes ~17 ms,
which left the search ~7 repairs a second. A sequence of plain computes needs much less: each value
lives from its compute to its last read (an output's final instance to the end), which is what
:meth:`coop.schedule.Schedule.from_order` means (contract 2). :func:`sequence_profile` computes exactly
that memory profile from tables built once per problem.

The simulator stays the judge: the local search screens its candidates here and simulates what it
returns (tests check that both give the same memory at every step on random graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

from coop.errors import ScheduleError
from coop.formulations.intervals.slots import SlotProblem


@dataclass(frozen=True)
class SequenceTables:
    """Per computed node what its compute reads, holds and costs (from a :class:`SlotProblem`).

    ``reads`` are the computed values a compute reads (caller-owned ones are always resident;
    an extra output reads nothing: its op made it); ``base`` is the caller-owned bytes, resident at
    every step.
    """

    reads: dict[int, tuple[int, ...]]
    mem: dict[int, int]
    workspace: dict[int, int]
    cost: dict[int, float]
    output_of: dict[int, int]
    outputs: frozenset[int]
    base: int

    @classmethod
    def build(cls, problem: SlotProblem) -> SequenceTables:
        """The tables of ``problem``'s graph (its costs in graph units, not the scaled integers)."""
        graph = problem.graph
        return cls(
            reads={v: () if v in problem.output_of else tuple(problem.inputs[v]) for v in problem.order},
            mem=dict(problem.mem),
            workspace=dict(problem.workspace),
            cost={v: graph.node(v).cost for v in problem.order},
            output_of=dict(problem.output_of),
            outputs=frozenset(problem.outputs),
            base=graph.caller_owned_bytes,
        )


@dataclass
class SequenceProfile:
    """A compute-only sequence's memory and lifetimes (the instance made at step k is instance k).

    ``memory[j]``: the bytes alive at step j plus that step's workspace, caller-owned values
    included (:attr:`coop.schedule.Simulation.memory`); instance k, of node ``sequence[k]``, counts
    from ``start[k]`` through ``end[k]`` inclusive (an extra output from right after its op's first
    compute).
    """

    memory: list[int]
    start: list[int]
    end: list[int]
    peak: int
    peak_step: int


def sequence_profile(tables: SequenceTables, sequence: list[int]) -> SequenceProfile:
    """The memory profile of computing ``sequence`` in order, each value freed after its last read.

    Parameters
    ----------
    tables : SequenceTables
        The problem's tables.
    sequence : list of int
        Node ids to compute, in order; every read must follow a compute of the value read.

    Returns
    -------
    SequenceProfile
        What :func:`coop.schedule.simulate` gives for ``Schedule.from_order(sequence)``: the same
        memory per step and the same instance lifetimes.

    Raises
    ------
    ScheduleError
        When a compute reads a value that no earlier step computed.
    """
    reads, output_of = tables.reads, tables.output_of
    steps = len(sequence)
    current: dict[int, int] = {}  # node -> the step that made its live instance
    first: dict[int, int] = {}
    end = list(range(steps))  # an instance read by no one ends where it starts
    start = list(range(steps))
    for j, v in enumerate(sequence):
        for source in reads[v]:
            k = current.get(source)
            if k is None:
                raise ScheduleError(f"step {j} (compute %{v}): input {source} is not resident (never computed)",
                                    step=j)
            end[k] = j
        if v in output_of:
            start[j] = first[output_of[v]] + 1
        current[v] = j
        first.setdefault(v, j)
    for v in tables.outputs:
        k = current.get(v)
        if k is not None:
            end[k] = steps - 1
    mem, workspace = tables.mem, tables.workspace
    delta = [0] * (steps + 1)
    for k, v in enumerate(sequence):
        size = mem[v]
        delta[start[k]] += size
        delta[end[k] + 1] -= size
    memory = []
    running = tables.base
    for j, v in enumerate(sequence):
        running += delta[j]
        memory.append(running + workspace[v])
    peak = max(memory, default=tables.base)
    return SequenceProfile(memory, start, end, peak, memory.index(peak) if memory else 0)


def sequence_cost(tables: SequenceTables, sequence: list[int]) -> float:
    """The compute cost of ``sequence`` in graph units.

    Parameters
    ----------
    tables : SequenceTables
        The problem's tables.
    sequence : list of int
        Node ids computed, in order.

    Returns
    -------
    float
        The sum of their costs (the graph's, not the scaled integers).
    """
    cost = tables.cost
    return sum(cost[v] for v in sequence)
