"""The static :class:`Plan`: a validated schedule for one model, batch shape and training context, and its replay.

``coop.plan`` makes one (:mod:`coop.planner.plan`), ``coop.load_plan`` rebuilds one from a plan file
(:mod:`coop.planner.plan_files`). A batch of other shapes runs under online eviction (:class:`DynamicPlan`); another
training context re-plans with the cheapest fitting baseline, taking no solver time inside a training loop.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coop.budget import format_memory, min_budget
from coop.errors import ContextError, CoopError, InfeasibleError, SolveTimeoutError
from coop.formulations import SolveResult
from coop.formulations.ladder.auto import cheapest_fitting_baseline
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.autograd_cost import AutogradWork, autograd_work
from coop.graph_capture.batch import Batch
from coop.graph_capture.context import TrainingContext
from coop.memory_viz import write_memory_viz
from coop.planner.base import BasePlan, LossFn, recapture
from coop.planner.dynamic import DynamicPlan
from coop.planner.plan_files import plan_document, read_plan, write_plan
from coop.planner.prediction import eager_rates, overhead_against_eager
from coop.planner.rounds import Round, replan_within
from coop.runtime.executor import Executor, replay_graph
from coop.runtime.graph_replay import GraphAPI, GraphReplay
from coop.schedule import Schedule, Simulation, simulate


class Plan(BasePlan):
    """A validated schedule for one model, batch shape and training context, ready to replay every step.

    ``model`` is the module the step was captured from; under DistributedDataParallel it is the
    wrapped module and ``wrapper`` the DDP instance whose reducer syncs the gradients.
    """

    def __init__(self, model: nn.Module, captured: Captured, schedule: Schedule, budget: int, formulation: str,
                 result: SolveResult | None = None, note: str = "", loss_fn: LossFn | None = None,
                 wrapper: nn.Module | None = None, simulation: Simulation | None = None) -> None:
        super().__init__(model, captured, budget, loss_fn=loss_fn, wrapper=wrapper)
        self.arena_peak: int | None = None  # packed arena peak, set by plan(..., arena=True)
        #: every CPU byte the ordinary replay's step held at its peak (caller-owned values + the step's allocations,
        #: kernels' scratch included), measured by plan() on the example batch; None where not measured (note)
        self.step_footprint: int | None = None
        self._dynamic_by_shape: dict[tuple, DynamicPlan] = {}
        self.schedule = schedule
        self.formulation = formulation
        self.result = result
        self.note = note
        self.executor = Executor(captured, schedule, simulation=simulation)
        self.simulation: Simulation = self.executor.simulation
        #: the CUDA-graph replay of the executor's program (:meth:`use_cuda_graph`); None: the ordinary replay
        self.graph_replay: GraphReplay | None = None
        #: the solves coop.plan took to reach this plan (:mod:`coop.planner.rounds`); empty for a loaded plan
        self.rounds: list[Round] = []

    def use_cuda_graph(self, api: GraphAPI | None = None) -> None:
        """Replay the plan's program as one CUDA graph, captured at the first step (coop.runtime.graph_replay;
        opt-in, not yet measured on a GPU). ``api`` replaces torch.cuda's graphs (a test's fake); without it a
        step with no CUDA value is refused in one line. Call it after :meth:`use_copy_stream` / :meth:`use_arena`
        (which it does not combine with): it wraps the executor the plan has now."""
        self.graph_replay = GraphReplay(self.executor, api)

    def use_copy_stream(self) -> None:
        """Page on a side CUDA stream (coop.runtime.copy_stream; opt-in)."""
        self.executor = Executor(self.captured, self.executor.schedule, copy_stream=True,
                                 simulation=self.executor.simulation)

    def use_arena(self, placement: Any) -> None:
        """Replay inside one arena per device at ``placement``'s offsets (coop.runtime.arena_replay); refused in one
        line for a step with values on an accelerator (:func:`refuse_arena_off_cpu`).

        ``arena_footprint`` is then every byte a step holds at its peak: the caller-owned values, the buffers
        (arenas, scratch, output slots) and what the step allocates beside them once measured
        (:func:`coop.runtime.arena_replay.measure_outside`; until then the largest transient, a lower estimate)."""
        refuse_arena_off_cpu(self.captured.graph)
        self.executor = Executor(self.captured, self.executor.schedule, placement=placement,
                                 simulation=self.executor.simulation)
        self.arena_peak = placement.arena_peak

    @property
    def arena_footprint(self) -> int | None:
        program = self.executor.arena_program
        return None if program is None else program.footprint(self.graph.caller_owned_bytes)

    # ---------------------------------------------------------------- numbers
    @property
    def graph(self) -> Graph:
        """The Graph the plan's schedule is legal on (random draws recomputable: the executor replays them)."""
        return self.executor.graph

    @property
    def predicted_peak(self) -> int:
        return self.simulation.peak

    @property
    def predicted_recompute_overhead(self) -> float:
        """The recomputations' (and page transfers') cost over the captured program's, by the node costs alone:
        ``(schedule cost - baseline cost) / baseline cost``, what the solver minimises (the predicted overhead before
        issue 42)."""
        return self.simulation.overhead

    @property
    def predicted_overhead(self) -> float:
        """The predicted ``plan step / eager step - 1``, the scale ``benchmark()`` measures: eager's autograd work
        counted in its step (:mod:`coop.planner.prediction`), so a plan that recomputes little predicts a negative
        overhead. Priced at the thread count of the last ``benchmark()`` (the measurement ``summary()`` shows beside
        it), else at torch's current count. :attr:`predicted_recompute_overhead` where that term does not apply."""
        return self.predicted_overhead_at(self._benchmarked_threads())

    def _benchmarked_threads(self) -> int | None:
        """The thread count of the last ``benchmark()``, which the prediction is priced at (None: none ran)."""
        return self.last_benchmark.threads if self.last_benchmark is not None else None

    def predicted_overhead_at(self, threads: int | None) -> float:
        """:attr:`predicted_overhead` with autograd priced at ``threads`` CPU threads (None: torch's current count;
        the calibration runs once per thread count, :func:`coop.graph_capture.autograd_cost.autograd_rates`)."""
        simulation = self.simulation
        rates = eager_rates(self.graph, threads)
        work = self.autograd_work if rates is not None else AutogradWork(recorded=0, nodes=0)  # counted where priced
        return overhead_against_eager(simulation.cost, simulation.baseline_cost, work, rates)

    def _autograd_summary(self) -> dict[str, Any] | None:
        """The autograd term of ``summary()["predicted_overhead"]``, priced as it is (rates in µs, the counted work),
        or None where it does not apply."""
        rates = eager_rates(self.graph, self._benchmarked_threads())
        if rates is None:
            return None
        work = self.autograd_work
        return {**rates.as_dict(), "recorded": work.recorded, "nodes": work.nodes}

    @functools.cached_property
    def autograd_work(self) -> AutogradWork:
        """What autograd does in the eager step this plan replaces (counted once on the captured program)."""
        return autograd_work(self.captured)

    def summary(self) -> dict[str, Any]:
        """Peak, overhead, budget and solver status as a JSON-ready dict."""
        result = self.result
        return {
            **super().summary(),
            "peak_fraction": self.predicted_peak / self.baseline_peak,
            "predicted_overhead": self.predicted_overhead,
            "predicted_recompute_overhead": self.predicted_recompute_overhead,
            "autograd_cost": self._autograd_summary(),
            "min_budget": min_budget(self.graph),
            "nodes": len(self.graph.nodes),
            "steps": len(self.schedule),
            "recomputations": self.simulation.recomputations,
            "status": result.status if result else "loaded",
            "gap": result.gap if result else None,
            "solve_s": result.wall_s if result else 0.0,
            "note": self.note,
            "arena_peak": self.arena_peak,
            "arena_footprint": self.arena_footprint,
            "step_footprint": self.step_footprint,
            "cuda_graph": self.graph_replay.status if self.graph_replay is not None else "off",
            "rounds": [round_.to_dict() for round_ in self.rounds],
            "rungs": [rung.to_dict() for rung in getattr(result, "rungs", None) or []],
            **implementations_used(self.graph, self.schedule),
        }

    def memory_timeline(self) -> dict[str, list[int]]:
        """Predicted device bytes per step of the plan and of the baseline order (for plots)."""
        baseline = simulate(self.graph, Schedule.from_order(self.graph.order)).memory
        return {"plan": list(self.simulation.memory), "baseline": list(baseline)}

    def export_memory_viz(self, path: str | Path) -> dict[str, Any]:
        """Write the predicted step as a PyTorch memory snapshot (:mod:`coop.memory_viz`) to open in
        https://pytorch.org/memory_viz beside a measured one: every value the step holds, allocated and freed
        where the schedule says, with the op that does it; the most bytes live over the trace is
        :attr:`predicted_peak` (on a one-device step).

        Parameters
        ----------
        path : str or Path
            The ``.pickle`` file to write.

        Returns
        -------
        dict of str to Any
            The snapshot (``segments``, ``device_traces``), as ``torch.cuda._memory_viz`` reads it.
        """
        return write_memory_viz(path, self.graph, self.executor.schedule, self.simulation)

    # ---------------------------------------------------------------- replay
    def _step_here(self, batch: Batch) -> torch.Tensor:
        """Replay the schedule; a batch of other shapes or flags runs captured again under online eviction, with a
        warning."""
        mismatch = self._batch_mismatch(batch)
        if mismatch:
            return self._dynamic_fallback(batch, mismatch)._step_batch(batch)
        return super()._step_here(batch)

    @property
    def replay(self) -> Executor | GraphReplay:
        """What a step runs: the CUDA-graph replay where :meth:`use_cuda_graph` asked for it, else the executor."""
        return self.graph_replay if self.graph_replay is not None else self.executor

    def _run(self, batch: tuple[torch.Tensor, ...], state: dict[str, torch.Tensor]) -> list[Any]:
        return self.replay.run_flat(self.captured.flat_inputs(self.model, batch, state))

    def _replan(self, captured: Captured, change: str) -> tuple[BasePlan, str]:
        """The cheapest baseline schedule that fits (no solver time inside a training loop) with room for the
        generator states its replay saves, else online eviction."""
        graph = replay_graph(captured)

        def within(budget: int) -> Plan:
            fallback = cheapest_fitting_baseline(graph, budget)
            return Plan(self.model, captured, fallback.schedule, budget, fallback.formulation, fallback,
                        loss_fn=self.loss_fn, wrapper=self.wrapper, simulation=fallback.simulation,
                        note=f"re-planned for another training context: {change}")

        try:
            other = replan_within(within, captured, self.budget)
        except (InfeasibleError, SolveTimeoutError):
            dynamic = DynamicPlan(captured, self.model, self.budget, policy="coop", wrapper=self.wrapper,
                                  loss_fn=self.loss_fn)
            return dynamic, "online eviction (coop policy)"
        if self.graph_replay is not None:  # the re-plan replays as this one did: one CUDA graph per plan
            other.use_cuda_graph(self.graph_replay.api)
        return other, f"the {other.formulation} schedule"

    def _batch_mismatch(self, batch: Batch) -> str:
        """Why this batch does not fit the plan's shapes or non-tensor values ('' when it does); its structure is
        the plan's (:func:`coop.graph_capture.batch.read_step_batch` refused any other)."""
        flags = self.captured.layout.flag_difference(batch.layout)
        if flags:
            return flags
        paths = self.captured.layout.tensor_paths
        for path, tensor, want in zip(paths, batch.tensors, self.captured.batch_shapes, strict=True):
            have = (tuple(tensor.shape), tensor.dtype)
            if have != want:
                return (f"{path} has shape {list(have[0])} {have[1]}, the plan was made for {list(want[0])} "
                        f"{want[1]}")
        return ""

    def _dynamic_fallback(self, batch: Batch, mismatch: str) -> DynamicPlan:
        """Online eviction (Coop's policy) under the same budget for a batch of unplanned shapes or flags."""
        if self.captured.sharding is not None:
            raise ContextError(f"{mismatch}; a plan of an FSDP-sharded model replays the batch shapes it was made for "
                               "(every rank must run the same collectives); make a new plan for this batch")
        key = batch.key
        dynamic = self._dynamic_by_shape.get(key)
        if dynamic is None:
            warnings.warn(f"{mismatch}; running this batch under online eviction (coop policy) within the plan's "
                          f"budget of {format_memory(self.budget, self.graph)}; make a new plan for it to get a static schedule",
                          stacklevel=5)
            captured = recapture(self.model, batch, self.loss_fn, TrainingContext.current(self.model, batch.tensors))
            dynamic = DynamicPlan(captured, self.model, self.budget, policy="coop", wrapper=self.wrapper,
                                  loss_fn=self.loss_fn)
            self._dynamic_by_shape[key] = dynamic
        return dynamic

    # ---------------------------------------------------------------- files
    def save(self, path: str | Path) -> None:
        """Write the plan (schedule, budget, graph digest, batch shapes, whether a ``loss_fn`` made the loss) as
        JSON (:func:`coop.planner.plan_files.plan_document`)."""
        write_plan(path, plan_document(self.captured, self.schedule, self.budget, self.formulation, self.summary(),
                                       loss_fn=self.loss_fn))

    def __repr__(self) -> str:
        measured = "" if self.last_benchmark is None else f", measured {self.last_benchmark.measured_overhead:.1%}"
        return (f"Plan({self.graph.name}, {self.formulation}, peak {format_memory(self.predicted_peak, self.graph)} of "
                f"{format_memory(self.baseline_peak, self.graph)}, overhead {self.predicted_overhead:.1%}{measured})")


