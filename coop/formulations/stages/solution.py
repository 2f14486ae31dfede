"""From a stage model's solution to a :class:`~coop.schedule.Schedule` (Checkmate, POET, MONeT).

:func:`stages_from_solution` and :func:`retained_from_solution` read what each stage computes and
retains from the solver's values; :func:`schedule_from_stages` and, for per-node choices
(:class:`StageStep`), :func:`schedule_from_stage_steps` turn the stages into steps. The model itself
is :mod:`coop.formulations.stages.model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coop.formulations.stages.model import Entry, StageProblem, StageVariables, entry_value
from coop.schedule import Schedule, Step


@dataclass(frozen=True)
class StageStep:
    """One compute of a stage: the position, the values it reads, its implementation and what it overwrites."""

    position: int
    reads: tuple[int, ...]
    impl: str | None = None      # None: the node's own fields
    consumes: int | None = None  # the position an in-place implementation overwrites


def stages_from_solution(variables: StageVariables, values: Sequence[float],
                         size: int) -> tuple[list[list[int]], list[set[int]]]:
    """The positions computed in each stage and the positions retained into each stage.

    Parameters
    ----------
    variables : StageVariables
        Where R and S live in the model.
    values : sequence of float
        The solution's variable values.

    Returns
    -------
    tuple of (list of lists of int, list of sets of int)
        ``computed[t]`` ascending, and ``retained[t]`` for t = 0..size.
    """
    computed = [[i for i in range(t + 1) if entry_value(variables.R[t][i], values)] for t in range(size)]
    retained = [retained_from_solution(variables.S, values, t) for t in range(size + 1)]
    return computed, retained


def retained_from_solution(S: list[list[Entry]], values: Sequence[float], t: int) -> set[int]:
    """The positions retained into stage t (``S[t,i] = 1``).

    Parameters
    ----------
    values : sequence of float
        The solution's variable values.

    Returns
    -------
    set of int
        The retained positions.
    """
    return {i for i in range(t) if entry_value(S[t][i], values)}


def schedule_from_stages(problem: StageProblem, computed: list[list[int]], retained: list[set[int]],
                         boundaries: list[tuple[list[int], list[int]]] | None = None) -> Schedule:
    """The schedule of one-choice stages (Checkmate, POET).

    Parameters
    ----------
    problem : StageProblem
        The projected graph.
    computed : list of lists of int
        Per stage, the positions computed, ascending.
    retained : list of sets of int
        Per stage t = 0..T, the positions retained into it.
    boundaries : list of (page-outs, page-ins) or None
        Per stage, what is paged out and in after it (POET).

    Returns
    -------
    Schedule
        See :func:`schedule_from_stage_steps`.
    """
    stages = [[StageStep(k, problem.deps[k]) for k in stage] for stage in computed]
    kept = [retained[t + 1] for t in range(problem.size)]
    return schedule_from_stage_steps(problem.ids, stages, kept, boundaries)


def schedule_from_stage_steps(ids: Sequence[int], stages: list[list[StageStep]], kept: list[set[int]],
                              boundaries: list[tuple[list[int], list[int]]] | None = None) -> Schedule:
    """Stage by stage: compute the stage's steps in order; free a value right after its last reader in the stage.

    After each compute, what it read and itself are freed unless a later step of the stage reads
    them, they are kept into the next stage, paged out after the stage, or consumed in place
    (already gone): the paper's FREE. ``boundaries[t]`` = (page-outs, page-ins) after stage t (POET):
    a value paged out there is kept to the end of the stage; the page-outs, then the page-ins,
    follow the stage's last step.

    Parameters
    ----------
    ids : sequence of int
        Position -> node id.
    stages : list of lists of StageStep
        Per stage, its computes in order.
    kept : list of sets of int
        Per stage, the positions retained into the next stage.
    boundaries : list of (page-outs, page-ins) or None
        Per stage, the positions paged out and in after it.

    Returns
    -------
    Schedule
        The steps (to be checked by :func:`coop.schedule.simulate`).

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4: one scheduler turns any solution into a schedule.
    """
    steps: list[Step] = []
    for t, stage in enumerate(stages):
        page_out, page_in = boundaries[t] if boundaries is not None else ([], [])
        keep = kept[t] | set(page_out)
        for index, step in enumerate(stage):
            steps.append(Step(op="compute", node=ids[step.position], impl=step.impl))
            for i in (*step.reads, step.position):
                if i == step.consumes or i in keep:
                    continue
                if any(i in later.reads for later in stage[index + 1:]):
                    continue
                steps.append(Step(op="free", node=ids[i]))
        steps += [Step(op="page_out", node=ids[i]) for i in page_out]
        steps += [Step(op="page_in", node=ids[i]) for i in page_in]
    return Schedule(steps=tuple(steps))
