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

from dataclasses import dataclass, field
from typing import Any

from coop.budget import parsed_budget
from coop.device_profiles import DeviceProfile
from coop.graph import Graph
from coop.online.delta import Decision, DeltaPolicy, delta_profile
from coop.online.delta_decisions import DeltaDecisions
from coop.online.online_sim import OnlineResult, OnlineSimulator, run_engine


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
    """The online engine with swapping: DELTA's policy decides, two copy engines and a host tier carry it out.

    The plain engine with other decisions, composed: the decisions, the time model and their bookkeeping are one
    :class:`~coop.online.delta_decisions.DeltaDecisions` (``decisions``, which the runtime's
    :class:`coop.runtime.fallback.DeltaStep` holds too); no extension point is overridden. The engine is the
    policy's DeltaView.
    """

    policy: DeltaPolicy
    decisions: DeltaDecisions

    def __init__(self, graph: Graph, budget: int, policy: DeltaPolicy, max_overhead: float = 10.0,
                 replay_random: bool = True, prefetch: bool = True, next_use: bool = True,
                 compact: bool = False) -> None:
        super().__init__(graph, budget, policy, max_overhead, replay_random, compact=compact)
        self.decisions = DeltaDecisions(self, policy, prefetch, next_use)


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
    delta = engine.decisions
    decisions = [decision.action for _, decision in delta.decision_log]
    return DeltaResult(
        **result.__dict__,
        device_profile=profile.name,
        recomputed_cost=engine.extra_cost,
        exposed_copy_s=engine.exposed_s,
        copy_s=delta.copy_s,
        swap_decisions=decisions.count("swap"),
        recompute_decisions=decisions.count("recompute"),
        swaps=delta.swaps,
        swapped_bytes=delta.swapped_bytes,
        page_ins=delta.page_ins,
        prefetches=delta.prefetches,
        host_peak=delta.host_peak,
        decision_log=delta.decision_log,
    )


__all__ = ["DeltaResult", "DeltaSimulator", "simulate_delta"]
