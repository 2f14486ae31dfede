"""Pure simulation of online eviction (DTR, DTE, Coop) over an address-ordered arena.

:func:`simulate_online` runs a graph's baseline order op by op in an :class:`Arena` of the budget's
size, as a dynamic runtime would: caller-owned values are allocated first and pinned; every
computed value is freed after its last read in the order (graph outputs stay); when an
allocation does not fit, the policy picks victims, and an evicted value is recomputed on demand
from its lineage (recursively: a recomputation allocates too, and may evict). Staleness runs on a
logical clock, the summed cost of the operations executed so far.

References: Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021 (the engine and the
DTR heuristic); Zhang et al., "Coop: Memory is not a Commodity", NeurIPS 2023 (address-aware
eviction, fragmentation at failures); MegEngine's DTE.

Soundness rules (why the exported schedule is legal and fits):

* a value being computed pins its inputs, its output and its workspace until the op ends;
* random ops (``Tag.nondeterministic_seeded``: bernoulli, dropout, rand*, coop's bool masks) are
  *replayable* by default (``replay_random``): the engine saves the generator state right before
  a random op's first draw and a recomputation replays the op from it, drawing the very same
  numbers without moving the program's generator (:class:`coop.runtime.fallback.RngState`). So
  they are evictable and recomputed like any op; in Graph terms the schedule is legal on
  :func:`with_random_replay` (the graph with those nodes marked recomputable);
* caller-owned values, graph outputs once computed, and the outputs of the remaining
  non-recomputable nodes (extra outputs of multi-output ops; random ops with ``replay_random``
  off) are never evicted. Such a kept value stays resident until no recomputation can read it:
  after the last program read of every recomputable value downstream of it (the walk stops at
  non-recomputable values and at outputs, which are never recomputed once pinned), because a
  recomputation of a consumer must read the very same value;
* address rule, for every policy: values that can never be evicted (graph outputs, kept values)
  are placed against a wall (an arena end or another never-evictable block; the smallest hole
  walled on both sides first), so they pile up together instead of splitting the evictable
  region into holes that no eviction can merge (Coop's observation that pinned blocks fragment
  the arena, applied to the engine rather than to one policy);
* with ``compact`` (the dynamic fallback's setting, off by default here), a request that no eviction can
  place is retried once after the arena is compacted (never-evictable and pinned blocks first, evictable ones
  above, the free bytes on top): addresses are a model there, the device allocator's are real; bytes still
  never exceed the budget;
* a recomputation walk counts, before it starts, how often its planned computes (the target and its missing
  ancestors) read each value, and a value the program reads no more stays resident (evictable, not pinned)
  until the walk has made its last read of it: a residual block reads its input twice (branch and shortcut),
  and dropping a dead ancestor after its first consumer made the second read recompute its whole lineage
  again, doubling per residual block above it (ResNet-50's H200 graph at 0.51 of its peak: 4,303 recomputes
  at one program step and past 10x the baseline, where a walk that recomputes each ancestor once takes 374);
* the computes executed form a coop :class:`~coop.schedule.Schedule`; in it every instance lives
  at most as long as it was resident in the arena, so its simulated peak is at most the arena's
  used bytes, which never exceed the budget.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Iterator

from coop.budget import parsed_budget
from coop.graph import Graph
from coop.online.arena import Arena
from coop.online.online_result import (
    BUDGET_RESOLUTION,
    THRASH_OVERHEAD,
    OnlineResult,
    OnlineStatus,
    OutOfMemory,
    Thrashing,
    least_running_budget,
    run_engine,
)
from coop.online.policies import EvictionPolicy, TensorInfo, make_policy
from coop.schedule import Schedule, Step, prompt_order


class _Workspace:
    """Arena tag of an op's temporary workspace (pinned while the op runs)."""

    __slots__ = ("node",)

    def __init__(self, node: int) -> None:
        self.node = node

    def __hash__(self) -> int:
        return hash(("workspace", self.node))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Workspace) and other.node == self.node

    def __repr__(self) -> str:
        return f"workspace(%{self.node})"


