"""What ``coop.plan`` takes beside the model, budget and batch: :class:`PlanOptions`, one documented field each.

``coop.plan``'s keywords are these fields; the options refuse, in one line and before any solve, the combinations
coop does not replay (:meth:`PlanOptions.refuse_combinations`, :meth:`PlanOptions.refuse_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from coop.errors import CoopError
from coop.formulations.core.progress import StageProgress
from coop.graph import Graph
from coop.graph_capture import Captured, capture
from coop.graph_capture.batch import Batch
from coop.planner.base import LossFn
from coop.runtime.copy_stream import require_cuda
from coop.runtime.graph_replay import require_cuda_graph

#: Seconds at least between two of a solver's incumbent lines in ``coop.plan``'s progress (its stages and
#: ``auto``'s rungs are always printed).
SOLVER_REPORT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class PlanOptions:
    """How ``coop.plan`` captures, solves and replays a step; each field is the keyword of the same name."""

    #: ``loss_fn(model, *args, **kwargs)`` (the batch's arguments) returns the loss; None: the model's call does, as a
    #: scalar tensor or an output with ``.loss`` (transformers' ``ModelOutput``; see :func:`coop.capture`). A plan
    #: file records whether one was used, and ``coop.load_plan`` asks for it.
    loss_fn: LossFn | None = None
    #: The solver: ``"auto"`` picks per graph (coop.formulations.ladder.auto: the baseline order when it fits, Checkmate's
    #: MILP on small graphs, Moccasin's CP-SAT on large ones); ``"dynamic"`` returns a :class:`DynamicPlan` (online
    #: eviction) instead of solving.
    formulation: str = "auto"
    #: Seconds the solver may take (each round's solve).
    time_limit: float = 60
    #: Capture with the real step's measured op times, storage sizes and each op's internal scratch (its workspace in
    #: the graph, which the schedule then counts).
    profile: bool = False
    #: The budget is the size of everything a step holds: every value the step computes gets an address in its
    #: device's arena (coop.runtime.placement's packed execution placement), the plan replays inside those arenas
    #: (coop.runtime.arena_replay: one buffer per device, allocated at the first step and reused; the loss is copied
    #: into one of two slots after the arena, a new ``.grad`` is handed out where the step computed it), and the
    #: budget must hold the step's whole footprint (``summary()["arena_footprint"]``): the caller-owned values
    #: (parameters, buffers, batch; counted once), the buffers (arenas, scratch, the loss's slots) and what a step
    #: allocates beside them (kernels' internal scratch such as oneDNN's convolution reorders, measured by running
    #: the step once on the example batch, :func:`coop.runtime.arena_replay.measure_outside`). The live-bytes
    #: budget of the solve is lowered by what the footprint exceeds (bisecting where the solver finds nothing) until
    #: it fits (:meth:`coop.planner.rounds.Rounds.arena`); the note itemises it, and ``plan.budget`` stays the
    #: budget asked for. CPU steps only (:func:`coop.planner.static_plan.refuse_arena_off_cpu`).
    arena: bool = False
    #: A name such as ``"a100-pcie4"``, a .toml path or a :class:`coop.device_profiles.DeviceProfile`: prices paging
    #: for ``formulation="poet"`` and lets ``auto`` page to the device's slower tier when recomputation alone cannot
    #: reach the budget; with ``formulation="dynamic", policy="delta"`` it prices DELTA's swaps (required there).
    device_profile: Any = None
    #: Capture the operator implementations PyTorch offers (MONeT: ReLU/hardtanh backward from a compact mask,
    #: in-place activations; coop.graph_capture.alternatives); None: only for ``formulation="monet"``.
    #: ``summary()`` lists the implementations a plan uses and which are inexact.
    alternatives: bool | None = None
    #: Remove inexact implementations before solving (:func:`coop.planner.solving.exact_only`).
    exact: bool = False
    #: Run the plan's page-outs and page-ins on a side stream overlapped with compute (coop.runtime.copy_stream;
    #: CUDA only, opt-in, not yet measured on a GPU).
    copy_stream: bool = False
    #: Replay the plan's program as one CUDA graph captured at the first step (coop.runtime.graph_replay): the batch
    #: copied into static buffers, loss and gradients delivered as eager delivers them; a schedule that recomputes
    #: random draws or pages, or a step whose capture fails (a CPU sync such as ``.item()``, a data-dependent
    #: shape), falls back to the ordinary replay with one warning naming the op, and ``summary()["cuda_graph"]``
    #: says which runs. CUDA steps only. Default False for now: issue 23 wants it the default on CUDA once the GPU
    #: acceptance rows (benchmarks/bench_cuda.py, ``cuda-graph``) prove it bit-identical to eager and within the
    #: reserved-bytes rule; that proof is not in yet.
    cuda_graph: bool = False
    #: Refuse, in one line, what coop would otherwise plan with a warning: a ``torch.compile``d module (coop plans
    #: its ``_orig_mod`` and replays its own program of the eager step, so the compiled kernels do not run in
    #: ``plan.step``).
    strict: bool = False
    #: For a model on the meta device (built under ``torch.device("meta")``: no weights, any size): the device the
    #: plan will run on (:mod:`coop.graph_capture.meta`). Such a plan cannot step; ``plan.save`` it and
    #: ``coop.load_plan`` it on the real model, which checks that the real step has the same graph.
    device: str | None = None
    #: The online eviction policy of ``formulation="dynamic"``: ``"coop"`` (the default), ``"dtr"``, ``"dtr-eq"``,
    #: ``"dte"``, or ``"delta"`` (swap or recompute, with ``device_profile``: :mod:`coop.online.delta`).
    policy: str = "coop"
    #: Report on stderr as the call goes, each line stamped with the real seconds since it began: the capture
    #: (and profiling), each round's solve and measure (:mod:`coop.planner.rounds`), each rung of ``auto`` as it
    #: ends (its status and the best overhead so far), a solver's incumbents at most every
    #: :data:`SOLVER_REPORT_INTERVAL_S` seconds, and the plan chosen. None: when stderr is a terminal; False: never.
    progress: bool | None = None

    @property
    def dynamic(self) -> bool:
        return self.formulation == "dynamic"

    @property
    def pages(self) -> bool:
        """Whether schedules may page (a device profile lets POET page): budgets then meet the paged bound."""
        return self.device_profile is not None

    @property
    def streams(self) -> int:
        """The CUDA streams the replay allocates on (a CUDA graph: its private pool)."""
        return 2 if self.copy_stream or self.cuda_graph else 1

    def refuse_combinations(self) -> None:
        """Refuse, before capturing, ``copy_stream`` without CUDA or beside ``arena`` or ``formulation="dynamic"``."""
        if self.copy_stream:
            require_cuda()
            if self.arena or self.dynamic:
                raise CoopError(f"copy_stream=True does not combine with "
                                f"{'arena=True' if self.arena else 'formulation=dynamic'} yet; drop one of them")

    def reporter(self) -> StageProgress:
        """This call's progress (:attr:`progress`), its clock started now with a first line naming the formulation
        and time limit (what comes before the capture, such as unwrapping a compiled model, counts)."""
        reporter = StageProgress.on_stderr(self.progress, min_interval_s=SOLVER_REPORT_INTERVAL_S)
        reporter.stage(f"coop.plan: {self.formulation}" + ("" if self.dynamic else f", time limit {self.time_limit:g} s"))
        return reporter

    def capture(self, module: nn.Module, batch: Batch, progress: StageProgress | None = None) -> Captured:
        """Capture ``module``'s step on ``batch``, with the operator alternatives where asked for (or for MONeT).

        Parameters
        ----------
        module : nn.Module
            The unwrapped model.
        batch : Batch
            The example batch, read (:func:`coop.graph_capture.batch.read_batch`).
        progress : StageProgress or None
            Told as the capture (and profiling) starts and ends.

        Returns
        -------
        Captured
            The step.
        """
        progress = progress or StageProgress(None)
        with_alternatives = (self.formulation == "monet" and self.device is None) if self.alternatives is None \
            else self.alternatives
        progress.stage("capturing the step" + (" and profiling its ops" if self.profile else ""))
        captured = capture(module, batch, loss_fn=self.loss_fn, profile=self.profile, alternatives=with_alternatives,
                           device=self.device)
        progress.stage(f"captured {len(captured.graph.nodes)} nodes" + (", profiled" if self.profile else ""))
        return captured

    def refuse_for(self, captured: Captured) -> None:
        """Refuse, in one line, what the captured step cannot replay: an FSDP-sharded step other than statically, a
        CUDA graph of a step with no CUDA value or beside another replay option.
        """
        if captured.sharding is not None and (self.arena or self.copy_stream or self.cuda_graph or self.dynamic):
            asked = "arena=True" if self.arena else "copy_stream=True" if self.copy_stream else \
                "cuda_graph=True" if self.cuda_graph else "formulation='dynamic'"
            raise CoopError(f"coop replays an FSDP-sharded step with the ordinary static replay only; drop {asked}")
        if self.cuda_graph:
            _refuse_cuda_graph(captured.graph, arena=self.arena, copy_stream=self.copy_stream, dynamic=self.dynamic)

    def prepare(self, candidate: Any) -> None:
        """Switch a candidate plan to the replay asked for (a copy stream, a CUDA graph), so that its step is
        measured as it will run (a CUDA graph with its private pool; a fresh graph replaces it once chosen).

        Parameters
        ----------
        candidate : Plan
            A plan of :class:`coop.planner.rounds.Rounds`.
        """
        if self.copy_stream:
            candidate.use_copy_stream()
        if self.cuda_graph:
            candidate.use_cuda_graph()


def _refuse_cuda_graph(graph: Graph, *, arena: bool, copy_stream: bool, dynamic: bool) -> None:
    """Refuse ``cuda_graph=True`` in one line before solving: a step with no CUDA value, or a combination."""
    require_cuda_graph(graph)
    other = "arena=True" if arena else "copy_stream=True" if copy_stream else "formulation=dynamic" if dynamic else ""
    if other:
        raise CoopError(f"cuda_graph=True does not combine with {other} yet; drop one of them")
