"""DELTA's eviction policy: a filter picks what leaves memory, a director swaps or recomputes each one.

Tang, Wang, Zhang, Liu, Zhang, Qiao, Lai, Li, "DELTA: Dynamically Optimizing GPU Memory beyond Tensor
Recomputation", arXiv 2203.15980 (2022). A dynamic runtime that releases tensors under memory pressure and,
per released tensor, either *swaps* it to host memory (to be prefetched back, the copy overlapping compute)
or *drops* it to be *recomputed* from its lineage, whichever is cheaper. coop's reading, on the same arena
and engine as DTR, DTE and Coop (:mod:`coop.online.policies`):

* **filter** (which tensors are released): Coop's cheapest contiguous window over the address-ordered arena
  (:class:`coop.online.policies.CoopPolicy`, so that freed bytes are usable by the request), every tensor in
  it scored by the director's price (the cheaper action's) over how soon it is needed again, and the window
  by its summed score per byte freed: a tensor needed soon is dear to release, a big one cheap per byte.
  How soon: DTR's staleness (time since its last use), or the distance to its next use where the engine
  knows it (the simulator over a static Graph: the compute until the next program read, on the logical
  clock) and it is sooner. A known next use only ever makes a tensor dearer, never cheaper than its
  staleness says: a swap's page-out is paid now, whatever the distance, and on GPT-2 with a slow link
  (a72, at 0.6 of the peak) trusting far next uses raised the overhead from Coop's 15 % to 60 %;
* **director** (what happens to each released tensor, :meth:`DeltaPolicy.decide`): the swap price is the
  page-out plus the page-in, each the link's latency plus the bytes over its throughput
  (:meth:`coop.device_profiles.DeviceProfile.pageout_s`, ``pagein_s``: POET's model of a host link); the page-out
  is free when a valid host copy already exists (values are immutable: a copy paged in earlier stays
  valid). The recomputation price is what rebuilding the tensor runs: its cost plus that of its evicted
  ancestors (the values reachable through evicted lineage inputs), not DTR's whole ``e*``. ``e*`` adds the
  evicted descendants too, which need the tensor back whether it is recomputed or paged in, so that term is
  common to both actions and cancels from the comparison; counting it on one side only made the director
  swap where recomputing cost less (bench_delta, A100-timed GPT-2: overhead 7.6-26.6 % with ``e*``,
  6.6-20.0 % with the ancestors' closure, Coop 5.0-19.5 %). The cheaper wins; a tie recomputes (it keeps
  host memory free). A value that cannot be recomputed (a graph output, a kept random draw, an extra output
  of a multi-output op) can only be swapped; a value the device cannot page (a host scalar) only recomputed.

The prefetcher and the copy engines are the engine's (:mod:`coop.online.delta_sim`): it knows when a
swapped tensor is used next and starts its page-in early enough to hide it.

Costs are read as seconds on the profiled device and memory as bytes, as POET reads its graphs
(:func:`coop.formulations.poet.setting.node_price`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from coop.device_profiles import DeviceProfile, DeviceProfileError, known_profiles, load_device_profile
from coop.online.arena import Block
from coop.online.policies import CoopPolicy, EngineView, TensorInfo, evicted_closure_cost, staleness

#: The policy's name (``coop simulate --policy delta``).
DELTA = "delta"

Action = Literal["swap", "recompute"]

#: Distance floor: a tensor used at this very step still gets a finite score (as DTR's staleness floor).
MIN_DISTANCE = 1e-9


class DeltaKnowledge(Protocol):
    """What DELTA's decisions know beyond the engine (the host tier, next uses, lineage): an engine's ``decisions``
    (:class:`coop.online.delta_decisions.DeltaDecisions`)."""

    def next_use_distance(self, key: Hashable) -> float | None:
        """Logical time until the next use of a tensor (None: the engine does not know)."""
        ...

    def recomputable(self, key: Hashable) -> bool:
        """Whether a dropped tensor could be recomputed from its lineage."""
        ...

    def swappable(self, key: Hashable) -> bool:
        """Whether the tensor may be paged to the host tier."""
        ...

    def has_host_copy(self, key: Hashable) -> bool:
        """Whether a valid copy of the tensor is in host memory already (its page-out is free)."""
        ...

    def parents(self, key: Hashable) -> Iterable[Hashable]:
        """The lineage inputs of a tensor (what rebuilding it runs first)."""
        ...


class DeltaView(EngineView, Protocol):
    """The engine as DELTA sees it: an :class:`EngineView` whose ``decisions`` the policy reads directly
    for the host tier, next uses and lineage."""

    @property
    def decisions(self) -> DeltaKnowledge: ...

    def parents(self, key: Hashable) -> Iterable[Hashable]:
        """The lineage inputs of a tensor (the values its recomputation reads)."""
        ...


@dataclass(frozen=True, slots=True)
class Decision:
    """The director's verdict on one released tensor and the two prices it compared (seconds; inf: impossible)."""

    action: Action
    swap_s: float
    recompute_s: float

    @property
    def price(self) -> float:
        """The price of the chosen action."""
        return self.swap_s if self.action == "swap" else self.recompute_s


