"""A CPU model of PyTorch's CUDA caching allocator: replay allocation events, predict the bytes it reserves.

:func:`predict_reserved` replays events (:class:`Alloc`, :class:`Free`, :class:`RecordStream`, :class:`Sync`,
:class:`EmptyCache`, :class:`ReleasePool`) and reports reserved bytes after each, their peak, and the segments with
their blocks; :func:`schedule_events` turns a legal coop schedule into the events its replay makes.

The rules modelled are the native allocator's. The constants are those of the torch 2.13 headers installed with
coop (``c10/core/AllocatorConfig.h``): 512 B minimum block, 1 MiB largest small request, 2 MiB small segments,
10 MiB below which a large request shares a segment, 2 MiB rounding above, 20 MiB default large segment.

* **Rounding and pools.** A request of n > 0 bytes becomes the next multiple of 512 B (0 bytes hold no block:
  torch hands out a null pointer). Up to 1 MiB it is served by the small pool, above by the large pool. Pools are
  kept per stream and per memory pool (the default one, 0, or a CUDA graph capture's private pool, 1, 2, ...): a
  block serves only requests of its own stream, memory pool and size class.
* **Best fit.** A request takes the smallest cached free block of its pool that fits (ties: the lower address;
  the model orders segments by creation, an assumption, since real addresses are the driver's).
* **New segments.** With no fit a segment is reserved: 2 MiB for a small request; for a large one
  ``large_segment_size`` (20 MiB) under 10 MiB, else the request rounded up to 2 MiB.
* **Splitting.** The block found is cut to the request where the rest is at least 512 B (small pool) or more than
  1 MiB (large pool, and only for a request below ``max_split_size``); else the request holds the whole block
  (:attr:`Prediction.active` counts block bytes as torch's ``memory_allocated`` does, :attr:`Prediction.allocated`
  the rounded requests). The headers do not state these thresholds (the wheel ships no allocator ``.cpp``): they
  are the split rule of the allocator's implementation, to be confirmed against a GPU's ``memory_snapshot``.
* **Coalescing and streams.** A freed block merges with the free neighbours in its segment; one freed after a
  :class:`RecordStream` onto another stream first awaits a :class:`Sync` of each such stream.
* **empty_cache** completes every pending free, then releases each segment with no allocated block (a private
  pool's only after :class:`ReleasePool`, when its graph is gone).
* **max_split_size** (``max_split_size_mb``, above 20 MiB): a cached block of at least that size serves no
  request below it, nor one at or above it if it exceeds the request by ``max_non_split_rounding`` (20 MiB) or
  more; a request at or above it takes its whole block.
* **Expandable segments** (``expandable_segments:True``): per stream and size class the default pool has one
  virtual segment that grows by mapping pages (2 MiB small, ``large_segment_size`` large): reserved is the pages
  mapped. A request takes the best-fitting free mapped block (walking on to a larger fit while that one has less
  unmapped room after it); else the lowest run of free and unmapped space long enough is mapped, in whole pages,
  as far as the request needs. A split keeps any rest of at least 512 B, in every pool. ``empty_cache`` unmaps
  the whole pages inside free blocks. Private pools keep ordinary segments.
* **Capacity** (optional): where a new segment or page would pass ``capacity`` the cache is emptied and the
  request retried once, else :class:`AllocatorOutOfMemory`. Not modelled: ``roundup_power2_divisions``, garbage
  collection thresholds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from coop.graph import Graph
from coop.schedule import Schedule, Simulation, simulate

MIB = 1024 * 1024
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = MIB  # kSmallSize: the largest small request
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge
DEFAULT_LARGE_SEGMENT = 20 * MIB  # large_segment_size_
_VIRTUAL = 1 << 62  # an expandable segment's address range: never the limit here

BlockState = Literal["allocated", "awaiting_free", "free", "unmapped"]


class AllocatorOutOfMemory(RuntimeError):
    """The modelled allocator could not fit a request within ``capacity``, even after emptying its cache."""


@dataclass(frozen=True)
class Alloc:
    """Allocate ``size`` bytes as allocation ``id`` on ``stream`` from ``pool`` (0: the default one); ``node``: its value."""

    id: int
    size: int
    stream: int = 0
    pool: int = 0
    node: int | None = None


@dataclass(frozen=True)
class Free:
    """Free the allocation ``id``."""

    id: int


@dataclass(frozen=True)
class RecordStream:
    """Mark allocation ``id`` as used on ``stream`` (``Tensor.record_stream``): its free waits for that stream."""

    id: int
    stream: int


@dataclass(frozen=True)
class Sync:
    """All work queued on ``stream`` so far has finished: frees waiting on it complete."""

    stream: int


@dataclass(frozen=True)
class EmptyCache:
    """``torch.cuda.empty_cache()``."""


@dataclass(frozen=True)
class ReleasePool:
    """The private pool ``pool`` is no longer held (its CUDA graph is gone): empty_cache may release its segments."""

    pool: int


Event = Alloc | Free | RecordStream | Sync | EmptyCache | ReleasePool


@dataclass(frozen=True)
class AllocatorSettings:
    """The allocator's settings the model reads, in bytes; ``max_split_size`` None: unlimited; ``capacity`` None: none."""

    expandable: bool = False
    large_segment_size: int = DEFAULT_LARGE_SEGMENT
    max_split_size: int | None = None
    max_non_split_rounding: int = DEFAULT_LARGE_SEGMENT
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.max_split_size is not None and self.max_split_size <= DEFAULT_LARGE_SEGMENT:
            raise ValueError(f"max_split_size {self.max_split_size} B: the allocator requires more than 20 MiB")
        if self.large_segment_size <= 0 or self.large_segment_size % ROUND_LARGE:
            raise ValueError(f"large_segment_size {self.large_segment_size} B must be a positive multiple of 2 MiB")


