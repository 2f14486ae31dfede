"""``coop.plan(..., formulation="dynamic")``: a plan that evicts online, and decides once per shape.

The engine that runs tensors under eviction is the runtime's (:func:`coop.runtime.fallback.run_dynamic`);
this module is the plan around it: the same face as a static plan (:class:`BasePlan`), the same
write-back, and the same re-plan for another training context or another batch shape.

On a static graph the online engine's decisions are the same every step, so the first step's are
recorded as a schedule (the computes it executed, recomputations included), checked by the one
validator within the budget, and replayed by the static executor from the second step on: later
steps pay no host time for eviction decisions. A batch of other shapes is captured again and its
plan records its own first step (``record=False`` keeps every step online).

With ``policy="delta"`` (DELTA: swap or recompute, priced on a device profile's host link) the first step
makes real copies to the host tier and records them as page steps; the static executor replays them with
the same paging functions. On a step whose values all live on the CPU the host tier is a
:class:`coop.runtime.paging.HostPool` made with the plan, sized to the host bytes the simulator predicts for
the graph and budget (:func:`coop.online.delta_sim.simulate_delta`, whose decisions the step repeats), and
shared by the online step and its replays: the step itself allocates device-tier memory only.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from coop.budget import below_min_budget, min_budget, parse_budget
from coop.device_profiles import DeviceProfile
from coop.errors import BudgetError, CoopError
from coop.graph_capture import Captured
from coop.graph_capture.batch import Batch
from coop.graph_capture.context import TrainingContext
from coop.online.delta import DELTA, DeltaPolicy, delta_profile
from coop.online.delta_sim import simulate_delta
from coop.online.policies import EvictionPolicy
from coop.planner.base import BasePlan, LossFn
from coop.runtime.copy_stream import CopyStream, StreamAPI
from coop.runtime.executor import Executor, replay_graph
from coop.runtime.fallback import DynamicStats, online_generator_bytes, run_dynamic
from coop.runtime.paging import HostPool
from coop.schedule import Schedule, validate


class DynamicPlan(BasePlan):
    """Every step runs the captured program op by op, evicting by ``policy`` within ``budget``.

    ``step(*batch)`` returns the loss, accumulates gradients into ``.grad`` as ``backward()``
    would and writes new buffer values (BatchNorm statistics) into the model. A batch of other
    shapes is captured again for it, with a warning, like another training context.
    ``last_stats`` holds the last online step's evictions, recomputations and arena measurements.

    With ``record`` (the default) the first step's decisions become :attr:`recorded`, an executor of
    their schedule that runs every later step (:attr:`replayed_steps` counts them); a recorded schedule
    that the validator refuses (a bug: the engine's soundness rules make it legal and within budget)
    is not replayed, and the warning says why.

    ``policy="delta"`` needs ``device_profile`` (refused in one line naming the shipped profiles without one);
    :attr:`host_pool` is then the host tier of a CPU-only step (None on an accelerator, whose pages go to pinned
    host memory). ``copy_stream`` says where DELTA's copies run, in the online step and in the replays of its
    record alike (:mod:`coop.runtime.copy_stream`): None, torch.cuda's side stream on a step with an accelerator
    and the compute stream otherwise; False, the compute stream; True or a ``StreamAPI``, that side stream.
    """

    def __init__(self, captured: Captured, model: nn.Module, budget: int | str | float,  # noqa: PYI041
                 policy: str | EvictionPolicy = "coop", replay_random: bool = True, *, wrapper: nn.Module | None = None,
                 loss_fn: LossFn | None = None, record: bool = True,
                 device_profile: str | DeviceProfile | None = None,
                 copy_stream: bool | StreamAPI | None = None) -> None:
        if captured.sharding is not None:  # online decisions differ between ranks, whose collectives must match
            raise CoopError("online eviction cannot run an FSDP-sharded step (each rank would decide its own "
                            "re-gathers); plan it with a static formulation")
        delta = isinstance(policy, DeltaPolicy) or (isinstance(policy, str) and policy.lower() == DELTA)
        # the bound of the graph the engine runs (its random draws replayed); DELTA swaps, so a value that cannot be
        # recomputed may still leave the device
        bounded = replay_graph(captured, replay_random)
        super().__init__(model, captured, parse_budget(budget, bounded, paging=delta), loss_fn=loss_fn,
                         wrapper=wrapper)
        self.policy = policy
        self.replay_random = replay_random
        #: the online engine's arena: the budget less the generator states a CPU-only step saves beside it
        self.arena_budget = self.budget - online_generator_bytes(captured.graph, replay_random)
        self.record = record
        self.device_profile: DeviceProfile | None = None
        #: the host tier of a CPU-only step's DELTA swaps (None: no DELTA, or an accelerator's pinned memory)
        self.host_pool: HostPool | None = None
        #: where DELTA's copies run (None: on the compute stream)
        self.copy_stream: bool | StreamAPI | None = None
        if delta:
            self.copy_stream = captured.graph.has_accelerator if copy_stream is None else copy_stream
            self.device_profile = policy.link if isinstance(policy, DeltaPolicy) else delta_profile(device_profile)
            if not captured.graph.has_accelerator:
                predicted = simulate_delta(captured.graph, self.arena_budget, self.device_profile,
                                           replay_random=replay_random, compact=True)  # as the step runs
                self.host_pool = HostPool(predicted.host_peak)
        states = self.budget - self.arena_budget
        if states and below_min_budget(self.arena_budget, bounded, paging=delta):
            least = min_budget(bounded, paging=delta)
            raise BudgetError(f"budget {self.budget} B leaves {self.arena_budget} B for online eviction after the "
                              f"generator states its step saves ({states} B), below min_budget {least} B; use at "
                              f"least {least + states}")
        self.last_stats: DynamicStats | None = None
        #: the static replay of the first step's recorded schedule (None before it, or without ``record``)
        self.recorded: Executor | None = None
        self.replayed_steps = 0
        self._record_refused = False  # the validator refused the record once: every step stays online

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
        """Budget, baseline peak, the last online step's eviction statistics, and how many steps replayed its record."""
        stats = self.last_stats
        return {
            **super().summary(),
            "last_step": None if stats is None else {k: v for k, v in vars(stats).items()
                                                     if not k.startswith("_") and k != "schedule"},
            "recorded": self.recorded is not None,
            "replayed_steps": self.replayed_steps,
        }

    def _change(self, current: TrainingContext, batch: Batch) -> str:
        """The context's difference and, unlike a static plan's, a batch of other shapes or other non-tensor
        values (flags)."""
        changes = [super()._change(current, batch), self.captured.layout.flag_difference(batch.layout)]
        got = [(tuple(t.shape), t.dtype) for t in batch.tensors]
        if got != list(self.captured.batch_shapes):
            shapes = [list(shape) for shape, _ in got]
            planned = [list(shape) for shape, _ in self.captured.batch_shapes]
            changes.append(f"the batch has shapes {shapes}, the plan was made for {planned}")
        return "; ".join(filter(None, changes))

    def _run(self, batch: tuple[torch.Tensor, ...], state: dict[str, torch.Tensor]) -> list[Any]:
        if self.recorded is not None:
            self.replayed_steps += 1
            return self.recorded.run_flat(self.captured.flat_inputs(self.model, batch, state))
        streams = None if self.copy_stream in (None, False) else CopyStream(None if self.copy_stream is True
                                                                             else self.copy_stream)
        outputs, self.last_stats = run_dynamic(self.captured, self.model, batch, self.arena_budget, self.policy,
                                                replay_random=self.replay_random, device_profile=self.device_profile,
                                                host_pool=self.host_pool, copy_stream=streams)
        if self.record and not self._record_refused and self.last_stats.schedule is not None:
            self.recorded = self._recorded_executor(self.last_stats.schedule)
            self._record_refused = self.recorded is None
        return outputs

    def _recorded_executor(self, schedule: Schedule) -> Executor | None:
        """The static executor of the online step's schedule, once the validator accepts it within the budget."""
        graph = replay_graph(self.captured, self.replay_random)
        verdict = validate(graph, schedule, self.budget)
        if not verdict.ok:
            warnings.warn(f"the online step's recorded schedule is not replayed ({verdict.reason}); every step "
                          f"runs the online engine", UserWarning, stacklevel=4)
            return None
        pages = any(step.op in ("page_out", "page_in") for step in schedule.steps)
        copy_stream = self.copy_stream if pages and self.copy_stream is not None else False
        return Executor(self.captured, schedule, self.replay_random, copy_stream=copy_stream,
                        simulation=verdict.simulation, host_pool=self.host_pool)

    def _replan(self, captured: Captured, change: str) -> tuple[BasePlan, str]:
        other = DynamicPlan(captured, self.model, self.budget, self.policy, self.replay_random, wrapper=self.wrapper,
                            loss_fn=self.loss_fn, record=self.record, device_profile=self.device_profile,
                            copy_stream=self.copy_stream)
        return other, f"online eviction ({self.policy_name} policy)"
