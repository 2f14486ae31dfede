"""Online eviction policies: what to evict when an allocation does not fit.

Each policy sees an abstract view of the engine (:class:`EngineView`): tensors as opaque keys
with a size, a compute cost, a last-access time on a logical clock (the sum of the costs of the
operations executed so far) and an evictable flag; their lineage neighbours; and the
address-ordered :class:`~coop.online.arena.Arena`. Nothing here knows the Graph, so the pure
simulator (:mod:`coop.online.online_sim`) and a runtime engine that holds real tensors drive the
same policy objects.

Policies:

* ``dtr``: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021). Evict the tensor of
  least ``h(t) = e*(t) / (size(t) * staleness(t))`` where ``e*(t)`` is the cost of ``t`` plus the
  cost of its *evicted neighbourhood*: the evicted values connected to ``t`` through evicted
  ancestors and descendants, all of which a rematerialization of ``t`` or of its evicted
  children would have to recompute.
* ``dtr-eq``: the same, with the paper's equivalence-class approximation of ``e*``: evicted
  values are merged with their evicted neighbours in a union-find that keeps the summed cost per
  class; a rematerialized value leaves its cost but does not split its class (DTR Sec. 4).
* ``dte``: MegEngine's dynamic tensor eviction: the ``dtr-eq`` heuristic with the size replaced
  by the bytes a contiguous allocation gains, the tensor plus the free blocks beside it.
* ``coop``: Coop (Zhang et al., NeurIPS 2023). Evict the cheapest *contiguous window* of blocks
  (free blocks and evictable tensors, no pinned block inside) whose bytes cover the request,
  found by a two-pointer scan in O(blocks). By default a window costs its expected recompute per
  byte it frees: the sum over its tensors of ``e*(t) / staleness(t)`` (``e*`` from the same
  equivalence classes as ``dtr-eq``; free blocks cost nothing) divided by the window's bytes,
  free blocks included. That is DTE's score (a tensor plus the free blocks beside it) grown to a
  window, and for a one-tensor window DTR's ``h``; the scan compares, for every right end, the
  shortest window that covers the request. Tensors are split by cost density (cost / bytes,
  against the running median) into cheap and expensive ones (Zhang et al.'s cheap tensor
  partitioning); both take the best-fit free block, cheap ones at its top and expensive ones at
  its bottom, so that cheap tensors gather at one end of every hole without splitting a larger
  one. A recomputed tensor goes back to its old address when that range is free (in-place
  recompute). Earlier settings are kept for ablations: ``window_cost="h"`` (sum of DTR's ``h``
  over the window), ``"estar"``, ``"cost"``; ``layout="ends"`` (cheap tensors from the top of
  the highest hole that fits, expensive ones by best fit).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedList

from coop.errors import CoopError
from coop.online.arena import Arena, Block

#: Staleness floor: a value touched at this very clock tick still gets a finite score.
_MIN_STALENESS = 1e-9


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What a policy may know about one tensor held in the arena."""

    key: Hashable
    size: int
    cost: float
    last_access: float
    evictable: bool


class EngineView(Protocol):
    """The engine as a policy sees it (implemented by the simulator and the runtime engine)."""

    @property
    def clock(self) -> float: ...

    @property
    def arena(self) -> Arena: ...

    def info(self, key: Hashable) -> TensorInfo:
        """The tensor behind an arena tag (pinned blocks such as workspaces report evictable False)."""
        ...

    def evictable(self) -> Iterable[TensorInfo]:
        """The resident tensors that may be evicted now."""
        ...

    def neighbours(self, key: Hashable) -> Iterable[Hashable]:
        """Lineage parents and children of a tensor (recomputable values only)."""
        ...

    def is_evicted(self, key: Hashable) -> bool:
        """Computed before and not resident now (evicted, or released after its last use)."""
        ...

    def cost(self, key: Hashable) -> float: ...


def staleness(view: EngineView, info: TensorInfo) -> float:
    """Logical time since the tensor was last touched (never zero).

    Parameters
    ----------
    view : EngineView
        The engine's state; its ``clock`` is the current logical time.
    info : TensorInfo
        The tensor, with its ``last_access``.

    Returns
    -------
    float
        ``view.clock - info.last_access``, at least ``_MIN_STALENESS``.
    """
    return max(view.clock - info.last_access, _MIN_STALENESS)