class OnlineSimulator:
    """The engine: executes the order, evicts by policy, recomputes on demand (an EngineView).

    Like :class:`torch.fx.Interpreter`, a fixed walk with documented override points. **The walk** (:meth:`run`)::

        for position, node in enumerate(order):
            decisions.before_step(position)            # the program is about to run node
            materialize node:                          # each input resident, else
                decisions.bring_back(input)            #   brought back without recomputation, or
                  or recompute it                      #   recomputed (the same walk)
                allocate output and workspace:         # where it does not fit, the policy picks victims
                    decisions.evict(victim)            #   each leaves memory (decisions.is_evictable says who
                      -> forget(victim)                #   may), its data deleted
                    on_compact()                       #   or, with ``compact``, the arena closes its gaps
                decisions.on_run(node); run_node(node) # the op runs
            decisions.release_if_done(value), then     # each value read for the last time may go
              the engine frees it
        decisions.finish()

    **Two ways to extend it**, each with one parent:

    - *what a value and an op are* (an engine holding real tensors): a subclass overrides :meth:`run_node` (the
      op runs), :meth:`forget` (a value's data is deleted) and :meth:`on_compact` (the arena model closed its
      gaps); the runtime's :class:`coop.runtime.fallback.DynamicStep` does;
    - *what leaves memory and how it comes back* (a host tier, a time model): the engine calls its
      :attr:`decisions` object (a :class:`Decisions`, documented there), composed, not inherited: DELTA's
      :class:`~coop.online.delta_decisions.DeltaDecisions` in :class:`coop.online.delta_sim.DeltaSimulator`
      and in the runtime's ``DeltaStep`` (a DynamicStep), so the two DELTA engines decide by one body of code.

    :meth:`is_evicted` and :meth:`is_evictable` (what the policies read) and :meth:`schedule` (the steps
    executed) answer from the decisions. Everything else here (``_materialize``, ``_allocate``, ``_drop``, pins,
    ``_release_if_done``) is the walk itself.
    """

    def __init__(self, graph: Graph, budget: int, policy: EvictionPolicy, max_overhead: float,
                 replay_random: bool = True, compact: bool = False) -> None:
        self.graph = graph
        #: Close the arena's gaps (:meth:`Arena.compact`) when the policy finds no room but gaps exist: the
        #: runtime fallback's last resort, where the device allocator, not coop, chooses real addresses.
        self.compact = compact
        self.compactions = 0
        self.policy = policy
        self._arena = Arena(budget)
        self._clock = 0.0
        self.max_extra_cost = max_overhead * graph.baseline_cost
        # Extra outputs right after their op: contract 2 counts them from the op's compute anyway.
        self.order = prompt_order(graph)
        self.max_recomputations = int(max_overhead * max(len(self.order), 1)) + len(self.order)
        nodes = {n.id: n for n in graph.nodes}
        self._size = {i: n.mem for i, n in nodes.items()}
        self._cost = {i: n.cost for i, n in nodes.items()}
        self._inputs = {i: tuple(p for p in n.inputs if not nodes[p].caller_owned) for i, n in nodes.items()}
        self._owned = set(graph.caller_owned_ids)
        self.replayable = replayable_random_ids(graph) if replay_random else set()
        self._kept = {i for i, n in nodes.items() if not n.caller_owned and not n.recomputable} - self.replayable
        self._outputs = set(graph.outputs)
        self._neighbours = {
            i: tuple(p for p in self._inputs[i] if p not in self._kept)
            + tuple(c for c in graph.consumers[i] if c not in self._kept)
            for i in nodes
        }
        self._release_after = graph.release_positions(self.order, self._kept)
        self._release_at: dict[int, list[int]] = {}
        for kept, step in self._release_after.items():
            self._release_at.setdefault(step, []).append(kept)
        self._released_kept: set[int] = set()
        self._remaining = {i: 0 for i in nodes}  # program reads still to come
        for v in self.order:
            for p in self._inputs[v]:
                self._remaining[p] += 1
        self._resident: set[int] = set()
        #: The walk under way (:meth:`_materialize`): the computes it still plans, and how often they read each value.
        self._planned: set[int] = set()
        self._walk_reads: dict[int, int] = {}
        self._ever: set[int] = set()
        self._pins: dict[int, int] = {i: 0 for i in nodes}
        self._last_access: dict[int, float] = {i: 0.0 for i in nodes}
        self._previous_address: dict[int, int] = {}
        self.executed: list[int] = []
        self.evictions = 0
        self.recomputations = 0
        self.random_replays = 0  # recomputations of random ops from their saved generator state
        self.extra_cost = 0.0
        self.search_s = 0.0
        #: Seconds the compute waited on copies to or from the host (engines that page; 0 here).
        self.exposed_s = 0.0
        #: What leaves memory and how it comes back (:class:`Decisions`): an engine composes others by assigning
        #: this right after construction, before :meth:`run`.
        self.decisions: Decisions = Decisions(self)

    # ---------------------------------------------------------------- EngineView
    @property
    def clock(self) -> float:
        return self._clock

    @property
    def arena(self) -> Arena:
        return self._arena

    def info(self, key: Hashable) -> TensorInfo:
        if isinstance(key, _Workspace):
            return TensorInfo(key, self._arena.block_of(key).size, 0.0, self._clock, False)
        return TensorInfo(key, self._size[key], self._cost[key], self._last_access[key], self.is_evictable(key))

    def evictable(self) -> Iterator[TensorInfo]:
        for key in self._resident:
            if self.is_evictable(key):
                yield TensorInfo(key, self._size[key], self._cost[key], self._last_access[key], True)

    def neighbours(self, key: Hashable) -> Iterable[Hashable]:
        return self._neighbours[key]

    def cost(self, key: Hashable) -> float:
        return self._cost[key]

    def _never_evictable(self, key: int) -> bool:
        return key in self._owned or key in self._kept or key in self._outputs

    def is_evicted(self, key: Hashable) -> bool:
        """EngineView: only a recomputation brings ``key`` back (:meth:`Decisions.is_evicted`)."""
        return self.decisions.is_evicted(key)

    def is_evictable(self, key: int) -> bool:
        """Whether the resident value ``key`` may be a victim now (:meth:`Decisions.is_evictable`)."""
        return self.decisions.is_evictable(key)

    def schedule(self) -> Schedule:
        """The steps executed so far as a coop Schedule (:meth:`Decisions.schedule`)."""
        return self.decisions.schedule()

    # ---------------------------------------------------------------- extension points (override in a subclass)
    def run_node(self, node: int) -> None:
        """Extension point: the op of ``node`` runs, once its inputs are resident and pinned and its output and
        workspace have room (for a first compute and for every recomputation), right after
        :meth:`Decisions.on_run`. Does nothing here; a real engine computes the op. An override must not
        allocate or evict."""

    def forget(self, key: int) -> None:
        """Extension point: the value ``key`` leaves device memory (evicted or released), just before its block
        is freed. Does nothing here; a real engine deletes the value's tensors."""

    def on_compact(self) -> None:
        """Extension point: the arena model closed its gaps (``compact`` only). Does nothing here; a runtime
        releases its allocator's cached blocks."""

    # ---------------------------------------------------------------- the run
    def run(self) -> None:
        """Run the whole order, bring back the outputs evicted on the way, then :meth:`Decisions.finish`."""
        for owned in self.graph.caller_owned_ids:
            if self._size[owned] and self._arena.allocate(self._size[owned], owned) is None:
                raise OutOfMemory(f"the caller-owned values ({self.graph.caller_owned_bytes}) do not fit the budget")
        for position, v in enumerate(self.order):
            self.decisions.before_step(position)
            self._materialize(v, program_step=True)
            for kept in self._release_at.get(position, ()):
                self._released_kept.add(kept)
                self._release_if_done(kept)
        # Outputs evicted on the way are brought back; each one is pinned so the next cannot evict it.
        restored = []
        for output in self.graph.outputs:
            if output not in self._owned:
                self._materialize(output, program_step=False)
                self._pin(output)
                restored.append(output)
        for output in restored:
            self._unpin(output)
        self.decisions.finish()

    def _materialize(self, target: int, program_step: bool) -> None:
        """Make ``target`` resident, recomputing missing ancestors first (iterative DFS).

        Each frame is [node, index of the next input to make resident]; an input is pinned as
        soon as it is resident so that materializing its siblings cannot evict it. The walk's
        computes are planned first (:meth:`_plan_walk`), and a value the program no longer reads
        is released only after the walk's last planned read of it, so that a value two frames
        read (a residual block's input: its branch and its shortcut) is recomputed once, not once
        per read.
        """
        if target in self._resident and not program_step:
            return
        if not program_step and self.decisions.bring_back(target):
            return
        self._plan_walk(target)
        stack: list[list[int]] = [[target, 0]]
        try:
            while stack:
                frame = stack[-1]
                node, position = frame
                inputs = self._inputs[node]
                if position < len(inputs):
                    source = inputs[position]
                    if source in self._resident:
                        self._pin(source)
                        frame[1] += 1
                    elif self.decisions.bring_back(source):
                        self._unplan(source)  # paged in, not recomputed: its inputs are not read after all
                        self._pin(source)
                        frame[1] += 1
                    else:
                        self._plan(source)  # planned already, unless the walk itself evicted it
                        stack.append([source, 0])
                    continue
                stack.pop()
                self._execute(node, recompute=node in self._ever)
                self._unplan(node)
                is_program_step = program_step and not stack
                if is_program_step:
                    for source in inputs:
                        self._remaining[source] -= 1
                for source in inputs:
                    self._unpin(source)
                if stack:  # the parent frame now holds this input
                    self._pin(node)
                    stack[-1][1] += 1
                else:
                    self._release_if_done(node)
        finally:
            held = list(self._walk_reads)
            self._planned.clear()
            self._walk_reads.clear()
            for key in held:
                self._release_if_done(key)

    def _plan_walk(self, target: int) -> None:
        """Plan the computes that materializing ``target`` needs: it and its missing ancestors (O(their edges))."""
        self._plan(target)
        frontier = [target]
        while frontier:
            for source in self._inputs[frontier.pop()]:
                if source not in self._resident and source not in self._planned:
                    self._plan(source)
                    frontier.append(source)

    def _plan(self, node: int) -> None:
        """Count the reads a planned compute of ``node`` will make (once per plan)."""
        if node in self._planned:
            return
        self._planned.add(node)
        for source in self._inputs[node]:
            self._walk_reads[source] = self._walk_reads.get(source, 0) + 1

    def _unplan(self, node: int) -> None:
        """A planned compute happened (or will not): its reads are done; a value read for the last time may go."""
        if node not in self._planned:
            return
        self._planned.discard(node)
        for source in self._inputs[node]:
            reads = self._walk_reads[source] - 1
            if reads:
                self._walk_reads[source] = reads
            else:
                del self._walk_reads[source]
                self._release_if_done(source)

    def _execute(self, node: int, recompute: bool) -> None:
        size = self._size[node]
        self._pin(node)  # the output under construction is not evictable
        previous = self._previous_address.get(node) if self.policy.in_place_recompute else None
        self._allocate(node, size, self._cost[node], previous, permanent=self._never_evictable(node))
        workspace = self.graph.node(node).workspace
        if workspace:
            self._allocate(_Workspace(node), workspace, 0.0, None)
        self.decisions.on_run(node)
        self.run_node(node)
        self._resident.add(node)
        self._ever.add(node)
        self.executed.append(node)
        self._clock += self._cost[node]
        for source in self._inputs[node]:
            self._last_access[source] = self._clock
        self._last_access[node] = self._clock
        if workspace:
            self._arena.free(_Workspace(node))
        self._unpin_quietly(node)
        self.policy.on_resident(node, self)
        if recompute:
            self.recomputations += 1
            self.random_replays += node in self.replayable
            self.extra_cost += self._cost[node]
            if self.extra_cost > self.max_extra_cost or self.recomputations > self.max_recomputations:
                raise Thrashing(f"recomputation passed the limit after {self.recomputations} recomputes")

    def _allocate(self, key: Hashable, size: int, cost: float, previous_address: int | None,
                  permanent: bool = False) -> None:
        """Place ``key`` in the arena, evicting policy-chosen victims until it fits.

        ``previous_address`` (in-place recompute) is tried first when given; ``permanent`` values
        (never evictable) go to the high end whatever the policy.
        """
        if size == 0:
            return
        if previous_address is not None and self._arena.allocate_at(previous_address, size, key):
            return
        placement = "top" if permanent else self.policy.placement(size, cost)
        first_try = True
        compacted = False
        while not self._place(key, size, placement, permanent, record=first_try):
            first_try = False
            started = time.perf_counter()
            victims = self.policy.choose(size, self)
            self.search_s += time.perf_counter() - started
            if not victims and self.compact and not compacted:
                # what cannot leave first, the evictable values above it: one run of evictable and free bytes
                self._arena.compact(first=lambda tag: not isinstance(tag, int) or not self.is_evictable(tag))
                self.compactions += 1
                self.on_compact()
                compacted = True
                continue
            if not victims:
                raise OutOfMemory(
                    f"no eviction makes room for {size} (free {self._arena.free_bytes}, "
                    f"largest free block {self._arena.largest_free})"
                )
            for victim in victims:
                self.decisions.evict(victim)
                self.evictions += 1
            compacted = False  # room was made: gaps may have opened again

    def _place(self, key: Hashable, size: int, placement: str, permanent: bool, record: bool) -> bool:
        """One allocation attempt (``placement``: one of :data:`coop.online.arena.PLACEMENTS`);
        never-evictable values go next to the other never-evictable blocks."""
        if permanent:
            start = self._permanent_address(size)
            if start is not None:
                return self._arena.allocate_at(start, size, key)
        return self._arena.allocate(size, key, record=record, placement=placement) is not None

    def _permanent_address(self, size: int) -> int | None:
        """Where a never-evictable value fragments the evictable region least (None: nowhere fits):
        against a wall (:meth:`coop.online.arena.Arena.wall_address`), an arena end or another
        never-evictable block, caller-owned ones included."""
        return self._arena.wall_address(size, self._is_fixed)

    def _is_fixed(self, tag: Hashable) -> bool:
        """A block tag that no eviction can free: a value that is never evictable (workspaces are not)."""
        return isinstance(tag, int) and self._never_evictable(tag)

    def _drop(self, key: int) -> None:
        """Take a value out of memory (eviction or release); its lineage stays for recomputation."""
        self.forget(key)
        if self._size[key]:
            self._previous_address[key] = self._arena.address_of(key)
            self._arena.free(key)
        self._resident.discard(key)
        self.policy.on_evicted(key, self)

    def _pin(self, key: int) -> None:
        self._pins[key] += 1

    def _unpin(self, key: int) -> None:
        self._pins[key] -= 1
        self._release_if_done(key)

    def _release_if_done(self, key: int) -> None:
        """Called whenever a value may have been read for the last time (unpinned, a walk's last planned read, a
        kept value's release step): the decisions release what else they hold of it, then the engine drops it if
        nobody will read it again (outputs and kept values stay)."""
        self.decisions.release_if_done(key)
        if (
            key in self._resident
            and self._pins[key] == 0
            and self._remaining[key] == 0
            and key not in self._walk_reads
            and key not in self._outputs
            and (key not in self._kept or key in self._released_kept)
        ):
            self._drop(key)

    def _unpin_quietly(self, key: int) -> None:
        self._pins[key] -= 1


