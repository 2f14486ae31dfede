"""What ``coop.compile`` records: each compilation of the measured re-solve (:class:`CompileRound`) and the record
attached to the compiled module (:class:`CompiledRecord`), which :mod:`coop.compiled.refit` fills and
:mod:`coop.compiled.api` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coop.compiled.inductor_buffers import BufferObserver, ObservedGraph, step_peak
from coop.compiled.order import KeepMatmulsInPlace
from coop.compiled.partitioner import CompiledPlan, CoopPartitioner
from coop.compiled.pin import PinScheduleOrder

__all__ = ["CompileRound", "CompiledRecord"]


@dataclass
class CompileRound:
    """One compilation of the measured re-solve: the shave it planned with and what the step then held."""

    shave: int
    budget: int
    predicted_peak: int
    measured_peak: int | None
    reason: str
    #: the step's peak from the buffers inductor's generated code keeps (:mod:`coop.compiled.inductor_buffers`),
    #: caller-owned values included as in ``measured_peak``; None when no compiled graph was observed
    observed_peak: int | None = None
    #: how many values the round's Graph inlined from earlier rounds' buffers (:mod:`coop.compiled.observed`)
    inlined: int = 0
    #: the plan's predicted recomputation overhead (a fraction of the step's cost; how the rounds within the budget
    #: are ranked); None when nothing was planned
    overhead: float | None = None
    #: whether the round's kernels ran in coop's order (:mod:`coop.compiled.pin`)
    pinned: bool = False
    #: whether the round ran with inductor's layout optimization (channels-last convolutions)
    layout_optimization: bool = False
    #: whether the round ran with inductor's horizontal fusion (independent kernels joined)
    horizontal_fusion: bool = False
    #: whether the round ran inductor's ``addmm`` folds (coop's matmul keeper not installed, :mod:`coop.compiled.order`)
    addmm_folds: bool = False
    #: the floor (``min_budget``) of the Graph the round was planned on, what was measured charged; set where the
    #: round found no schedule (its ``budget`` then is what it was planned at, the floor where the shave went below it)
    floor: int | None = None


@dataclass
class CompiledRecord:
    """What ``coop.compile`` did, attached to the compiled module as ``coop_record``."""

    partitioner: CoopPartitioner
    rounds: list[CompileRound] = field(default_factory=list)
    #: the kernels and buffers inductor generated for each compiled graph (None: the user set their own
    #: ``_post_fusion_custom_pass``, which coop leaves in place)
    buffers: BufferObserver | None = None
    #: the post-grad pass that keeps coop's products where the schedule put them (None: the user set their own
    #: ``post_grad_custom_post_pass``, which coop leaves in place; :mod:`coop.compiled.order`)
    order: KeepMatmulsInPlace | None = None
    #: the scheduler pass that runs the kernels in coop's order (None: the user set their own
    #: ``_post_fusion_custom_pass``, or the round ran in inductor's order; :mod:`coop.compiled.pin`)
    pin: PinScheduleOrder | None = None
    #: whether inductor's layout optimization (channels-last convolutions) was on for this compilation
    #: (:func:`coop.compiled.api.compile`: on until a measured round misses its budget, where the user left it)
    layout_optimization: bool = False
    #: whether inductor's horizontal fusion was on for this compilation (on until a measured round misses its
    #: budget, where the user left its threshold)
    horizontal_fusion: bool = False
    #: whether inductor's ``addmm`` folds stayed (no matmul keeper: a measured round before any miss)
    addmm_folds: bool = False

    def observed_graphs(self, plan: CompiledPlan) -> tuple[ObservedGraph, ObservedGraph] | None:
        """``plan``'s observed forward and backward; None until both were compiled (the backward compiles at the
        first backward) or where nothing is observed."""
        if self.buffers is None:
            return None
        forward, backward = self.buffers.of(plan.joint.graph.name)
        return None if forward is None or backward is None else (forward, backward)

    def observed_peak(self, plan: CompiledPlan) -> int | None:
        """The peak of ``plan``'s forward and backward from the buffers inductor keeps, caller-owned values
        included; None where they were not observed (:meth:`observed_graphs`)."""
        observed = self.observed_graphs(plan)
        if observed is None:
            return None
        forward, backward = observed
        return step_peak(forward, backward, len(plan.partition.saved)) + plan.joint.graph.caller_owned_bytes

    @property
    def plans(self) -> list[CompiledPlan]:
        return self.partitioner.plans

    def summary(self) -> str:
        lines = [plan.summary() for plan in self.plans] or ["no graph planned yet (the model has not run)"]
        for number, r in enumerate(self.rounds):
            measured = "not measured" if r.measured_peak is None else f"measured {r.measured_peak:,} B"
            observed = "" if r.observed_peak is None else f" (inductor's buffers: {r.observed_peak:,} B)"
            if r.inlined:
                observed += f"; {r.inlined} values inlined as observed"
            if r.overhead is not None:
                observed += f"; recomputation {100 * r.overhead:.2f} % predicted"
            if r.pinned:
                observed += "; kernels in coop's order"
            if r.layout_optimization:
                observed += "; inductor's channels-last layout"
            if r.horizontal_fusion:
                observed += "; horizontal fusion"
            if r.addmm_folds:
                observed += "; inductor's addmm folds"
            lines.append(f"round {number}: {r.reason}; budget {r.budget:,} B (shave {r.shave:,} B), predicted "
                         f"{r.predicted_peak:,} B, {measured}{observed}")
        lines.append(self.pin.describe() if self.pin is not None else "kernels in inductor's order (not pinned)")
        timed = [plan for plan in self.plans if plan.overhead_of_step is not None]
        if timed:
            plan = timed[-1]
            lines.append(f"the step ran {1000 * plan.step_s:.2f} ms (median of the timed steps); its recomputation "
                         f"{100 * plan.overhead_of_step:.2f} % of the step without it, predicted")
        return "\n".join(lines)
