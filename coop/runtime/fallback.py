"""The dynamic fallback's engine: run a captured training step on real tensors under a budget, evicting online.

When no static plan fits the situation (the planner's :class:`coop.planner.dynamic.DynamicPlan`),
:class:`DynamicStep` executes the captured joint fx graph op by op with the *same* engine and
policy objects as the pure simulator (:class:`coop.online.online_sim.OnlineSimulator`, policies
DTR / DTR-eq / DTE / Coop): it is an EngineView whose values are real tensors. Sizes are the Graph's ``mem`` (the capture measured
them from the storages of these very ops), costs the Graph's ``cost``. When an allocation does
not fit the arena, the policy picks victims and their tensors are deleted; a value needed again is
recomputed from its fx lineage (Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021;
Zhang et al., "Coop: Memory is not a Commodity", NeurIPS 2023).

Why results equal eager PyTorch bit for bit: the ops run in the captured program order with the
same kernels; a recomputation repeats a deterministic op on identical inputs. Random ops (dropout,
bernoulli, coop's bool masks) make their first draw in program order, so they draw exactly the
numbers eager draws, in the same order; the generator state right before each first draw is
saved (:class:`RngState`, host memory), and a recomputation of an evicted random value sets that
state, reruns the op and restores the generator, so the replay draws the same bits and later
draws are unaffected. With ``replay_random=False`` random values are instead never evicted.

The arena is the engine's model of device memory; the real addresses are the allocator's (torch's caching
allocator on CUDA, the host's on CPU). Where no eviction makes a contiguous room in the model but the bytes are
there (GPT-2 small at 0.5 on an H200: the 823 MB logits gradient beside two pinned logits-sized inputs), the
step compacts the model (:meth:`coop.online.arena.Arena.compact`: what cannot leave first, the evictable values
above it), releases the allocator's cached blocks (``torch.cuda.empty_cache`` on a CUDA step, so that the next
segment it maps is counted against the budget again) and goes on; ``stats.extra["compactions"]`` counts them.

A Graph node owns several fx nodes: the op that allocates its storage and the views/getitems
folded into it. Only the owner runs when the engine computes the node; folded aliases are
computed on first use from their (resident) inputs and are deleted with their owner.

With the ``delta`` policy (:mod:`coop.online.delta`) the engine is :class:`DeltaStep`, a DynamicStep holding
the simulator's DELTA decisions (:class:`coop.online.delta_decisions.DeltaDecisions`, which
:class:`coop.online.delta_sim.DeltaSimulator` holds too: its filter, director, prefetcher and time model, so its
decisions are the simulator's) over real tensors, a swap being a real copy of the value's storage to the host tier and back by the static executor's paging functions (:func:`coop.runtime.paging.page_out`,
:func:`~coop.runtime.paging.page_in`). On a CPU-only step the host tier is a :class:`~coop.runtime.paging.
HostPool` allocated before the step (the "device" and the host are one memory there, and the pool keeps them
apart); on CUDA the host buffers are pinned and the copies ``non_blocking`` on the compute stream. The step's
decisions, page steps included, are recorded as a schedule for the static executor.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from coop.budget import baseline_peak, below_min_budget, parsed_budget
from coop.device_profiles import DeviceProfile
from coop.errors import BudgetError, InfeasibleError
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.online.delta import DELTA, DeltaPolicy, delta_profile
from coop.online.delta_decisions import DeltaDecisions
from coop.online.delta_sim import DeltaSimulator
from coop.online.online_sim import (
    THRASH_OVERHEAD,
    OnlineSimulator,
    OutOfMemory,
    Thrashing,
    least_running_budget,
    replayable_random_ids,
)
from coop.online.policies import EvictionPolicy, make_policy
from coop.runtime.copy_stream import CopyStream, PagedOut, PendingPageIn
from coop.runtime.executor import recorded_program
from coop.runtime.paging import HostCopy, HostPool, page_in, page_out, pin_host_copy
from coop.runtime.program_builder import paged_value_name
from coop.runtime.reserved import AllocatorCounters, cuda_counters
from coop.runtime.rng import RngState
from coop.schedule import Schedule, relative_overhead


@dataclass
class DynamicStats:
    """What one dynamic step did: evictions, recomputations, overhead and arena measurements."""

    policy: str
    budget: int
    evictions: int
    recomputations: int
    overhead: float
    peak: int
    arena_peak: int
    search_s: float
    fragmentation: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: the step's decisions as a static schedule: the computes it executed, in order (recomputations
    #: included; DELTA's page-outs and page-ins too); legal on the graph with random draws replayable, and its simulated peak is at most the
    #: arena's used bytes (coop.online.online_sim's soundness rules)
    schedule: Schedule | None = field(default=None, repr=False)


class DynamicStep(OnlineSimulator):
    """One training step of a Captured module on real tensors, evicting by policy within ``budget``."""

    def __init__(self, captured: Captured, budget: int, policy: EvictionPolicy, max_overhead: float = 10.0,
                 replay_random: bool = True) -> None:
        # Real addresses are the device allocator's: where no eviction makes a contiguous room in the arena
        # model, its gaps are closed and the allocator's cached blocks released (a CUDA step; None on CPU).
        super().__init__(captured.graph, budget, policy, max_overhead, replay_random, compact=True)
        self.allocator: AllocatorCounters | None = cuda_counters(captured.graph.devices)
        self.module: fx.GraphModule = captured.module
        self.fx_names: dict[int, list[str]] = captured.fx_names
        self.owner_of: dict[str, int] = captured.owner_of
        self.fx_nodes: dict[str, fx.Node] = {n.name: n for n in self.module.graph.nodes}
        self.env: dict[str, Any] = {}
        # Extra outputs of multi-output ops taken by a getitem that is its own Graph node: a
        # recomputation of the op makes fresh copies, which are dropped at once (already extracted).
        self._claimed: dict[str, list[int]] = {}
        for fx_node in self.module.graph.nodes:
            if fx_node.op == "call_function" and fx_node.target is operator.getitem:
                source = fx_node.args[0]
                if isinstance(source, fx.Node) and self.owner_of.get(fx_node.name) != self.owner_of.get(source.name):
                    self._claimed.setdefault(source.name, []).append(int(fx_node.args[1]))  # type: ignore[arg-type]
        self.rng_states: dict[int, RngState] = {}  # replayable random node -> generator state before its draw
        self._getitem_of: dict[tuple[str, int], int] = {}
        for fx_node in self.module.graph.nodes:
            source = fx_node.args[0] if fx_node.args else None
            if fx_node.target is operator.getitem and isinstance(source, fx.Node) and source.name in self._claimed:
                    self._getitem_of[(fx_node.args[0].name, int(fx_node.args[1]))] = self.owner_of[fx_node.name]  # type: ignore[arg-type]

    # ---------------------------------------------------------------- inputs and outputs
    def bind(self, flat_inputs: list[torch.Tensor]) -> None:
        """Place the step's flat inputs (parameters, buffers, batch) and the module's constants."""
        placeholders = [n for n in self.module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(flat_inputs):
            raise BudgetError(f"the captured step takes {len(placeholders)} inputs, got {len(flat_inputs)}")
        for fx_node, value in zip(placeholders, flat_inputs, strict=True):
            self.env[fx_node.name] = value
        for fx_node in self.module.graph.nodes:
            if fx_node.op == "get_attr":
                self.env[fx_node.name] = getattr(self.module, str(fx_node.target))

    def outputs(self) -> list[Any]:
        """The step's flat outputs (loss, gradients, new buffers) once :meth:`run` finished."""
        output_node = next(n for n in self.module.graph.nodes if n.op == "output")
        return fx.node.map_arg(output_node.args[0], lambda n: self._value(n.name))  # type: ignore[return-value]

    # ---------------------------------------------------------------- extension points
    def on_compact(self) -> None:
        """The arena model closed its gaps: the device allocator's cached blocks are released too (CUDA)."""
        if self.allocator is not None:
            self.allocator.empty_cache()

    def run_node(self, node: int) -> None:
        """The op runs on real tensors: its owner fx node is evaluated (a random draw saved or replayed)."""
        super().run_node(node)
        owner = self.fx_nodes[self.fx_names[node][0]]
        if owner.op in ("placeholder", "get_attr", "output"):
            return
        if node not in self.replayable:
            self._compute(owner)
        elif node not in self._ever:  # the first draw, in program order: remember where the generator was
            self.rng_states[node] = RngState.capture(owner)
            self._compute(owner)
        else:  # a recomputation replays the very same draw and leaves the generator where it is
            with self.rng_states[node].replayed():
                self._compute(owner)

    def forget(self, key: Hashable) -> None:
        """The value's fx values (its owner and folded aliases) are deleted."""
        for name in self.fx_names.get(key, ()):  # type: ignore[call-overload]
            self.env.pop(name, None)

    # ---------------------------------------------------------------- fx evaluation
    def _value(self, name: str) -> Any:
        if name in self.env:
            return self.env[name]
        node_id = self.owner_of[name]
        if node_id not in self._resident and node_id not in self._owned:
            raise RuntimeError(f"fx value {name} (Graph node {node_id}) is read while not resident")
        self._compute(self.fx_nodes[name])  # a folded alias, made on first use
        return self.env[name]

    def _compute(self, fx_node: fx.Node) -> None:
        args = fx.node.map_arg(fx_node.args, lambda n: self._value(n.name))
        kwargs = fx.node.map_arg(fx_node.kwargs, lambda n: self._value(n.name))
        result = fx_node.target(*args, **kwargs)  # type: ignore[operator]
        del args, kwargs
        if fx_node.target is operator.getitem and isinstance(fx_node.args[0], fx.Node):
            source = fx_node.args[0].name
            if source in self._claimed and self.owner_of[fx_node.name] != self.owner_of[source]:
                self.env[source][fx_node.args[1]] = None  # the extracted output now lives in its own node
        elif isinstance(result, tuple) and fx_node.name in self._claimed:
            result = list(result)
            for index in self._claimed[fx_node.name]:
                if self._getitem_of.get((fx_node.name, index)) in self._ever:
                    result[index] = None  # a recomputation's fresh copy of an already extracted output
        self.env[fx_node.name] = result


