"""coop.plan: capture -> budget -> solve and measure (the rounds) -> the replay asked for.

Orchestration only, each job in its module: the options and their refusals (:mod:`coop.planner.options`), one
solve with its fallback (:mod:`coop.planner.solving`), the measure-and-re-solve rounds (:mod:`coop.planner.rounds`,
:mod:`coop.planner.measure`), the static :class:`Plan` (:mod:`coop.planner.static_plan`) and its files
(:mod:`coop.planner.plan_files`). A plan shows the common face of :class:`coop.planner.base.BasePlan`: a static
:class:`Plan`, or with ``formulation="dynamic"`` a :class:`coop.planner.dynamic.DynamicPlan`.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from coop.budget import format_memory, min_budget, parse_budget, store_all_fits
from coop.errors import BudgetError
from coop.formulations.core.progress import StageProgress
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.batch import Batch, read_batch
from coop.graph_capture.context import TrainingContext
from coop.planner.base import LossFn
from coop.planner.dynamic import DynamicPlan
from coop.planner.measure import measure_arena_step, measure_ordinary_step, modelled_ordinary_step
from coop.planner.options import PlanOptions
from coop.planner.plan_files import library_versions, op_counts, op_difference, version_difference
from coop.planner.ranks import require_same_graph, solved_on_rank_zero
from coop.planner.rounds import GENERATOR_STATE_ROUNDS, RESERVED_ROUNDS, Round, Rounds
from coop.planner.solving import ReportedRounds, exact_only, plan_from_rank_zero, solve_within
from coop.planner.static_plan import Plan, implementations_used, load_plan, refuse_arena_off_cpu
from coop.runtime.allocator import AllocatorAssumption, prepare_allocator
from coop.runtime.executor import replay_graph, unwrap_model


def plan(model: nn.Module, budget: str | float, example_batch: Any, *, loss_fn: LossFn | None = None,
         formulation: str = "auto", time_limit: float = 60, profile: bool = False, arena: bool = False,
         captured: Captured | None = None, device_profile: Any = None, alternatives: bool | None = None,
         exact: bool = False, copy_stream: bool = False, cuda_graph: bool = False, strict: bool = False,
         device: str | None = None, policy: str = "coop", progress: bool | None = None) -> Plan | DynamicPlan:
    """Capture a training step, solve for a schedule within ``budget`` and return its replay.

    A formulation that finds no schedule within the budget falls back to the cheapest fitting baseline (the
    ``note`` says so). The planned step is run once on ``example_batch`` to measure what it holds
    (``summary()["step_footprint"]``); where that exceeds the budget (the generator states a CPU replay saves,
    kernels' scratch, the CUDA allocator's reserve) it is solved again below, each solve a round listed in
    ``summary()["rounds"]`` (:mod:`coop.planner.rounds`), with a warning naming the fix where none fits. The budget
    holds once the caller released the previous ``.grad`` values (``zero_grad()``). The plan records the training
    context it was captured in and ``step`` honours it; a DistributedDataParallel model is captured without the
    wrapper, whose reducer syncs the gradients; a ``torch.compile``d one through its ``_orig_mod``, with a warning.

    Parameters
    ----------
    model : nn.Module
        The model to train, possibly wrapped in DistributedDataParallel or compiled by ``torch.compile``.
    budget : str or float
        Bytes, a size (``"6GiB"``) or a share of the baseline peak (``"90%"``, 0.9): :func:`coop.budget.parse_budget`.
    example_batch : Any
        One batch as the model takes it: a dict (``model(**batch)``), a tuple or list (``model(*batch)``) or one
        tensor, nesting tensors and flags (:func:`coop.graph_capture.batch.read_batch`).
    captured : Captured or None
        An earlier :func:`coop.capture` of this model and batch to reuse (several budgets, one capture).
    loss_fn, formulation, time_limit, profile, arena, device_profile, alternatives, exact : Any
        How the step is captured and solved: each a field of :class:`coop.planner.options.PlanOptions`, which says
        what it does.
    copy_stream, cuda_graph, strict, device, policy : Any
        How the plan replays: fields of :class:`PlanOptions` too.
    progress : bool or None
        Report each stage on stderr with the real seconds since the call began (:attr:`PlanOptions.progress`);
        None: when stderr is a terminal.

    Returns
    -------
    Plan or DynamicPlan
        The plan, ready to ``step``; a :class:`DynamicPlan` for ``formulation="dynamic"``.

    Raises
    ------
    CoopError, ContextError, CaptureError
        For an option combination or step coop does not replay (:class:`PlanOptions`), or a step it cannot capture.
    BudgetError
        For a budget that cannot be parsed, or below :func:`coop.budget.min_budget` (after the allocator's rounding).
    InfeasibleError
        When no round's plan holds within the budget where it must (generator states, the arena, CUDA's reserve).
    """
    options = PlanOptions(loss_fn=loss_fn, formulation=formulation, time_limit=time_limit, profile=profile,
                          arena=arena, device_profile=device_profile, alternatives=alternatives, exact=exact,
                          copy_stream=copy_stream, cuda_graph=cuda_graph, strict=strict, device=device, policy=policy,
                          progress=progress)
    reporter = options.reporter()
    options.refuse_combinations()
    module, wrapper = unwrap_model(model, strict=strict)
    read = read_batch(example_batch)
    captured = captured if captured is not None else options.capture(module, read, reporter)
    if captured.context is None:
        captured.context = TrainingContext.current(module, read.tensors)
    options.refuse_for(captured)
    # the bound of the graph the executor replays (its random draws recomputable); with a device profile POET may page
    # what cannot be recomputed: then the bound of paged schedules
    bounded = replay_graph(captured)
    budget_bytes = parse_budget(budget, bounded, paging=options.pages)
    if arena:
        refuse_arena_off_cpu(captured.graph)
    allocator = prepare_allocator(captured.graph, streams=options.streams)
    live_bytes = within_allocator_headroom(budget_bytes, allocator, bounded, paging=options.pages)
    if options.dynamic:
        chosen: Plan | DynamicPlan = DynamicPlan(captured, module, live_bytes, policy=policy, wrapper=wrapper,
                                                 loss_fn=loss_fn, device_profile=device_profile)
    else:
        chosen = _solved_and_measured(module, wrapper, captured, read, options, budget_bytes, live_bytes, reporter,
                                      allocator)
        if fits := store_all_fits(budget_bytes, captured.graph):  # said in the summary, not an error
            chosen.note = f"{fits}; {chosen.note}" if chosen.note else fits
    chosen.allocator = allocator
    reporter.stage(_ready_line(chosen), final=True)
    return chosen


def _ready_line(chosen: Plan | DynamicPlan) -> str:
    """The last line of ``coop.plan``'s progress: the plan it returns."""
    if isinstance(chosen, DynamicPlan):
        return f"plan ready: online eviction ({chosen.policy_name} policy)"
    return (f"plan ready: {chosen.formulation}, predicted overhead {100 * chosen.predicted_overhead:.2f} %, "
            f"{len(chosen.rounds)} round{'s' if len(chosen.rounds) != 1 else ''}")


