"""DELTA's decisions as one object an online engine holds: what leaves memory by a swap, what comes back by a
page-in, and the time model and bookkeeping behind them.

:class:`DeltaDecisions` (a :class:`~coop.online.online_sim.Decisions`) is composed into an engine, not inherited:
the simulator's :class:`coop.online.delta_sim.DeltaSimulator` (an :class:`~coop.online.online_sim.OnlineSimulator`)
and the dynamic fallback's :class:`coop.runtime.fallback.DeltaStep` (a :class:`~coop.runtime.fallback.DynamicStep`)
each hold one as their ``decisions``, which the engine's walk calls (:class:`~coop.online.online_sim.OnlineSimulator`'s
docstring shows where), so the two engines decide alike by one body of code. The time model (a compute stream,
two copy engines, a prefetcher) is :mod:`coop.online.delta_sim`'s docstring.

The object reads and updates its engine's state (its arena, residency, pins, clock and counters), as a part of
that engine. Where the engine moves real data, a :class:`Carrier` (the engine itself) is told of every copy.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Container, Hashable, Iterable
from typing import Protocol

from coop.device_profiles import DeviceProfile
from coop.online.delta import Decision, DeltaPolicy
from coop.online.online_result import Thrashing
from coop.online.online_sim import Decisions, OnlineSimulator
from coop.schedule import Schedule, Step


class Carrier(Protocol):
    """What an engine with real data does when DELTA moves a value (the runtime's :class:`DeltaStep`)."""

    def copy_out(self, key: int) -> None:
        """A value with no valid host copy is swapped out: copy its data to the host (before its block is freed)."""
        ...

    def copy_in(self, key: int) -> None:
        """A swapped value is paged in (on demand or prefetched): start the copy back to the device."""
        ...

    def drop_copy(self, key: int) -> None:
        """The value's host copy is no longer valid or needed: release it (called whether or not one exists)."""
        ...


class DeltaDecisions(Decisions):
    """DELTA's swap half over an online engine: its director's verdicts, the copy engines, the host tier.

    ``policy`` is the engine's (its filter picks victims; its director, :meth:`evict`, swaps or recomputes them).
    ``prefetch``: page-ins start ahead of their use (:meth:`before_step`), else every page-in is on demand.
    ``next_use``: the filter sees each value's next use (:meth:`next_use_distance`), else staleness alone.
    ``pageable``, where given: only these values may be swapped (besides the graph's own rule). ``carrier``: told
    of every copy (an engine holding real tensors); None: the copies are modelled only.
    """

    def __init__(self, engine: OnlineSimulator, policy: DeltaPolicy, prefetch: bool = True, next_use: bool = True,
                 pageable: Container[int] | None = None, carrier: Carrier | None = None) -> None:
        super().__init__(engine)
        self.policy = policy
        self.carrier = carrier
        self.link: DeviceProfile = policy.link
        self.prefetch = prefetch
        self.knows_next_use = next_use
        graph = engine.graph
        self._pageable = {n.id: graph.pageable(n.id) and n.mem > 0 and (pageable is None or n.id in pageable)
                          for n in graph.nodes}
        # Program reads of every value, by position in the order; the baseline compute before each position.
        self._reads: dict[int, list[int]] = {i: [] for i in engine._size}
        for position, v in enumerate(engine.order):
            for source in engine._inputs[v]:
                self._reads[source].append(position)
        self._before = [0.0, *itertools.accumulate(engine._cost[v] for v in engine.order)]
        self._position = 0
        self._now = 0.0  # the compute stream's time (s)
        self._out_free = 0.0  # when the device-to-host engine is free
        self._in_free = 0.0  # when the host-to-device engine is free
        self.on_host: set[int] = set()  # values with a valid host copy
        self._away: set[int] = set()  # values on the host only (swapped out, not paged in)
        self._arrives: dict[int, float] = {}  # resident value -> when its page-in finishes
        self.steps: list[Step] = []
        self.host_bytes = 0
        self.host_peak = 0
        self.copy_s = 0.0
        self.swaps = 0
        self.swapped_bytes = 0
        self.page_ins = 0
        self.prefetches = 0
        self.decision_log: list[tuple[int, Decision]] = []

    # ---------------------------------------------------------------- the DeltaView
    def next_use_distance(self, key: Hashable) -> float | None:
        """Baseline compute from the current program step to the value's next program read (outputs: the end);
        None when the engine is told not to know (``next_use=False``, as a runtime that sees no future)."""
        if not self.knows_next_use:
            return None
        position = self._next_use(key)  # type: ignore[arg-type]
        return None if position is None else self._before[position] - self._before[self._position]

    def recomputable(self, key: Hashable) -> bool:
        engine = self.engine
        return key not in engine._kept and key not in engine._outputs and key not in engine._owned

    def swappable(self, key: Hashable) -> bool:
        return self._pageable.get(key, False) and key not in self.engine._owned  # type: ignore[call-overload]

    def has_host_copy(self, key: Hashable) -> bool:
        return key in self.on_host

    def parents(self, key: Hashable) -> Iterable[Hashable]:
        return self.engine._inputs[key]  # type: ignore[index]

    def is_evicted(self, key: Hashable) -> bool:
        """Computed before and neither resident nor on the host: only recomputation brings it back."""
        engine = self.engine
        return key in engine._ever and key not in engine._resident and key not in self.on_host

    def is_evictable(self, key: int) -> bool:
        """Values the base engine never evicts (outputs, kept values) may leave by swapping."""
        engine = self.engine
        if key not in engine._resident or engine._pins[key] or not engine._size[key] or key in engine._owned:
            return False
        return self.recomputable(key) or self.swappable(key)

    def _next_use(self, key: int) -> int | None:
        reads = self._reads[key]
        index = bisect.bisect_left(reads, self._position)
        if index < len(reads):
            return reads[index]
        return len(self.engine.order) if key in self.engine._outputs else None

    # ---------------------------------------------------------------- time
    def _wait_until(self, moment: float) -> None:
        """The compute stream waits for a copy; the wait is exposed copy time."""
        if moment <= self._now:
            return
        engine = self.engine
        engine.exposed_s += moment - self._now
        self._now = moment
        if engine.extra_cost + engine.exposed_s > engine.max_extra_cost:
            raise Thrashing(f"recomputation and copy waits passed the limit after {self.swaps} swaps "
                            f"and {engine.recomputations} recomputes")

    def on_run(self, node: int) -> None:
        """The op runs: it waits for the page-ins of its inputs, then takes its cost on the compute stream."""
        for source in self.engine._inputs[node]:
            arrival = self._arrives.pop(source, None)
            if arrival is not None:
                self._wait_until(arrival)
        self._now += self.engine._cost[node]
        self.steps.append(Step(op="compute", node=node))

    # ---------------------------------------------------------------- swapping out
    def evict(self, key: int) -> None:
        """The director's verdict on a victim: swap it out, or drop it (host copy too) to be recomputed."""
        engine = self.engine
        decision = self.policy.decide(engine.info(key), engine)
        self.decision_log.append((key, decision))
        if decision.action == "swap":
            self._swap_out(key)
        else:
            self._drop_host_copy(key)
            self._arrives.pop(key, None)
            engine._drop(key)

    def _swap_out(self, key: int) -> None:
        engine = self.engine
        size = engine._size[key]
        if key not in self.on_host:
            if self.carrier is not None:  # no valid host copy yet: the value's data leaves now
                self.carrier.copy_out(key)
            start = max(self._now, self._out_free)
            self._out_free = start + self.link.pageout_s(size)
            self.copy_s += self._out_free - start
            self.on_host.add(key)
            self.host_bytes += size
            self.host_peak = max(self.host_peak, self.host_bytes)
            self.swaps += 1
            self.swapped_bytes += size
            self._wait_until(self._out_free)  # the block is free once its copy has left
        self._arrives.pop(key, None)  # a page-in still in flight is abandoned
        self.steps.append(Step(op="page_out", node=key))
        self._away.add(key)
        engine._drop(key)

    def _drop_host_copy(self, key: int) -> None:
        if self.carrier is not None:
            self.carrier.drop_copy(key)
        if key in self.on_host:
            self.on_host.discard(key)
            self._away.discard(key)
            self.host_bytes -= self.engine._size[key]

    def release_if_done(self, key: int) -> None:
        """A value nobody reads again leaves the host (the engine then frees its device copy, so the policy sees
        it gone)."""
        engine = self.engine
        if (
            key in self.on_host
            and engine._pins[key] == 0
            and engine._remaining[key] == 0
            and key not in engine._outputs
            and (key not in engine._kept or key in engine._released_kept)
        ):
            self._drop_host_copy(key)

    # ---------------------------------------------------------------- paging in
    def bring_back(self, key: int) -> bool:
        """Page a swapped value in on demand (True), or leave it to recomputation (False: not on the host)."""
        if key not in self._away:
            return False
        engine = self.engine
        previous = engine._previous_address.get(key) if self.policy.in_place_recompute else None
        engine._allocate(key, engine._size[key], engine._cost[key], previous)
        self._page_in(key, prefetched=False)
        return True

    def _page_in(self, key: int, prefetched: bool) -> None:
        engine = self.engine
        start = max(self._now, self._in_free)
        self._in_free = start + self.link.pagein_s(engine._size[key])
        self.copy_s += self._in_free - start
        self._arrives[key] = self._in_free
        self._away.discard(key)
        engine._resident.add(key)
        engine._last_access[key] = engine.clock
        self.steps.append(Step(op="page_in", node=key))
        self.page_ins += 1
        self.prefetches += prefetched
        self.policy.on_resident(key, engine)
        if self.carrier is not None:
            self.carrier.copy_in(key)

    def before_step(self, position: int) -> None:
        """Prefetch: start the page-in of every swapped value that can wait no longer, into free memory only."""
        self._position = position
        if not self.prefetch or not self._away:
            return
        after_this_step = self._before[position + 1]
        due = sorted((use, key) for key in self._away if (use := self._next_use(key)) is not None)
        for use, key in due:
            backlog = max(self._in_free - self._now, 0.0)
            if self._before[use] - after_this_step >= self.link.pagein_s(self.engine._size[key]) + backlog:
                continue  # it can wait one more step and still arrive in time
            if self._place_without_eviction(key):
                self._page_in(key, prefetched=True)

    def _place_without_eviction(self, key: int) -> bool:
        engine = self.engine
        size = engine._size[key]
        previous = engine._previous_address.get(key) if self.policy.in_place_recompute else None
        if previous is not None and engine.arena.allocate_at(previous, size, key):
            return True
        placement = self.policy.placement(size, engine._cost[key])
        return engine.arena.allocate(size, key, placement, record=False) is not None

    # ---------------------------------------------------------------- the end of the run
    def finish(self) -> None:
        """After the run: the step ends when every output is back on the device."""
        self._position = len(self.engine.order)
        for output in self.engine.graph.outputs:
            arrival = self._arrives.pop(output, None)
            if arrival is not None:
                self._wait_until(arrival)

    def schedule(self) -> Schedule:
        """The steps executed, page steps included, as a coop Schedule."""
        return Schedule(steps=tuple(self.steps))


__all__ = ["Carrier", "DeltaDecisions"]