class DeltaStep(DynamicStep):
    """DELTA on real tensors: :class:`DeltaSimulator`'s decisions, carried out by real copies to a host tier.

    The filter, director, prefetcher and time model are the simulator's: the step holds one
    :class:`~coop.online.delta_decisions.DeltaDecisions` as its ``decisions`` (as DeltaSimulator does, over the
    same Graph costs and sizes; the walk calls it, no extension point forwards to it), so a step swaps and
    recomputes exactly what :func:`coop.online.delta_sim.simulate_delta` predicts for the graph and budget; this
    class adds the copies, as the decisions' :class:`~coop.online.delta_decisions.Carrier` (:meth:`copy_out`,
    :meth:`copy_in`, :meth:`drop_copy`). A swap copies the storage of the value's tensor (the first fx value of its Graph node that is a tensor; its views are re-derived on first use
    after the page-in) with :func:`coop.runtime.paging.page_out`, into ``host_pool`` where it is given and
    pinned like the value's pages; a page-in copies it back with :func:`~coop.runtime.paging.page_in`. A host
    copy stays valid until the value's last use, as in the simulator (a second swap of it copies nothing).
    ``host_copy_bytes`` / ``host_copy_peak`` are the bytes of the live host copies, measured on the copies.

    With ``copy_stream`` (:class:`coop.runtime.copy_stream.CopyStream`, CUDA's by default on an accelerator) the
    copies run on its side stream by its protocol: a page-out after the value's producer, waited for by the
    compute stream before the value's block is freed (the eviction makes room for the allocation that follows,
    as the simulator models it), a page-in queued when the engine pages in (prefetches included)
    and waited for by the compute stream only at the value's first read.
    """

    policy: DeltaPolicy
    decisions: DeltaDecisions

    def __init__(self, captured: Captured, budget: int, policy: DeltaPolicy, max_overhead: float = 10.0,
                 replay_random: bool = True, host_pool: HostPool | None = None,
                 copy_stream: CopyStream | None = None) -> None:
        super().__init__(captured, budget, policy, max_overhead, replay_random)
        self.host_pool = host_pool
        self.copy_stream = copy_stream
        self._paged: dict[int, PagedOut] = {}  # on the copy stream: the host copy and the event after its copy
        self._pending: dict[int, PendingPageIn] = {}  # on the copy stream: page-ins not yet waited for
        self.host_copies: dict[int, HostCopy] = {}
        self.host_copy_bytes = 0
        self.host_copy_peak = 0
        values = {n.name: n.meta.get("val") for n in self.module.graph.nodes}
        # Graph node -> the fx value whose storage a page-out copies (as the executor's ProgramBuilder.base_of)
        self._base: dict[int, str] = {}
        for node_id, names in self.fx_names.items():
            base = paged_value_name(names, values, captured.graph.node(node_id).device)
            on_host = base is not None and values[base].device.type == "cpu"
            if base is not None and not (on_host and captured.graph.has_accelerator):  # a host value stays put
                self._base[node_id] = base
        self.decisions = DeltaDecisions(self, policy, pageable=self._base, carrier=self)

    # ---------------------------------------------------------------- extension point
    def forget(self, key: Hashable) -> None:
        pending = self._pending.pop(key, None)  # type: ignore[call-overload]
        if pending is not None:  # paged in and dropped unread: the block returns to the pool only after the copy
            self.copy_stream.wait(pending)  # type: ignore[union-attr]
        super().forget(key)

    # ---------------------------------------------------------------- the copies (the decisions' Carrier)
    def copy_out(self, key: int) -> None:
        """The value has no valid host copy: its storage leaves now (before the decisions free its block)."""
        value = self._value(self._base[key])
        pin = pin_host_copy(value.device)
        if self.copy_stream is None:
            copy = page_out(value, pin=pin, non_blocking=pin, pool=self.host_pool)
        else:
            self._paged[key] = self.copy_stream.page_out(value, pin=pin)
            copy = self._paged[key].host
        del value
        self.host_copies[key] = copy
        self.host_copy_bytes += copy.nbytes
        self.host_copy_peak = max(self.host_copy_peak, self.host_copy_bytes)

    def copy_in(self, key: int) -> None:
        """The decisions paged the value in: copy it back now, or queue the copy on the copy stream."""
        if self.copy_stream is None:
            self.env[self._base[key]] = page_in(self.host_copies[key])
        else:
            self._pending[key] = self.copy_stream.page_in(self._paged[key])

    def drop_copy(self, key: int) -> None:
        """The value's host copy is released (if it has one)."""
        self._paged.pop(key, None)
        copy = self.host_copies.pop(key, None)
        if copy is not None:
            self.host_copy_bytes -= copy.nbytes
        del copy

    # ---------------------------------------------------------------- fx evaluation
    def _value(self, name: str) -> Any:
        if name not in self.env and self._pending:  # the first read of a value paged in on the copy stream
            pending = self._pending.pop(self.owner_of.get(name, -1), None)  # type: ignore[arg-type]
            if pending is not None:
                self.env[self._base[self.owner_of[name]]] = self.copy_stream.wait(pending)  # type: ignore[union-attr]
        return super()._value(name)

    def outputs(self) -> list[Any]:
        """The step's flat outputs, every page-in still pending waited for."""
        for key in list(self._pending):
            self._value(self._base[key])
        return super().outputs()


