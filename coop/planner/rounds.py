"""The measure-and-re-solve rounds of one ``coop.plan`` call, as one object: :class:`Rounds`.

A schedule's live peak is what the formulations bound; what a step holds is more: the generator states its
replay saves, kernels' scratch the capture did not see, the CUDA allocator's reserve, the arena replay's buffers.
Each round solves within a live-bytes budget, measures what the plan then holds, and re-solves below the budget by
what it exceeds, at most a fixed number of times. Every solve is recorded as a :class:`Round` (its name, why it
ran, the budget it solved within, what its step measured and the seconds it took), which
``Plan.summary()["rounds"]`` lists:

- ``solve``: the first solve, within the budget less the allocator's page rounding;
- ``generator states``: again below by the generator states the replay saves (CPU steps that recompute random
  ops, :func:`coop.runtime.executor.saved_generator_bytes`);
- ``measured scratch``: a CPU step held more than the budget: again with each op's scratch, measured on the first
  plan's own replay, as its workspace;
- ``reserved excess``: a CUDA step reserved more than the budget: again below by the excess;
- ``arena footprint``: an arena replay's footprint exceeded the budget: again below by the excess, or bisecting
  where the solver finds nothing.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from coop.budget import format_memory, min_budget
from coop.errors import BudgetError, InfeasibleError, SolveTimeoutError
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.cost import measure_workspace
from coop.planner.measure import FlatInputs, Measured
from coop.runtime.executor import recorded_program, replay_graph, saved_generator_bytes
from coop.runtime.placement import EXECUTION_ROUNDS, next_live_budget
from coop.runtime.program_builder import SOURCE_NODE
from coop.schedule import Schedule

#: Re-solves at most to make room for the saved generator states (their count changes with the schedule).
GENERATOR_STATE_ROUNDS = 3

#: Re-solves at most after a CUDA step reserved more than its budget (each one a solve within the time limit). Three
#: were too few on an H200 (2026-11-26, ResNet-50 at 0.5): 1.507 GB, then 1.444 GB against a 1.437 GB budget when
#: the third round ended; the excess shrinks round after round, but the allocator's fragmentation grows as the
#: live budget falls.
RESERVED_ROUNDS = 5


class Candidate(Protocol):
    """What the rounds read and set of a plan (:class:`coop.planner.static_plan.Plan`)."""

    captured: Captured
    schedule: Schedule
    budget: int
    note: str
    step_footprint: int | None
    graph_replay: Any
    executor: Any

    @property
    def graph(self) -> Graph: ...

    @property
    def predicted_peak(self) -> int: ...


@dataclass
class Round:
    """One solve of a ``coop.plan`` call: its name, why it ran, the live-bytes budget it solved within, what its
    step measured (None: not measured), what the CUDA allocator model predicted it holds (``modelled``; None where
    the model does not apply) and what it came to (``outcome``), and the seconds the solve and measure took."""

    name: str
    reason: str
    budget: int
    measured: int | None = None
    modelled: int | None = None
    outcome: str = "solved"
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Rounds:
    """The solves of one plan, each recorded in :attr:`taken`, until what the plan holds fits the budget.

    ``solve(captured, live_budget)`` is one solve (the formulation and its fallback); ``measure(plan, live_budget)``
    runs the planned step and says what it holds (:mod:`coop.planner.measure`); ``prepare(plan)`` switches a
    candidate to the replay the plan will run (a copy stream, a CUDA graph) before it is measured; ``flat`` makes
    the example batch's flat inputs. ``budget_bytes`` is what the step must hold within, ``live_bytes`` the budget
    less the allocator's page rounding, which the first solve aims at; ``paging`` says that schedules may page (a
    device profile), which lowers the floor below which no round aims; ``predict(plan)`` is the CUDA allocator
    model's prediction of what a candidate holds (:func:`coop.planner.measure.modelled_ordinary_step`), acted on
    before any step is measured.
    """

    def __init__(self, solve: Callable[[Captured, int], Candidate], captured: Captured, budget_bytes: int,
                 live_bytes: int, *, measure: Callable[[Candidate, int], Measured] | None = None,
                 prepare: Callable[[Candidate], None] | None = None, flat: FlatInputs | None = None,
                 paging: bool = False, predict: Callable[[Candidate], int | None] | None = None) -> None:
        self.solve = solve
        self.predict = predict
        self.captured = captured
        self.budget_bytes = budget_bytes
        self.live_bytes = live_bytes
        self.measure = measure
        self.prepare = prepare
        self.flat = flat
        #: below it no schedule exists (the bound of schedules that may page where ``paging``: a device profile)
        self.floor = min_budget(replay_graph(captured), paging=paging)
        #: every solve so far, in order
        self.taken: list[Round] = []

    def _size(self, nbytes: int) -> str:
        return format_memory(nbytes, self.captured.graph)

    def _solved(self, name: str, reason: str, aim: int, captured: Captured | None = None) -> Candidate:
        """One solve within ``aim``, recorded."""
        round_, started = Round(name, reason, aim), time.perf_counter()
        self.taken.append(round_)
        try:
            return self.solve(captured or self.captured, aim)
        except (InfeasibleError, SolveTimeoutError, BudgetError):
            round_.outcome = "no schedule"
            raise
        finally:
            round_.seconds = time.perf_counter() - started

    @staticmethod
    def _held(modelled: bool, subject: bool = True) -> str:
        """How a footprint was known: held (measured), or predicted by the CUDA allocator model."""
        if modelled:
            return "the CUDA allocator model predicted the step holds" if subject else "was predicted to hold"
        return "the step held" if subject else "held"

    def _modelled(self, candidate: Candidate, aim: int) -> Measured:
        """What the CUDA allocator model predicts ``candidate``'s step holds (None where it does not apply), recorded
        on the round that solved it."""
        modelled = None if self.predict is None else self.predict(candidate)
        last = self.taken[-1]
        last.modelled = modelled
        if modelled is not None:
            last.outcome = "predicted to fit" if modelled <= self.budget_bytes else "predicted above the budget"
        note = "" if modelled is None else (f"the CUDA allocator model predicts {self._size(modelled)} held, "
                                            f"solved within a live-bytes budget of {self._size(aim)}")
        return modelled, note

    def _measured(self, candidate: Candidate, aim: int) -> Measured:
        """What ``candidate``'s step holds, recorded on the round that solved it."""
        assert self.measure is not None, "Rounds without a measure solve only"
        started = time.perf_counter()
        footprint, note = self.measure(candidate, aim)
        last = self.taken[-1]
        last.seconds += time.perf_counter() - started
        last.measured = footprint
        if footprint is not None or last.modelled is None:  # a prediction's outcome stands where nothing was measured
            last.outcome = ("not measured" if footprint is None else "fits" if footprint <= self.budget_bytes
                            else "held above the budget")
        return footprint, note

    # ---------------------------------------------------------------- the rounds
    def within_generator_states(self, live: int, *, name: str = "solve", reason: str = "",
                                captured: Captured | None = None) -> Candidate:
        """The plan solved within ``live`` whose live peak leaves room for the generator states its replay saves,
        re-solving below ``live`` by them at most :data:`GENERATOR_STATE_ROUNDS` times; its note says so.

        Raises InfeasibleError, naming the states and the fix, where no round leaves room."""
        reason = reason or "the formulation, within the live-bytes budget"
        chosen, aim = self._solved(name, reason, live, captured), live
        states = 0
        for round_ in range(GENERATOR_STATE_ROUNDS + 1):
            states = saved_generator_bytes(chosen.graph, chosen.schedule)
            if chosen.predicted_peak + states <= live:
                if aim < live:
                    chosen.budget = live
                    chosen.note = (chosen.note + "; " if chosen.note else "") + (
                        f"solved within {self._size(aim)} to leave room for the generator states its replay "
                        f"saves ({self._size(states)})")
                return chosen
            self.taken[-1].outcome = "no room for the generator states"
            if round_ == GENERATOR_STATE_ROUNDS:
                break
            aim = min(aim - 1, live - states)
            chosen = self._solved("generator states", f"the replay saves {self._size(states)} of generator states "
                                  f"beside a live peak of {self._size(chosen.predicted_peak)}: solved below by them",
                                  aim, captured)
        raise InfeasibleError(f"no plan within {self._size(live)} leaves room for the generator states its replay "
                              f"saves (last {self._size(states)}, live peak {self._size(chosen.predicted_peak)}); raise "
                              "the budget by that much")

    def as_asked(self, aim: int, *, name: str = "solve", reason: str = "") -> Candidate:
        """:meth:`within_generator_states`, switched to the replay the plan will run (``prepare``) so that its step is
        measured as it will run."""
        candidate = self.within_generator_states(aim, name=name, reason=reason)
        if self.prepare is not None:
            self.prepare(candidate)
        return candidate

    def ordinary(self) -> Candidate:
        """The ordinary replay's plan: solved, measured, and where it holds more than the budget re-solved below the
        CUDA allocator's excess (:meth:`below_measured_excess`) or with the CPU kernels' measured scratch
        (:meth:`with_measured_scratch`); a warning names the fix where the step still holds more."""
        chosen = self.as_asked(self.live_bytes, reason="the formulation, within the budget less the allocator's "
                               "page rounding")
        modelled, _ = self._modelled(chosen, self.live_bytes)
        if modelled is not None and modelled > self.budget_bytes:  # the allocator model first: no step runs for it
            chosen = self.below_measured_excess(chosen, modelled, modelled=True)
        footprint, held = self._measured(chosen, self.live_bytes)
        chosen.note = (chosen.note + "; " if chosen.note else "") + held
        graph = self.captured.graph
        if footprint is not None and footprint > self.budget_bytes and graph.has_accelerator:
            chosen = self.below_measured_excess(chosen, footprint)  # the CUDA allocator's reserve above the live bytes
        elif footprint is not None and footprint > self.budget_bytes:
            chosen = self.with_measured_scratch(chosen)
        if chosen.step_footprint is not None and chosen.step_footprint > self.budget_bytes:
            warnings.warn(f"the step holds {self._size(chosen.step_footprint)}, above the budget "
                          f"{self._size(self.budget_bytes)} (the schedule's predicted peak "
                          f"{self._size(chosen.predicted_peak)}: kernels' internal scratch beyond what the graph "
                          "knows); plan with profile=True (capture then measures each kernel's scratch and the "
                          "schedule counts it), or lower the budget by the excess", stacklevel=4)  # the caller of coop.plan
        return chosen

    def below_measured_excess(self, chosen: Candidate, footprint: int, *, modelled: bool = False) -> Candidate:
        """A plan whose measured step holds within the budget: ``chosen`` held ``footprint``, so solve again below its
        live-bytes budget by the excess (or by the footprint's ratio to the budget, whichever is lower:
        :func:`coop.runtime.placement.next_live_budget`), measure, and repeat at most :data:`RESERVED_ROUNDS` times.
        With ``modelled`` the footprints are the CUDA allocator model's predictions (``predict``), not measures.

        Raises InfeasibleError, in one line naming the last measure and the fix, where no round fits (or the aim falls
        below min_budget, or the solver finds nothing there)."""
        budget = self.budget_bytes
        first, live, note = footprint, self.live_bytes, ""
        name = "modelled excess" if modelled else "reserved excess"
        for _ in range(RESERVED_ROUNDS):
            aim = next_live_budget(live, chosen.predicted_peak, footprint, budget)
            if aim < self.floor:
                break
            # A rejected candidate's CUDA graph keeps its private pool reserved while it lives: measured beside the
            # next candidate's, it would count twice (an H200: GPT-2 held 8.3 GB, then 14.0 GB at a lower budget).
            chosen.graph_replay = None
            reason = (f"{self._held(modelled)} {self._size(footprint)} on the device, above the budget "
                      f"{self._size(budget)}: solved below by the excess")
            try:
                candidate = self.as_asked(aim, name=name, reason=reason)
            except (InfeasibleError, SolveTimeoutError, BudgetError):
                break
            measured, note = self._modelled(candidate, aim) if modelled else self._measured(candidate, aim)
            if measured is None or measured <= budget:
                candidate.note = (candidate.note + "; " if candidate.note else "") + (
                    f"re-solved within a live-bytes budget of {self._size(aim)}: the plan solved within "
                    f"{self._size(self.live_bytes)} {self._held(modelled, subject=False)} {self._size(first)} on the "
                    f"device, above the budget {self._size(budget)}; {note}")
                return candidate
            chosen, live, footprint = candidate, aim, measured
        raise InfeasibleError(f"no plan's step stays within the budget {self._size(budget)} once the device's "
                              f"allocator reserves its blocks: the last {self._held(modelled, subject=False)} "
                              f"{self._size(footprint)} at a live-bytes "
                              f"budget of {self._size(live)} (first {self._size(first)}); raise the budget by the "
                              "excess")

    def with_measured_scratch(self, chosen: Candidate) -> Candidate:
        """``chosen`` re-solved on its graph with each op's scratch, measured on ``chosen``'s own replay, as its
        workspace: the planned step fits in memory where an eager one may not, so no unplanned step is run
        (:func:`coop.graph_capture.cost.measure_workspace` over the replay program, each replay node mapped back to
        the graph node it computes). Returns the re-solved plan when its measured step holds within the budget, else
        ``chosen`` (the caller warns)."""
        assert self.flat is not None, "the scratch is measured on the example batch"
        captured = chosen.captured
        with recorded_program():
            measured = measure_workspace(chosen.executor.module, self.flat())
        if not measured:
            return chosen
        scratch: dict[int, int] = {}
        for node in chosen.executor.module.graph.nodes:
            owner = captured.owner_of.get(node.meta.get(SOURCE_NODE, ""))
            if owner is not None and measured.get(node.name, 0) > 0:
                scratch[owner] = max(scratch.get(owner, 0), measured[node.name])
        data = captured.graph.model_dump()
        for node in data["nodes"]:  # on top of what the graph counts already (a multi-output op's later outputs)
            node["workspace"] += scratch.get(node["id"], 0)
        with_scratch = dataclasses.replace(captured, graph=Graph.model_validate(data))
        reason = (f"the step held {self._size(chosen.step_footprint or 0)}, above the budget "
                  f"{self._size(self.budget_bytes)}: solved again with the scratch of {len(scratch)} ops measured on "
                  "its replay as their workspace")
        try:
            again = self.within_generator_states(self.live_bytes, name="measured scratch", reason=reason,
                                                 captured=with_scratch)
        except (InfeasibleError, SolveTimeoutError, BudgetError):
            return chosen
        footprint, held = self._measured(again, self.live_bytes)
        if footprint is None or footprint > self.budget_bytes:
            return chosen
        again.note = (again.note + "; " if again.note else "") + (
            f"re-solved with the scratch of {len(scratch)} ops measured on the first plan's replay as their workspace "
            f"(that plan held {format_memory(chosen.step_footprint or 0, with_scratch.graph)}); {held}")
        return again

    def arena(self) -> Candidate:
        """The plan solved within the highest live-bytes budget whose measured arena footprint fits the budget.

        The live-bytes budget that fits lies in [floor, ceiling): below min_budget no schedule exists, and ceiling
        is the least live budget whose plan overflowed. Each round solves, measures the step, then aims below by
        what the footprint exceeds the budget; where the solver finds nothing (within its time limit) or the aim
        falls below the floor, it bisects instead. Raises InfeasibleError where no round fits."""
        budget = self.budget_bytes
        floor, ceiling, live_budget, last = self.floor, budget + 1, budget, ""
        name, reason = "solve", "the formulation, within the arena budget"
        for _ in range(EXECUTION_ROUNDS):
            try:
                candidate = self._solved(name, reason, live_budget)
            except (InfeasibleError, SolveTimeoutError):
                floor, aim = live_budget + 1, None  # no schedule found at or below it
                reason = f"no schedule within {self._size(live_budget)}: bisecting above it"
            else:
                footprint, last = self._measured(candidate, live_budget)
                if footprint <= budget:
                    candidate.note = (candidate.note + "; " if candidate.note else "") + last
                    candidate.budget = budget  # solved within live_budget; the plan keeps the caller's budget
                    return candidate
                ceiling = min(ceiling, live_budget)
                aim = next_live_budget(live_budget, candidate.predicted_peak, footprint, budget)
                reason = f"the arena footprint {self._size(footprint)} exceeded the budget: solved below by the excess"
            if aim is None or aim < floor:
                aim = (floor + ceiling) // 2
            if not floor <= aim < ceiling:
                break
            live_budget, name = aim, "arena footprint"
        raise InfeasibleError(f"no plan fits an arena budget of {self._size(budget)}: the arena replay's footprint "
                              f"stays above it (last {last or 'none: no schedule to place'}); raise the budget, or "
                              "plan without arena=True")


def replan_within(solve: Callable[[int], Candidate], captured: Captured, budget: int) -> Candidate:
    """One plan within ``budget`` with room for its saved generator states, without measuring (a re-plan inside a
    training loop takes no solver time and runs no extra step).

    Parameters
    ----------
    solve : callable
        ``solve(budget)`` returns a plan within ``budget``.
    captured : Captured
        The step solved for.
    budget : int
        Its live-bytes budget.

    Returns
    -------
    Candidate
        The plan, its ``rounds`` set to the solves taken.

    Raises
    ------
    InfeasibleError
        Where no plan leaves room for the generator states.
    """
    rounds = Rounds(lambda _captured, aim: solve(aim), captured, budget, budget)
    chosen = rounds.within_generator_states(budget, reason="the cheapest fitting baseline, for another training "
                                            "context")
    chosen.rounds = rounds.taken
    return chosen
