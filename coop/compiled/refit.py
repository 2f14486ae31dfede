"""The measured re-solve of ``coop.compile``: compile, measure one step, plan again (issue 41).

:func:`fit_measured` compiles with a shave (bytes the plan keeps below the requested budget; negative: above it),
measures the step on the CPU allocator (or CUDA's reserved bytes), and decides the next round:

* each measured round also profiles one more step on the example batch for what extern kernels allocate inside
  themselves (:mod:`coop.compiled.extern_scratch`), charged as workspace from the next round on (its note says
  what was charged, what matched no node, or why nothing was measured);
* the first round over its budget in inductor's order is compiled again with the kernels in coop's order
  (:mod:`coop.compiled.pin`), where coop.compile's ``pin`` is None (its default): inductor's scheduler can run a
  recomputation early and keep its value live across the step's peak, which neither the plan nor the walk of
  inductor's buffers sees;
* a round over its budget is planned again on what inductor held (:mod:`coop.compiled.observed`) while that
  shows something new (and below the measured excess too where the round itself was planned on such an
  observation: the buffers did not explain the excess), else below the measured excess (the shave grows by it),
  until the held bytes stop
  following the plan down; where the Graph with the values inductor never wrote inlined has no schedule at the
  budget (their readers keep their inputs live: ResNet at 0.7), the next round is planned with every value
  written, what was measured still charged, and so are the rounds after it;
* a round within its budget that recomputes and leaves slack starts the slack rounds (:func:`next_slack_shave`):
  the budget raised by the slack, and after a slack round that missed, raised by the slack less the miss (a
  secant step kept between the largest raise that fitted and the smallest that missed, halving the bracket when
  the step would leave it), each on the observation of the rounds so far (a fitting round's
  buffers too: pinned LLaMA at 0.5 fitted in round 0 with a plan recomputing 1.527 GFLOP, and its slack round,
  on the same Graph, recomputed as much; unpinned, round 1 on the observation recomputed 0.336). They stop when a
  round fits with little slack (unless its buffers show something new: :func:`next_slack_round` plans it once
  more at its own budget on them, and not again once such a round held what the one before it held), a raise
  changes nothing the step held, the bracket is narrower than two :data:`SHAVE_STEP`, or after
  :data:`SLACK_ROUNDS` of them (beyond the ``rounds`` that seek the budget: unpinned LLaMA at 0.5 fitted in its
  second round, and its slack round, the third, missed by 44,812 B).

The round returned is the cheapest of those within the budget (the least predicted recomputation, then the
fewest held bytes). Where none was within it, :class:`coop.errors.OverBudgetError` is raised, naming the least held
bytes and carrying that round's step (``compiled``): no step over its budget is returned as if it met it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch._dynamo.exc import BackendCompilerFailed

from coop.budget import min_budget
from coop.compiled.extern_scratch import match_calls, scratch_note
from coop.compiled.measure import extern_calls, held_bytes, step_seconds, warm_up
from coop.compiled.observed import Observation, observe_round
from coop.compiled.record import CompiledRecord, CompileRound
from coop.errors import CoopError, OverBudgetError
from coop.formulations.core.progress import StageProgress

if TYPE_CHECKING:
    from coop.compiled.partitioner import CompiledPlan

__all__ = ["NOTHING_TO_BUY_BACK", "SHAVE_STEP", "SLACK_ROUNDS", "CompileRound", "SlackPoint", "buys_back",
           "fit_measured", "held_follows_the_plan", "next_slack_round", "next_slack_shave"]

#: the smallest shave step worth another compile
SHAVE_STEP = 64 * 1024
#: a predicted recomputation overhead no slack round buys back (a store-all schedule's is float noise: BERT of
#: bench_compile planned store-all at 1.07 of its peak with 2.6e-16, and a third round was compiled for it)
NOTHING_TO_BUY_BACK = 1e-4
#: at most this many slack rounds after the first round within the budget, beyond ``rounds`` (fewer when
#: ``rounds`` is smaller: ``rounds - 1``)
SLACK_ROUNDS = 2


@dataclass(frozen=True)
class SlackPoint:
    """One round of the slack phase: how far its plan's budget was raised above the requested one, and what the
    step then held beyond the requested budget (negative: the slack it left)."""

    raised: int
    excess: int


def next_slack_shave(points: list[SlackPoint], requested: int, recomputes: bool) -> int | None:
    """The shave of the next slack round, or None when the slack phase is done.

    The first point is the round that fitted first; every later one a slack round (module docstring). The next
    raise is the last raise plus the last slack, or less the last miss and a shave step, kept inside the bracket
    (at least :data:`SHAVE_STEP` above the largest raise that fitted, below the smallest that missed), else the
    bracket's middle; a raise already tried ends the phase.

    Parameters
    ----------
    points : list of SlackPoint
        The slack phase so far, oldest first.
    requested : int
        The requested budget in bytes (the slack that is not worth a round: 2 % of it, at least SHAVE_STEP).
    recomputes : bool
        Whether the last round's plan recomputes anything (a plan that does not has nothing to buy back).

    Returns
    -------
    int or None
        The next round's shave (minus its raise), or None.

    >>> next_slack_shave([SlackPoint(0, -1_000_000)], 10_000_000, True)  # a fit leaving 1 MB: raise by it
    -1000000
    >>> next_slack_shave([SlackPoint(0, -1_000_000), SlackPoint(1_000_000, 200_000)], 10_000_000, True)  # less the miss
    -734464
    >>> next_slack_shave([SlackPoint(0, -100_000)], 10_000_000, True) is None  # 1 % slack: not worth a round
    True
    """
    last = points[-1]
    if len(points) > 1 and last.excess == points[-2].excess:
        return None  # the raise changed nothing the step held: the solver gave the same plan
    worth = max(SHAVE_STEP, requested // 50)
    if last.excess <= 0 and (not recomputes or -last.excess <= worth):
        return None
    fitted = max((p.raised for p in points if p.excess <= 0), default=None)
    missed = min((p.raised for p in points if p.excess > 0), default=None)
    if fitted is None:
        return None  # no slack round without a round that fitted
    # after a miss, one shave step further down: a secant step lands on the budget itself, and the held bytes
    # scatter around it (pinned LLaMA at 0.5: raised 835,000 B, missed by 291,596; raised 543,716, missed by 6,924)
    proposal = last.raised - last.excess - (SHAVE_STEP if last.excess > 0 else 0)
    upper = missed if missed is not None else proposal + 2 * SHAVE_STEP
    if upper - fitted < 2 * SHAVE_STEP:
        return None
    if not fitted + SHAVE_STEP <= proposal < upper:
        proposal = (fitted + upper) // 2
    if any(proposal == p.raised for p in points):
        return None
    return -proposal


def buys_back(overhead: float) -> bool:
    """Whether a plan's predicted recomputation ``overhead`` (a fraction of the step) leaves a slack round anything
    to buy back: more than :data:`NOTHING_TO_BUY_BACK`.

    >>> buys_back(0.0225), buys_back(2.6e-16), buys_back(0.0)
    (True, False, False)
    """
    return overhead > NOTHING_TO_BUY_BACK


def next_slack_round(points: list[SlackPoint], requested: int, recomputes: bool,
                     observed_new: bool) -> tuple[int, str] | None:
    """The next slack round's shave and reason, or None: :func:`next_slack_shave`, and when it has none, a round
    that fitted and recomputes is planned once more at its own budget if its buffers showed something new.

    A Graph rebuilt on what inductor kept (:mod:`coop.compiled.observed`: values never written cost no bytes) can
    admit a cheaper schedule at the same budget: pinned LLaMA at 0.5 fitted in round 0 with 11,999,848 B planned,
    11,979,348 B held (31 kB of slack, too little to raise) and 1.527 GFLOP recomputed, where unpinned, round 1 on
    the observation recomputed 0.336 GFLOP at that budget (bench_compile, 2026-11-29).

    Parameters
    ----------
    points, requested, recomputes
        As :func:`next_slack_shave` takes them.
    observed_new : bool
        Whether the last round's buffers give an observation the round was not planned on (the next round is
        planned on it).

    Returns
    -------
    tuple of (int, str) or None
        The shave and the reason the round summary gives.

    >>> next_slack_round([SlackPoint(0, -31_000)], 12_010_820, True, True)
    (0, "planned again at the fitting round's budget on the buffers inductor kept")
    >>> next_slack_round([SlackPoint(0, -31_000)], 12_010_820, True, False) is None
    True
    >>> next_slack_round([SlackPoint(0, -31_000), SlackPoint(0, -31_000)], 12_010_820, True, True) is None
    True
    """
    following = next_slack_shave(points, requested, recomputes)
    last = points[-1]
    if following is None:
        # a round planned again on the buffers that held what the round before it held, at the same raise, planned
        # the same split: another observation would too (bench_compile's ViT at 0.9, 2026-12-01: three rounds of
        # 49,543,256 B planned, 51,228,456 B held)
        same_again = len(points) > 1 and last == points[-2]
        if observed_new and recomputes and last.excess <= 0 and not same_again:
            return -last.raised, "planned again at the fitting round's budget on the buffers inductor kept"
        return None
    reason = ("planned again with the slack the step left (less recomputation)" if last.excess <= 0 else
              f"planned again with the slack less the last round's miss ({last.excess:,} B) and a shave step")
    return following, reason + (", on the buffers inductor kept" if observed_new else "")


@dataclass
class _Attempt:
    compiled: nn.Module
    record: CompiledRecord
    held: int
    #: how attempts compare (lower is better): within the budget before over it, then recomputation or held bytes
    rank: tuple[int, float, float] = (1, 0.0, 0.0)
    #: its index among the rounds (``CompiledRecord.rounds``)
    index: int = 0


def fit_measured(compile_with: Callable[[int, Observation | None, int | None], nn.Module], batch: Any,
                 loss_fn: Callable[[Any], torch.Tensor] | None, rounds: int,
                 pin_after_miss: Callable[[], str | None] | None = None,
                 progress: StageProgress | None = None) -> nn.Module:
    """Compile, measure one step, and while it holds more than its budget, or fits leaving slack, plan again.

    Each round's step is measured after :func:`coop.compiled.measure.warm_up` (the plan judged is the one compiled
    last, which the steps run); it holds what the meter measured (the CPU allocator's peak, or CUDA's reserved
    bytes), caller-owned values added. The walk of inductor's buffers (:attr:`CompileRound.observed_peak`) reads the
    kernels before inductor's ``reorder_for_peak_memory`` moves them, so it can be above what the step holds (ViT at
    0.7: 36,457,464 B held, the walk above the budget of 37,414,977 B): it says what to plan on, not whether a round
    met its budget. With ``pin_after_miss`` (called once: the compilations after it run the kernels in coop's
    order, :mod:`coop.compiled.pin`, and without inductor's channels-last layout where coop.compile switches it too;
    it returns the reason's words for what it switched, None for the pin alone), the first round in inductor's order
    that misses its budget is planned again at the same shave in coop's order, on what was measured of the extern
    kernels' scratch only; unless it ran with the channels-last layout and missed by no more than the layout's copies
    of caller-owned convolution inputs (``CompiledPlan.layout_copies``): then, once, the next round keeps inductor's
    order and layout and is planned below what the step held above its plan. Why the pin: inductor's
    scheduler had moved a recomputation off coop's schedule (the tied MLP of tests/test_compile_observed.py at 0.5,
    2026-11-30: ``reorder_for_peak_memory`` ran the backward's recomputed ``x @ w`` six kernels before its reader,
    its 262,144 B live across the backward's peak; a plan of 2,266,884 B held 2,516,488 B in inductor's order, where
    the walk, which reads the order before that pass, said 2,262,532 B, and 2,266,888 B in coop's order). A round that misses its budget otherwise is planned again on what inductor held in it and the
    rounds before (the values it never wrote inlined into their readers, its temporaries and fused kernels' overlaps
    charged), at the same shave, while the observation shows something new; when it shows nothing new, the shave
    grows by the round's excess over the budget. A re-solve that finds no schedule below it is tried once more
    halfway between the last shave that planned and the one that did not. After the first round within the budget
    come the slack rounds (:func:`next_slack_shave`). At most ``rounds`` compilations seek the budget (the round
    whose inlined Graph has no plan is not one of them: it compiles nothing; nor is the miss in inductor's order
    that switched to coop's: it measured inductor's scheduler, not a plan seeking the budget in the order run) and
    ``min(SLACK_ROUNDS, rounds - 1)`` more use the slack; the module docstring says which is returned (with its own record:
    torch.compile's wrappers of one model share their attributes). ``progress`` hears a line as each round starts
    (with its reason) and one with what its step held. The returned step is timed
    (:func:`coop.compiled.measure.step_seconds`) into its plan's ``step_s``, of which the plan's predicted overhead is
    also given as a share (``CompiledPlan.overhead_of_step``).
    """
    progress = progress or StageProgress(None)
    state = _Rounds(rounds=rounds, pin_after_miss=pin_after_miss)
    for _ in range(rounds + state.slack_rounds + 2):  # + the refused round and the switched one
        progress.stage(f"round {len(state.history)}: compiling and measuring the step ({state.reason})")
        compiled = compile_with(state.shave, state.observation, state.requested)
        record: CompiledRecord = compiled.coop_record
        record.rounds = state.history
        part = record.partitioner
        try:
            compiled_steps = warm_up(compiled, batch, loss_fn, lambda plans=part.plans: len(plans))
            measured = held_bytes(compiled, batch, loss_fn)
        except (BackendCompilerFailed, CoopError) as exc:
            inner = exc.inner_exception if isinstance(exc, BackendCompilerFailed) else exc
            if not isinstance(inner, CoopError) or state.best is None:
                raise inner from None
            if state.after_refusal(part, inner):
                continue
            break
        if not part.plans:
            raise CoopError(_ran_without_coop())
        if (compiled_steps[-1] if compiled_steps else len(part.plans)) != 1 or measured is None:
            return compiled  # graph breaks (several graphs) or a running profiler: nothing to compare
        plan = part.plans[-1]  # the graph compiled last is the one the steps run (measure.warm_up)
        held = measured + plan.joint.graph.caller_owned_bytes
        progress.stage(f"round {len(state.history)}: the step held {held:,} B against {plan.requested:,} B ("
                       + ("within" if held <= plan.requested else f"{held - plan.requested:,} B over") + ")")
        state.history.append(_measured_round(record, plan, state.shave, held, state.reason, state.observation))
        scratch = _measured_scratch(compiled, batch, loss_fn, plan, state.history[-1])
        state.requested, state.planned_shave = plan.requested, state.shave
        state.keep_if_best(compiled, record, plan, held)
        if state.slack or held <= plan.requested:
            going_on = state.after_fit(record, plan, scratch, held)
        else:
            going_on = state.after_miss(record, plan, scratch, held)
        if not going_on:
            break
    best = state.best
    assert best is not None
    best.compiled.coop_record = best.record  # the wrappers share the model's attributes: its own record back
    if best.held > best.record.plans[-1].requested:
        raise _over_budget(best)
    best.record.plans[-1].step_s = step_seconds(best.compiled, batch, loss_fn)
    progress.stage(f"coop.compile ready: round {best.index} of {len(best.record.rounds)}, held {best.held:,} B against "
                   f"{best.record.plans[-1].requested:,} B", final=True)
    return best.compiled


@dataclass
class _Rounds:
    """:func:`fit_measured`'s state between rounds, and its decisions after each (the module docstring's rules):
    the next round's shave, observation and reason, or the end."""

    rounds: int
    pin_after_miss: Callable[[], str | None] | None
    history: list[CompileRound] = field(default_factory=list)
    best: _Attempt | None = None
    shave: int = 0
    planned_shave: int = 0
    observation: Observation | None = None
    #: the first round's budget in bytes, kept by the later rounds
    requested: int | None = None
    #: the slack phase: from the first round within the budget on
    slack: list[SlackPoint] = field(default_factory=list)
    #: once a Graph with inlined values had no plan, later rounds inline nothing
    keep_writing: bool = False
    reason: str = "first plan"
    #: a miss that inductor's channels-last copies explain was planned below once
    copies_shaved: bool = False
    #: the rounds whose inlined Graph had no plan: they compiled nothing, so they are not of ``rounds``
    refused: int = 0
    #: once a miss in inductor's order switched the rounds to coop's: that round measured inductor's scheduler, not
    #: coop's plan, so it is not of ``rounds`` (bench_compile's BERT at 0.5, 2026-12-01: round 0 in inductor's order
    #: 3.6 MB over, round 1 pinned 0.45 MB over, round 2 on its buffers 176,644 B over, and no round was left to plan
    #: below that excess)
    switched: bool = False

    @property
    def seeking(self) -> int:
        """The rounds so far that count against ``rounds``."""
        return len(self.history) - self.refused - int(self.switched)

    @property
    def slack_rounds(self) -> int:
        """At most this many slack rounds (``rounds=1``: one compilation, none)."""
        return min(SLACK_ROUNDS, self.rounds - 1)

    def keep_if_best(self, compiled: nn.Module, record: CompiledRecord, plan: CompiledPlan, held: int) -> None:
        """Keep the round just measured if it ranks best: within the budget, the least recomputation wins; over it,
        the least held."""
        overhead = self.history[-1].overhead
        within = held <= plan.requested
        attempt = _Attempt(compiled, record, held, (0, overhead, held) if within else (1, held, overhead),
                           len(self.history) - 1)
        if self.best is None or attempt.rank < self.best.rank:
            self.best = attempt

    def after_refusal(self, part: Any, inner: CoopError) -> bool:
        """After a round whose re-solve found no plan: whether another round follows (set up here)."""
        self.history.append(CompileRound(shave=self.shave, budget=part.last_budget or 0, predicted_peak=0,
                                         measured_peak=None, floor=part.last_floor,
                                         reason=f"no plan below the measured excess ({str(inner)[:160]})"))
        if self.observation is not None and self.observation.inline and not self.slack:
            # the values the last step never wrote keep their readers' inputs live: a Graph without them (what was
            # measured still charged) may fit where that one has no schedule (ResNet at 0.7: its min_budget was
            # above the budget in every process measured, so this round plans nothing and leaves the rounds that
            # seek the budget to the Graph that can)
            self.observation, self.keep_writing = replace(self.observation, inline=frozenset()), True
            self.refused += 1
            self.reason = ("planned again on the measured scratch and temporaries, every value written (the Graph "
                           "with the unwritten values inlined has no plan at this budget)")
            return True
        if (self.slack or self.shave - self.planned_shave < 2 * SHAVE_STEP
                or self.seeking >= self.rounds):
            return False
        self.shave = (self.planned_shave + self.shave) // 2
        return True

    def after_fit(self, record: CompiledRecord, plan: CompiledPlan, scratch: dict[str, int], held: int) -> bool:
        """After a round within the budget, or any round of the slack phase: whether a slack round follows."""
        self.slack.append(SlackPoint(raised=-self.shave, excess=held - plan.requested))
        seen = _observe(record, plan, self.observation, scratch, self.keep_writing)
        new = seen is not None and seen != self.observation
        # the moves of inline_saved recompute by choice, not for want of bytes: no slack round buys them back
        following = next_slack_round(self.slack, plan.requested, buys_back(plan.solver_overhead), new)
        if following is None or len(self.slack) > self.slack_rounds:
            return False
        self.shave, self.reason = following
        self.observation = seen if new else self.observation
        return True

    def after_miss(self, record: CompiledRecord, plan: CompiledPlan, scratch: dict[str, int], held: int) -> bool:
        """After a round over its budget before any fitted: whether another round seeks the budget."""
        if self.seeking >= self.rounds:
            return False
        copies_round = (None if self.pin_after_miss is None or self.copies_shaved
                        else _below_the_copies(record, plan, self.shave, held))
        if copies_round is not None:  # once; a miss after it switches as below
            self.copies_shaved = True
            self.shave, self.reason = copies_round
            self.observation = _measured_only(self.observation, scratch)
            return True
        if self.pin_after_miss is not None:
            # inductor's scheduler moved coop's order (a recomputation fused into, or reordered to, an early kernel),
            # or its channels-last layout copied caller-owned inputs no plan holds: its own order and layout missed
            # the budget, so the rounds after it are coop's (pinned order, layout off where the switch says so),
            # planned afresh on what was measured (the buffers seen in another order are not this order's)
            words = self.pin_after_miss() or "with the kernels in coop's order"
            self.pin_after_miss, self.switched = None, True
            self.observation = _measured_only(self.observation, scratch)
            self.reason = f"planned again {words} (inductor's held {held - plan.requested:,} B over)"
            return True
        following = _next_missed_round(record, plan, self.history, self.observation, scratch, self.keep_writing,
                                       self.shave, held)
        if following is None:
            return False
        self.shave, self.observation, self.reason = following
        return True


def _measured_round(record: CompiledRecord, plan: CompiledPlan, shave: int, held: int, reason: str,
                    observation: Observation | None) -> CompileRound:
    """The record of a round whose step was measured: its plan, what it held, and how it was compiled."""
    return CompileRound(shave=shave, budget=plan.budget, predicted_peak=plan.peak, measured_peak=held, reason=reason,
                        observed_peak=record.observed_peak(plan),
                        inlined=0 if observation is None else len(observation.inline), overhead=plan.overhead,
                        pinned=record.pin is not None, layout_optimization=record.layout_optimization,
                        horizontal_fusion=record.horizontal_fusion, addmm_folds=record.addmm_folds)


def _next_missed_round(record: CompiledRecord, plan: CompiledPlan, history: list[CompileRound],
                       observation: Observation | None, scratch: dict[str, int], keep_writing: bool, shave: int,
                       held: int) -> tuple[int, Observation | None, str] | None:
    """After a round over its budget: the next round's shave, observation and reason, or None to stop.

    On what the round's buffers showed that is new (and below the measured excess too where the round itself was
    planned on an observation), else below the measured excess while the held bytes follow the plan down and the
    budget is above the Graph's floor (:func:`fit_measured`).
    """
    following = _observe(record, plan, observation, scratch, keep_writing)
    if following is not None and following != observation:
        if observation is None:
            return shave, following, "planned again on the buffers inductor kept"
        # planned on what an earlier round showed and still over: the buffers do not explain the excess, so the
        # next round also plans below it (BERT at 0.5 with eager's draws, 2026-11-30: three rounds on new buffers,
        # each over by 1.0-1.2 MB, none shaved)
        return (_below_the_excess(plan, shave, held, min_budget(plan.joint.graph)), following,
                "planned again on the buffers inductor kept and below the measured excess")
    if not held_follows_the_plan(history):
        history[-1].reason += "; the held bytes did not follow the plan down: the excess is held outside it"
        return None
    floor = min_budget(plan.joint.graph)
    if plan.budget <= floor:
        return None
    return _below_the_excess(plan, shave, held, floor), observation, "planned again below the measured excess"


def _below_the_excess(plan: CompiledPlan, shave: int, held: int, floor: int) -> int:
    """The shave that plans the next round below what this one held over its budget, never below the floor."""
    return min(shave + held - plan.requested, plan.requested - floor)


def _below_the_copies(record: CompiledRecord, plan: CompiledPlan, shave: int, held: int) -> tuple[int, str] | None:
    """After a miss in inductor's channels-last layout by no more than its copies of caller-owned convolution inputs
    (:mod:`coop.compiled.layout_copies`): the next round's shave and reason, planned in inductor's order and layout
    (faster than coop's order without it: bench_compile's ViT at its compiler's held bytes at 0.9, 169.14 ms pinned
    against 154.94 ms for the compiler, 2026-12-01) below what the step held above its plan's predicted peak (the
    copies hold the same bytes whatever the plan: ViT's first round held 1,685,200 B above its prediction and its
    next, planned 1,141,968 B lower, 1,685,200 B again, 27,088 B over). None where the round ran without the layout,
    missed by more than the copies, or the Graph's floor leaves no room (a round clamped to it would miss alike)."""
    if not record.layout_optimization or held - plan.requested > plan.layout_copies:
        return None
    below = max(shave + held - plan.requested, held - plan.peak)
    if below > plan.requested - min_budget(plan.joint.graph):
        return None
    return below, (f"planned again {held - plan.peak:,} B below the budget, what the step held above its plan "
                   f"({held - plan.requested:,} B over the budget, no more than inductor's channels-last copies of "
                   f"the caller-owned convolution inputs: {plan.layout_copies:,} B)")


def _measured_only(observation: Observation | None, scratch: dict[str, int]) -> Observation | None:
    """What was measured of the extern kernels' scratch (this round's and ``observation``'s), without the buffers
    observed; None when nothing was."""
    kept = Observation(scratch=() if observation is None else observation.scratch).with_scratch(scratch)
    return kept if kept.scratch else None


def _observe(record: CompiledRecord, plan: CompiledPlan, previous: Observation | None,
             scratch: dict[str, int], keep_writing: bool = False) -> Observation | None:
    """The observation of ``plan``'s compiled graphs and the extern kernels' measured ``scratch`` joined with
    ``previous`` (with ``keep_writing``, no value inlined); None when the graphs were not observed and nothing was
    charged before or now."""
    observed = record.observed_graphs(plan)
    if observed is None:
        if previous is None and not scratch:
            return None
        return (previous or Observation()).with_scratch(scratch)
    forward, backward = observed
    computed = set(plan.partition.forward_counts) | set(plan.partition.backward_counts)
    seen = observe_round(plan.joint.graph, plan.joint.lowered.fx_names, computed, forward, backward, previous)
    return replace(seen.with_scratch(scratch), inline=frozenset()) if keep_writing else seen.with_scratch(scratch)


def _measured_scratch(compiled: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
                      plan: CompiledPlan, measured_round: CompileRound) -> dict[str, int]:
    """Owner fx name -> the scratch the extern kernels computing it took on one more real step of ``compiled``.

    The step's calls are matched to ``plan``'s forward and backward modules (:mod:`coop.compiled.extern_scratch`)
    and each joint value to its owner in ``plan``'s lowering; what was charged, what matched nothing, or why
    nothing was measured is added to ``measured_round``'s reason.
    """
    calls = extern_calls(compiled, batch, loss_fn)
    if calls is None or len(calls) != 2:
        measured_round.reason += "; " + scratch_note(None, None if calls is None else len(calls))
        return {}
    match = match_calls(calls, list(plan.partition.call_sites))
    lowered = plan.joint.lowered
    owners: dict[str, int] = {}
    for name, nbytes in match.charged.items():
        node_id = lowered.owner_of.get(name)
        if node_id is None:  # a value the round's Graph has no node for
            match.unmatched.append((name, nbytes))
            continue
        owner = lowered.fx_names[node_id][0]
        owners[owner] = max(owners.get(owner, 0), nbytes)
    match.charged = owners
    measured_round.reason += "; " + scratch_note(match, len(calls))
    return owners


def held_follows_the_plan(history: list[CompileRound]) -> bool:
    """Whether the last two measured rounds' held bytes fell by at least a quarter of their plans' predicted fall.

    A re-solve lowers the plan's peak; when the step's held bytes stay where they were, the excess is in buffers
    the compiled code keeps outside coop's graph, and shaving the budget further only buys recomputation. With
    fewer than two measured rounds, or when the last one was the first planned on an observation (another Graph,
    whose predictions do not compare with the round before), there is nothing to compare.

    Parameters
    ----------
    history
        The re-solve's rounds so far, oldest first; rounds that measured nothing are skipped.

    >>> first = CompileRound(shave=0, budget=100, predicted_peak=100, measured_peak=130, reason="first plan")
    >>> held_follows_the_plan([first, CompileRound(40, 60, 60, 128, "again")])
    False
    >>> held_follows_the_plan([first, CompileRound(40, 60, 60, 100, "again")])
    True
    """
    measured = [r for r in history if r.measured_peak is not None]
    if len(measured) < 2:
        return True
    before, after = measured[-2], measured[-1]
    if (before.inlined == 0) != (after.inlined == 0) or before.pinned != after.pinned:
        return True
    predicted_fall = before.predicted_peak - after.predicted_peak
    held_fall = before.measured_peak - after.measured_peak
    return predicted_fall <= 0 or 4 * held_fall >= predicted_fall


def _ran_without_coop() -> str:
    """The one line for a measured step that never reached coop's partitioner.

    Dynamo keeps at most ``recompile_limit`` compilations per function; each ``torch.compile`` of the same model
    with another backend or options takes one more, and past the limit the function runs eagerly, without a
    word at the default log level. A step that ran that way holds what eager holds, whatever the plan.
    """
    limit = torch._dynamo.config.recompile_limit
    return ("coop.compile: the measured step never reached coop's partitioner (dynamo ran the forward eagerly; most "
            f"often its recompile_limit, {limit}, was reached by earlier compilations of this model): call "
            "torch._dynamo.reset() before coop.compile or raise torch._dynamo.config.recompile_limit")


def _over_budget(best: _Attempt) -> OverBudgetError:
    """The refusal when no measured step met its budget, with the numbers and the step that held least."""
    record = best.record
    requested = record.plans[-1].requested
    outside = not held_follows_the_plan(record.rounds)
    floor = _floor_reached(record.rounds)
    if floor is not None:
        fix = (f"planned below the excess, the Graph with what was measured charged reached its floor ({floor:,} B) "
               "and had no schedule there: give a larger budget by the excess")
    elif outside:
        fix = ("the excess is held outside the plan (the held bytes did not fall with the planned peak): give a budget "
               "larger by the excess")
    else:
        fix = "give a larger budget, more time_limit or more rounds"
    return OverBudgetError(f"coop.compile: the compiled step held at least {best.held:,} B against its budget "
                           f"{requested:,} B ({best.held - requested:,} B over) in {len(record.rounds)} rounds (plans "
                           f"down to {min(p.budget for p in record.plans):,} B); {fix}, or take the step that held "
                           "least from this error's .compiled", held=best.held, budget=requested,
                           compiled=best.compiled, floor=floor)


def _floor_reached(rounds: list[CompileRound]) -> int | None:
    """The floor of the last round that was planned at its Graph's floor (the shave below the excess went under it)
    and found no schedule there; None when no round did."""
    return next((r.floor for r in reversed(rounds) if r.measured_peak is None and r.floor is not None
                 and r.budget == r.floor), None)