def _engine(captured: Captured, budget: int, policy: str | EvictionPolicy, max_overhead: float, replay_random: bool,
            device_profile: str | DeviceProfile | None, host_pool: HostPool | None,
            copy_stream: CopyStream | None) -> DynamicStep:
    """The engine for ``policy``: :class:`DeltaStep` for DELTA (its device profile required), else DynamicStep."""
    if isinstance(policy, str) and policy.lower() == DELTA:
        policy = DeltaPolicy(delta_profile(device_profile))
    if isinstance(policy, DeltaPolicy):
        policy.reset()
        if copy_stream is None and captured.graph.has_accelerator:
            copy_stream = CopyStream()
        return DeltaStep(captured, budget, policy, max_overhead, replay_random, host_pool, copy_stream)
    return DynamicStep(captured, budget, make_policy(policy), max_overhead, replay_random)


def online_generator_bytes(graph: Graph, replay_random: bool = True) -> int:
    """The most bytes of generator states an online step of ``graph`` saves, on a CPU-only step.

    The engine saves the CPU generator's state at the first draw of every replayable random op (:class:`RngState`)
    and keeps it for the step, and a replay swaps in one more while it runs: host memory, which on a CPU-only step
    is the budget's tier, so the dynamic plan's arena is this much smaller than its budget.

    Parameters
    ----------
    graph : Graph
        The step's graph.
    replay_random : bool
        Whether random values are replayed (False: none is evicted, no state is saved).

    Returns
    -------
    int
        ``(random ops + 1) x`` the CPU generator state's bytes; 0 with no random op, without replay, or on a step
        with an accelerator (its states are host memory, outside the device's budget).
    """
    draws = replayable_random_ids(graph) if replay_random else set()
    if graph.has_accelerator or not draws:
        return 0
    return (len(draws) + 1) * torch.get_rng_state().untyped_storage().nbytes()