class Decisions:
    """What leaves an online engine's memory and how it comes back: the object the engine composes and calls.

    The engine (:class:`OnlineSimulator`) calls these at fixed points of its walk (its docstring); a subclass
    overrides the ones it changes (:class:`coop.online.delta_decisions.DeltaDecisions` swaps to a host tier,
    times the copies and prefetches). This class is the plain engine's decisions: a victim is dropped and
    recomputed on demand, nothing is held elsewhere, and the steps are the computes. The object reads and
    updates its engine's state (arena, residency, pins, counters) as a part of that engine.
    """

    def __init__(self, engine: OnlineSimulator) -> None:
        self.engine = engine

    def is_evicted(self, key: Hashable) -> bool:
        """Computed before and not resident now, so only a recomputation brings it back (policies read it to group
        evicted neighbours); decisions that keep some values elsewhere (a host copy) return False for those."""
        engine = self.engine
        return key in engine._ever and key not in engine._resident

    def is_evictable(self, key: int) -> bool:
        """Whether the resident value ``key`` may be chosen as a victim now (the engine's :meth:`~OnlineSimulator.
        evictable`, :meth:`~OnlineSimulator.info` and compaction read it). Here: resident, unpinned, not empty, and
        neither caller-owned, kept nor an output. An override must keep pinned and caller-owned values out;
        decisions that can swap may let outputs and kept values leave."""
        engine = self.engine
        return (
            key in engine._resident
            and engine._pins[key] == 0
            and engine._size[key] > 0
            and key not in engine._owned
            and key not in engine._kept
            and key not in engine._outputs
        )

    def before_step(self, position: int) -> None:
        """Before the program runs ``engine.order[position]`` (before its walk materializes it). Nothing here;
        decisions that page start their prefetches here. May allocate, must not evict (a prefetch goes into free
        memory only)."""

    def on_run(self, node: int) -> None:
        """The op of ``node`` runs (just before the engine's :meth:`~OnlineSimulator.run_node`). Nothing here;
        timed decisions advance their clock and wait for the inputs' copies. Must not allocate or evict."""

    def bring_back(self, key: int) -> bool:
        """A value a walk needs is not resident: True after making it resident without recomputing it (allocate
        it with the engine's ``_allocate``, mark it resident and tell the policy, as a page-in does); False to
        recompute it. Here: always False."""
        return False

    def evict(self, key: int) -> None:
        """The policy chose ``key`` (resident, evictable) as a victim: take it out of the arena (the engine's
        ``_drop``, which frees its block and calls :meth:`~OnlineSimulator.forget`), or move it elsewhere and
        then drop it. Here: dropped, to be recomputed on demand."""
        self.engine._drop(key)

    def release_if_done(self, key: int) -> None:
        """A value may have been read for the last time (the engine then frees its device copy if so). Nothing
        here; decisions that hold more of a value (a host copy) release it here."""

    def finish(self) -> None:
        """After the run (outputs back): decisions with copies in flight wait for them."""

    def schedule(self) -> Schedule:
        """The steps executed so far as a coop Schedule (computes only here; with the page steps where the
        decisions page)."""
        return Schedule(steps=tuple(Step(op="compute", node=v) for v in self.engine.executed))


