"""``coop.compile`` and ``coop.partitioner``: coop's plan inside ``torch.compile``.

``coop.compile(model, budget)`` is ``torch.compile(model, ...)`` with :class:`~coop.compiled.partitioner.
CoopPartitioner` as inductor's partitioner, so the training loop stays as it is::

    >>> import torch, coop
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    >>> compiled = coop.compile(model, 0.8, time_limit=5)
    >>> compiled(torch.randn(4, 8)).sum().backward()  # doctest: +SKIP

With ``example_batch`` it runs a warm-up step and one measured step right away (the CPU allocator's own reports,
or the CUDA allocator's reserved bytes; :func:`coop.compiled.measure.held_bytes`) and, while the compiled step
holds more than its budget, plans again below the excess and recompiles; a plan that fits but recomputes and
leaves slack is planned again with the budget raised (``rounds`` bounds both; :mod:`coop.compiled.refit`). The
measured rounds of a model with convolution modules start with inductor's own layout optimization (channels-last
convolutions, faster on a CPU: the quick ResNet of bench_compile at the compiler's own held bytes ran 12.29 against
14.15 ms without it, 2026-11-30) and turn it off, with the pin, for the rounds after the first that misses its
budget: the layout copies caller-owned convolution inputs (the batch, the weights) and saves the copies for the
backward, bytes no plan holds (the same ResNet held 3,209,008 B with it and 2,806,384 B without, for one plan). A
first miss by no more than those copies (:mod:`coop.compiled.layout_copies`) is planned again once, layout and
inductor's order kept, below what the step held above its plan; a miss after that switches both. Inductor's ``addmm``
folds are switched the same way: the measured rounds keep them until a miss, after which :mod:`coop.compiled.order`
puts each product back where coop's schedule ran it (always, where nothing is measured).
Inductor's horizontal fusion is switched the same way (on in the measured rounds until one misses its budget: a
fused kernel runs where its earliest member was, so a recomputation fused with an earlier kernel lives longer than
planned). Without ``example_batch`` nothing is measured and both stay off. A fraction is of each compiled graph's own
peak without recomputation; with graph breaks every graph gets that share of its own peak (a budget in bytes
applies to each graph alone, so give a fraction, or ``fullgraph=True``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule
from torch._dynamo.exc import BackendCompilerFailed

from coop.compiled.inductor_buffers import BufferObserver
from coop.compiled.measure import step_loss
from coop.compiled.observed import Observation
from coop.compiled.order import KeepMatmulsInPlace
from coop.compiled.partitioner import CoopPartitioner, SolveMemo
from coop.compiled.pin import KeepFusionInOrder, PinScheduleOrder
from coop.compiled.record import CompiledRecord, CompileRound
from coop.compiled.refit import fit_measured, held_follows_the_plan
from coop.errors import CoopError, NeedsCudaError
from coop.formulations.core.progress import StageProgress
from coop.graph_capture.host_cost import machine_rates
from coop.planner.options import SOLVER_REPORT_INTERVAL_S

#: a fusion score no two kernels reach: no horizontal fusion (see :func:`compile`)
NO_HORIZONTAL_FUSION = 1 << 62

__all__ = ["CompileRound", "CompiledRecord", "CoopCompiledModule", "compile", "held_follows_the_plan", "inductor_options",
           "partitioner"]



class CoopCompiledModule(OptimizedModule):
    """What ``torch.compile`` returns, whose compile errors from coop's partitioner are coop's one line.

    Inductor compiles at the first call and wraps a partitioner's error in ``BackendCompilerFailed`` with its
    traceback; a :class:`~coop.errors.CoopError` (a budget below the floor, a graph coop refuses) is raised as
    itself instead.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except BackendCompilerFailed as exc:
            if isinstance(exc.inner_exception, CoopError):
                raise exc.inner_exception from None
            raise


def partitioner(budget: str | float, *, formulation: str = "auto", time_limit: float = 30.0,
                threads: int = 2, progress: bool | None = None) -> CoopPartitioner:
    """coop's partitioner for users who call ``torch.compile`` themselves.

    ``torch.compile(model, options={"custom_partitioner_fn": coop.partitioner(0.5)})``. Nothing is measured: the
    budget holds for the plan, and inductor's fusion may move it (``coop.compile(..., example_batch=)`` measures).

    Parameters
    ----------
    budget, formulation, time_limit, threads
        As :class:`~coop.compiled.partitioner.CoopPartitioner` takes them.
    progress : bool or None
        Report each graph's planning on stderr as inductor compiles it (as ``coop.compile``'s ``progress``).

    Returns
    -------
    CoopPartitioner
        The partitioner; its ``plans`` fill as inductor compiles.
    """
    return CoopPartitioner(budget, formulation=formulation, time_limit=time_limit, threads=threads,
                           progress=_reporter(progress))