class EvictionPolicy:
    """Base class: the hooks an engine calls. Subclasses choose victims."""

    name: str = ""
    #: Whether a recomputed tensor should first try its previous address.
    in_place_recompute: bool = False

    def reset(self) -> None:
        """Forget all state before a new run."""

    def from_end(self, size: int, cost: float) -> bool:
        """Whether to allocate a new tensor from the high end of the arena."""
        return False

    def placement(self, size: int, cost: float) -> str:
        """Where a new tensor goes: one of :data:`coop.online.arena.PLACEMENTS` (default: best fit,
        or the top of the highest hole when :meth:`from_end` says so)."""
        return "top" if self.from_end(size, cost) else "best"

    def choose(self, request: int, view: EngineView) -> list[Hashable]:
        """Tensors to evict so that an allocation of ``request`` bytes can succeed (empty: none can)."""
        raise NotImplementedError

    def on_evicted(self, key: Hashable, view: EngineView) -> None:
        """A tensor left memory (evicted, or released after its last use)."""

    def on_resident(self, key: Hashable, view: EngineView) -> None:
        """A tensor was computed or recomputed."""


# ---------------------------------------------------------------------------- DTR
class DTRPolicy(EvictionPolicy):
    """DTR with the exact evicted-neighbourhood cost e* (Kirisame et al., ICLR 2021)."""

    name = "dtr"

    def choose(self, request: int, view: EngineView) -> list[Hashable]:
        best_key: Hashable | None = None
        best_score = float("inf")
        for info in view.evictable():
            score = self.score(info, view)
            if score < best_score or best_key is None:
                best_key, best_score = info.key, score
        return [] if best_key is None else [best_key]

    def score(self, info: TensorInfo, view: EngineView) -> float:
        return self.recompute_cost(info, view) / (self.effective_size(info, view) * staleness(view, info))

    def effective_size(self, info: TensorInfo, view: EngineView) -> int:
        return info.size

    def recompute_cost(self, info: TensorInfo, view: EngineView) -> float:
        """e*(t): cost of t plus every evicted value reachable from t through evicted values."""
        return evicted_closure_cost(info, view, view.neighbours)


def evicted_closure_cost(info: TensorInfo, view: EngineView, links: Callable[[Hashable], Iterable[Hashable]]) -> float:
    """A tensor's cost plus the cost of every evicted value reachable from it through evicted values along ``links``.

    DTR's e* follows every neighbour (inputs and users, :meth:`DTRPolicy.recompute_cost`); DELTA's director
    follows the inputs only (what rebuilding the tensor runs, :meth:`coop.online.delta.DeltaPolicy.recompute_seconds`).

    Parameters
    ----------
    view : EngineView
        The engine's view (``is_evicted``, ``cost``).
    links : callable
        The keys next to a key: ``view.neighbours`` or ``view.parents``.

    Returns
    -------
    float
        The summed cost.
    """
    total = info.cost
    seen = {info.key}
    frontier = [info.key]
    while frontier:
        for linked in links(frontier.pop()):
            if linked not in seen and view.is_evicted(linked):
                seen.add(linked)
                total += view.cost(linked)
                frontier.append(linked)
    return total


class _UnionFind:
    """Union-find with a summed cost per class (DTR's equivalence-class approximation)."""

    def __init__(self) -> None:
        self.parent: dict[Hashable, Hashable] = {}
        self.total: dict[Hashable, float] = {}

    def find(self, key: Hashable) -> Hashable:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:  # path compression
            self.parent[key], key = root, self.parent[key]
        return root

    def add_cost(self, key: Hashable, cost: float) -> None:
        if key not in self.parent:
            self.parent[key] = key
            self.total[key] = 0.0
        self.total[self.find(key)] += cost

    def union(self, a: Hashable, b: Hashable) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            self.parent[root_b] = root_a
            self.total[root_a] += self.total.pop(root_b)


class DTREquivalencePolicy(DTRPolicy):
    """DTR with e* approximated by union-find classes of evicted neighbourhoods."""

    name = "dtr-eq"

    def __init__(self) -> None:
        self._classes = _UnionFind()
        self._member: set[Hashable] = set()  # keys whose cost currently counts in their class

    def reset(self) -> None:
        self.__init__()

    def on_evicted(self, key: Hashable, view: EngineView) -> None:
        if key in self._member:
            return
        self._member.add(key)
        self._classes.add_cost(key, view.cost(key))
        for neighbour in view.neighbours(key):
            if neighbour in self._classes.parent and view.is_evicted(neighbour):
                self._classes.union(key, neighbour)

    def on_resident(self, key: Hashable, view: EngineView) -> None:
        # The class is not split (the paper's approximation); only this value's cost leaves it.
        if key in self._member:
            self._member.discard(key)
            self._classes.add_cost(key, -view.cost(key))

    def recompute_cost(self, info: TensorInfo, view: EngineView) -> float:
        total = info.cost
        roots = set()
        for neighbour in view.neighbours(info.key):
            if neighbour in self._classes.parent and view.is_evicted(neighbour):
                roots.add(self._classes.find(neighbour))
        return total + sum(max(self._classes.total[root], 0.0) for root in roots)


