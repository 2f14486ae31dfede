"""One solve of a captured step within a live-bytes budget: the formulation, else the cheapest fitting baseline.

What :class:`coop.planner.rounds.Rounds` calls each round. Formulations see the graph with random draws
recomputable (:func:`coop.runtime.executor.replay_graph`): the executor replays a recomputed dropout mask from its
saved generator state, bit for bit. A schedule is simulated once: a formulation's result carries the one
simulator's verdict on its schedule (:func:`fitting_simulation`), which the plan's executor takes.
:class:`ReportedRounds` are the rounds that say each solve and measure on ``coop.plan``'s progress.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from coop.budget import format_memory, min_budget
from coop.errors import InfeasibleError, ScheduleError
from coop.formulations import SolveResult, solve
from coop.formulations.core.progress import StageProgress
from coop.formulations.ladder.auto import cheapest_fitting_baseline
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.planner.base import LossFn
from coop.planner.measure import Measured
from coop.planner.rounds import Candidate, Rounds
from coop.planner.static_plan import Plan
from coop.runtime.executor import replay_graph
from coop.schedule import Schedule, Simulation, draws_out_of_order, validate


def solve_within(model: nn.Module, captured: Captured, budget_bytes: int, *, formulation: str, time_limit: float,
                 loss_fn: LossFn | None, wrapper: nn.Module | None, device_profile: Any = None,
                 paging: bool = False, exact: bool = False, progress: StageProgress | None = None) -> Plan:
    """Solve within a live-bytes budget; fall back to the cheapest fitting baseline, and say so in the note.

    Below the graph's min_budget no schedule exists (a proven bound), so no baseline is tried there.

    Parameters
    ----------
    formulation, time_limit, device_profile : Any
        As ``coop.plan`` takes them.
    paging : bool
        Whether schedules may page (``PlanOptions.pages``): the floor named where nothing fits is the paged one.
    loss_fn, wrapper : Any
        Handed to the plan.
    exact : bool
        Solve on :func:`exact_only` of the graph.
    progress : StageProgress or None
        Told as the solve starts and ends; the formulation reports to it (``auto``: each rung).

    Returns
    -------
    Plan
        The formulation's plan, or the fallback's with a note saying why.

    Raises
    ------
    InfeasibleError
        When the budget is below min_budget, or a solver proved that no schedule fits.
    SolveTimeoutError
        When the formulation found nothing in its time and no baseline fits: more time may find one.
    """
    progress = progress or StageProgress(None)
    graph = exact_only(replay_graph(captured)) if exact else replay_graph(captured)
    progress.stage(f"solving with {formulation} within {format_memory(budget_bytes, graph)} (time limit "
                   f"{time_limit:g} s)")
    result = solve(graph, budget_bytes, formulation, time_limit=time_limit, captured=captured,
                   device_profile=device_profile, progress=progress.forward())
    simulation = fitting_simulation(graph, result, budget_bytes)
    if simulation is not None:
        progress.stage(f"solved: {result.formulation} ({result.status}), overhead {100 * simulation.overhead:.2f} %")
        return Plan(model, captured, result.schedule, budget_bytes, result.formulation, result, note=result.message,
                    loss_fn=loss_fn, wrapper=wrapper, simulation=simulation)
    least = min_budget(graph, paging=paging)
    if budget_bytes < least:  # every schedule's peak is at least min_budget: none can fit
        raise InfeasibleError(f"no schedule within budget {format_memory(budget_bytes, graph)}: it is below "
                              f"min_budget {format_memory(least, graph)}, the proven lower bound; raise the budget")
    # a time-out proves nothing: where no baseline fits either, SolveTimeoutError (not InfeasibleError) says so
    fallback = cheapest_fitting_baseline(graph, budget_bytes, failed=formulation, result=result,
                                         time_limit=time_limit)
    note = (f"{formulation} found no schedule within the budget ({result.status}: {result.message}); fell back to "
            f"{fallback.formulation}")
    progress.stage(f"{formulation} found no schedule within the budget ({result.status}); fell back to "
                   f"{fallback.formulation}")
    return Plan(model, captured, fallback.schedule, budget_bytes, fallback.formulation, fallback, note=note,
                loss_fn=loss_fn, wrapper=wrapper, simulation=fitting_simulation(graph, fallback, budget_bytes))


class ReportedRounds(Rounds):
    """:class:`~coop.planner.rounds.Rounds` that say on ``progress`` (keyword-only, beside Rounds' own arguments)
    each round as it starts (its number, name and reason) and each measure as it ends (what the step held)."""

    def __init__(self, *args: Any, progress: StageProgress, **keywords: Any) -> None:
        super().__init__(*args, **keywords)
        self.progress = progress

    def _solved(self, name: str, reason: str, aim: int, captured: Captured | None = None) -> Candidate:
        self.progress.stage(f"round {len(self.taken) + 1} ({name}): {reason}")
        return super()._solved(name, reason, aim, captured)

    def _modelled(self, candidate: Candidate, aim: int) -> Measured:
        modelled, note = super()._modelled(candidate, aim)
        if modelled is not None:
            self.progress.stage(f"round {len(self.taken)}: {self.taken[-1].outcome} by the CUDA allocator model "
                                f"({self._size(modelled)} of the budget {self._size(self.budget_bytes)})")
        return modelled, note

    def _measured(self, candidate: Candidate, aim: int) -> Measured:
        self.progress.stage(f"round {len(self.taken)}: measuring the planned step")
        footprint, note = super()._measured(candidate, aim)
        held = "" if footprint is None else f" ({self._size(footprint)} of the budget {self._size(self.budget_bytes)})"
        self.progress.stage(f"round {len(self.taken)}: {self.taken[-1].outcome}{held}")
        return footprint, note


def fitting_simulation(graph: Graph, result: SolveResult, budget: int) -> Simulation | None:
    """The simulation of ``result``'s schedule where that schedule is legal on ``graph`` within ``budget``.

    A result's ``simulation`` is the one simulator's verdict on its schedule (:class:`SolveResult`), so it is not
    simulated again: the draw order and the budget are checked as :func:`coop.schedule.validate` checks them. A
    result without one (or with one of another length) is validated.

    Parameters
    ----------
    graph : Graph
        The graph the result was solved on.
    result : SolveResult
        A formulation's result.
    budget : int
        The live-bytes budget.

    Returns
    -------
    Simulation or None
        The simulation, or None where there is no schedule, it is illegal, draws out of order or exceeds the budget.
    """
    schedule = result.schedule
    if schedule is None:
        return None
    simulation = result.simulation
    if simulation is None or len(simulation.memory) != len(schedule.steps):
        verdict = validate(graph, schedule, budget)
        return verdict.simulation if verdict.ok else None
    if simulation.peak > budget or draws_out_of_order(graph, schedule) is not None:
        return None
    return simulation


def plan_from_rank_zero(model: nn.Module, captured: Captured, schedule: Schedule, budget_bytes: int,
                        formulation: str, result: SolveResult | None, note: str, *, loss_fn: LossFn | None) -> Plan:
    """The plan of an FSDP rank other than 0: rank 0's schedule, validated on this rank's own step and budget.

    Parameters
    ----------
    model : nn.Module
        This rank's module.
    captured : Captured
        This rank's capture.
    schedule, budget_bytes, formulation, result, note : Any
        Rank 0's plan, as broadcast (:func:`coop.planner.ranks.solved_on_rank_zero`).
    loss_fn : LossFn or None
        Handed to the plan.

    Returns
    -------
    Plan
        The plan, its simulation the validator's.

    Raises
    ------
    ScheduleError
        When rank 0's schedule is not legal within the budget on this rank's step.
    """
    verdict = validate(replay_graph(captured), schedule, budget_bytes)
    if not verdict.ok:
        raise ScheduleError(f"rank 0's schedule is not legal on this rank's step ({verdict.reason}); plan again with "
                            "the same model and batch shapes on every rank")
    return Plan(model, captured, schedule, budget_bytes, formulation, result, note=note, loss_fn=loss_fn,
                simulation=verdict.simulation)


def exact_only(graph: Graph) -> Graph:
    """``graph`` without its inexact implementations (``plan(..., exact=True)``): no formulation can choose them.

    Parameters
    ----------
    graph : Graph
        A graph, possibly with operator implementations (MONeT).

    Returns
    -------
    Graph
        ``graph`` itself when every implementation is exact, else a copy whose nodes keep only the exact ones.
    """
    if all(impl.exact for node in graph.nodes for impl in node.impls):
        return graph
    data = graph.model_dump()
    for node in data["nodes"]:
        node["impls"] = [impl for impl in node["impls"] if impl["exact"]]
    return Graph.model_validate(data)
