"""coop as inductor's partitioner: the joint graph planned under a budget and split as the schedule says.

``torch._inductor.config.custom_partitioner_fn`` takes a :class:`torch._inductor.custom_graph_pass.
CustomPartitionerFn`: inductor runs its joint-graph passes, then hands the joint graph to it and compiles the two
modules it returns. :class:`CoopPartitioner` lowers the joint graph (:mod:`coop.compiled.joint`), parses the
budget against it with the one budget parser (a fraction is of the joint graph's peak without recomputation,
what inductor's own partitioner at ``activation_memory_budget=1`` keeps), solves it with a coop formulation
(``auto`` by default), validates the schedule, recomputes in the backward the saved pointwise values inductor would
inline there where the budget allows (:mod:`coop.compiled.inline_saved`) and emits it (:mod:`coop.compiled.emit`).
Every plan it makes is kept in :attr:`CoopPartitioner.plans` for the summary and the tests.
"""

from __future__ import annotations

import hashlib
import time
import uuid
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from coop.budget import baseline_peak, min_budget, parse_budget
from coop.compiled.emit import Partition, emit_partition
from coop.compiled.inline_saved import recompute_saved_pointwise
from coop.compiled.joint import JointGraph, lower_joint
from coop.compiled.layout_copies import channels_last_copy_bytes
from coop.compiled.observed import Observation
from coop.compiled.pricing import predicted_overhead
from coop.errors import CoopError, InfeasibleError, SolveTimeoutError
from coop.formulations.core.progress import StageProgress
from coop.formulations.core.registry import solve
from coop.formulations.core.result import SolveResult
from coop.graph_capture.random_ops import split_native_dropouts
from coop.schedule import validate

__all__ = ["CompiledPlan", "CoopPartitioner", "SolveMemo"]


@dataclass
class CompiledPlan:
    """One graph the partitioner planned: its Graph, budget, solver result and emitted partition."""

    joint: JointGraph
    budget: int
    requested: int  # the user's budget in bytes, before any measured shave
    result: SolveResult
    partition: Partition
    peak: int
    baseline_peak: int
    wall_s: float
    #: joint fx names of the saved pointwise values moved into the backward (:mod:`coop.compiled.inline_saved`)
    moved: tuple[str, ...] = ()
    #: the predicted overhead of the solver's own schedule, before those moves (what a larger budget could buy back)
    solver_overhead: float = 0.0
    #: the plan's predicted recomputation overhead, those moves included (:func:`coop.compiled.pricing.
    #: predicted_overhead`: a share of the step's cost)
    overhead: float = 0.0
    #: the median seconds of the compiled step that runs this plan, measured (``coop.compile``'s measured rounds,
    #: :func:`coop.compiled.measure.step_seconds`); None where nothing was timed
    step_s: float | None = None
    #: the solver's result was an earlier round's, for the same Graph and budget (:class:`SolveMemo`)
    reused: bool = False
    #: bytes of the channels-last copies inductor makes of caller-owned convolution inputs where its layout
    #: optimization is on (:mod:`coop.compiled.layout_copies`): held by the step, by no value of the Graph
    layout_copies: int = 0

    @property
    def extra_s(self) -> float:
        """The seconds the plan's recomputations are predicted to add to a step (its Graph's cost unit)."""
        sim = self.result.simulation
        return 0.0 if sim is None else sim.cost - sim.baseline_cost

    @property
    def overhead_of_step(self) -> float | None:
        """The predicted overhead as a share of the step measured without the recomputations: the predicted extra
        seconds over the measured step less them (:attr:`step_s`); None where no step was timed. The solver's costs
        price what recomputing adds; the step's own time, which they price less well (a convolution's FLOPs at the
        nominal rate: bench_compile's ResNet step priced 2.3 ms and ran 7.8), is measured."""
        if self.step_s is None or self.step_s <= self.extra_s:
            return None
        return self.extra_s / (self.step_s - self.extra_s)

    def summary(self) -> str:
        """Plain words: budget, predicted peak, overhead, what is saved and recomputed."""
        recomputed = self.partition.recomputed()
        sim = self.result.simulation
        overhead = f"{100 * self.overhead:.2f} %" if sim is not None else "n/a"
        return (f"{self.joint.graph.name}: {len(self.joint.graph.nodes)} nodes, budget {self.budget:,} B "
                f"({self.budget / self.baseline_peak:.2f} of the peak {self.baseline_peak:,} B), predicted peak "
                f"{self.peak:,} B, overhead {overhead} ({self.result.formulation}, {self.result.status}, "
                f"{self.wall_s:.1f} s); saves {len(self.partition.saved)} values, recomputes "
                f"{sum(recomputed.values())} computations of {len(recomputed)} nodes"
                + (f" ({len(self.moved)} saved pointwise values recomputed in the backward)" if self.moved else "")
                + ("; the schedule solved for the same Graph and budget in an earlier round" if self.reused else ""))