# ---------------------------------------------------------------------------- DTE
class DTEPolicy(DTREquivalencePolicy):
    """MegEngine's DTE: DTR-eq whose size counts the free blocks adjacent to the tensor."""

    name = "dte"

    def effective_size(self, info: TensorInfo, view: EngineView) -> int:
        return info.size + view.arena.free_neighbour_bytes(info.key)


# ---------------------------------------------------------------------------- Coop
@dataclass(frozen=True, slots=True)
class Window:
    """A run of contiguous blocks ``blocks[first:last + 1]`` and its eviction cost."""

    first: int
    last: int
    cost: float
    victims: tuple[Hashable, ...]


def cheapest_window(slots: list[tuple[int, float | None]], request: int,
                    per_byte: bool = False) -> tuple[int, int, float] | None:
    """Two-pointer scan for the cheapest contiguous run of slots whose bytes cover ``request``.

    ``slots`` are ``(bytes, cost)`` in address order; ``cost`` None marks a pinned slot that no
    window may contain. Costs are non-negative, so for each right end the best left end is the
    rightmost one that still covers the request, and that left end only moves right: O(n).
    With ``per_byte`` the windows are ranked by cost / bytes instead of cost, over the same
    candidates (for each right end, the shortest covering window): still O(n), and the window
    returned is the cheapest per byte among the windows that no left block can be dropped from.

    Parameters
    ----------
    slots : list of tuple of (int, float or None)
        The slots' ``(bytes, cost)`` in address order; cost None: pinned.
    request : int
        The bytes the window must cover.
    per_byte : bool
        Rank windows by cost / bytes instead of cost.

    Returns
    -------
    tuple of (int, int, float) or None
        ``(first, last, score)``: the window's first and last slot indices and its score (its cost,
        or cost / bytes); None when no window without a pinned slot covers ``request``.
    """
    best: tuple[int, int, float] | None = None
    left = 0
    window_bytes = 0
    window_cost = 0.0
    for right, (size, cost) in enumerate(slots):
        if cost is None:  # a pinned block resets the window
            left, window_bytes, window_cost = right + 1, 0, 0.0
            continue
        window_bytes += size
        window_cost += cost
        while left < right and window_bytes - slots[left][0] >= request:
            window_bytes -= slots[left][0]
            window_cost -= slots[left][1]  # type: ignore[operator]
            left += 1
        if window_bytes >= request:
            score = max(window_cost, 0.0) / max(window_bytes, 1) if per_byte else window_cost
            if best is None or score < best[2]:
                best = (left, right, score)
    return best


#: How Coop scores a tensor inside a window (see CoopPolicy).
WINDOW_COSTS = ("ratio", "h", "estar", "cost")
#: Where Coop puts cheap and expensive tensors (see CoopPolicy).
LAYOUTS = ("hole-ends", "ends")


