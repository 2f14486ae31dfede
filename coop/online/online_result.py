"""What one online run reports (:class:`OnlineResult`) and how a run stops early (:class:`OutOfMemory`,
:class:`Thrashing`, DTR's :data:`THRASH_OVERHEAD`), shared by every online engine; the one runner that reports
an engine's run (:func:`run_engine`) and the bisection for the least budget where one runs
(:func:`least_running_budget`).

The engine is :mod:`coop.online.online_sim`; everything here is importable from there too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from coop.budget import baseline_peak
from coop.graph import Graph
from coop.online.arena import Arena
from coop.online.policies import EvictionPolicy
from coop.schedule import Schedule, relative_overhead

OnlineStatus = Literal["ok", "thrashed", "oom"]

#: DTR's thrashing threshold: a finished run that recomputed more than twice the baseline.
THRASH_OVERHEAD = 2.0


@dataclass
class OnlineResult:
    """One online run: status, compute overhead, eviction counts and arena measurements.

    ``status``: "ok"; "thrashed" when the run finished with overhead > 2 (DTR's threshold; the
    schedule is still legal) or was stopped once its extra compute passed ``max_overhead`` x the
    baseline (no schedule); "oom" when nothing evictable could make room (no schedule). A run cut
    short reports as ``overhead`` the recomputation it had paid for when it stopped. ``peak`` is
    the most used bytes at once (caller-owned included), ``arena_peak`` the highest
    address ever occupied; ``fragmentation`` the mean free bytes / arena size over the failed
    allocation requests (Coop's measure), ``largest_free_fraction`` the mean largest free block /
    arena size over the same failures.
    """

    policy: str
    budget: int
    status: OnlineStatus
    overhead: float
    cost: float
    baseline_cost: float
    evictions: int
    recomputations: int
    steps: int
    failures: int
    search_s: float
    wall_s: float
    fragmentation: float
    largest_free_fraction: float
    peak: int
    arena_peak: int
    schedule: Schedule | None = field(default=None, repr=False)
    message: str = ""
    random_replays: int = 0
    #: times the arena's gaps were closed (``compact=True``: the dynamic fallback's last resort)
    compactions: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the schedule is left out)."""
        return {k: v for k, v in self.__dict__.items() if k != "schedule"}


class OutOfMemory(Exception):
    """Nothing evictable can make room for an allocation (the engine stops; callers report it)."""


class Thrashing(Exception):
    """The extra compute passed the caller's limit (the engine stops; callers report it)."""


class OnlineEngine(Protocol):
    """What :func:`run_engine` reads of an engine (:class:`coop.online.online_sim.OnlineSimulator` and its
    subclasses): its run, the computes it executed and its counters."""

    graph: Graph
    policy: EvictionPolicy
    executed: list[int]
    evictions: int
    recomputations: int
    random_replays: int
    compactions: int
    extra_cost: float
    exposed_s: float
    search_s: float

    @property
    def arena(self) -> Arena: ...

    def run(self) -> None: ...

    def cost(self, key: Hashable) -> float: ...

    def schedule(self) -> Schedule: ...


def run_engine(engine: OnlineEngine) -> OnlineResult:
    """Run an engine over its graph's order and report it (the one report of every online engine).

    Parameters
    ----------
    engine : OnlineEngine
        A fresh engine (an :class:`~coop.online.online_sim.OnlineSimulator`, or a subclass that pages or holds
        real tensors).

    Returns
    -------
    OnlineResult
        As :func:`coop.online.online_sim.simulate_online` describes it; the overhead counts the engine's recomputation and
        the copy time it could not hide (``engine.exposed_s``, zero for recomputation-only engines).
    """
    graph = engine.graph
    started = time.perf_counter()
    status: OnlineStatus = "ok"
    message = ""
    try:
        engine.run()
    except OutOfMemory as exc:
        status, message = "oom", str(exc)
    except Thrashing as exc:
        status, message = "thrashed", str(exc)
    wall_s = time.perf_counter() - started
    cost = sum(engine.cost(v) for v in engine.executed)
    baseline = graph.baseline_cost
    overhead = relative_overhead(cost - baseline + engine.exposed_s, baseline)
    if status != "ok":  # a run cut short: the recomputation (and waiting) it paid for so far, not its unfinished cost
        overhead = relative_overhead(engine.extra_cost + engine.exposed_s, baseline)
    schedule = None
    if status == "ok":
        schedule = engine.schedule()
        if overhead > THRASH_OVERHEAD:
            status, message = "thrashed", f"overhead {overhead:.2f} exceeds {THRASH_OVERHEAD}"
    arena = engine.arena
    failures = arena.failures
    return OnlineResult(
        policy=engine.policy.name,
        budget=arena.size,
        status=status,
        overhead=overhead,
        cost=cost,
        baseline_cost=baseline,
        evictions=engine.evictions,
        recomputations=engine.recomputations,
        steps=len(schedule) if schedule is not None else len(engine.executed),
        failures=len(failures),
        search_s=engine.search_s,
        wall_s=wall_s,
        fragmentation=arena.mean_failure_free_fraction,
        largest_free_fraction=(sum(f.largest_free for f in failures) / len(failures) / arena.size) if failures else 0.0,
        peak=arena.peak_used,
        arena_peak=arena.high_water,
        schedule=schedule,
        message=message,
        random_replays=engine.random_replays,
        compactions=engine.compactions,
    )


#: The step of :func:`least_running_budget`'s bisection, as a fraction of the baseline peak.
BUDGET_RESOLUTION = 0.005


def least_running_budget(graph: Graph, engine_at: Callable[[int], OnlineEngine], failed: int) -> int | None:
    """The least budget above ``failed`` at which a fresh engine runs without thrashing, by bisection.

    "Runs" means :func:`run_engine` reports "ok": the run finished and recomputed at most
    ``THRASH_OVERHEAD`` x the baseline (an engine built with that ``max_overhead`` stops a thrashing
    run early). Online eviction is not monotone in the budget (a heuristic's choices change with
    the room it has), so this is the boundary the bisection finds between ``failed`` and the
    baseline peak, to within ``BUDGET_RESOLUTION`` of the peak: the budget returned was run and
    ran; one a resolution below it did not.

    Parameters
    ----------
    graph : Graph
        The graph the engines run.
    engine_at : callable
        A fresh engine over ``graph`` for a budget (the policy and settings of the run that failed).
    failed : int
        A budget at which the engine did not run.

    Returns
    -------
    int or None
        That budget, in graph units; None when the engine does not run at the baseline peak either.
    """
    def runs(budget: int) -> bool:
        return run_engine(engine_at(budget)).status == "ok"

    peak = baseline_peak(graph)
    high = max(peak, failed + 1)
    if not runs(high):
        return None
    low = failed
    resolution = max(int(BUDGET_RESOLUTION * peak), 1)
    while high - low > resolution:
        middle = (low + high) // 2
        if runs(middle):
            high = middle
        else:
            low = middle
    return high
