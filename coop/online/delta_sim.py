"""DELTA over a Graph: the online engine with a host tier, two copy engines and a prefetcher.

:class:`DeltaSimulator` is the online engine of :mod:`coop.online.online_sim` (same arena, same soundness
rules, same recomputation on demand) with the swap half of DELTA (Tang et al., arXiv 2203.15980, 2022;
the policy, its filter and director: :mod:`coop.online.delta`). Its time model:

* the compute stream runs the ops one after another: each takes its cost (seconds on the profiled device);
* two copy engines beside it, device-to-host and host-to-device (a GPU has one of each; PCIe and
  NVLink-C2C are full duplex): a copy occupies its engine for ``latency + bytes / throughput`` of the
  profile, copies on one engine run one after another, and compute proceeds meanwhile;
* swapping a tensor out starts its page-out on the first engine as soon as that engine is free; the
  allocation that needed the room waits until the copy has finished (only then is its block free);
* a swapped tensor is prefetched: before each program step the engine starts the page-in of every
  swapped tensor whose next use is too close to wait one more step (the compute before that use, on the
  baseline order, no longer covers the copy and the copies queued before it), into free memory only (a
  prefetch never evicts); a tensor needed before its prefetch could start is paged in on demand;
* a use of a paged-in tensor waits until its page-in has finished.

The time the compute stream spends waiting (``exposed_s``) is the only copy time counted: the overhead
is (recomputed cost + exposed copy time) / baseline cost. Host memory holds one copy per swapped value
until the value's last use (a copy stays valid while the value is paged in again, so a second release of
it costs no page-out); ``host_peak`` is the most host bytes at once. The steps executed, page steps
included, form a coop :class:`~coop.schedule.Schedule` (a ``page_out`` where a tensor is swapped, a
``page_in`` where its page-in starts), legal and within the arena by the engine's rules.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from coop.budget import parsed_budget
from coop.device_profiles import DeviceProfile
from coop.graph import Graph
from coop.online.delta import Decision, DeltaPolicy, delta_profile
from coop.online.online_sim import OnlineResult, OnlineSimulator, Thrashing, run_engine
from coop.schedule import Schedule, Step


@dataclass
class DeltaResult(OnlineResult):
    """An online run of DELTA: :class:`OnlineResult` plus what it swapped, recomputed and waited for.

    ``recomputed_cost`` is the cost of the recomputations (the graph's unit, seconds on the profile);
    ``exposed_copy_s`` the time the compute waited on copies; ``copy_s`` the time the copy engines were busy;
    ``swap_decisions`` / ``recompute_decisions`` the director's verdicts; ``swaps`` / ``swapped_bytes`` the
    page-outs and their bytes; ``page_ins`` the page-ins, ``prefetches`` those started ahead of their use;
    ``host_peak`` the most host memory held at once. ``decision_log`` lists every released tensor with the
    director's decision (left out of :meth:`to_dict`).
    """

    device_profile: str = ""
    recomputed_cost: float = 0.0
    exposed_copy_s: float = 0.0
    copy_s: float = 0.0
    swap_decisions: int = 0
    recompute_decisions: int = 0
    swaps: int = 0
    swapped_bytes: int = 0
    page_ins: int = 0
    prefetches: int = 0
    host_peak: int = 0
    decision_log: list[tuple[int, Decision]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the schedule and the decision log are left out)."""
        return {k: v for k, v in super().to_dict().items() if k != "decision_log"}


class DeltaSimulator(OnlineSimulator):
    """The online engine with swapping: DELTA's policy decides, two copy engines and a host tier carry it out."""

    policy: DeltaPolicy

    def __init__(self, graph: Graph, budget: int, policy: DeltaPolicy, max_overhead: float = 10.0,
                 replay_random: bool = True, prefetch: bool = True, next_use: bool = True,
                 compact: bool = False) -> None:
        super().__init__(graph, budget, policy, max_overhead, replay_random, compact=compact)
        self.link: DeviceProfile = policy.link
        self.prefetch = prefetch
        self.knows_next_use = next_use
        self._pageable = {n.id: graph.pageable(n.id) and n.mem > 0 for n in graph.nodes}
        # Program reads of every value, by position in the order; the baseline compute before each position.
        self._reads: dict[int, list[int]] = {i: [] for i in self._size}
        for position, v in enumerate(self.order):
            for source in self._inputs[v]:
                self._reads[source].append(position)
        self._before = [0.0, *itertools.accumulate(self._cost[v] for v in self.order)]
        self._position = 0
        self._now = 0.0  # the compute stream's time (s)
        self._out_free = 0.0  # when the device-to-host engine is free
        self._in_free = 0.0  # when the host-to-device engine is free
        self._host: set[int] = set()  # values with a valid host copy
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

    # ---------------------------------------------------------------- DeltaView
    def next_use_distance(self, key: Hashable) -> float | None:
        """Baseline compute from the current program step to the value's next program read (outputs: the end);
        None when the engine is told not to know (``next_use=False``, as a runtime that sees no future)."""
        if not self.knows_next_use:
            return None
        position = self._next_use(key)  # type: ignore[arg-type]
        return None if position is None else self._before[position] - self._before[self._position]

    def recomputable(self, key: Hashable) -> bool:
        return key not in self._kept and key not in self._outputs and key not in self._owned

    def swappable(self, key: Hashable) -> bool:
        return self._pageable.get(key, False) and key not in self._owned  # type: ignore[call-overload]

    def has_host_copy(self, key: Hashable) -> bool:
        return key in self._host

    def parents(self, key: Hashable) -> Iterable[Hashable]:
        return self._inputs[key]  # type: ignore[index]

    def is_evicted(self, key: Hashable) -> bool:
        return key in self._ever and key not in self._resident and key not in self._host

    def _evictable(self, key: int) -> bool:
        # Values the base engine never evicts (outputs, kept values) may leave by swapping.
        if key not in self._resident or self._pins[key] or not self._size[key] or key in self._owned:
            return False
        return self.recomputable(key) or self.swappable(key)

    def _next_use(self, key: int) -> int | None:
        reads = self._reads[key]
        index = bisect.bisect_left(reads, self._position)
        if index < len(reads):
            return reads[index]
        return len(self.order) if key in self._outputs else None

    # ---------------------------------------------------------------- time
    def _wait_until(self, moment: float) -> None:
        """The compute stream waits for a copy; the wait is exposed copy time."""
        if moment <= self._now:
            return
        self.exposed_s += moment - self._now
        self._now = moment
        if self.extra_cost + self.exposed_s > self.max_extra_cost:
            raise Thrashing(f"recomputation and copy waits passed the limit after {self.swaps} swaps "
                            f"and {self.recomputations} recomputes")

    def _run_node(self, node: int) -> None:
        for source in self._inputs[node]:
            arrival = self._arrives.pop(source, None)
            if arrival is not None:
                self._wait_until(arrival)
        self._now += self._cost[node]
        self.steps.append(Step(op="compute", node=node))

    # ---------------------------------------------------------------- swapping out
    def _evict(self, key: int) -> None:
        decision = self.policy.decide(self.info(key), self)
        self.decision_log.append((key, decision))
        if decision.action == "swap":
            self._swap_out(key)
        else:
            self._drop_host_copy(key)
            self._arrives.pop(key, None)
            self._drop(key)

    def _swap_out(self, key: int) -> None:
        size = self._size[key]
        if key not in self._host:
            start = max(self._now, self._out_free)
            self._out_free = start + self.link.pageout_s(size)
            self.copy_s += self._out_free - start
            self._host.add(key)
            self.host_bytes += size
            self.host_peak = max(self.host_peak, self.host_bytes)
            self.swaps += 1
            self.swapped_bytes += size
            self._wait_until(self._out_free)  # the block is free once its copy has left
        self._arrives.pop(key, None)  # a page-in still in flight is abandoned
        self.steps.append(Step(op="page_out", node=key))
        self._away.add(key)
        self._drop(key)

    def _drop_host_copy(self, key: int) -> None:
        if key in self._host:
            self._host.discard(key)
            self._away.discard(key)
            self.host_bytes -= self._size[key]

    def _release_if_done(self, key: int) -> None:
        # A value nobody reads again leaves the host too (before its device copy, so the policy sees it gone).
        if (
            key in self._host
            and self._pins[key] == 0
            and self._remaining[key] == 0
            and key not in self._outputs
            and (key not in self._kept or key in self._released_kept)
        ):
            self._drop_host_copy(key)
        super()._release_if_done(key)

    # ---------------------------------------------------------------- paging in
    def _bring_back(self, key: int) -> bool:
        if key not in self._away:
            return False
        previous = self._previous_address.get(key) if self.policy.in_place_recompute else None
        self._allocate(key, self._size[key], self._cost[key], previous)
        self._page_in(key, prefetched=False)
        return True

    def _page_in(self, key: int, prefetched: bool) -> None:
        start = max(self._now, self._in_free)
        self._in_free = start + self.link.pagein_s(self._size[key])
        self.copy_s += self._in_free - start
        self._arrives[key] = self._in_free
        self._away.discard(key)
        self._resident.add(key)
        self._last_access[key] = self._clock
        self.steps.append(Step(op="page_in", node=key))
        self.page_ins += 1
        self.prefetches += prefetched
        self.policy.on_resident(key, self)

    def _before_step(self, position: int) -> None:
        self._position = position
        if not self.prefetch or not self._away:
            return
        after_this_step = self._before[position + 1]
        due = sorted((use, key) for key in self._away if (use := self._next_use(key)) is not None)
        for use, key in due:
            backlog = max(self._in_free - self._now, 0.0)
            if self._before[use] - after_this_step >= self.link.pagein_s(self._size[key]) + backlog:
                continue  # it can wait one more step and still arrive in time
            if self._place_without_eviction(key):
                self._page_in(key, prefetched=True)

    def _place_without_eviction(self, key: int) -> bool:
        size = self._size[key]
        previous = self._previous_address.get(key) if self.policy.in_place_recompute else None
        if previous is not None and self._arena.allocate_at(previous, size, key):
            return True
        placement = self.policy.placement(size, self._cost[key])
        return self._arena.allocate(size, key, placement, record=False) is not None

    # ---------------------------------------------------------------- the run
    def run(self) -> None:
        super().run()
        self._position = len(self.order)
        for output in self.graph.outputs:  # the step ends when every output is back on the device
            arrival = self._arrives.pop(output, None)
            if arrival is not None:
                self._wait_until(arrival)

    def schedule(self) -> Schedule:
        """The steps executed, page steps included, as a coop Schedule."""
        return Schedule(steps=tuple(self.steps))


def simulate_delta(
    graph: Graph,
    budget: int,
    device_profile: str | DeviceProfile | None,
    *,
    max_overhead: float = 10.0,
    replay_random: bool = True,
    prefetch: bool = True,
    next_use: bool = True,
    compact: bool = False,
) -> DeltaResult:
    """Run ``graph.order`` under ``budget`` with DELTA: release by its filter, swap or recompute by its director.

    Parameters
    ----------
    graph : Graph
        The graph whose baseline order is run; its costs are read as seconds on the profiled device, its
        memory as bytes.
    budget : int
        The arena size, in graph units (already parsed, :func:`coop.budget.parse_budget`).
    device_profile : str or DeviceProfile or None
        The device whose host link prices and times the swaps (a shipped name, a .toml path or a
        profile); None is refused.
    max_overhead : float
        The run stops as thrashing once recomputation plus exposed copy time passes ``max_overhead`` x
        the baseline cost.
    replay_random : bool
        Whether random draws are recomputed by replaying their saved RNG state (as :func:`simulate_online`).
    prefetch : bool
        Start page-ins ahead of their use (False: every page-in on demand, fully exposed).
    next_use : bool
        Let the filter see each tensor's next use (False: staleness alone, as a runtime without a static
        graph; prefetching still uses the next use).
    compact : bool
        Close the arena's gaps where no release makes a contiguous room (as :func:`simulate_online`; the
        dynamic fallback's rule, so its host pool is sized by the same run).

    Returns
    -------
    DeltaResult
        The online result (status, overhead = (recomputed cost + exposed copy time) / baseline, peaks, the
        schedule with its page steps when "ok") and the swap figures: decisions, swapped bytes, page-ins,
        prefetches, recomputed cost, exposed and busy copy time, host peak.

    Raises
    ------
    DeviceProfileError
        When no device profile is given, or it is unknown or malformed.
    BudgetError
        When ``budget`` is not a parsed budget.

    References
    ----------
    Tang et al., "DELTA: Dynamically Optimizing GPU Memory beyond Tensor Recomputation", arXiv 2203.15980
    (2022).
    """
    profile = delta_profile(device_profile)
    budget_units = parsed_budget(budget, "simulate_delta")
    engine = DeltaSimulator(graph, budget_units, DeltaPolicy(profile), max_overhead, replay_random, prefetch, next_use,
                            compact=compact)
    result = run_engine(engine)
    decisions = [decision.action for _, decision in engine.decision_log]
    return DeltaResult(
        **result.__dict__,
        device_profile=profile.name,
        recomputed_cost=engine.extra_cost,
        exposed_copy_s=engine.exposed_s,
        copy_s=engine.copy_s,
        swap_decisions=decisions.count("swap"),
        recompute_decisions=decisions.count("recompute"),
        swaps=engine.swaps,
        swapped_bytes=engine.swapped_bytes,
        page_ins=engine.page_ins,
        prefetches=engine.prefetches,
        host_peak=engine.host_peak,
        decision_log=engine.decision_log,
    )


__all__ = ["DeltaResult", "DeltaSimulator", "simulate_delta"]