def compile(model: nn.Module, budget: str | float, *, formulation: str = "auto",
            time_limit: float = 30.0, threads: int = 2, example_batch: Any = None,
            loss_fn: Callable[[Any], torch.Tensor] | None = None, rounds: int = 3, progress: bool | None = None,
            device: str | None = None, pricing: str = "fused", pin: bool | None = None,
            **compile_kwargs: Any) -> nn.Module:
    """``torch.compile(model, **compile_kwargs)`` with coop as inductor's partitioner (module docstring).

    Parameters
    ----------
    model : nn.Module
        The model (real weights, not wrapped by DDP or FSDP).
    budget : str or float
        Bytes or a share of the compiled step's peak without recomputation (the one budget parser's forms).
    formulation, time_limit, threads
        The coop formulation (no paging) and its solver limits, per compiled graph.
    example_batch : Any
        A tensor, a tuple of positional arguments or a dict of keyword arguments: coop runs one measured forward
        and backward now and plans again while the step holds more than the budget (gradients, buffers and the
        RNG are put back). None: compile lazily, nothing measured.
    loss_fn : callable or None
        Maps the model's output to the loss (default: the output itself, its ``loss`` attribute, or its first
        element).
    rounds : int
        At most this many plans of the measured re-solve that seek the budget (a miss in inductor's order that
        switches the rounds to coop's order is not one of them); after the first within it, at most
        ``min(2, rounds - 1)`` more planned with its slack (:mod:`coop.compiled.refit`: the cheapest round within
        the budget is kept).
    progress : bool or None
        Report on stderr as the call goes, each line stamped with the seconds since it began: each round as it
        starts (and why) and what its step held, each graph's solve (``auto``'s rungs, the solver's incumbents at
        most every 5 s) and its plan, and the round returned. None (the default): where stderr is a terminal, as
        ``coop.plan``'s ``progress``; False: never.
    device : str or None
        For a meta-device model only: the device to plan for (``"cuda"``: values sized as its allocator holds
        them). A meta-device model is planned, not compiled for training (module docstring).
    pricing : str
        ``"fused"`` (default): the capture's nominal rates, the random draws (inductor's, or eager's mask draws) at
        this machine's measured price, and a recomputed pointwise value priced without the buffers inductor's fusion
        never writes; ``"nominal"``: the nominal rates alone; ``"draws"``: those and the draws; ``"measured"``:
        every op of a CPU step as its compiled kernel runs here (:mod:`coop.compiled.pricing`,
        :func:`coop.compiled.joint.lower_joint`).
    pin : bool or None
        Run the compiled kernels in coop's order (:mod:`coop.compiled.pin`: no fusion that would compute a value
        early across another kernel coop ran first). None (the default): inductor fuses and orders the kernels as it
        would until a measured round (``example_batch``) holds more than its budget, and the rounds after it are
        pinned (inductor's scheduler can move a recomputation of coop's schedule early and keep its value live across
        the step's peak: the tied MLP of tests/test_compile_observed.py at 0.5 held 2,516,488 B unpinned against its
        budget 2,277,892 B, 2,266,888 B pinned, 2026-11-30). True: pinned from the first compilation. False: never
        pinned (LLaMA at 0.5 ran 120.85 against 84.22 ms for the compiler's own budget pinned, its first plan kept
        recomputing 1.577 GFLOP: the pin costs speed where inductor's order meets the budget).
    **compile_kwargs
        ``torch.compile``'s (``mode`` becomes the options it stands for; ``dynamic`` must stay False; CUDA graphs,
        ``mode="reduce-overhead"``, are refused on a CPU model). Inductor
        options coop sets unless ``options`` sets them: no horizontal fusion (``score_fusion_memory_threshold``) and
        layout optimization as the module docstring says. On a CPU step with dropout,
        ``options={"fallback_random": True}`` trades memory for speed: inductor's own CPU draw builds a Philox engine
        per element (27-30 ns an element at one thread on the machine of BENCHMARKS.md, against 8.9 ns for eager's
        ``bernoulli_``), so bench_compile's BERT step ran
        162.00 ms compiled against 139.68 ms eager, and 134.00 ms with eager's draws (2026-11-29). A dropout is then
        eager's ``native_dropout``, which coop splits into its draw and a product
        (:func:`coop.graph_capture.random_ops.split_native_dropouts`, float32 and float64): the mask (one byte an
        element, float8 zeros and ones on CPU) is held for the backward, never drawn again, and the output is
        rebuilt from it where the schedule says; with inductor's draws (the default) coop rebuilds a mask from its
        seed and holds only the seeds.

    Returns
    -------
    nn.Module
        What ``torch.compile`` returns, with ``coop_record`` (plans and rounds; ``coop_record.summary()``).
    """
    _refuse(model, compile_kwargs)
    reporter = _reporter(progress)
    reporter.stage(f"coop.compile: {formulation}, time limit {time_limit:g} s per graph"
                   + (f", up to {max(1, rounds)} measured round{'s' if rounds > 1 else ''}" if example_batch is not None
                      else ""))
    if any(p.device.type == "meta" for p in model.parameters()):
        return _plan_on_meta(model, budget, example_batch, loss_fn, device, formulation=formulation,
                             time_limit=time_limit, threads=threads, progress=reporter, pricing=pricing)
    if device is not None:
        raise CoopError(f"coop.compile: device={device!r} is for meta-device models; a model with real weights is "
                        "planned on its own device: leave device out")
    control = _RoundControl.for_model(model, compile_kwargs, example_batch, pin)

    memo = SolveMemo()  # a round compiled again on the same Graph and budget is not solved again

    def compile_with(shave: int, observation: Observation | None = None, requested: int | None = None) -> nn.Module:
        # a later round keeps the first round's budget in bytes: a share of a Graph rebuilt from an observation
        # would be another number
        part = CoopPartitioner(budget if requested is None else requested, formulation=formulation,
                               time_limit=time_limit, threads=threads, shave=shave, observation=observation,
                               pricing=pricing, memo=memo, progress=reporter)
        options = control.options(part)
        observer, keeper, pinner = _install_passes(options, control.pinned, control.keep_matmuls)
        compiled = torch.compile(model, backend="inductor", options=options, **compile_kwargs)
        compiled.__class__ = CoopCompiledModule
        compiled.coop_record = CompiledRecord(partitioner=part, buffers=observer, order=keeper,
                                              pin=pinner, layout_optimization=bool(options["layout_optimization"]),
                                              horizontal_fusion=options["score_fusion_memory_threshold"]
                                              != NO_HORIZONTAL_FUSION,
                                              addmm_folds=keeper is None)
        return compiled

    if example_batch is None:
        return compile_with(0)
    if pricing != "nominal" and all(p.device.type == "cpu" for p in model.parameters()):
        # the partitioner's calibration runs inside the first measured step otherwise, and its tensors were counted
        # as the step's (the tied MLP of tests/test_compile_observed.py at 0.5: 9,273,184 B measured in round 0 for
        # a step that holds 2,262,536 B)
        machine_rates()
    return fit_measured(compile_with, example_batch, loss_fn, max(1, rounds),
                        control.after_miss if control.switches else None, reporter)