def simulate_online(
    graph: Graph,
    budget: int,
    policy: str | EvictionPolicy,
    *,
    max_overhead: float = 10.0,
    replay_random: bool = True,
    compact: bool = False,
) -> OnlineResult:
    """Run ``graph.order`` under ``budget`` with an online eviction ``policy`` ("dtr", "dtr-eq", "dte", "coop").

    The budget is the arena size in graph units, parsed by the caller (:func:`coop.budget.parse_budget`); a
    budget below :func:`coop.budget.min_budget` is not an error here: the run reports "oom". ``policy`` is a name
    or an object (:func:`make_policy`). The run stops as thrashing once its extra compute passes ``max_overhead``
    x the baseline cost, or its recomputations pass ``max_overhead`` x the steps of the order plus the steps.
    ``replay_random``: random ops may be recomputed by replaying their saved RNG state
    (:func:`replayable_random_ids`). ``compact``: where no eviction makes a contiguous room but the arena has
    gaps, close them and go on (:meth:`coop.online.arena.Arena.compact`; counted in ``compactions``), the dynamic
    fallback's rule, whose real addresses the device allocator chooses; off, the address model binds (Coop's).

    Returns
    -------
    OnlineResult
        The status ("ok", "oom" or "thrashed", with its message), overhead, cost, evictions,
        recomputations, allocation failures and fragmentation, peaks and timings; the schedule of
        computes only when the status is "ok". A finished run whose overhead exceeds
        ``THRASH_OVERHEAD`` is reported "thrashed"; a run cut short reports the recomputation it paid
        for so far as its overhead.

    Raises
    ------
    BudgetError
        When ``budget`` is not a parsed budget (:func:`coop.budget.parsed_budget`).
    CoopError
        When ``policy`` names no policy.
    """
    budget_units = parsed_budget(budget, "simulate_online")
    policy_object = make_policy(policy)
    return run_engine(OnlineSimulator(graph, budget_units, policy_object, max_overhead, replay_random, compact))


def replayable_random_ids(graph: Graph) -> set[int]:
    """The ids of the computed random ops (not recomputable in ``graph``) that an engine can recompute exactly
    by replaying their saved RNG state."""
    return {v for v in graph.random_draws if not graph.node(v).recomputable}


__all__ = ["BUDGET_RESOLUTION", "THRASH_OVERHEAD", "Decisions", "OnlineResult", "OnlineSimulator", "OnlineStatus", "OutOfMemory",
           "Thrashing", "least_running_budget", "replayable_random_ids", "run_engine", "simulate_online"]