@dataclass(frozen=True)
class BlockView:
    """One block of a segment: offset from the segment's start, size, state, the allocation holding it."""

    offset: int
    size: int
    state: BlockState
    owner: int | None = None


@dataclass(frozen=True)
class SegmentView:
    """One segment: pool, kind, stream, reserved bytes, blocks in address order (an expandable one's: the mapped
    blocks and the unmapped holes between them; its ``size`` is the bytes mapped)."""

    pool: int
    kind: Literal["small", "large"]
    stream: int
    size: int
    expandable: bool
    blocks: tuple[BlockView, ...]


@dataclass
class Prediction:
    """What the model predicts for a trace: per event (after it) reserved, allocated and active bytes; peaks;
    the segments at the end and at the first event that reached the peak of reserved bytes."""

    reserved: list[int] = field(repr=False)
    allocated: list[int] = field(repr=False)
    active: list[int] = field(repr=False)
    peak_reserved: int
    peak_allocated: int
    segments: tuple[SegmentView, ...] = field(repr=False)
    peak_segments: tuple[SegmentView, ...] = field(repr=False)


@dataclass
class _Block:
    offset: int
    size: int
    state: BlockState
    owner: int | None = None
    waiting: set[int] = field(default_factory=set)


@dataclass
class _Segment:
    index: int
    pool: int
    small: bool
    stream: int
    expandable: bool
    page: int
    blocks: list[_Block]
    reserved: int