@dataclass
class _RoundControl:
    """What coop sets of inductor's options, order and layout per compilation, and the switch after the first
    measured round over its budget (:func:`coop.compiled.refit.fit_measured`'s ``pin_after_miss``)."""

    pinned: bool
    channels_last: bool
    pin_switch: bool
    horizontal_fusion: bool = False
    keep_matmuls: bool = True
    #: the user's inductor options with coop's defaults (:func:`inductor_options`)
    user_options: dict[str, Any] = field(default_factory=dict)
    #: inductor's own horizontal-fusion threshold, restored while ``horizontal_fusion``
    inductors_fusion: int = 0

    @classmethod
    def for_model(cls, model: nn.Module, compile_kwargs: dict[str, Any], example_batch: Any,
                  pin: bool | None) -> _RoundControl:
        """The first compilation's settings; takes the inductor options out of ``compile_kwargs``."""
        users_set = compile_kwargs.get("options") or {}  # before inductor_options adds coop's defaults
        user_options = inductor_options(compile_kwargs)
        measured = example_batch is not None
        return cls(
            pinned=bool(pin),
            # inductor's channels-last layout while measured rounds meet the budget (module docstring), where the
            # user left it (a model without convolution modules has nothing to lay out: it stays off, nothing
            # switches it)
            channels_last=(measured and "layout_optimization" not in users_set
                           and torch._inductor.config.layout_optimization
                           and any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())),
            # the pin is coop's _post_fusion_custom_pass: where the user set their own, nothing to switch on
            pin_switch=pin is None and user_options.get("_post_fusion_custom_pass") is None,
            # inductor's horizontal fusion while measured rounds meet the budget, where the user left the threshold
            # (ResNet of bench_compile at the compiler's own held bytes: 7.55 ms with it, 7.89 ms without; the
            # compiler itself 7.37 ms and 8.07 ms without it, 2026-12-01)
            horizontal_fusion=measured and "score_fusion_memory_threshold" not in users_set,
            # inductor's addmm folds while measured rounds meet the budget (the matmul keeper, coop.compiled.order,
            # only after a miss or where nothing is measured): undoing a fold splits one kernel into a product and an
            # add (bench_compile's ViT at 0.9, one plan: 287.96 ms with the keeper, 262.70 without, the plain compile
            # 255.72, the same 51,228,456 B held, 2026-12-01)
            keep_matmuls=not measured or user_options.get("post_grad_custom_post_pass") is not None,
            user_options=user_options, inductors_fusion=torch._inductor.config.score_fusion_memory_threshold)

    def options(self, partitioner: CoopPartitioner) -> dict[str, Any]:
        """This compilation's inductor options: the user's, coop's partitioner, and the layout and fusion as they
        stand now (the passes are :func:`_install_passes`')."""
        options = {**self.user_options, "custom_partitioner_fn": partitioner}
        if self.channels_last:
            options["layout_optimization"] = True
        if self.horizontal_fusion:
            options["score_fusion_memory_threshold"] = self.inductors_fusion
        return options

    @property
    def switches(self) -> bool:
        """Whether :meth:`after_miss` has anything to switch."""
        return self.pin_switch or self.channels_last or not self.keep_matmuls

    def after_miss(self) -> str:
        """Coop's order, no channels-last copies and no horizontal fusion for the rounds after the first miss; the
        reason's words."""
        words = []
        if self.pin_switch:
            self.pinned = True
            words.append("with the kernels in coop's order")
        if self.channels_last:  # on until now: only measured rounds turn it on, and this runs once
            self.channels_last = False
            words.append("without inductor's channels-last layout")
        if self.horizontal_fusion:  # likewise
            self.horizontal_fusion = False
            words.append("without horizontal fusion")
        if not self.keep_matmuls:  # likewise
            self.keep_matmuls = True
            words.append("with coop's products where its schedule put them")
        return " and ".join(words)