def refuse_arena_off_cpu(graph: Graph) -> None:
    """Refuse, in one line, an arena replay of a step with values on an accelerator.

    The arena replay writes an op's result into its planned view through CPU kernels
    (:mod:`coop.runtime.arena_kernels`); on CUDA most ops allocate their own output beside the arena and copy
    it in. Measured on an H100 (torch 2.11): ResNet-50 allocated 1.16-1.30x the prediction at 1.33-1.58x eager
    step time, with 421-442 ops computed outside the arena, and GPT-2 crashed. There coop uses the ordinary
    replay, whose reserved bytes it bounds with the caching allocator's expandable segments.

    Parameters
    ----------
    graph : Graph
        The captured step; its ``devices`` are read.

    Returns
    -------
    None

    Raises
    ------
    CoopError
        When a value of the step lives on a device other than the CPU.
    """
    accelerators = [d for d in graph.devices if d not in (None, "cpu")]
    if accelerators:
        raise CoopError(f"arena=True replays CPU steps only, and this step runs on {', '.join(accelerators)}: on CUDA "
                        "the arena's ops allocate their outputs outside it and copy them in (measured on an H100: "
                        "1.16-1.30x the predicted bytes at 1.33-1.58x eager time, a crash on GPT-2); plan without "
                        "arena=True, the ordinary replay, whose reserved bytes coop bounds with expandable segments")