def _where_it_runs(engine: DynamicStep, failed: int) -> str:
    """Where the failed step's policy runs without thrashing, measured by the simulator (one clause of the error).

    The simulator is the step's own engine without tensors (same graph, policy, random replay and compaction),
    so its decisions at a budget are the step's: :func:`coop.online.online_sim.least_running_budget` bisects
    between the failed budget and the baseline peak (about ten simulated steps: 1-2 s for ResNet-50). Online
    eviction is not monotone in the budget, so the clause names the budget found, not a guarantee above it.
    """
    graph = engine.graph
    replay_random = bool(engine.replayable)  # the only use of the flag: an empty set either way otherwise
    simulator = DeltaSimulator if isinstance(engine, DeltaStep) else OnlineSimulator

    def engine_at(budget: int) -> OnlineSimulator:
        policy = copy.deepcopy(engine.policy)
        policy.reset()
        return simulator(graph, budget, policy, THRASH_OVERHEAD, replay_random, compact=True)  # type: ignore[arg-type]

    peak = baseline_peak(graph)
    least = least_running_budget(graph, engine_at, failed)
    name = engine.policy.name
    if least is None:
        return f"the simulator finds no budget up to the baseline peak ({peak:,} B) where {name} runs without thrashing"
    return (f"the least budget found where the simulator runs {name} without thrashing: {least:,} B "
            f"({least / peak:.3f} of the baseline peak {peak:,} B)")