def _install_passes(options: dict[str, Any], pinned: bool,
                    keep_matmuls: bool = True) -> tuple[BufferObserver | None, KeepMatmulsInPlace | None,
                                                        PinScheduleOrder | None]:
    """Coop's inductor passes into ``options`` where the user set none of their own: the buffer observer, the pin
    (:mod:`coop.compiled.pin`, where ``pinned``) and the matmul keeper (:mod:`coop.compiled.order`, where
    ``keep_matmuls``); those installed."""
    observer = keeper = pinner = None
    if options.get("_post_fusion_custom_pass") is None:
        observer = BufferObserver()
        options["_post_fusion_custom_pass"] = observer
        if pinned:  # no fusion across coop's order, the fused kernels in coop's order
            guard = None
            if options.get("_pre_fusion_custom_pass") is None:
                guard = options["_pre_fusion_custom_pass"] = KeepFusionInOrder()
            pinner = options["_post_fusion_custom_pass"] = PinScheduleOrder(observer, guard)
    if keep_matmuls and options.get("post_grad_custom_post_pass") is None:
        keeper = options["post_grad_custom_post_pass"] = KeepMatmulsInPlace()
    return observer, keeper, pinner


def inductor_options(compile_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The user's inductor options (``options``, ``mode`` as the options it stands for; both taken out of
    ``compile_kwargs``, ``dynamic`` set False unless given), and the two options coop sets unless the user does."""
    compile_kwargs.setdefault("dynamic", False)
    user_options = dict(compile_kwargs.pop("options", None) or {})
    mode = compile_kwargs.pop("mode", None)
    if mode is not None:  # torch.compile takes a mode or options, not both: the mode as the options it stands for
        user_options = {**torch._inductor.list_mode_options(mode, compile_kwargs["dynamic"]), **user_options}
    # Horizontal fusion joins independent kernels and runs the joined kernel where its earliest member was, so a
    # recomputation fused with an earlier kernel runs early and lives long (measured: 16.5 MB held for a 10.6 MB
    # plan on a 6-layer MLP; 13.1 MB without it). Still needed with the measured re-solve (2026-11-30, inductor's
    # default threshold 10): the tied MLP of test_compile_observed at 0.6 held 2,757,640 B against 2,733,471 B in
    # both rounds, twice, where without it the step met the budget. Off unless the user sets the threshold;
    # coop.compile's measured rounds turn it on until one misses its budget (as the layout below), where a
    # measurement shows whether a fused kernel ran a recomputation early.
    user_options.setdefault("score_fusion_memory_threshold", NO_HORIZONTAL_FUSION)
    # Inductor's layout optimization runs a convolution in channels-last: it copies the convolution's weight and
    # input (the batch, the weights: caller-owned values coop counts once) and saves the copies for the backward,
    # bytes no Graph of the joint graph has (ViT at 0.5: 1,671,168 B from the forward's first kernel to the
    # backward's convolution). Off unless the user sets it; coop.compile's measured rounds turn it on until one
    # misses its budget (module docstring), where a measurement shows what the copies hold. With it, bench_compile's
    # ViT at 0.9 was no faster (176.74 against 173.47 ms, eager draws, within the run's noise), its ResNet faster.
    user_options.setdefault("layout_optimization", False)
    return user_options


def _reporter(progress: bool | None) -> StageProgress:
    """The progress of one coop.compile or partitioner: on stderr where ``progress`` is True, or None and stderr is
    a terminal (:meth:`StageProgress.on_stderr`); solvers' incumbent lines at most every 5 s."""
    return StageProgress.on_stderr(progress, min_interval_s=SOLVER_REPORT_INTERVAL_S)