class SolveMemo:
    """The solver's results of one ``coop.compile``, by Graph content, budget and solver settings.

    A round compiled again with only inductor's order changed (the pin after a first miss) lowers the same joint
    graph to the same Graph: solving it again would spend the time limit again (27 s of BERT's 196 s in
    bench_compile's size at 0.5) for a schedule as good, or, with a time limit, a different one for no reason.
    """

    def __init__(self) -> None:
        self._results: dict[tuple[Any, ...], SolveResult] = {}

    def get(self, key: tuple[Any, ...]) -> SolveResult | None:
        """The result solved under ``key`` (the Graph's ``sha256``, the budget and the solver settings), or None."""
        return self._results.get(key)

    def put(self, key: tuple[Any, ...], result: SolveResult) -> None:
        """Keep a result that has a schedule (a time-out is not kept: another round may give it more luck)."""
        if result.schedule is not None:
            self._results[key] = result


class CoopPartitioner(CustomPartitionerFn):
    """A ``CustomPartitionerFn`` that splits each compiled step as a coop schedule under ``budget``.

    Parameters
    ----------
    budget : str, float or int
        Bytes (``"2GiB"``, an int) or a share of the compiled step's peak without recomputation (``0.5``,
        ``"50%"``); the one budget parser's forms (:func:`coop.budget.parse_budget`).
    formulation : str
        A coop formulation without paging (default ``auto``).
    time_limit : float
        Seconds the solver may take per compiled graph.
    shave : int
        Bytes taken off the parsed budget before solving: what a measured compiled step held beyond its plan
        (``coop.compile``'s measured re-solve sets it).
    fusion : bool
        Price the values inductor's pointwise fusion never writes as part of their reader
        (:mod:`coop.compiled.fusion`); False prices every aten value as a buffer.
    device : str or None
        The device whose allocator sizes the values (``"cuda"`` for a meta-device model planned for a GPU);
        None: each value's own.
    observation : Observation or None
        What an earlier compiled round of the same model showed inductor holds (:mod:`coop.compiled.observed`):
        the Graph is rebuilt from it before solving (``coop.compile``'s measured re-solve sets it).
    pricing : str
        ``"fused"`` (default), ``"nominal"``, ``"draws"`` or ``"measured"``, as :func:`coop.compiled.joint.lower_joint`
        takes them (:mod:`coop.compiled.pricing`).
    memo : SolveMemo or None
        Solver results shared by the rounds of one ``coop.compile``: a Graph and budget solved before is not solved
        again (None: every graph is solved).
    inline_saved : bool
        Recompute in the backward each saved pointwise value inductor would inline into its backward readers, where
        the schedule stays legal and within the budget (:mod:`coop.compiled.inline_saved`); False keeps the solver's
        schedule as it is.
    progress : StageProgress or None
        Where each graph's planning is reported: a line as its solve starts, ``auto``'s rungs and the solver's
        incumbents, and a line with the plan (:class:`~coop.formulations.core.progress.StageProgress`); None:
        silent.
    """

    def __init__(self, budget: str | float, *, formulation: str = "auto", time_limit: float = 30.0,
                 threads: int = 2, shave: int = 0, fusion: bool = True, device: str | None = None,
                 observation: Observation | None = None, pricing: str = "fused", inline_saved: bool = True,
                 memo: SolveMemo | None = None, progress: StageProgress | None = None) -> None:
        if formulation in ("poet", "dynamic") or formulation.startswith("delta"):
            raise CoopError(f"coop.compile: formulation {formulation!r} pages or runs online, which compiled "
                            "graphs do not run; use auto, moccasin, checkmate, monet, blocks or a baseline")
        self.budget = budget
        self.formulation = formulation
        self.time_limit = time_limit
        self.threads = threads
        self.shave = shave
        self.fusion = fusion
        self.device = device
        self.observation = observation
        self.pricing = pricing
        self.inline_saved = inline_saved
        self.memo = memo
        self.progress = progress or StageProgress(None)
        self.plans: list[CompiledPlan] = []
        self.last_floor: int | None = None
        self.last_budget: int | None = None
        self.nonce = uuid.uuid4().hex

    def __call__(self, gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule,
                                                                                    fx.GraphModule]:
        start = time.perf_counter()
        self.last_floor = self.last_budget = None
        if split_native_dropouts(gm.graph):  # eager's draws (fallback_random): the mask alone is random
            gm.recompile()
        joint = lower_joint(gm, kwargs["num_fwd_outputs"], kwargs.get("static_lifetime_input_indices"),
                            name=f"compiled-{len(self.plans)}", fuse=self.fusion,
                            device=None if self.device is None else torch.device(self.device),
                            observation=self.observation, pricing=self.pricing)
        graph = joint.graph
        floor = min_budget(graph)
        if self.plans and _is_share(self.budget) and parse_budget(self.budget, graph, check=False) < floor:
            # a graph after a graph break whose share of its own peak is below its floor: planned without
            # recomputation (a schedule at the floor itself seldom exists; these graphs are small: a loss, a head)
            requested = baseline_peak(graph)
            warnings.warn(f"coop.compile: {graph.name} (after a graph break) cannot fit {self.budget} of its peak "
                          f"(its min_budget is {floor / requested:.2f} of it); planned without recomputation",
                          stacklevel=2)
        else:
            requested = parse_budget(self.budget, graph)  # the one parser and floor check (one line below it)
        budget = max(floor, requested - self.shave)
        # the last graph's floor and the budget it was planned at (kept when no schedule is found: the measured
        # re-solve names the floor in its refusal)
        self.last_floor, self.last_budget = floor, budget
        # store-all fits: nothing to plan (inductor's own split, every forward value kept once)
        formulation = "store-all" if self.formulation == "auto" and budget >= baseline_peak(graph) else self.formulation
        # the Graph's digest covers what a solve reads (nodes with their costs, outputs, order)
        key = (graph.sha256, budget, formulation, self.time_limit, self.threads)
        known = self.memo.get(key) if self.memo is not None else None
        if known is None:
            self.progress.stage(f"{graph.name}: {len(graph.nodes)} nodes, solving with {formulation} under "
                                f"{budget:,} B (time limit {self.time_limit:g} s)")
        result = known or solve(graph, budget, formulation, time_limit=self.time_limit, threads=self.threads,
                                progress=self.progress.forward())
        if self.memo is not None and known is None:
            self.memo.put(key, result)
        if result.schedule is None:
            if result.status == "infeasible":  # a solver's proof over its whole space
                raise InfeasibleError(f"coop.compile: {self.formulation} proved no schedule fits {budget:,} B for "
                                      f"{graph.name}: give a larger budget")
            raise SolveTimeoutError(f"coop.compile: {self.formulation} found no schedule within {self.time_limit:g} s "
                                    f"under {budget:,} B for {graph.name} ({result.message}); give more time_limit, "
                                    "a larger budget or formulation='auto'")
        verdict = validate(graph, result.schedule, budget)
        if not verdict.ok:
            raise CoopError(f"coop.compile: the {result.formulation} schedule is not legal under the budget: "
                            f"{verdict.reason}")
        moved: tuple[int, ...] = ()
        solver_overhead = predicted_overhead(graph, result.simulation)
        if self.inline_saved:
            schedule, verdict, moved = recompute_saved_pointwise(joint, gm, result.schedule, budget)
            if moved:
                result = replace(result, schedule=schedule, simulation=verdict.simulation)
        partition = emit_partition(gm, joint, result.schedule)
        plan = CompiledPlan(joint=joint, budget=budget, requested=requested, result=result, partition=partition,
                            peak=verdict.peak, baseline_peak=baseline_peak(graph), wall_s=time.perf_counter() - start,
                            moved=tuple(joint.lowered.fx_names[i][0] for i in moved),
                            solver_overhead=solver_overhead, overhead=predicted_overhead(graph, result.simulation),
                            reused=known is not None,
                            layout_copies=channels_last_copy_bytes(gm.graph))
        self.plans.append(plan)
        self.progress.stage(plan.summary())
        return partition.forward, partition.backward

    def __getstate__(self) -> dict[str, Any]:
        """Inductor pickles its configuration into AOTAutograd's cache key: the options and this instance's
        nonce, not the plans (nor the progress reporter, whose callback holds a stream). The nonce makes each
        partitioner miss that cache, so that every graph it is given is planned (and recorded) by this coop, not
        answered from a split another run made; inductor's cache of compiled kernels, keyed by the emitted modules,
        still serves."""
        return {**self.__dict__, "plans": [], "last_floor": None, "last_budget": None, "memo": None,
                "progress": None, "code": self.uuid()}

    def uuid(self) -> str:
        """Inductor's cache key: coop's source and every option that changes the split."""
        digest = hashlib.sha256()
        package = Path(__file__).resolve().parents[1]
        for path in sorted(package.rglob("*.py")):
            digest.update(path.read_bytes())
        digest.update(repr((self.budget, self.formulation, self.time_limit, self.threads, self.shave, self.fusion,
                             self.device, None if self.observation is None else self.observation.key(),
                             self.pricing, self.inline_saved)).encode())
        digest.update(self.nonce.encode())
        return digest.hexdigest()


def _is_share(spec: object) -> bool:
    """Whether a budget is a share of the peak (``0.5``, ``"50%"``, ``"0.5"``), not bytes."""
    if isinstance(spec, float):
        return True
    text = str(spec).strip()
    return text.endswith("%") or ("." in text and not any(c.isalpha() for c in text))