def run_dynamic(
    captured: Captured,
    model: nn.Module,
    batch: tuple[torch.Tensor, ...],
    budget: int,
    policy: str | EvictionPolicy = "coop",
    *,
    max_overhead: float = 10.0,
    replay_random: bool = True,
    device_profile: str | DeviceProfile | None = None,
    host_pool: HostPool | None = None,
    copy_stream: CopyStream | None = None,
) -> tuple[list[Any], DynamicStats]:
    """Run one captured step on real tensors within ``budget`` bytes with an online eviction policy.

    With ``replay_random`` (the default) random ops are evictable and recomputed by replaying
    their saved generator state; without it they stay resident until no recomputation needs them.

    Parameters
    ----------
    model : nn.Module
        The model whose parameters and buffers are the step's inputs.
    batch : tuple of torch.Tensor
        The step's batch.
    budget : int
        The budget in bytes (graph units; parsed by :func:`coop.budget.parsed_budget`).
    policy : str or EvictionPolicy
        The eviction policy, by name (``"coop"`` by default; ``"delta"`` swaps as well, :class:`DeltaStep`) or as
        an object.
    max_overhead : float
        The recomputation overhead (relative to the step's baseline cost) past which the policy counts as thrashing.
    replay_random : bool
        Whether random ops are evictable and replayed from saved generator states.
    device_profile : str or DeviceProfile or None
        The device whose host link prices DELTA's swaps (required for ``"delta"``, unused otherwise).
    host_pool : HostPool or None
        Where DELTA's host copies are carved from (each allocates its own buffer when None).
    copy_stream : CopyStream or None
        Where DELTA's copies run; None: torch.cuda's side stream on a step with an accelerator, else the
        compute stream.

    Returns
    -------
    tuple of (list, DynamicStats)
        The flat outputs and the run's stats (evictions, recomputations, overhead, peaks, search time; DELTA's
        swaps, page-ins and host bytes in ``extra``); the schedule has DELTA's page steps.

    Raises
    ------
    BudgetError
        Below :func:`coop.budget.min_budget`.
    InfeasibleError
        When the policy runs out of evictable memory or thrashes past ``max_overhead``; the message (one line)
        names the least budget at which the simulator found the same policy running without thrashing.
    DeviceProfileError
        For ``"delta"`` without a device profile (one line naming the shipped profiles), or an unknown one.
    """
    graph = captured.graph
    budget_bytes = parsed_budget(budget, "run_dynamic")
    if below := below_min_budget(budget_bytes, graph):
        raise BudgetError(below)
    engine = _engine(captured, budget_bytes, policy, max_overhead, replay_random, device_profile, host_pool,
                     copy_stream)
    engine.bind(captured.flat_inputs(model, batch))
    try:
        with torch.no_grad(), recorded_program():
            engine.run()
            outputs = engine.outputs()
    except (OutOfMemory, Thrashing) as exc:
        raise InfeasibleError(f"dynamic fallback ({engine.policy.name}) cannot run within {budget_bytes} B: {exc}; "
                              f"{_where_it_runs(engine, budget_bytes)}") from None
    cost = sum(engine.cost(v) for v in engine.executed) + engine.exposed_s
    baseline = graph.baseline_cost
    arena = engine.arena
    extra: dict[str, Any] = {"random_replays": engine.random_replays, "failures": len(arena.failures),
                             "compactions": engine.compactions}
    schedule = Schedule.from_order(engine.executed)
    if isinstance(engine, DeltaStep):
        delta = engine.decisions
        decisions = [decision.action for _, decision in delta.decision_log]
        extra |= {"device_profile": delta.link.name, "swap_decisions": decisions.count("swap"),
                  "recompute_decisions": decisions.count("recompute"), "swaps": delta.swaps,
                  "swapped_bytes": delta.swapped_bytes, "page_ins": delta.page_ins, "prefetches": delta.prefetches,
                  "exposed_copy_s": engine.exposed_s, "host_peak": delta.host_peak,
                  "host_copy_peak": engine.host_copy_peak}
        if engine.host_pool is not None:
            extra |= {"host_pool_peak": engine.host_pool.peak_bytes, "host_pool_overflow": engine.host_pool.overflow_bytes}
        schedule = engine.schedule()
        engine.host_copies.clear()
    stats = DynamicStats(
        policy=engine.policy.name,
        budget=budget_bytes,
        evictions=engine.evictions,
        recomputations=engine.recomputations,
        overhead=relative_overhead(cost - baseline, baseline),
        peak=arena.peak_used,
        arena_peak=arena.high_water,
        search_s=engine.search_s,
        fragmentation=arena.mean_failure_free_fraction,
        extra=extra,
        schedule=schedule,
    )
    engine.env.clear()
    engine.rng_states.clear()
    return list(outputs), stats


__all__ = ["DeltaStep", "DynamicStats", "DynamicStep", "run_dynamic"]
