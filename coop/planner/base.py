"""The face every plan shows: :class:`BasePlan`, whether its steps replay a static schedule or evict online.

``coop.plan`` returns a :class:`coop.planner.plan.Plan` (a validated schedule replayed by the
executor) or a :class:`coop.planner.dynamic.DynamicPlan` (online eviction on real tensors). A
training loop uses either the same way: ``step(*batch)`` returns the loss and leaves gradients in
``.grad`` (written back by :meth:`Captured.write_back`); ``budget``, ``formulation``,
``predicted_peak``, ``baseline_peak`` and ``summary()`` describe it; ``save(path)`` writes it
where a plan has a schedule to write. ``step`` takes the batch as ``coop.plan`` took it (a dict of keyword
arguments, a tuple, a tensor) or spread as the model takes it (:func:`coop.graph_capture.batch.read_step_batch`).

What both kinds share lives here once: the training-context check before every step, and the
re-plan, with one warning, for a context other than the capture's (:meth:`BasePlan._for_context`).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coop.budget import baseline_peak, format_memory
from coop.errors import BudgetError, ContextError, CoopError, InfeasibleError, SolveTimeoutError
from coop.graph import Graph
from coop.graph_capture import Captured, capture
from coop.graph_capture.batch import Batch, read_step_batch
from coop.graph_capture.context import TrainingContext
from coop.graph_capture.meta import META, refuse_weightless_step
from coop.planner.benchmark import StepBenchmark, Timer, benchmark_step
from coop.runtime.allocator import AllocatorAssumption
from coop.runtime.executor import GradientSync
from coop.runtime.fsdp import FsdpSync

LossFn = Callable[..., torch.Tensor]


class BasePlan(ABC):
    """A plan for one model, batch shape and training context: ``step`` runs a training step within ``budget``.

    ``model`` is the module the step was captured from; under DistributedDataParallel it is the
    wrapped module and ``wrapper`` the DDP instance whose reducer syncs the gradients
    (:class:`GradientSync`). ``loss_fn`` is how the step was captured, kept to capture it again
    in another training context.
    """

    formulation: str

    def __init__(self, model: nn.Module, captured: Captured, budget: int, *, loss_fn: LossFn | None = None,
                 wrapper: nn.Module | None = None) -> None:
        self.model = model
        self.captured = captured
        self.budget = budget
        self.loss_fn = loss_fn
        self.wrapper = wrapper
        self.sync: GradientSync | FsdpSync | None = None
        if wrapper is not None:
            self.sync = GradientSync(wrapper, captured)
        elif captured.sharding is not None:  # FSDP2: the step's own collectives reduce; FSDP's backward ends after
            self.sync = FsdpSync(captured)
        # Another training context (and batch) -> its replay: None where this plan's program still applies.
        self._by_context: dict[tuple, BasePlan | None] = {}
        #: What the plan assumed of the device allocator (set by coop.plan; coop.runtime.allocator).
        self.allocator: AllocatorAssumption | None = None
        #: The last :meth:`benchmark` (None before one ran): what ``summary()`` shows beside the prediction.
        self.last_benchmark: StepBenchmark | None = None

    # ---------------------------------------------------------------- numbers
    @property
    def graph(self) -> Graph:
        """The Graph the plan's steps run on."""
        return self.captured.graph

    @property
    def baseline_peak(self) -> int:
        """Peak bytes of the captured program order with no recomputation."""
        return baseline_peak(self.graph)

    @property
    @abstractmethod
    def predicted_peak(self) -> int | None:
        """Peak bytes the simulator predicts for a step (None where run-time decisions set it)."""

    def summary(self) -> dict[str, Any]:
        """What every plan reports, as a JSON-ready dict; each kind adds its own entries.

        ``measured_overhead`` (the step time over eager's, less 1) and ``benchmark`` (how it was measured,
        :meth:`StepBenchmark.as_dict`) are None until :meth:`benchmark` ran.
        """
        measured = self.last_benchmark
        return {
            "model": self.graph.name,
            "formulation": self.formulation,
            "budget": self.budget,
            "baseline_peak": self.baseline_peak,
            "predicted_peak": self.predicted_peak,
            "allocator": self.allocator.as_dict() if self.allocator is not None else None,
            "measured_overhead": measured.measured_overhead if measured is not None else None,
            "benchmark": measured.as_dict() if measured is not None else None,
        }

    def benchmark(self, batch: Any, steps: int = 9, warmup: int = 2, threads: int | None = None, *,
                  timer: Timer | None = None) -> StepBenchmark:
        """Time this plan's step against eager PyTorch's on the same model, alternating them step by step.

        ``warmup`` untimed pairs, then ``steps`` timed pairs (plan, eager, plan, eager, ...: a neighbour's load
        hits both alike); each side's time is its median, under ``torch.set_num_threads(threads)`` when given.
        Gradients are released before every step; the model's parameters, gradients, buffers and random
        generators, and the thread count, are put back afterwards (:func:`coop.planner.benchmark.benchmark_step`).
        The result is kept as :attr:`last_benchmark`, and ``summary()["measured_overhead"]`` shows it.

        Parameters
        ----------
        batch : Any
            A batch as ``coop.plan`` took it (one argument: a dict, tuple or tensor).
        steps, warmup : int
            Timed steps per side (at least 1), untimed pairs before them (0 or more).
        threads : int or None
            torch's CPU threads while it runs (at least 1); None: as they are.
        timer : callable or None
            A clock in seconds in place of ``time.perf_counter`` (a test's fake one).

        Returns
        -------
        StepBenchmark
            Both medians, the measured overhead beside the predicted one; ``str()`` says it in one line.

        Raises
        ------
        OptionError
            For ``steps < 1``, ``warmup < 0`` or ``threads < 1``, naming the fix.
        """
        clock = {} if timer is None else {"timer": timer}
        self.last_benchmark = benchmark_step(self, batch, steps=steps, warmup=warmup, threads=threads, **clock)
        return self.last_benchmark

    def save(self, path: str | Path) -> None:
        """Write the plan to ``path``; a plan without a schedule has nothing to write."""
        raise CoopError(f"a {self.formulation} plan decides its evictions while it runs and has no schedule to save; "
                        "save a plan made with a static formulation")

    def export_memory_viz(self, path: str | Path) -> dict[str, Any]:
        """Write the predicted step as a PyTorch memory snapshot; a plan without a schedule has none to write.

        Parameters
        ----------
        path : str or Path
            The ``.pickle`` file to write.

        Returns
        -------
        dict of str to Any
            The snapshot written (:meth:`coop.planner.plan.Plan.export_memory_viz`).

        Raises
        ------
        CoopError
            Here: a plan that decides its evictions while it runs predicts no timeline.
        """
        raise CoopError(f"a {self.formulation} plan decides its evictions while it runs and predicts no memory "
                        "timeline; export one from a plan made with a static formulation")

    # ---------------------------------------------------------------- replay
    def step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Forward + backward within the budget: grads accumulate into ``p.grad``; returns the loss.

        The batch comes as ``coop.plan`` got it (``plan.step(batch)``: a dict, a tuple or list, a tensor) or
        spread as the model takes it (``plan.step(*batch)``, ``plan.step(**batch)``); a batch of another
        structure (other keys, a string where a tensor was) stops with one CoopError line
        (:func:`coop.graph_capture.batch.read_step_batch`). Other shapes or other non-tensor values (flags) run a
        step captured for them, with a warning. A training context other than the capture's (autocast,
        train/eval, frozen parameters: :meth:`TrainingContext.mismatch`) is re-planned for within the same
        budget, with a warning
        (:meth:`_for_context`); one no re-plan can serve (gradients disabled, another device)
        stops with one ContextError line. Under DDP the gradients are all-reduced by the wrapper's
        own reducer, as in DDP eager (:class:`GradientSync`).
        """
        return self._step_batch(read_step_batch(args, kwargs, self.captured.layout))

    def _step_batch(self, batch: Batch) -> torch.Tensor:
        """:meth:`step` on a batch already read against the plan's layout."""
        current = TrainingContext.current(self.model, batch.tensors)
        recorded = self.captured.context
        if recorded is not None and META in recorded.devices:  # planned without weights (coop.graph_capture.meta)
            refuse_weightless_step(current.devices)
        change = self._change(current, batch)
        other = self._for_context(current, change, batch) if change else None
        if other is not None:
            try:
                return other._step_batch(batch)
            except (InfeasibleError, SolveTimeoutError) as exc:
                raise _does_not_fit(change, exc) from None
        return self._step_here(batch)

    def _change(self, current: TrainingContext, batch: Batch) -> str:
        """What differs from the capture that a re-plan serves ('' when nothing does)."""
        recorded = self.captured.context
        return recorded.mismatch(current) if recorded is not None else ""

    def _step_here(self, batch: Batch) -> torch.Tensor:
        """Run the step with this plan's own program and write the results back into the model."""
        tensors = batch.tensors
        if self.sync is not None:
            tensors = self.sync.before_step(tensors)
        release = self.sync.release if self.sync is not None else None
        state = self.captured.model_state(self.model)  # one walk of the module tree serves the step
        return self.captured.write_back(self.model, self._run(tensors, state), release, state)

    @abstractmethod
    def _run(self, batch: tuple[torch.Tensor, ...], state: dict[str, torch.Tensor]) -> list[Any]:
        """The step's flat outputs (loss, gradients, new buffers) on this batch; ``state``: the model's tensors by
        name (:meth:`Captured.model_state`)."""

    @abstractmethod
    def _replan(self, captured: Captured, change: str) -> tuple[BasePlan, str]:
        """A plan for the step captured again in another context, within this budget, and how it runs."""

    def _for_context(self, current: TrainingContext, change: str, batch: Batch) -> BasePlan | None:
        """The replay for a context other than the capture's (None: this plan's program still applies).

        The step is captured again in the new context. When its program is the same (a setting
        that changes no op, like deterministic algorithms on CPU) this plan stands. Otherwise it is
        re-planned within the same budget (:meth:`_replan`), once per context and batch shape, with
        a warning; a budget nothing meets there is a ContextError naming the difference.
        """
        key = (current, batch.key)
        if key in self._by_context:
            return self._by_context[key]
        again = recapture(self.model, batch, self.loss_fn, current)
        # the digest leaves out an op's constant arguments: a batch with other flags always takes the new capture
        same_flags = batch.layout.key == self.captured.layout.key
        if same_flags and again.graph.structure_sha256 == self.captured.graph.structure_sha256:
            self._by_context[key] = None
            return None
        try:
            other, how = self._replan(again, change)
        except BudgetError as exc:
            raise _does_not_fit(change, exc) from None
        warnings.warn(f"{change}; captured the step again for it and running it with {how} within the plan's budget "
                      f"of {format_memory(self.budget, self.graph)}; make a new plan for it to get an optimized schedule",
                      stacklevel=4)
        self._by_context[key] = other
        return other


def _does_not_fit(change: str, exc: Exception) -> ContextError:
    return ContextError(f"{change}, and the step does not fit the plan's budget there ({exc}); make a new plan for it")


def recapture(model: nn.Module, batch: Batch, loss_fn: LossFn | None, context: TrainingContext) -> Captured:
    """``model``'s step on ``batch`` captured again now, in ``context`` (which it records).

    Parameters
    ----------
    batch : Batch
        The batch to capture on, as read (its tensors and layout).
    loss_fn : LossFn or None
        As for :func:`coop.capture`.
    context : TrainingContext
        The training context the new capture is made in; stored on it.

    Returns
    -------
    Captured
        The new capture (analytic costs, no alternatives), its ``context`` set.
    """
    again = capture(model, batch, loss_fn=loss_fn)
    again.context = context
    return again