def implementations_used(graph: Graph, schedule: Schedule) -> dict[str, list[str]]:
    """The implementations a schedule chooses (``node:impl``), and which of them are inexact (MONeT).

    Parameters
    ----------
    schedule : Schedule
        The schedule; its compute steps with an ``impl`` are read.

    Returns
    -------
    dict of str to list of str
        ``"implementations"``: each ``node:impl`` chosen, sorted; ``"inexact_implementations"``: those that are
        inexact, with their tolerance.
    """
    used = sorted({(s.node, s.impl) for s in schedule.steps if s.op == "compute" and s.impl is not None})
    named = [(f"{node}:{impl}", graph.node(node).implementation(impl)) for node, impl in used]
    return {"implementations": [name for name, _ in named],
            "inexact_implementations": [f"{name} (tolerance {impl.tolerance:g})" for name, impl in named if not impl.exact]}


def load_plan(path: str | Path, model: nn.Module, loss_fn: LossFn | None = None) -> Plan:
    """Rebuild a saved plan for ``model``; refused when the model's graph differs from the saved one.

    The step is captured again on a batch of zeros of the saved shapes (tracing runs on fake tensors, so the
    graph is the same) and compared by its structure digest.

    Parameters
    ----------
    path : str or Path
        The plan file (written by ``Plan.save``).
    model : nn.Module
        The model the plan was made for, possibly wrapped in DistributedDataParallel.
    loss_fn : LossFn or None
        The loss function the plan was made with.

    Returns
    -------
    Plan
        The saved schedule, budget and formulation on a fresh capture of ``model``.

    Raises
    ------
    CoopError
        When the file cannot be read, is not a coop plan, was made with a ``loss_fn`` that is not passed (the
        message names ``loss_fn=``), or was made for a different model or batch shape.
    ContextError
        When the graph differs because the plan was captured in another training context (autocast, eval modules).
    """
    saved = read_plan(path, model, loss_fn)
    return Plan(saved.module, saved.captured, saved.schedule, saved.budget, saved.formulation, loss_fn=loss_fn,
                wrapper=saved.wrapper)
