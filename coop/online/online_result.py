"""What one online run reports (:class:`OnlineResult`) and how a run stops early (:class:`OutOfMemory`,
:class:`Thrashing`, DTR's :data:`THRASH_OVERHEAD`), shared by every online engine.

The engine is :mod:`coop.online.online_sim`; everything here is importable from there too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from coop.schedule import Schedule

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