class CoopPolicy(DTREquivalencePolicy):
    """Coop: evict the cheapest contiguous window; cheap and expensive tensors at opposite ends.

    Zhang et al., "Coop: Memory is not a Commodity", NeurIPS 2023: sliding-window eviction over the
    address-ordered blocks (two pointers, O(blocks)), cheap tensor partitioning by cost density,
    and in-place recomputation (here: a recomputed tensor first tries its previous address; the
    paper's in-place ops that mutate a recomputable tensor do not arise in a functional Graph).

    ``window_cost`` ranks windows: "ratio" (default) is the window's expected recompute per byte
    it frees, ``sum(e*(t) / staleness(t)) / window bytes`` (free blocks add bytes, no cost; for a
    single tensor with its free neighbours this is DTE's score); "h" sums DTR's heuristic
    ``e*(t) / (size(t) * staleness(t))`` over the window's tensors; "estar" sums
    ``e*(t) / staleness(t)``; "cost" sums ``cost(t) / staleness(t)`` (the first version). ``e*``
    comes from DTR's equivalence classes. ``layout`` places the two cost-density classes:
    "hole-ends" (default) puts both in the best-fit hole, cheap tensors at its top and expensive
    ones at its bottom; "ends" carves cheap tensors from the top of the highest hole that fits
    and gives expensive ones the best fit. ``partition`` and ``in_place`` switch off the
    cheap/expensive split (every tensor by best fit) and in-place recomputation (ablations).
    """

    name = "coop"

    def __init__(self, window_cost: str = "ratio", partition: bool = True, in_place: bool = True,
                 layout: str = "hole-ends") -> None:
        super().__init__()
        if window_cost not in WINDOW_COSTS:
            raise CoopError(f"unknown Coop window cost {window_cost!r}: use one of {', '.join(WINDOW_COSTS)}")
        if layout not in LAYOUTS:
            raise CoopError(f"unknown Coop layout {layout!r}: use one of {', '.join(LAYOUTS)}")
        self.window_cost = window_cost
        self.partition = partition
        self.layout = layout
        self.in_place_recompute = in_place
        self._densities: SortedList = SortedList()

    def reset(self) -> None:
        self.__init__(self.window_cost, self.partition, self.in_place_recompute, self.layout)  # type: ignore[misc]

    def from_end(self, size: int, cost: float) -> bool:
        """Whether a new tensor is cheap (cost density below the running median): cheap tensors go
        to the high end, of the best-fit hole ("hole-ends") or of the arena ("ends")."""
        # Why cheap ones high: best fit scatters its class into every hole it finds, while
        # carving from one end keeps a class packed, and the class that must sit together, so
        # that one window of it is cheap to evict, is the cheap one.
        if not self.partition:
            return False
        density = cost / size if size else 0.0
        cheap = bool(self._densities) and density < self._densities[len(self._densities) // 2]
        self._densities.add(density)
        return cheap

    def placement(self, size: int, cost: float) -> str:
        # "hole-ends" keeps best fit's choice of hole, so a cheap tensor never splits a larger
        # hole (the top one, typically) while a smaller one fits; plain "ends" split the top hole
        # and left the free bytes in pieces (the bench_online ablation coop-ends).
        cheap = self.from_end(size, cost)
        if not cheap:
            return "best"
        return "best-top" if self.layout == "hole-ends" else "top"

    def choose(self, request: int, view: EngineView) -> list[Hashable]:
        window = self.find_window(request, view)
        return [] if window is None else list(window.victims)

    def find_window(self, request: int, view: EngineView) -> Window | None:
        blocks = list(view.arena.blocks())
        slots = [self._slot(block, view) for block in blocks]
        found = cheapest_window(slots, request, per_byte=self.window_cost == "ratio")
        if found is None:
            return None
        first, last, cost = found
        victims = tuple(b.tag for b in blocks[first:last + 1] if not b.free)
        return Window(first, last, cost, victims)

    def _slot(self, block: Block, view: EngineView) -> tuple[int, float | None]:
        """A block as the window search sees it: its size and the price of freeing it (0 free, None never)."""
        if block.free:
            return block.size, 0.0
        info = view.info(block.tag)
        if not info.evictable:
            return block.size, None
        return block.size, self.eviction_price(block, info, view)

    def eviction_price(self, block: Block, info: TensorInfo, view: EngineView) -> float | None:
        """What evicting an evictable block costs in a window (None: it cannot be released)."""
        if self.window_cost == "cost":
            return info.cost / staleness(view, info)
        score = self.recompute_cost(info, view) / staleness(view, info)
        if self.window_cost == "h":
            score /= block.size
        return score


POLICIES: dict[str, type[EvictionPolicy]] = {
    "dtr": DTRPolicy,
    "dtr-eq": DTREquivalencePolicy,
    "dte": DTEPolicy,
    "coop": CoopPolicy,
}


def make_policy(name: str | EvictionPolicy) -> EvictionPolicy:
    """A fresh policy object by name (an object passes through after a reset).

    Parameters
    ----------
    name : str or EvictionPolicy
        A key of ``POLICIES``, or a policy object.

    Returns
    -------
    EvictionPolicy
        A new instance of the named policy, or ``name`` itself after ``reset()``.

    Raises
    ------
    CoopError
        When ``name`` is not a key of ``POLICIES``.
    """
    if isinstance(name, EvictionPolicy):
        name.reset()
        return name
    cls = POLICIES.get(name)
    if cls is None:
        raise CoopError(f"unknown eviction policy {name!r}: choose one of {', '.join(POLICIES)}")
    return cls()