def round_request(size: int) -> int:
    """The bytes the allocator hands out for a request: a multiple of 512 B, at least 512 B (0 for 0).

    Parameters
    ----------
    size : int
        The requested bytes.

    Returns
    -------
    int
        The rounded size.
    """
    return 0 if size <= 0 else max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def _round_up(size: int, unit: int) -> int:
    return -(-size // unit) * unit


class CachingAllocatorModel:
    """The allocator's books, event by event (:meth:`apply`); see the module's docstring for the rules."""

    def __init__(self, settings: AllocatorSettings | None = None) -> None:
        self.settings = settings or AllocatorSettings()
        self.segments: list[_Segment] = []
        self.live: dict[int, tuple[_Segment | None, int]] = {}  # id -> (segment, rounded size)
        self.recorded: dict[int, set[int]] = {}
        self.released_pools: set[int] = set()
        self.allocated = 0
        self._ids = itertools.count()

    @property
    def reserved(self) -> int:
        """Bytes reserved: ordinary segments' sizes plus the pages mapped in expandable ones."""
        return sum(segment.reserved for segment in self.segments)

    @property
    def active(self) -> int:
        """Bytes of blocks allocated or awaiting free (torch's active bytes; unsplit remainders included)."""
        return sum(b.size for s in self.segments for b in s.blocks if b.state in ("allocated", "awaiting_free"))

    def apply(self, event: Event) -> None:
        """Replay one event."""
        if isinstance(event, Alloc):
            self.alloc(event.id, event.size, event.stream, event.pool)
        elif isinstance(event, Free):
            self.free(event.id)
        elif isinstance(event, RecordStream):
            if event.id not in self.live:
                raise ValueError(f"allocation {event.id} is not live")
            self.recorded.setdefault(event.id, set()).add(event.stream)
        elif isinstance(event, Sync):
            self._sync({event.stream})
        elif isinstance(event, EmptyCache):
            self.empty_cache()
        elif isinstance(event, ReleasePool):
            self.released_pools.add(event.pool)
        else:
            raise TypeError(f"not an allocator event: {event!r}")

    # ------------------------------------------------------------------ allocation
    def alloc(self, ident: int, size: int, stream: int = 0, pool: int = 0) -> None:
        """Allocate ``size`` bytes as allocation ``ident`` (unique among live ones) on ``stream`` from ``pool``."""
        if ident in self.live:
            raise ValueError(f"allocation {ident} is already live")
        if pool in self.released_pools:
            raise ValueError(f"private pool {pool} was released; nothing allocates from it any more")
        rounded = round_request(size)
        if rounded == 0:
            self.live[ident] = (None, 0)
            return
        small = rounded <= SMALL_SIZE
        expandable = self.settings.expandable and pool == 0
        for retry in (False, True):
            found = self._best_fit(pool, small, stream, rounded, expandable)
            if found is None:
                found = self._expand(pool, small, stream, rounded) if expandable else self._new_segment(
                    pool, small, stream, rounded)
            if found is not None:
                break
            if retry or self.settings.capacity is None:
                raise AllocatorOutOfMemory(f"allocation {ident} of {size} B does not fit in {self.settings.capacity} B "
                                           f"with {self.reserved} B reserved")
            self.empty_cache()
        segment, index = found
        self._take(segment, index, rounded, ident)
        self.live[ident] = (segment, rounded)
        self.allocated += rounded

    def _pool_segments(self, pool: int, small: bool, stream: int) -> list[_Segment]:
        return [s for s in self.segments if s.pool == pool and s.small == small and s.stream == stream]

    def _best_fit(self, pool: int, small: bool, stream: int, size: int,
                  expandable: bool) -> tuple[_Segment, int] | None:
        """The smallest cached free block that fits (the max_split rules applied), or None."""
        candidates = sorted(((b.size, s.index, b.offset), s, i) for s in self._pool_segments(pool, small, stream)
                            for i, b in enumerate(s.blocks) if b.state == "free" and b.size >= size)
        if not candidates:
            return None
        pick = 0
        if expandable:  # among fits, walk on while the next one has less room to grow into
            def room(k: int) -> int:
                _, segment, i = candidates[k]
                after = segment.blocks[i + 1] if i + 1 < len(segment.blocks) else None
                return segment.blocks[i].size + (after.size if after is not None and after.state == "unmapped" else 0)
            while pick + 1 < len(candidates) and room(pick + 1) < room(pick):
                pick += 1
        (block_size, _, _), segment, index = candidates[pick]
        limit = self.settings.max_split_size
        if limit is not None and (size < limit <= block_size
                                  or limit <= size <= block_size - self.settings.max_non_split_rounding):
            return None
        return segment, index

    def _segment_size(self, small: bool, size: int) -> int:
        if small:
            return SMALL_SEGMENT
        return self.settings.large_segment_size if size < MIN_LARGE_ALLOC else _round_up(size, ROUND_LARGE)

    def _fits(self, extra: int) -> bool:
        return self.settings.capacity is None or self.reserved + extra <= self.settings.capacity

    def _new_segment(self, pool: int, small: bool, stream: int, size: int) -> tuple[_Segment, int] | None:
        """Reserve an ordinary segment for the request; None where it would pass the capacity."""
        total = self._segment_size(small, size)
        if not self._fits(total):
            return None
        segment = _Segment(next(self._ids), pool, small, stream, False, total, [_Block(0, total, "free")], total)
        self.segments.append(segment)
        return segment, 0

    def _take(self, segment: _Segment, index: int, size: int, ident: int) -> None:
        """Hand block ``index`` to allocation ``ident``, splitting off the remainder where the rule allows (with
        expandable segments on, the small pool's rule holds in every pool, private ones too)."""
        block = segment.blocks[index]
        remaining = block.size - size
        if segment.small or self.settings.expandable:
            split = remaining >= MIN_BLOCK
        else:
            limit = self.settings.max_split_size
            split = (limit is None or size < limit) and remaining > SMALL_SIZE
        if split:
            segment.blocks.insert(index + 1, _Block(block.offset + size, remaining, "free"))
            block.size = size
        block.state, block.owner = "allocated", ident

    # ------------------------------------------------------------------ expandable segments
    def _expandable_segment(self, pool: int, small: bool, stream: int) -> _Segment:
        for segment in self._pool_segments(pool, small, stream):
            if segment.expandable:
                return segment
        page = SMALL_SEGMENT if small else self.settings.large_segment_size
        segment = _Segment(next(self._ids), pool, small, stream, True, page, [_Block(0, _VIRTUAL, "unmapped")], 0)
        self.segments.append(segment)
        return segment

    def _expand(self, pool: int, small: bool, stream: int, size: int) -> tuple[_Segment, int] | None:
        """Map pages until a free block of ``size`` exists, from the lowest unmapped range (or the free block before
        it) that starts a long enough run of free and unmapped space; None past the capacity."""
        segment = self._expandable_segment(pool, small, stream)
        blocks = segment.blocks
        start = None  # the last unmapped range is unbounded: some run is long enough
        for u, block in enumerate(blocks):
            if block.state != "unmapped":
                continue
            first = u - 1 if u > 0 and blocks[u - 1].state == "free" else u
            room, k = 0, first
            while room < size and k < len(blocks) and blocks[k].state in ("free", "unmapped"):
                room += blocks[k].size
                k += 1
            if room >= size:
                start = first
                break
        saved, mapped_before = [_Block(b.offset, b.size, b.state, b.owner, set(b.waiting)) for b in blocks], segment.reserved
        index = start
        if blocks[index].state == "unmapped":
            index = self._map(segment, index, min(blocks[index].size, size))
        while blocks[index].size < size:
            index = self._map(segment, index + 1, min(size - blocks[index].size, blocks[index + 1].size))
        if not self._fits(0):  # past the capacity: undo the mapping
            segment.blocks, segment.reserved = saved, mapped_before
            return None
        return segment, index

    def _map(self, segment: _Segment, index: int, size: int) -> int:
        """Map the whole pages covering the first ``size`` bytes of unmapped block ``index``; merge it with its
        free neighbours; return the merged block's index."""
        block = segment.blocks[index]
        mapped = _round_up(size, segment.page)
        if mapped < block.size:
            segment.blocks.insert(index + 1, _Block(block.offset + mapped, block.size - mapped, "unmapped"))
            block.size = mapped
        block.state = "free"
        segment.reserved += mapped
        return self._merge(segment, index, "free")

    @staticmethod
    def _merge(segment: _Segment, index: int, state: BlockState) -> int:
        """Merge block ``index`` with the neighbours in ``state`` (its own); return its new index."""
        blocks = segment.blocks
        if index + 1 < len(blocks) and blocks[index + 1].state == state:
            blocks[index].size += blocks.pop(index + 1).size
        if index > 0 and blocks[index - 1].state == state:
            blocks[index - 1].size += blocks.pop(index).size
            index -= 1
        return index

    # ------------------------------------------------------------------ frees and the cache
    def free(self, ident: int) -> None:
        """Free allocation ``ident``: back to its pool, or awaiting the streams it was recorded on."""
        if ident not in self.live:
            raise ValueError(f"allocation {ident} is not live")
        segment, rounded = self.live.pop(ident)
        self.allocated -= rounded
        streams = self.recorded.pop(ident, set())
        if segment is None:
            return
        index = next(i for i, b in enumerate(segment.blocks) if b.owner == ident)
        block = segment.blocks[index]
        block.owner, block.waiting = None, streams - {segment.stream}
        block.state = "awaiting_free" if block.waiting else "free"
        if not block.waiting:
            self._merge(segment, index, "free")

    def _sync(self, streams: set[int] | None) -> None:
        """Complete the frees waiting on ``streams`` (None: on every stream)."""
        for segment in self.segments:
            for block in list(segment.blocks):
                if block.state != "awaiting_free":
                    continue
                block.waiting = set() if streams is None else block.waiting - streams
                if not block.waiting:
                    block.state = "free"
                    self._merge(segment, segment.blocks.index(block), "free")

    def empty_cache(self) -> None:
        """Complete every pending free, then release the cached segments (or unmap the free pages) that may go."""
        self._sync(None)
        for segment in self.segments:
            if segment.expandable:
                self._unmap_free(segment)
        self.segments = [s for s in self.segments if s.expandable or any(b.state != "free" for b in s.blocks)
                         or s.pool not in self.released_pools | {0}]

    def _unmap_free(self, segment: _Segment) -> None:
        """Unmap the whole pages inside each free block of an expandable segment."""
        index = 0
        while index < len(segment.blocks):
            block = segment.blocks[index]
            begin = _round_up(block.offset, segment.page)
            end = (block.offset + block.size) // segment.page * segment.page
            if block.state != "free" or end <= begin:
                index += 1
                continue
            pieces = [_Block(block.offset, begin - block.offset, "free"), _Block(begin, end - begin, "unmapped"),
                      _Block(end, block.offset + block.size - end, "free")]
            pieces = [p for p in pieces if p.size > 0]
            segment.blocks[index:index + 1] = pieces
            segment.reserved -= end - begin
            hole = index + (1 if pieces[0].state == "free" else 0)
            index = self._merge(segment, hole, "unmapped") + 1

    # ------------------------------------------------------------------ views
    def views(self) -> tuple[SegmentView, ...]:
        """The segments that reserve bytes (expandable ones with nothing mapped left out), in creation order."""
        views = []
        for s in self.segments:
            if s.reserved == 0:
                continue
            blocks = s.blocks[:-1] if s.expandable else s.blocks  # not the unbounded unmapped range at the end
            views.append(SegmentView(s.pool, "small" if s.small else "large", s.stream, s.reserved, s.expandable,
                                     tuple(BlockView(b.offset, b.size, b.state, b.owner) for b in blocks)))
        return tuple(views)


def predict_reserved(events: Iterable[Event], *, expandable: bool = False,
                     settings: AllocatorSettings | None = None) -> Prediction:
    """Replay ``events`` through the allocator model and predict its reserved bytes over time.

    Parameters
    ----------
    events : Iterable of Event
        Allocations, frees, stream records and syncs, ``empty_cache`` calls, pool releases, in order.
    expandable : bool
        Expandable segments on (``expandable_segments:True``); ignored when ``settings`` is given.
    settings : AllocatorSettings or None
        Every setting at once; None: the defaults with ``expandable``.

    Returns
    -------
    Prediction
        Reserved, allocated (rounded requests) and active (block) bytes after each event, the peaks, and the
        segment layouts at the end and at the peak of reserved bytes.

    Raises
    ------
    AllocatorOutOfMemory
        Where a request does not fit ``settings.capacity``.
    ValueError
        On a malformed trace (a free of an allocation that is not live, a duplicate id).
    """
    model = CachingAllocatorModel(settings or AllocatorSettings(expandable=expandable))
    reserved, allocated, active = [], [], []  # after each event
    peak, peak_segments = 0, ()
    for event in events:
        model.apply(event)
        reserved.append(model.reserved)
        allocated.append(model.allocated)
        active.append(model.active)
        if reserved[-1] > peak:
            peak, peak_segments = reserved[-1], model.views()
    return Prediction(reserved, allocated, active, peak, max(allocated, default=0), model.views(), peak_segments)


def schedule_events(graph: Graph, schedule: Schedule, *, page_in_stream: int = 0, workspace: bool = True,
                    include_owned: bool = True) -> list[Event]:
    """The allocations and frees a replay of a legal schedule makes, in the simulator's lifetimes.

    Each stay of a value on the device (a device interval of :func:`coop.schedule.simulate`) is one allocation
    of its instance's bytes (graph units taken as bytes), made at its first step (a compute, a page-in, or for an
    extra output the step after its op's) and freed after its last (before a free or page-out, or after its last
    read). In a step the allocations come first, then the workspace (allocated and freed), then the frees. An
    in-place compute takes over the storage it consumes; outputs and caller-owned values stay at the end; values
    of 0 bytes make no event.

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    page_in_stream : int
        The stream whose pool a page-in allocates from: 0 as coop's executor does (on the compute stream, which
        the copy stream waits for), 1 where a replay allocates it on the copy stream.
    workspace : bool
        Whether each compute's workspace is an allocation freed within its step.
    include_owned : bool
        Whether the caller-owned values (inputs, parameters, buffers) are allocated first (and their page steps
        replayed); False leaves them out.

    Returns
    -------
    list of Event
        :class:`Alloc` (``node`` set) and :class:`Free` events, all in the default pool.

    Raises
    ------
    ScheduleError
        When the schedule is illegal (from the simulator).
    """
    sim = simulate(graph, schedule)
    index = {n.id: n for n in graph.nodes}
    last = max(len(schedule.steps), 1) - 1
    final = {inst.node: k for k, inst in enumerate(sim.instances)}
    stays: list[tuple[int, int, int, int, bool]] = []  # (node, bytes, first step, last step, kept at the end)
    first_stay: dict[int, int] = {}  # instance -> index of its first stay in ``stays``
    if include_owned:
        for node_id, device in sorted(sim.owned_device.items()):
            stays += [(node_id, index[node_id].mem, first, end, end == last) for first, end in device]
    for k, inst in enumerate(sim.instances):
        first_stay[k] = len(stays)
        keep = inst.node in graph.outputs and final[inst.node] == k
        stays += [(inst.node, inst.mem, first, end, keep and end == last) for first, end in inst.device]
    carried = {first_stay[k]: first_stay[c] + len(sim.instances[c].device) - 1
               for k, c in _inplace_consumed(graph, schedule, sim).items()}  # stay -> the stay it continues
    holder = {}
    for s in range(len(stays)):  # the allocation whose storage each stay uses (in-place chains followed)
        holder[s] = holder[carried[s]] if s in carried else s
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    for s, (_, mem, first, end, keep) in enumerate(stays):
        if mem <= 0:
            continue
        if s not in carried:
            starts.setdefault(first, []).append(s)
        if not keep and s not in carried.values():
            ends.setdefault(end, []).append(s)
    events: list[Event] = []
    for j, step in enumerate(schedule.steps):
        for s in starts.get(j, []):
            node_id, mem = stays[s][0], stays[s][1]
            stream = page_in_stream if step.op == "page_in" and step.node == node_id else 0
            events.append(Alloc(s, mem, stream, node=node_id))
        if workspace and sim.workspace[j] > 0:
            events += [Alloc(len(stays) + j, sim.workspace[j]), Free(len(stays) + j)]
        events += [Free(holder[s]) for s in ends.get(j, [])]
    return events


def _inplace_consumed(graph: Graph, schedule: Schedule, sim: Simulation) -> dict[int, int]:
    """For each instance an in-place compute made, the instance whose storage it took over."""
    index = {n.id: n for n in graph.nodes}
    consumed: dict[int, int] = {}
    for k, inst in enumerate(sim.instances):
        step = schedule.steps[inst.computed_at]
        impl = index[inst.node].implementation(step.impl) if step.impl else None
        if impl is None or impl.inplace_of is None:
            continue
        j = inst.computed_at
        consumed[k] = max(c for c, other in enumerate(sim.instances)
                          if other.node == impl.inplace_of and other.computed_at < j and other.end == j - 1)
    return consumed


__all__ = ["Alloc", "AllocatorOutOfMemory", "AllocatorSettings", "BlockView", "CachingAllocatorModel", "EmptyCache",
           "Event", "Free", "Prediction", "RecordStream", "ReleasePool", "SegmentView", "Sync", "predict_reserved",
           "round_request", "schedule_events"]