def _plan_on_meta(model: nn.Module, budget: str | float, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
                  device: str | None, **options: Any) -> nn.Module:
    """Plan a meta-device model's compiled step for ``device`` without compiling kernels.

    AOTAutograd traces the joint graph with inductor's decompositions and hands it to the same partitioner; its
    forward and backward modules run as fx graphs on meta tensors (no data, no kernels), once, so that every graph
    of the step is planned. The joint graph is the one inductor would partition but for inductor's own joint passes
    (its RNG rewrite among them: a dropout stays one random op).
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    if batch is None:
        raise CoopError("coop.compile: a meta-device model is planned on an example batch: pass example_batch= "
                        "(meta tensors of the training batch's shapes)")
    part = CoopPartitioner(budget, device=device, **options)
    backend = aot_autograd(fw_compiler=_as_is, bw_compiler=_as_is, partition_fn=part,
                           decompositions=select_decomp_table())
    planned = torch.compile(model, backend=backend, dynamic=False)
    planned.__class__ = CoopCompiledModule
    planned.coop_record = CompiledRecord(partitioner=part)
    step_loss(planned, batch, loss_fn).backward()
    model.zero_grad(set_to_none=True)
    return planned


def _as_is(gm: torch.fx.GraphModule, example_inputs: Any) -> torch.fx.GraphModule:
    """A compiler that leaves the graph as it is (run by fx on meta tensors)."""
    return gm


def _refuse(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """One line for what coop.compile cannot honour yet."""
    backend = kwargs.pop("backend", "inductor")
    if backend != "inductor":
        raise CoopError(f"coop.compile plans inductor's partition; backend={backend!r} has none: leave backend "
                        "out (inductor)")
    if kwargs.get("dynamic"):
        raise CoopError("coop.compile plans static shapes: leave dynamic=False (one plan per input shape)")
    if not isinstance(model, nn.Module):
        raise CoopError(f"coop.compile takes an nn.Module, not {type(model).__name__}")
    mode = kwargs.get("mode")
    asked = (torch._inductor.list_mode_options(mode, False) if mode is not None else {}) | (kwargs.get("options") or {})
    parameters = list(model.parameters())
    if asked.get("triton.cudagraphs") and parameters and all(p.device.type == "cpu" for p in parameters):
        # measured (the quick GPT-2 of bench_cuda at 0.5, the same generated code): 3,893,080 B held with the option,
        # 2,234,728 B without it
        raise NeedsCudaError(f"coop.compile: {'mode=' + repr(mode) if mode else 'triton.cudagraphs'} asks for CUDA "
                             "graphs, which a CPU model has none of, and on CPU the compiled step then holds more "
                             "than coop plans: leave the mode out on CPU (keep it for CUDA)")
    wrapped = type(model).__name__
    if wrapped in ("DistributedDataParallel", "FullyShardedDataParallel") or hasattr(model, "_get_fsdp_state"):
        raise CoopError(f"coop.compile does not plan a {wrapped}-wrapped model yet: use coop.plan for DDP/FSDP2")
