"""coop.plan: capture -> budget -> formulation -> validate -> executor, and the static Plan.

Orchestration only: the capture, the one budget parser, the formulations, the one simulator and
validator and the executor do the work; this module chooses among schedules (falling back to
:func:`coop.formulations.auto.cheapest_fitting_baseline`) and returns a plan with the common face
of :class:`coop.planner.base.BasePlan`: a static :class:`Plan`, or with ``formulation="dynamic"``
a :class:`coop.planner.dynamic.DynamicPlan`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coop.budget import format_memory, min_budget, parse_budget
from coop.errors import BudgetError, ContextError, CoopError, InfeasibleError, ScheduleError
from coop.formulations import SolveResult, solve
from coop.formulations.auto import cheapest_fitting_baseline
from coop.graph import Graph
from coop.graph_capture import Captured, capture
from coop.graph_capture.batch import Batch, layout_from_dict, read_batch
from coop.graph_capture.context import TrainingContext
from coop.graph_capture.cost import measure_workspace
from coop.graph_capture.meta import weightless
from coop.memory_viz import write_memory_viz
from coop.online.static_arena import EXECUTION_ROUNDS, execution_placement, next_live_budget
from coop.planner.base import BasePlan, LossFn, recapture
from coop.planner.dynamic import DynamicPlan
from coop.planner.ranks import require_same_graph, solved_on_rank_zero
from coop.runtime.allocator import AllocatorAssumption, prepare_allocator
from coop.runtime.arena_replay import measure_outside
from coop.runtime.copy_stream import require_cuda
from coop.runtime.executor import (
    Executor,
    recorded_program,
    replay_graph,
    saved_generator_bytes,
    unwrap_model,
)
from coop.runtime.graph_replay import GraphAPI, GraphReplay, require_cuda_graph
from coop.runtime.meter import cpu_allocation_peak
from coop.runtime.program_builder import SOURCE_NODE
from coop.runtime.reserved import cuda_counters, reserved_step_peak
from coop.schedule import Schedule, Simulation, Step, simulate, validate

PLAN_FORMAT = "coop.plan/1"


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
        self.executor = Executor(self.captured, self.executor.schedule, arena=placement,
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
    def predicted_overhead(self) -> float:
        return self.simulation.overhead

    def summary(self) -> dict[str, Any]:
        """Peak, overhead, budget and solver status as a JSON-ready dict."""
        result = self.result
        return {
            **super().summary(),
            "peak_fraction": self.predicted_peak / self.baseline_peak,
            "predicted_overhead": self.predicted_overhead,
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
                        loss_fn=self.loss_fn, wrapper=self.wrapper,
                        note=f"re-planned for another training context: {change}")

        try:
            other = _within_saved_generator_states(within, self.budget, graph)
        except InfeasibleError:
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
        """Write the plan (schedule, budget, graph digest, batch shapes) as JSON."""
        document = {
            "format": PLAN_FORMAT,
            "graph": {"name": self.graph.name, "structure_sha256": self.captured.graph.structure_sha256,
                      "nodes": len(self.captured.graph.nodes), "ops": op_counts(self.captured.graph)},
            "budget": self.budget,
            "formulation": self.formulation,
            "batch": [{"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
                      for shape, dtype in self.captured.batch_shapes],
            "layout": _layout_document(self.captured),
            "steps": [s.model_dump(exclude_none=True) for s in self.schedule.steps],
            "alternatives": "alternatives" in self.captured.graph.meta,
            "versions": library_versions(),
            "summary": self.summary(),
        }
        if self.captured.context is not None:  # what the capture depends on, to name it when a load differs
            document["context"] = {"autocast": [list(a) for a in self.captured.context.autocast],
                                   "eval_modules": list(self.captured.context.eval_modules)}
        Path(path).write_text(json.dumps(document, indent=1) + "\n")

    def __repr__(self) -> str:
        return (f"Plan({self.graph.name}, {self.formulation}, peak {format_memory(self.predicted_peak, self.graph)} of "
                f"{format_memory(self.baseline_peak, self.graph)}, overhead {self.predicted_overhead:.1%})")


def plan(model: nn.Module, budget: str | float, example_batch: Any, *, loss_fn: LossFn | None = None,
         formulation: str = "auto", time_limit: float = 60, profile: bool = False,
         arena: bool = False, captured: Captured | None = None, device_profile: Any = None,
         alternatives: bool | None = None, exact: bool = False, copy_stream: bool = False,
         cuda_graph: bool = False, strict: bool = False, device: str | None = None,
         policy: str = "coop") -> Plan | DynamicPlan:
    """Capture a training step, solve for a schedule within ``budget`` and return its replay.

    A formulation that returns no schedule within the budget falls back to the cheapest fitting baseline,
    and the plan's ``note`` (and ``summary()["note"]``) says so. On a step whose values all live on the CPU the
    ordinary replay leaves room for the generator states it saves to replay recomputed random ops
    (:func:`coop.runtime.executor.saved_generator_bytes`), and the planned step is run once on ``example_batch``
    to measure what it holds (the caller-owned values plus every allocation, kernels' scratch included:
    ``summary()["step_footprint"]``); where that exceeds the budget (scratch a capture without ``profile`` does
    not know) it re-solves once with each op's scratch, measured on that plan's own replay (no unplanned step), as
    its workspace, keeps the re-solved plan when its measured step fits, and otherwise warns, naming the fix.
    The budget holds for a step after the caller released the previous ``.grad`` values (``zero_grad()``);
    accumulated ``.grad`` values are the caller's own memory, as in eager PyTorch. On CUDA the budget less the
    caching allocator's page rounding (:func:`within_allocator_headroom`) is what the schedule's live bytes
    must meet.

    The plan records the training context it was captured in (autocast, grad mode, devices,
    deterministic algorithms, train/eval; a ``captured`` without one is taken to be from the
    current context) and ``step`` honours it. A model wrapped in DistributedDataParallel is
    captured without the wrapper (``loss_fn`` receives the wrapped module) and its gradients are
    synced by the wrapper's reducer. A ``torch.compile``d module is planned through its ``_orig_mod``, with a
    warning that coop's replay replaces the compiled step (``strict=True`` refuses it instead).

    Parameters
    ----------
    model : nn.Module
        The model to train, possibly wrapped in DistributedDataParallel or compiled by ``torch.compile``.
    budget : str or float
        The memory budget, in any form :func:`coop.budget.parse_budget` reads (bytes, a size string such as
        ``"6GiB"``, or a fraction of the baseline peak such as ``"90%"``).
    example_batch : Any
        One batch as the model takes it: a dict of keyword arguments (``model(**batch)``), a tuple or list of
        positional ones (``model(*batch)``), or one tensor; tensors may nest in dicts, tuples and lists beside
        None and bool, int, float or str values, which are part of the plan like the tensors' shapes
        (:func:`coop.graph_capture.batch.read_batch`).
    loss_fn : LossFn or None
        ``loss_fn(model, *args, **kwargs)`` (the batch's arguments) returns the loss; None: the model's call does,
        as a scalar tensor or an output with ``.loss`` (transformers' ``ModelOutput``; see :func:`coop.capture`).
    formulation : str
        The solver: ``"auto"`` picks per graph (coop.formulations.auto: the baseline order when it fits,
        Checkmate's MILP on small graphs, Moccasin's CP-SAT on large ones); ``"dynamic"`` returns a
        :class:`DynamicPlan` (online eviction) instead of solving.
    time_limit : float
        Seconds the solver may take.
    profile : bool
        Capture with the real step's measured op times, storage sizes and each op's internal scratch (its
        workspace in the graph, which the schedule then counts).
    arena : bool
        The budget is the size of everything a step holds: every value the step computes gets an address in
        its device's arena (coop.online.static_arena's packed execution placement), the plan replays inside those
        arenas (coop.runtime.arena_replay: one buffer per device, allocated at the first step and reused; the loss
        is copied into one of two slots after the arena, a new ``.grad`` is handed out where the step computed
        it), and the budget must hold the step's whole footprint (``summary()["arena_footprint"]``): the
        caller-owned values (parameters, buffers, batch; they stay in the caller's storages and are counted
        once), the buffers (arenas, scratch, the loss's slots) and what a step allocates beside them (kernels'
        internal scratch such as oneDNN's convolution reorders, measured by running the step once on
        ``example_batch`` at the current thread count, :func:`coop.runtime.arena_replay.measure_outside`). The
        live-bytes budget of the solve is lowered by what the footprint exceeds (bisecting where the solver finds
        nothing) until it fits; the note itemises it, and ``plan.budget`` stays the budget asked for. CPU steps
        only (:func:`refuse_arena_off_cpu`).
    captured : Captured or None
        Reuses an earlier :func:`coop.capture` of this model and batch (several budgets, one capture and one
        profile); None captures now.
    device_profile : Any
        A name such as ``"a100-pcie4"``, a .toml path or a :class:`coop.device_profiles.DeviceProfile`: prices
        paging for ``formulation="poet"`` and lets ``auto`` page to the device's slower tier when recomputation
        alone cannot reach the budget; with ``formulation="dynamic", policy="delta"`` it prices DELTA's swaps
        (required there).
    alternatives : bool or None
        Capture the operator implementations PyTorch offers (MONeT: ReLU/hardtanh backward from a compact mask,
        in-place activations; coop.graph_capture.alternatives); None: only for ``formulation="monet"``.
        ``summary()`` lists the implementations a plan uses and which are inexact.
    exact : bool
        Remove inexact implementations before solving (:func:`exact_only`).
    copy_stream : bool
        Run the plan's page-outs and page-ins on a side stream overlapped with compute (coop.runtime.copy_stream;
        CUDA only, opt-in, not yet measured on a GPU).
    cuda_graph : bool
        Replay the plan's program as one CUDA graph captured at the first step (coop.runtime.graph_replay): the
        batch copied into static buffers, loss and gradients delivered as eager delivers them; a schedule that
        recomputes random draws or pages, or a step whose capture fails (a CPU sync such as ``.item()``, a
        data-dependent shape), falls back to the ordinary replay with one warning naming the op, and
        ``summary()["cuda_graph"]`` says which runs. CUDA steps only. Default False for now: issue 23 wants it the
        default on CUDA once the GPU acceptance rows (benchmarks/bench_cuda.py, ``cuda-graph``) prove it
        bit-identical to eager and within the reserved-bytes rule; that proof is not in yet.
    strict : bool
        Refuse, in one line, what coop would otherwise plan with a warning: a ``torch.compile``d module (coop plans
        its ``_orig_mod`` and replays its own program of the eager step, so the compiled kernels do not run in
        ``plan.step``).
    device : str or None
        For a model on the meta device (built under ``torch.device("meta")``: no weights, any size): the device
        the plan will run on (:mod:`coop.graph_capture.meta`). Such a plan cannot step; ``plan.save`` it and
        ``coop.load_plan`` it on the real model, which checks that the real step has the same graph.
    policy : str
        The online eviction policy of ``formulation="dynamic"``: ``"coop"`` (the default), ``"dtr"``, ``"dtr-eq"``,
        ``"dte"``, or ``"delta"`` (swap or recompute, with ``device_profile``: :mod:`coop.online.delta`).

    Returns
    -------
    Plan or DynamicPlan
        The plan, ready to ``step``; a :class:`DynamicPlan` for ``formulation="dynamic"``.

    Raises
    ------
    CoopError
        When ``copy_stream`` is combined with ``arena`` or ``formulation="dynamic"``, or ``arena`` is asked for on a
        step with values on an accelerator; when ``cuda_graph`` is asked for on a step with no CUDA value (CUDA
        graphs replay CUDA kernels only), or with ``arena``, ``copy_stream`` or ``formulation="dynamic"``.
    ContextError
        When ``copy_stream`` is asked for without CUDA, or a value it pages was captured off CUDA.
    ScheduleError
        When ``copy_stream`` is asked for and the plan pages no computed value.
    CaptureError
        For a wrapper coop cannot honour (FSDP, DataParallel; torch.compile with ``strict``), a batch value that is
        neither a tensor nor a flag, or a step that cannot be captured.
    BudgetError
        For a budget that cannot be parsed, or that is below :func:`coop.budget.min_budget` (after the allocator's
        page rounding on CUDA).
    InfeasibleError
        When no plan leaves room for the saved generator states, or (with ``arena``) no plan's footprint fits.
    """
    if copy_stream:
        require_cuda()
        if arena or formulation == "dynamic":
            raise CoopError(f"copy_stream=True does not combine with {'arena=True' if arena else 'formulation=dynamic'} "
                            "yet; drop one of them")
    module, wrapper = unwrap_model(model, strict=strict)
    read = read_batch(example_batch)
    batch = read.tensors
    if captured is None:
        with_alternatives = (formulation == "monet" and device is None) if alternatives is None else alternatives
        captured = capture(module, read, loss_fn=loss_fn, profile=profile, alternatives=with_alternatives,
                           device=device)
    if captured.context is None:
        captured.context = TrainingContext.current(module, batch)
    if captured.sharding is not None and (arena or copy_stream or cuda_graph or formulation == "dynamic"):
        asked = "arena=True" if arena else "copy_stream=True" if copy_stream else "cuda_graph=True" if cuda_graph \
            else "formulation='dynamic'"
        raise CoopError(f"coop replays an FSDP-sharded step with the ordinary static replay only; drop {asked}")
    graph = captured.graph
    if cuda_graph:
        _refuse_cuda_graph(graph, arena=arena, copy_stream=copy_stream, dynamic=formulation == "dynamic")
    budget_bytes = parse_budget(budget, graph)
    if arena:
        refuse_arena_off_cpu(graph)
    allocator = prepare_allocator(graph, streams=2 if copy_stream or cuda_graph else 1)  # a graph: its private pool
    live_bytes = within_allocator_headroom(budget_bytes, allocator, graph)
    if formulation == "dynamic":
        dynamic = DynamicPlan(captured, module, live_bytes, policy=policy, wrapper=wrapper, loss_fn=loss_fn,
                              device_profile=device_profile)
        dynamic.allocator = allocator
        return dynamic
    solver = functools.partial(_plan_within, module, formulation=formulation, time_limit=time_limit,
                               loss_fn=loss_fn, wrapper=wrapper, device_profile=device_profile, exact=exact)
    if captured.sharding is not None and not captured.sharding.weightless:  # every rank replays rank 0's schedule
        require_same_graph(captured)
        solver = solved_on_rank_zero(solver, functools.partial(_plan_from_rank_zero, module, loss_fn=loss_fn))
    within = functools.partial(solver, captured)
    flat = functools.partial(captured.flat_inputs, module, batch)
    if arena:
        chosen = _fit_measured(within, functools.partial(_measure_arena_step, flat=flat), budget_bytes, graph)
    else:
        def replayed_as_asked(aim: int) -> Plan:  # the replay the plan will run, so that its step is measured
            candidate = _within_saved_generator_states(within, aim, graph)
            if copy_stream:
                candidate.use_copy_stream()
            if cuda_graph:  # measured with its graph's private pool (a fresh graph replaces it below)
                candidate.use_cuda_graph()
            return candidate

        chosen = replayed_as_asked(live_bytes)
        footprint, held = _measure_ordinary_step(chosen, live_bytes, flat=flat)
        chosen.note = (chosen.note + "; " if chosen.note else "") + held
        if footprint is not None and footprint > budget_bytes and graph.has_accelerator:
            # the CUDA allocator's reserve above the live bytes: solve lower by the excess
            chosen = _below_measured_excess(chosen, footprint, replayed_as_asked,
                                            functools.partial(_measure_ordinary_step, flat=flat), budget_bytes,
                                            live_bytes)
        elif footprint is not None and footprint > budget_bytes:
            chosen = _with_measured_scratch(chosen, solver, live_bytes, budget_bytes, flat)
        if chosen.step_footprint is not None and chosen.step_footprint > budget_bytes:
            warnings.warn(f"the step holds {format_memory(chosen.step_footprint, graph)}, above the budget "
                          f"{format_memory(budget_bytes, graph)} (the schedule's predicted peak "
                          f"{format_memory(chosen.predicted_peak, graph)}: kernels' internal scratch beyond what the graph "
                          "knows); "
                          "plan with profile=True (capture then measures each kernel's scratch and the schedule counts "
                          "it), or lower the budget by the excess", stacklevel=2)
    if copy_stream and chosen.executor.copy_stream is None:
        chosen.use_copy_stream()
    if cuda_graph:
        chosen.use_cuda_graph()
    chosen.allocator = allocator
    return chosen


def _refuse_cuda_graph(graph: Graph, *, arena: bool, copy_stream: bool, dynamic: bool) -> None:
    """Refuse ``cuda_graph=True`` in one line before solving: a step with no CUDA value, or a combination."""
    require_cuda_graph(graph)
    other = "arena=True" if arena else "copy_stream=True" if copy_stream else "formulation=dynamic" if dynamic else ""
    if other:
        raise CoopError(f"cuda_graph=True does not combine with {other} yet; drop one of them")


#: Re-solves at most to make room for the saved generator states (their count changes with the schedule).
GENERATOR_STATE_ROUNDS = 3


def _within_saved_generator_states(within: Callable[[int], Plan], live_bytes: int, graph: Graph) -> Plan:
    """The plan solved within ``live_bytes`` whose schedule's live peak leaves room for the generator states its
    replay saves (:func:`coop.runtime.executor.saved_generator_bytes`: CPU steps that recompute random ops),
    re-solving below the budget by them where it does not; its note says so."""
    chosen, aim = within(live_bytes), live_bytes
    for round_ in range(GENERATOR_STATE_ROUNDS + 1):
        states = saved_generator_bytes(chosen.graph, chosen.schedule)
        if chosen.predicted_peak + states <= live_bytes:
            if aim < live_bytes:
                chosen.budget = live_bytes
                chosen.note = (chosen.note + "; " if chosen.note else "") + (
                    f"solved within {format_memory(aim, graph)} to leave room for the generator states its replay "
                    f"saves ({format_memory(states, graph)})")
            return chosen
        if round_ == GENERATOR_STATE_ROUNDS:
            break
        aim = min(aim - 1, live_bytes - states)
        chosen = within(aim)
    raise InfeasibleError(f"no plan within {format_memory(live_bytes, graph)} leaves room for the generator states its "
                          f"replay saves (last {format_memory(states, graph)}, live peak "
                          f"{format_memory(chosen.predicted_peak, graph)}); raise the budget by that much")


#: (footprint in bytes or None when it cannot be measured, what it consists of)
Measured = tuple[int | None, str]


def _fit_measured(within: Callable[[int], Plan], measure: Callable[[Plan, int], tuple[int, str]], budget_bytes: int,
                  graph: Graph) -> Plan:
    """The plan solved within the highest live-bytes budget whose measured footprint fits ``budget_bytes``.

    The live-bytes budget that fits lies in [floor, ceiling): below min_budget no schedule exists, and ceiling is
    the least live budget whose plan overflowed. Each round solves, measures the step (``measure``), then aims
    below by what the footprint exceeds the budget; where the solver finds nothing (within its time limit) or the
    aim falls below the floor, it bisects instead.
    """
    floor, ceiling, live_budget, last = min_budget(graph), budget_bytes + 1, budget_bytes, ""
    for _ in range(EXECUTION_ROUNDS):
        try:
            candidate = within(live_budget)
        except InfeasibleError:
            floor, aim = live_budget + 1, None  # no schedule found at or below it
        else:
            footprint, last = measure(candidate, live_budget)
            if footprint <= budget_bytes:
                candidate.note = (candidate.note + "; " if candidate.note else "") + last
                candidate.budget = budget_bytes  # solved within live_budget; the plan keeps the caller's budget
                return candidate
            ceiling = min(ceiling, live_budget)
            aim = next_live_budget(live_budget, candidate.predicted_peak, footprint, budget_bytes)
        if aim is None or aim < floor:
            aim = (floor + ceiling) // 2
        if not floor <= aim < ceiling:
            break
        live_budget = aim
    raise InfeasibleError(f"no plan fits an arena budget of {format_memory(budget_bytes, graph)}: the arena replay's "
                          f"footprint stays above it (last {last or 'none: no schedule to place'}); raise the budget, "
                          "or plan without arena=True")


def _measure_arena_step(candidate: Plan, live_budget: int, *, flat: Callable[[], list[torch.Tensor]]) -> tuple[int, str]:
    """Place ``candidate``'s schedule in arenas, build its arena replay and measure one step
    (:func:`coop.runtime.arena_replay.measure_outside`): its footprint, itemised."""
    placement = execution_placement(candidate.graph, candidate.executor.schedule,
                                    simulation=candidate.executor.simulation)
    candidate.use_arena(placement)
    program = candidate.executor.arena_program
    owned = candidate.graph.caller_owned_bytes
    measure_outside(program, functools.partial(candidate.executor.run_flat, flat()))
    footprint = program.footprint(owned)
    return footprint, _arena_note(candidate, placement, live_budget)


def _with_measured_scratch(chosen: Plan, solver: Callable[..., Plan], live_bytes: int, budget_bytes: int,
                           flat: Callable[[], list[torch.Tensor]]) -> Plan:
    """``chosen`` re-solved on its graph with each op's scratch, measured on ``chosen``'s own replay, as its
    workspace: the planned step fits in memory where an eager one may not, so no unplanned step is run
    (:func:`coop.graph_capture.cost.measure_workspace` over the replay program, each replay node mapped back to
    the graph node it computes). Returns the re-solved plan when its measured step holds within the budget, else
    ``chosen`` (the caller warns)."""
    captured = chosen.captured
    with recorded_program():
        measured = measure_workspace(chosen.executor.module, flat())
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
    graph = with_scratch.graph
    try:
        again = _within_saved_generator_states(functools.partial(solver, with_scratch), live_bytes, graph)
    except (InfeasibleError, BudgetError):
        return chosen
    footprint, held = _measure_ordinary_step(again, live_bytes, flat=flat)
    if footprint is None or footprint > budget_bytes:
        return chosen
    again.note = (again.note + "; " if again.note else "") + (
        f"re-solved with the scratch of {len(scratch)} ops measured on the first plan's replay as their workspace "
        f"(that plan held {format_memory(chosen.step_footprint or 0, graph)}); {held}")
    return again


#: Re-solves at most after a CUDA step reserved more than its budget (each one a solve within the time limit). Three
#: were too few on an H200 (2026-11-26, ResNet-50 at 0.5): 1.507 GB, then 1.444 GB against a 1.437 GB budget when
#: the third round ended; the excess shrinks round after round, but the allocator's fragmentation grows as the
#: live budget falls.
RESERVED_ROUNDS = 5


def _below_measured_excess(chosen: Plan, footprint: int, within: Callable[[int], Plan],
                           measure: Callable[[Plan, int], Measured], budget_bytes: int, live_bytes: int) -> Plan:
    """A plan whose measured step holds within ``budget_bytes``: ``chosen`` held ``footprint``, so solve again below
    its live-bytes budget by the excess (or by the footprint's ratio to the budget, whichever is lower:
    :func:`coop.online.static_arena.next_live_budget`), measure, and repeat at most :data:`RESERVED_ROUNDS` times.

    Raises InfeasibleError, in one line naming the last measure and the fix, where no round fits (or the aim falls
    below min_budget, or the solver finds nothing there)."""
    graph = chosen.graph
    size = functools.partial(format_memory, graph=graph)
    first, live, note = footprint, live_bytes, ""
    for _ in range(RESERVED_ROUNDS):
        aim = next_live_budget(live, chosen.predicted_peak, footprint, budget_bytes)
        if aim < min_budget(graph):
            break
        # A rejected candidate's CUDA graph keeps its private pool reserved while it lives: measured beside the
        # next candidate's, it would count twice (an H200: GPT-2 held 8.3 GB, then 14.0 GB at a lower budget).
        chosen.graph_replay = None
        try:
            candidate = within(aim)
        except (InfeasibleError, BudgetError):
            break
        measured, note = measure(candidate, aim)
        if measured is None or measured <= budget_bytes:
            candidate.note = (candidate.note + "; " if candidate.note else "") + (
                f"re-solved within a live-bytes budget of {size(aim)}: the plan solved within {size(live_bytes)} held "
                f"{size(first)} on the device, above the budget {size(budget_bytes)}; {note}")
            return candidate
        chosen, live, footprint = candidate, aim, measured
    raise InfeasibleError(f"no plan's step stays within the budget {size(budget_bytes)} once the device's allocator "
                          f"reserves its blocks: the last held {size(footprint)} at a live-bytes budget of {size(live)} "
                          f"(first {size(first)}); raise the budget by the excess")


def _measure_ordinary_step(candidate: Plan, live_budget: int, *, flat: Callable[[], list[torch.Tensor]]) -> Measured:
    """Run one step of ``candidate``'s ordinary replay on the example batch and count every CPU byte it holds at
    its peak (:func:`coop.runtime.meter.cpu_allocation_peak`, the CPU allocator's own reports: kernels' internal
    scratch such as oneDNN's convolution reorders included) above the caller-owned values.

    On a step with values on one CUDA device, what the caching allocator reserves for a warm step instead
    (:func:`coop.runtime.reserved.reserved_step_peak`, the measure of the GPU acceptance command) plus the
    caller-owned values. Not measured (None, the note says why): another accelerator, a schedule that pages (on a
    CPU-only step its host copies are CPU allocations too, so the CPU allocator's sum would count the host tier
    as held), and a step run while another profiler is recording.
    """
    graph = candidate.graph
    size = functools.partial(format_memory, graph=graph)
    solved = f"solved within a live-bytes budget of {size(live_budget)}"
    if weightless(candidate.model):
        return None, f"held bytes not measured: the model is on the meta device (no weights); {solved}"
    if candidate.captured.sharding is not None:
        return None, (f"held bytes not measured: a step of an FSDP-sharded model runs collectives and hands its "
                      f"gradients to FSDP; {solved}")
    if graph.has_accelerator:
        counters = cuda_counters(graph.devices)
        if counters is None:
            return None, f"held bytes not measured: the step runs on an accelerator other than one CUDA device; {solved}"
        index = counters.device.index if counters.device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index]):  # the measured steps draw from a copy of the generators
            reserved = reserved_step_peak(lambda: candidate.replay.run_flat(flat()), counters)
        owned = graph.caller_owned_bytes
        candidate.step_footprint = owned + reserved
        pool = " (its CUDA graph's private pool included)" if candidate.graph_replay is not None else ""
        return owned + reserved, (f"held {size(owned + reserved)} = caller-owned {size(owned)} + what the CUDA "
                                  f"allocator reserved for the step{pool} {size(reserved)} (a warm step on the example "
                                  f"batch; predicted live {size(candidate.predicted_peak)}), {solved}")
    if any(step.op == "page_out" for step in candidate.schedule.steps):
        return None, ("held bytes not measured: the schedule pages, and on a CPU-only step the host copies share the "
                      f"CPU allocator; {solved}")
    peak = cpu_allocation_peak(functools.partial(candidate.executor.run_flat, flat()))
    if peak is None:
        return None, f"held bytes NOT measured: another profiler was running; {solved}"
    owned = graph.caller_owned_bytes
    candidate.step_footprint = owned + peak
    return owned + peak, (f"held {size(owned + peak)} = caller-owned {size(owned)} + the step's allocations "
                          f"{size(peak)} (predicted live {size(candidate.predicted_peak)} + kernel scratch measured on "
                          f"the example batch at {torch.get_num_threads()} threads), {solved}")


def within_allocator_headroom(budget_bytes: int, allocator: AllocatorAssumption, graph: Graph) -> int:
    """The live-bytes budget a schedule must meet: the budget less the allocator's page rounding.

    Parameters
    ----------
    budget_bytes : int
        The budget asked for, in bytes.
    allocator : AllocatorAssumption
        What :func:`coop.runtime.allocator.prepare_allocator` assumed; its ``headroom`` is 0 on CPU.
    graph : Graph
        The captured step (for :func:`coop.budget.min_budget` and the message's units).

    Returns
    -------
    int
        ``budget_bytes - allocator.headroom``.

    Raises
    ------
    BudgetError
        When the headroom leaves less than :func:`coop.budget.min_budget`, naming the least budget that leaves
        ``min_budget`` after it.
    """
    live = budget_bytes - allocator.headroom
    least = min_budget(graph)
    if allocator.headroom and live < least:
        raise BudgetError(f"budget {format_memory(budget_bytes, graph)} leaves {format_memory(live, graph)} for the step "
                          f"after the CUDA allocator's page rounding ({format_memory(allocator.headroom, graph)}), below "
                          f"min_budget {format_memory(least, graph)}; use at least {least + allocator.headroom}")
    return live


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


def _footprint_items(program: Any, owned: int, graph: Graph, live_budget: int) -> str:
    """An arena replay's footprint, item by item: ``"X = caller-owned A + arenas B + ..."``."""
    size = functools.partial(format_memory, graph=graph)
    if program.outside_peak is not None:
        how = f"measured on the example batch at {program.outside_threads} threads"
    else:
        how = ("NOT measured: another profiler was running; kernels' internal scratch is not in it, only the largest "
               "transient is")
    outside = program.outside_peak if program.outside_peak is not None else program.max_transient
    return (f"{size(program.footprint(owned))} = caller-owned {size(owned)} + arenas {size(program.arena_bytes)} + "
            f"scratch {size(program.scratch_bytes)} + output slots {size(program.slot_bytes)} + allocated beside them "
            f"{size(outside)} ({how}), solved within a live-bytes budget of {size(live_budget)}")


def _arena_note(candidate: Plan, placement: Any, live_budget: int) -> str:
    """What an arena plan holds at its peak, item by item (the plan's note, or why it was refused)."""
    graph = candidate.graph
    program = candidate.executor.arena_program
    size = functools.partial(format_memory, graph=graph)
    note = (f"arena footprint {_footprint_items(program, graph.caller_owned_bytes, graph, live_budget)}; "
            f"{placement.method} placement")
    if program.transients:  # ops whose kernel allocates its own output: their workspace, computed then copied in
        note += (f"; {len(program.transients)} ops allocate their own output as workspace outside the arena "
                 f"(largest {size(program.max_transient)})")
    return note


def _plan_within(model: nn.Module, captured: Captured, budget_bytes: int, *, formulation: str, time_limit: float,
                 loss_fn: LossFn | None, wrapper: nn.Module | None, device_profile: Any = None,
                 exact: bool = False) -> Plan:
    """Solve within a live-bytes budget; fall back to the cheapest fitting baseline, and say so.

    Formulations see the graph with random draws recomputable (:func:`replay_graph`): the executor
    replays a recomputed dropout mask from its saved generator state, bit for bit.
    """
    graph = exact_only(replay_graph(captured)) if exact else replay_graph(captured)
    result = solve(graph, budget_bytes, formulation, time_limit=time_limit, captured=captured,
                   device_profile=device_profile)
    verdict = None if result.schedule is None else validate(graph, result.schedule, budget_bytes)
    if verdict is not None and verdict.ok:  # its simulation is handed on: the plan simulates its schedule once
        return Plan(model, captured, result.schedule, budget_bytes, result.formulation, result, note=result.message,
                    loss_fn=loss_fn, wrapper=wrapper, simulation=verdict.simulation)
    fallback = cheapest_fitting_baseline(graph, budget_bytes, failed=formulation)
    note = (f"{formulation} found no schedule within the budget ({result.status}: {result.message}); fell back to "
            f"{fallback.formulation}")
    return Plan(model, captured, fallback.schedule, budget_bytes, fallback.formulation, fallback, note=note,
                loss_fn=loss_fn, wrapper=wrapper)


def _plan_from_rank_zero(model: nn.Module, captured: Captured, schedule: Schedule, budget_bytes: int,
                         formulation: str, result: SolveResult | None, note: str, *,
                         loss_fn: LossFn | None) -> Plan:
    """The plan of an FSDP rank other than 0: rank 0's schedule, validated on this rank's own step and budget."""
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


def implementations_used(graph: Graph, schedule: Schedule) -> dict[str, list[str]]:
    """The implementations a schedule chooses (``node:impl``), and which of them are inexact (MONeT).

    Parameters
    ----------
    graph : Graph
        The graph the schedule is for.
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


def _layout_document(captured: Captured) -> dict[str, Any] | None:
    """The saved plan's batch layout (None for positional tensors, ``model(*batch)``)."""
    layout = captured.layout
    if layout.positional_only:
        return None
    try:
        return layout.to_dict()
    except Exception as exc:  # noqa: BLE001 - pytree refuses containers it cannot serialise (a namedtuple, ...)
        raise CoopError(f"cannot save a plan whose batch nests {type(exc).__name__}: {exc}; pass the batch in dicts, "
                        "tuples and lists") from None


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
        When the file cannot be read, is not a coop plan, or was made for a different model or batch shape.
    ContextError
        When the graph differs because the plan was captured in another training context (autocast, eval modules).
    """
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CoopError(f"cannot read plan file {path}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != PLAN_FORMAT:
        raise CoopError(f"{path} is not a coop plan (expected format {PLAN_FORMAT!r})")
    # Tracing runs on fake tensors, so a batch of zeros of the saved shapes captures the same graph.
    module, wrapper = unwrap_model(model, strict=False)
    device = next(module.parameters()).device
    batch = tuple(torch.zeros(b["shape"], dtype=getattr(torch, b["dtype"]), device=device) for b in document["batch"])
    layout = layout_from_dict(document["layout"]) if document.get("layout") else None  # None: model(*batch)
    if layout is not None and len(layout.tensor_paths) != len(batch):
        raise CoopError(f"plan file {path} names {len(layout.tensor_paths)} batch tensors in its layout and "
                        f"{len(batch)} shapes; make a new plan with coop.plan")
    example = Batch(layout, batch) if layout is not None else batch
    captured = capture(module, example, loss_fn=loss_fn, alternatives=bool(document.get("alternatives", False)))
    captured.context = TrainingContext.current(module, batch)
    if captured.graph.structure_sha256 != document["graph"]["structure_sha256"]:
        saved = document.get("context") or {}
        now = {"autocast": [list(a) for a in captured.context.autocast], "eval_modules": list(captured.context.eval_modules)}
        changed = [f"{key} was {saved[key] or 'off/none'} and is {now[key] or 'off/none'}"
                   for key in now if key in saved and saved[key] != now[key]]
        if changed:
            raise ContextError(f"plan {path} was captured in another training context ({'; '.join(changed)}); load it "
                               "in the context it was made in, or make a new plan with coop.plan")
        raise CoopError(f"plan {path} was made for a different model or batch shape (graph digest differs"
                        f"{op_difference(document['graph'], captured.graph)}"
                        f"{version_difference(document.get('versions'))}); make a new plan with coop.plan")
    schedule = Schedule(steps=tuple(Step.model_validate(s) for s in document["steps"]))
    return Plan(module, captured, schedule, int(document["budget"]), document["formulation"], loss_fn=loss_fn,
                wrapper=wrapper)


def op_counts(graph: Graph) -> dict[str, int]:
    """How many nodes of each op ``graph`` has (saved with a plan, to say how another capture differs).

    Parameters
    ----------
    graph : Graph
        A captured step.

    Returns
    -------
    dict of str to int
        Op name (``""`` for a node without one) to its count, sorted by name.
    """
    return dict(sorted(Counter(node.op or "" for node in graph.nodes).items()))


#: The libraries whose versions decide the traced program: torch's dispatch and decompositions, and a model
#: library's Python (transformers 5.17 and 5.24 trace Llama's rotary embedding and causal mask differently).
TRACED_LIBRARIES = ("torch", "transformers")


def library_versions() -> dict[str, str]:
    """The installed versions of :data:`TRACED_LIBRARIES` (those installed), saved with a plan.

    Returns
    -------
    dict
        Library name -> version string.
    """
    versions = {}
    for name in TRACED_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def version_difference(saved: dict[str, str] | None) -> str:
    """The traced libraries whose versions differ from a saved plan's, for :func:`load_plan`'s refusal.

    Parameters
    ----------
    saved : dict or None
        The plan file's ``versions`` (None: a plan saved before they were recorded).

    Returns
    -------
    str
        ``"; the plan was saved under transformers 5.24.0 and this process runs 5.17.0 (...)"``, or ``""``.
    """
    if not saved:
        return ""
    now = library_versions()
    differing = [f"{name} {saved[name]} and this process runs {now.get(name, 'none')}" for name in TRACED_LIBRARIES
                 if name in saved and saved[name] != now.get(name)]
    if not differing:
        return ""
    return (f"; the plan was saved under {'; '.join(differing)} (another version may trace another program: plan "
            "and train with the same versions)")


def op_difference(saved: dict[str, Any], graph: Graph) -> str:
    """What differs between a saved plan's graph and a new capture, for :func:`load_plan`'s refusal.

    Parameters
    ----------
    saved : dict
        The plan file's ``graph`` section (``nodes`` and ``ops`` where the plan was saved with them).
    graph : Graph
        The graph captured now.

    Returns
    -------
    str
        ``"; the plan's graph has N nodes and this one M: OP x 12 there, 0 here, ..."`` (the first three ops whose
        counts differ, with a hint where a fused attention kernel is among them), a note that the op counts agree,
        or ``""`` where the plan file holds no op counts.
    """
    if "ops" not in saved:
        return ""
    there, here = Counter(saved["ops"]), Counter(op_counts(graph))
    differing = [op for op in sorted(set(there) | set(here)) if there[op] != here[op]]
    if not differing:
        return f"; both have {len(graph.nodes)} nodes of the same ops, wired or sized differently"
    shown = ", ".join(f"{op} x {there[op]} there, {here[op]} here" for op in differing[:3])
    more = f" (+{len(differing) - 3} more ops)" if len(differing) > 3 else ""
    fused = (" -- a fused attention kernel differs: capture and train under the same "
             "torch.nn.attention.sdpa_kernel([...])" if any("scaled_dot_product" in op for op in differing) else "")
    return f"; the plan's graph has {saved.get('nodes', '?')} nodes and this one {len(graph.nodes)}: {shown}{more}{fused}"