def _solved_and_measured(module: nn.Module, wrapper: nn.Module | None, captured: Captured, batch: Batch,
                         options: PlanOptions, budget_bytes: int, live_bytes: int, progress: StageProgress,
                         allocator: AllocatorAssumption) -> Plan:
    """The rounds of a static plan (rank 0's solves on an FSDP-sharded step), then the replay asked for; each round
    said on ``progress``."""
    solver = functools.partial(solve_within, module, formulation=options.formulation, time_limit=options.time_limit,
                               loss_fn=options.loss_fn, wrapper=wrapper, device_profile=options.device_profile,
                               paging=options.pages, exact=options.exact, progress=progress)
    if captured.sharding is not None and not captured.sharding.weightless:  # every rank replays rank 0's schedule
        require_same_graph(captured)
        solver = solved_on_rank_zero(solver, functools.partial(plan_from_rank_zero, module, loss_fn=options.loss_fn))
    flat = functools.partial(captured.flat_inputs, module, batch.tensors)
    measure = functools.partial(measure_arena_step, flat=flat) if options.arena else \
        functools.partial(measure_ordinary_step, flat=flat, allocator=allocator)
    predict = None if options.arena else functools.partial(modelled_ordinary_step, allocator=allocator)
    rounds = ReportedRounds(solver, captured, budget_bytes, live_bytes, measure=measure,
                            prepare=options.prepare, flat=flat, progress=progress,
                            paging=options.pages, predict=predict)
    chosen = rounds.arena() if options.arena else rounds.ordinary()
    if options.copy_stream and chosen.executor.copy_stream is None:
        chosen.use_copy_stream()
    if options.cuda_graph:
        chosen.use_cuda_graph()
    chosen.rounds = rounds.taken
    return chosen


def within_allocator_headroom(budget_bytes: int, allocator: AllocatorAssumption, graph: Graph, *,
                              paging: bool = False) -> int:
    """The live-bytes budget a schedule must meet: the budget less the allocator's page rounding.

    Parameters
    ----------
    allocator : AllocatorAssumption
        What :func:`coop.runtime.allocator.prepare_allocator` assumed; its ``headroom`` is 0 on CPU.
    graph : Graph
        The captured step (for :func:`coop.budget.min_budget` and the message's units).
    paging : bool
        Whether the schedule may page (a device profile): the bound is then that of paged schedules.

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
    least = min_budget(graph, paging=paging)
    if allocator.headroom and live < least:
        raise BudgetError(f"budget {format_memory(budget_bytes, graph)} leaves {format_memory(live, graph)} for the step "
                          f"after the CUDA allocator's page rounding ({format_memory(allocator.headroom, graph)}), below "
                          f"min_budget {format_memory(least, graph)}; use at least {least + allocator.headroom}")
    return live


__all__ = [
    "GENERATOR_STATE_ROUNDS",
    "RESERVED_ROUNDS",
    "Plan",
    "PlanOptions",
    "Round",
    "Rounds",
    "exact_only",
    "implementations_used",
    "library_versions",
    "load_plan",
    "op_counts",
    "op_difference",
    "plan",
    "refuse_arena_off_cpu",
    "version_difference",
    "within_allocator_headroom",
]