def decide(swap_s: float, recompute_s: float) -> Decision:
    """The director's rule: the cheaper of swapping and recomputing; a tie recomputes.

    Parameters
    ----------
    swap_s : float
        Seconds to page the tensor out and back in (``inf`` when it cannot be paged).
    recompute_s : float
        Seconds to recompute it with its evicted neighbourhood (``inf`` when it cannot be recomputed).

    Returns
    -------
    Decision
        The action and both prices.

    References
    ----------
    Tang et al., "DELTA: Dynamically Optimizing GPU Memory beyond Tensor Recomputation", arXiv 2203.15980
    (2022): the director.
    """
    return Decision("swap" if swap_s < recompute_s else "recompute", swap_s, recompute_s)


def delta_profile(device_profile: str | DeviceProfile | None) -> DeviceProfile:
    """The device profile whose host link prices DELTA's swaps; None is refused in one line naming the profiles.

    Parameters
    ----------
    device_profile : str or DeviceProfile or None
        A shipped profile's name, a ``.toml`` path, or a profile.

    Returns
    -------
    DeviceProfile
        The loaded profile.

    Raises
    ------
    DeviceProfileError
        When no profile is given, or the name or file is refused by
        :func:`coop.device_profiles.load_device_profile`.
    """
    if device_profile is None:
        raise DeviceProfileError("delta prices swaps on a host link and needs a device profile: give --device-profile "
                                 f"(device_profile=) one of {', '.join(known_profiles())}, or a .toml profile's path")
    return load_device_profile(device_profile)


class DeltaPolicy(CoopPolicy):
    """DELTA: release Coop's cheapest window, priced per tensor by the director's cheaper action over its next use.

    ``link`` is the device profile whose page-in and page-out prices a swap. The window scan, the cheap /
    expensive layout and in-place recomputation are Coop's (its keyword arguments pass through).
    """

    name = DELTA

    def __init__(self, link: DeviceProfile, window_cost: str = "ratio", partition: bool = True,
                 in_place: bool = True, layout: str = "hole-ends") -> None:
        super().__init__(window_cost, partition, in_place, layout)
        self.link = link

    def reset(self) -> None:
        self.__init__(self.link, self.window_cost, self.partition, self.in_place_recompute, self.layout)  # type: ignore[misc]

    # ------------------------------------------------------------ the director
    def swap_seconds(self, info: TensorInfo, view: DeltaView) -> float:
        """Page-out (free with a valid host copy) plus page-in, on the link; inf when the tensor cannot be paged."""
        if not view.decisions.swappable(info.key):
            return math.inf
        page_out = 0.0 if view.decisions.has_host_copy(info.key) else self.link.pageout_s(info.size)
        return page_out + self.link.pagein_s(info.size)

    def recompute_seconds(self, info: TensorInfo, view: DeltaView) -> float:
        """The tensor's cost plus its evicted ancestors' (what rebuilding it runs); inf when it cannot be
        recomputed."""
        if not view.decisions.recomputable(info.key):
            return math.inf
        return evicted_closure_cost(info, view, view.decisions.parents)

    def decide(self, info: TensorInfo, view: DeltaView) -> Decision:
        """Swap or recompute this released tensor, whichever is cheaper now (:func:`decide`)."""
        return decide(self.swap_seconds(info, view), self.recompute_seconds(info, view))

    # ------------------------------------------------------------ the filter
    def distance(self, info: TensorInfo, view: DeltaView) -> float:
        """How soon the tensor is needed again: its staleness, or the distance to its next use where the engine
        knows it and it is sooner (never zero)."""
        stale = staleness(view, info)
        known = view.decisions.next_use_distance(info.key)
        return stale if known is None else max(min(known, stale), MIN_DISTANCE)

    def eviction_price(self, block: Block, info: TensorInfo, view: EngineView) -> float | None:
        """The director's price (swap or recompute, the cheaper) over the distance to the next use."""
        delta_view: DeltaView = view  # type: ignore[assignment]
        price = self.decide(info, delta_view).price
        return None if math.isinf(price) else price / self.distance(info, delta_view)

    # ------------------------------------------------------------ hooks
    def on_evicted(self, key: Hashable, view: EngineView) -> None:
        # A swapped tensor is not lost: it joins no evicted neighbourhood (recomputing a neighbour pages it in).
        if view.is_evicted(key):
            super().on_evicted(key, view)


__all__ = ["DELTA", "Decision", "DeltaKnowledge", "DeltaPolicy", "DeltaView", "decide", "delta_profile"]
