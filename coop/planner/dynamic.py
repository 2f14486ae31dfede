"""``coop.plan(..., formulation="dynamic")``: a plan whose every step runs under online eviction.

The engine that runs tensors under eviction is the runtime's (:func:`coop.runtime.fallback.run_dynamic`);
this module is the plan around it: the same face as a static plan (:class:`BasePlan`), the same
write-back, and the same re-plan for another training context or another batch shape.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from coop.budget import parse_budget
from coop.graph_capture import Captured
from coop.graph_capture.context import TrainingContext
from coop.online.policies import EvictionPolicy
from coop.planner.base import BasePlan, LossFn, batch_key
from coop.runtime.fallback import DynamicStats, run_dynamic


class DynamicPlan(BasePlan):
    """Every step runs the captured program op by op, evicting by ``policy`` within ``budget``.

    ``step(*batch)`` returns the loss, accumulates gradients into ``.grad`` as ``backward()``
    would and writes new buffer values (BatchNorm statistics) into the model. A batch of other
    shapes is captured again for it, with a warning, like another training context.
    ``last_stats`` holds the last step's evictions, recomputations and arena measurements.
    """

    def __init__(self, captured: Captured, model: nn.Module, budget: int | str | float,  # noqa: PYI041
                 policy: str | EvictionPolicy = "coop", replay_random: bool = True, *, wrapper: nn.Module | None = None,
                 loss_fn: LossFn | None = None) -> None:
        super().__init__(model, captured, parse_budget(budget, captured.graph), loss_fn=loss_fn, wrapper=wrapper)
        self.policy = policy
        self.replay_random = replay_random
        self.last_stats: DynamicStats | None = None

    @property
    def formulation(self) -> str:  # type: ignore[override]
        return f"dynamic ({self.policy_name})"

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else type(self.policy).__name__

    @property
    def predicted_peak(self) -> None:
        """None: evictions are decided while the step runs; the arena never holds more than ``budget``."""
        return None

    def summary(self) -> dict[str, Any]:
        """Budget, baseline peak and the last step's eviction statistics."""
        stats = self.last_stats
        return {
            **super().summary(),
            "last_step": None if stats is None else {k: v for k, v in vars(stats).items() if not k.startswith("_")},
        }

    def _change(self, current: TrainingContext, batch: tuple[torch.Tensor, ...]) -> str:
        """The context's difference and, unlike a static plan's, a batch of other shapes."""
        change = super()._change(current, batch)
        if batch_key(batch) != tuple(self.captured.batch_shapes):
            shapes = [list(shape or ()) for shape, _ in batch_key(batch)]
            planned = [list(shape) for shape, _ in self.captured.batch_shapes]
            change = "; ".join(filter(None, [change, f"the batch has shapes {shapes}, the plan was made for {planned}"]))
        return change

    def _run(self, batch: tuple[torch.Tensor, ...]) -> list[Any]:
        outputs, self.last_stats = run_dynamic(self.captured, self.model, batch, self.budget, self.policy,
                                                replay_random=self.replay_random)
        return outputs

    def _replan(self, captured: Captured, change: str) -> tuple[BasePlan, str]:
        other = DynamicPlan(captured, self.model, self.budget, self.policy, self.replay_random, wrapper=self.wrapper,
                            loss_fn=self.loss_fn)
        return other, f"online eviction ({self.policy_name} policy)"
