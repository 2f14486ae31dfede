"""Addresses for static plans: place every instance of a legal schedule in one address space.

The simulator (:func:`coop.schedule.simulate`) counts *live bytes*; a real allocator must also
find a contiguous range for each value, so the highest address it touches (``arena_peak``) can
exceed the live peak by the fragmentation the order of frees leaves behind. This is the
dynamic-storage-allocation view of Coop (Zhang et al., NeurIPS 2023, "Coop: Memory is not a
Commodity") applied to a static schedule, where every lifetime is known in advance:

* :func:`best_fit_placement` replays the schedule's lifetimes (the simulator's ``instances``)
  in schedule order over the :class:`~coop.online.arena.Arena` model: best fit, lowest address
  on ties, free neighbours merged; caller-owned values take the lowest addresses first.
* :func:`exact_placement` solves the offset assignment exactly with CP-SAT for small schedules:
  each instance is a rectangle (lifetime x address range), ``AddNoOverlap2D`` keeps rectangles
  apart, and the objective minimises the highest address (a 2-D strip packing with fixed
  x-coordinates). It starts from the best-fit placement as hint and upper bound, so it is never
  worse than best fit; the live peak is its lower bound.

Paged values (POET) occupy the device only between page steps; each device residency is its own
block and may come back at another address. Workspaces are blocks live at their own step only.

**One address space per device.** A captured step's values carry their device (``Node.device``:
``"cuda:0"``, ``"cpu"``; None for an imported graph's one device), and a CUDA step also holds host
values (0-d CPU scalars, the RNG seeds an attention kernel returns). Every block is placed in its own
device's address space: two blocks on different devices never compete for an address, each device's
``arena_peaks`` entry is the highest address used there, and ``arena_peak`` is their sum (the bytes of
all arenas together). A workspace lives on its op's device.

**The execution placement** (:func:`execution_placement`, what :mod:`coop.runtime.arena_replay` runs)
places only what the arena holds: the instances a schedule computes and the workspaces. Caller-owned
values (parameters, buffers, the batch) live in the caller's own storages, outside any arena, so they
take no address there (``caller_owned=False``); their bytes are counted once, by whoever adds up the
step's footprint (:func:`coop.planner.plan.plan` with ``arena=True``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from coop.errors import CoopError
from coop.graph import Graph, device_order
from coop.online.arena import Arena
from coop.schedule import Schedule, Simulation, simulate

#: CP-SAT placement is attempted only up to this many blocks unless the caller asks for more.
EXACT_MAX_BLOCKS = 60

PlacementStatus = Literal["heuristic", "optimal", "feasible"]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One block to place: ``size`` bytes resident on the device over steps ``start..end`` inclusive."""

    label: str
    node: int
    start: int
    end: int
    size: int
    instance: int = -1  # index into the simulation's instances (-1: a caller-owned value or a workspace)
    device: str | None = None  # the address space it is placed in (Node.device; None: an imported graph's one)

    def overlaps(self, other: Lifetime) -> bool:
        """Whether the two blocks share a step and an address space (the same device)."""
        return self.device == other.device and self.start <= other.end and other.start <= self.end


@dataclass
class Placement:
    """Offsets of every block, each in its device's address space; ``arena_peak`` is the sum over devices of
    the highest address used there (fragmentation included), ``live_peak`` the same sum of each device's
    most bytes live at one step (no placement of these blocks is lower)."""

    method: str
    status: PlacementStatus
    lifetimes: list[Lifetime]
    offsets: list[int]
    arena_peak: int
    live_peak: int
    wall_s: float = 0.0
    bound: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def fragmentation(self) -> float:
        """Address space lost to fragmentation: (arena_peak - live_peak) / arena_peak."""
        return (self.arena_peak - self.live_peak) / self.arena_peak if self.arena_peak else 0.0

    @property
    def arena_peaks(self) -> dict[str | None, int]:
        """Per device, the highest address its blocks reach (the size of that device's arena)."""
        return _device_peaks(self.lifetimes, self.offsets)

    @property
    def devices(self) -> list[str | None]:
        """The devices with blocks, sorted (None: an imported graph's one device)."""
        return sorted({b.device for b in self.lifetimes}, key=device_order)

    def check(self) -> None:
        """Raise CoopError when two blocks alive at a common step share an address on one device."""
        order = sorted(range(len(self.lifetimes)), key=lambda k: self.lifetimes[k].start)
        active: list[int] = []
        for k in order:
            block = self.lifetimes[k]
            active = [a for a in active if self.lifetimes[a].end >= block.start]
            for a in active:
                if self.lifetimes[a].device != block.device:
                    continue  # another device's address space
                low, high = self.offsets[a], self.offsets[a] + self.lifetimes[a].size
                if self.offsets[k] < high and low < self.offsets[k] + block.size:
                    raise CoopError(f"placement overlap on {block.device or 'the device'}: {self.lifetimes[a].label} "
                                    f"and {block.label}")
            active.append(k)

    def to_dict(self) -> dict[str, object]:
        return {
            "method": self.method,
            "status": self.status,
            "blocks": len(self.lifetimes),
            "arena_peak": self.arena_peak,
            "live_peak": self.live_peak,
            "arena_peaks": {str(device): peak for device, peak in self.arena_peaks.items()},
            "fragmentation": self.fragmentation,
            "wall_s": self.wall_s,
            "bound": self.bound,
        }


def schedule_lifetimes(graph: Graph, schedule: Schedule, *, alignment: int = 1, extras_from_op: bool = False,
                       caller_owned: bool = True, simulation: Simulation | None = None) -> tuple[list[Lifetime], int]:
    """The device blocks of a legal schedule and its live peak (the simulator's, unchanged).

    The blocks are what :func:`coop.schedule.simulate` counts: each caller-owned value's and each
    instance's device intervals (one block per stay on the device) and each step's workspace, each
    on its value's device (``Node.device``; a workspace on its op's).

    For execution in an arena (:mod:`coop.runtime.arena_replay`) two options make the blocks
    addressable by real kernels without changing the bytes live at any step (``alignment`` and
    ``extras_from_op`` below).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    alignment : int
        Round every block up to a multiple of it (so every offset is one: a view of any dtype can
        start there, and vectorized kernels see aligned pointers); 1: no rounding.
    extras_from_op : bool
        Start each extra output's block (``Node.output_of``) at its op's step, where the simulator
        counts it inside the op's workspace, and take it out of that workspace: the op then writes
        the extra output once, at the address it keeps for its whole life.
    caller_owned : bool
        False leaves the caller-owned values out (they live outside an arena:
        :func:`execution_placement`).
    simulation : Simulation or None
        ``simulate(graph, schedule)`` where the caller already holds it (an executor's); computed
        when None.

    Returns
    -------
    tuple of (list of Lifetime, int)
        The blocks of positive size, and the simulated peak in graph units.

    Raises
    ------
    ScheduleError
        When the schedule is illegal and ``simulation`` is None (from :func:`coop.schedule.simulate`).
    """
    sim = simulation if simulation is not None else simulate(graph, schedule)
    lifetimes: list[Lifetime] = []
    for owned, intervals in sim.owned_device.items() if caller_owned else ():
        lifetimes.extend(_blocks(f"owned %{owned}", owned, intervals, graph.node(owned).mem))
    workspace = list(sim.workspace)
    for k, instance in enumerate(sim.instances):
        device = instance.device
        if extras_from_op and device and graph.node(instance.node).output_of is not None:
            op_step = instance.start - 1  # the simulator counts an extra output from the step after its op's
            first, last = device[0]
            if first == instance.start and op_step >= 0:
                device = ((op_step, last), *device[1:])
                workspace[op_step] = max(0, workspace[op_step] - instance.mem)
        lifetimes.extend(_blocks(f"%{instance.node}#{k}", instance.node, device, instance.mem, k))
    for j, size in enumerate(workspace):
        if size:
            node = schedule.steps[j].node
            lifetimes.append(Lifetime(f"workspace %{node}@{j}", node, j, j, size))
    lifetimes = [replace(b, device=graph.node(b.node).device,
                         size=-(-b.size // alignment) * alignment if alignment > 1 else b.size) for b in lifetimes]
    return [b for b in lifetimes if b.size > 0], sim.peak


def best_fit_placement(graph: Graph, schedule: Schedule, *, alignment: int = 1, extras_from_op: bool = False,
                       caller_owned: bool = True, simulation: Simulation | None = None) -> Placement:
    """Place every block in schedule order with best fit over the Arena model (lowest address on ties).

    Each device's blocks go in that device's address space.

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    alignment : int
        As in :func:`schedule_lifetimes`.
    extras_from_op : bool
        As in :func:`schedule_lifetimes`.
    caller_owned : bool
        As in :func:`schedule_lifetimes`.
    simulation : Simulation or None
        As in :func:`schedule_lifetimes`.

    Returns
    -------
    Placement
        The "best-fit" heuristic placement: the blocks, their offsets, the summed arena peaks and
        the live peak (its bound); ``alignment``, ``extras_from_op`` and ``caller_owned`` are
        recorded in ``extra`` so that an executor can refuse a placement made without them.
    """
    started = time.perf_counter()
    lifetimes, _ = schedule_lifetimes(graph, schedule, alignment=alignment, extras_from_op=extras_from_op,
                                      caller_owned=caller_owned, simulation=simulation)
    offsets = _per_device(lifetimes, _best_fit)
    live_peak = _live_peak(lifetimes)
    return Placement("best-fit", "heuristic", lifetimes, offsets, sum(_device_peaks(lifetimes, offsets).values()),
                     live_peak, time.perf_counter() - started, bound=live_peak,
                     extra={"alignment": alignment, "extras_from_op": extras_from_op, "caller_owned": caller_owned})


def packed_placement(graph: Graph, schedule: Schedule, *, alignment: int = 1, extras_from_op: bool = False,
                     caller_owned: bool = True, simulation: Simulation | None = None) -> Placement:
    """The lower of two placements of the same blocks, per device.

    Best fit in schedule order (an online allocator's view) and greedy by size (the offline view:
    every lifetime is known before the step, so the largest blocks are placed first, each at the
    lowest-waste gap among the blocks it overlaps in time).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    alignment : int
        As in :func:`schedule_lifetimes`.
    extras_from_op : bool
        As in :func:`schedule_lifetimes`.
    caller_owned : bool
        As in :func:`schedule_lifetimes`.
    simulation : Simulation or None
        As in :func:`schedule_lifetimes`.

    Returns
    -------
    Placement
        The best-fit placement (:func:`best_fit_placement`) when it meets the live peak or greedy by
        size is no lower; else the "greedy-by-size" placement, with best fit's ``extra``.

    References
    ----------
    Pisarchyk and Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020 (greedy by size).
    """
    online = best_fit_placement(graph, schedule, alignment=alignment, extras_from_op=extras_from_op,
                                caller_owned=caller_owned, simulation=simulation)
    if online.arena_peak == online.live_peak:
        return online  # already at the lower bound
    started = time.perf_counter()
    offsets = _per_device(online.lifetimes, _greedy_by_size)
    arena_peak = sum(_device_peaks(online.lifetimes, offsets).values())
    if arena_peak >= online.arena_peak:
        return online
    return Placement("greedy-by-size", "heuristic", online.lifetimes, offsets, arena_peak, online.live_peak,
                     online.wall_s + time.perf_counter() - started, bound=online.live_peak, extra=dict(online.extra))


#: Byte alignment of every block placed for execution: a multiple of every dtype's size and of a
#: cache line, so views of any dtype start on aligned addresses (:func:`execution_placement`).
ARENA_ALIGNMENT = 64


def execution_placement(graph: Graph, schedule: Schedule, alignment: int = ARENA_ALIGNMENT, *,
                        simulation: Simulation | None = None) -> Placement:
    """The placement an arena replay executes (:func:`packed_placement`): aligned blocks, extra outputs placed
    from their op's step, each device's values in its own arena, caller-owned values in none (they stay in the
    caller's storages: ``arena_peaks`` are the arenas' sizes and nothing else).

    Parameters
    ----------
    graph : Graph
        The Graph ``schedule`` is legal on.
    schedule : Schedule
        The schedule the arena replay runs (an executor's ``schedule``: extra outputs taken at their op's step).
    alignment : int
        Bytes every block is rounded up to (every offset is a multiple of it).
    simulation : Simulation or None
        ``simulate(graph, schedule)`` where the caller already holds it (``executor.simulation``); computed when
        absent.

    Returns
    -------
    Placement
        Each block's offset in its device's arena.
    """
    return packed_placement(graph, schedule, alignment=alignment, extras_from_op=True, caller_owned=False,
                            simulation=simulation)


def exact_placement(
    graph: Graph,
    schedule: Schedule,
    *,
    time_limit: float = 10.0,
    max_blocks: int = EXACT_MAX_BLOCKS,
    threads: int = 2,
) -> Placement:
    """The least arenas for this schedule by CP-SAT (NoOverlap2D over lifetime x address, one per device).

    Never worse than :func:`best_fit_placement`: its placement is the hint and each device's arena peak
    the upper bound of that device's; the objective is the sum of the devices' arena peaks.

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    time_limit : float
        CP-SAT's time limit in seconds (at least 0.01).
    max_blocks : int
        The most blocks this solves; more raise.
    threads : int
        CP-SAT's workers (at least 1).

    Returns
    -------
    Placement
        The "exact" placement: "optimal" when proven (best fit meeting the live peak is), else
        "feasible"; when CP-SAT finds nothing better in ``time_limit`` the best fit's offsets are
        returned. Its bound is the solver's, at least the live peak.

    Raises
    ------
    CoopError
        When the schedule has more than ``max_blocks`` blocks (use best fit).
    """
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    greedy = best_fit_placement(graph, schedule)
    lifetimes = greedy.lifetimes
    if len(lifetimes) > max_blocks:
        raise CoopError(
            f"exact placement of {len(lifetimes)} blocks exceeds max_blocks={max_blocks}: use best_fit_placement "
            "or raise max_blocks"
        )
    if greedy.arena_peak == greedy.live_peak or not lifetimes:
        # Best fit already meets the lower bound: it is optimal.
        return Placement("exact", "optimal", lifetimes, greedy.offsets, greedy.arena_peak, greedy.live_peak,
                         time.perf_counter() - started, bound=greedy.live_peak)
    model = cp_model.CpModel()
    greedy_peaks = greedy.arena_peaks
    live_peaks = _live_peaks(lifetimes)
    tops = {device: model.NewIntVar(live_peaks[device], peak, f"arena_peak_{device}")
            for device, peak in greedy_peaks.items()}
    offsets = []
    by_device: dict[str | None, tuple[list, list]] = {device: ([], []) for device in tops}
    for k, block in enumerate(lifetimes):
        upper = greedy_peaks[block.device]
        offset = model.NewIntVar(0, upper - block.size, f"offset_{k}")
        model.AddHint(offset, greedy.offsets[k])
        model.Add(offset + block.size <= tops[block.device])
        offsets.append(offset)
        x_intervals, y_intervals = by_device[block.device]
        # x: the lifetime (fixed), half-open [start, end + 1); y: the address range (variable).
        x_intervals.append(model.NewFixedSizeIntervalVar(block.start, block.end - block.start + 1, f"life_{k}"))
        y_intervals.append(model.NewFixedSizeIntervalVar(offset, block.size, f"addr_{k}"))
    for x_intervals, y_intervals in by_device.values():
        model.AddNoOverlap2D(x_intervals, y_intervals)
    for device, top in tops.items():
        model.AddHint(top, greedy_peaks[device])
    model.Minimize(sum(tops.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = max(1, threads)
    status = solver.Solve(model)
    wall_s = time.perf_counter() - started
    solved = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if not solved or solver.ObjectiveValue() >= greedy.arena_peak:
        proven = status == cp_model.OPTIMAL
        bound = int(solver.BestObjectiveBound()) if solved else greedy.live_peak
        return Placement("exact", "optimal" if proven else "feasible", lifetimes, greedy.offsets, greedy.arena_peak,
                         greedy.live_peak, wall_s, bound=max(bound, greedy.live_peak))
    values = [solver.Value(o) for o in offsets]
    arena_peak = sum(_device_peaks(lifetimes, values).values())
    return Placement("exact", "optimal" if status == cp_model.OPTIMAL else "feasible", lifetimes, values, arena_peak,
                     greedy.live_peak, wall_s, bound=max(int(solver.BestObjectiveBound()), greedy.live_peak))


def place(graph: Graph, schedule: Schedule, *, exact: bool | None = None, time_limit: float = 10.0) -> Placement:
    """Best fit, improved by the exact packing when ``exact`` (default: when the schedule is small).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    exact : bool or None
        True: always run :func:`exact_placement`; False: never; None: when there are at most
        ``EXACT_MAX_BLOCKS`` blocks.
    time_limit : float
        The exact packing's time limit in seconds.

    Returns
    -------
    Placement
        :func:`best_fit_placement`'s, or :func:`exact_placement`'s.
    """
    greedy = best_fit_placement(graph, schedule)
    if exact is False or (exact is None and len(greedy.lifetimes) > EXACT_MAX_BLOCKS):
        return greedy
    return exact_placement(graph, schedule, time_limit=time_limit, max_blocks=max(EXACT_MAX_BLOCKS, len(greedy.lifetimes)))


# -------------------------------------------------------------------- internals
def _per_device(lifetimes: list[Lifetime], place_blocks: Callable[[list[Lifetime]], list[int]]) -> list[int]:
    """Offsets of every block, each device's blocks placed by ``place_blocks`` in their own address space."""
    groups: dict[str | None, list[int]] = {}
    for k, block in enumerate(lifetimes):
        groups.setdefault(block.device, []).append(k)
    offsets = [0] * len(lifetimes)
    for members in groups.values():
        for k, offset in zip(members, place_blocks([lifetimes[k] for k in members]), strict=True):
            offsets[k] = offset
    return offsets


def _device_peaks(lifetimes: list[Lifetime], offsets: list[int]) -> dict[str | None, int]:
    """Per device, the highest address its blocks reach."""
    peaks: dict[str | None, int] = {}
    for block, offset in zip(lifetimes, offsets, strict=True):
        peaks[block.device] = max(peaks.get(block.device, 0), offset + block.size)
    return dict(sorted(peaks.items(), key=lambda item: device_order(item[0])))


def _live_peaks(lifetimes: list[Lifetime]) -> dict[str | None, int]:
    """Per device, the most bytes of its blocks alive at one step (a lower bound of its arena)."""
    changes: dict[str | None, dict[int, int]] = {}
    for block in lifetimes:
        delta = changes.setdefault(block.device, {})
        delta[block.start] = delta.get(block.start, 0) + block.size
        delta[block.end + 1] = delta.get(block.end + 1, 0) - block.size
    peaks: dict[str | None, int] = {}
    for device, delta in changes.items():
        live = peak = 0
        for step in sorted(delta):
            live += delta[step]
            peak = max(peak, live)
        peaks[device] = peak
    return peaks


def _live_peak(lifetimes: list[Lifetime]) -> int:
    """The sum over devices of their live peaks: no placement of these blocks has a lower ``arena_peak``."""
    return sum(_live_peaks(lifetimes).values())


def _best_fit(lifetimes: list[Lifetime]) -> list[int]:
    # An unbounded address space, modelled by an arena twice the size of every block together: its
    # untouched top is one free block larger than any hole, so best fit reuses the tightest hole
    # that fits and extends the high-water mark only when none does.
    arena = Arena(2 * sum(b.size for b in lifetimes) + 1)
    by_start: dict[int, list[int]] = {}
    by_end: dict[int, list[int]] = {}
    for k, block in enumerate(lifetimes):
        by_start.setdefault(block.start, []).append(k)
        by_end.setdefault(block.end, []).append(k)
    offsets = [0] * len(lifetimes)
    for step in sorted(set(by_start) | set(by_end)):
        for k in by_start.get(step, []):  # allocations first: a block ending here is still live here
            start = arena.allocate(lifetimes[k].size, k)
            assert start is not None  # the arena holds every block at once
            offsets[k] = start
        for k in by_end.get(step, []):
            arena.free(k)
    return offsets


def _greedy_by_size(lifetimes: list[Lifetime]) -> list[int]:
    """Offsets by greedy by size: largest block first (earlier start on ties), each at the smallest gap
    that holds it among the blocks already placed that share a step with it, else on top of them."""
    starts = np.array([b.start for b in lifetimes], dtype=np.int64)
    ends = np.array([b.end for b in lifetimes], dtype=np.int64)
    sizes = np.array([b.size for b in lifetimes], dtype=np.int64)
    offsets = np.zeros(len(lifetimes), dtype=np.int64)
    placed = np.zeros(len(lifetimes), dtype=bool)
    for k in sorted(range(len(lifetimes)), key=lambda i: (-lifetimes[i].size, lifetimes[i].start, i)):
        conflicts = np.flatnonzero(placed & (starts <= ends[k]) & (ends >= starts[k]))
        best, best_gap, top = None, None, 0
        for j in conflicts[np.argsort(offsets[conflicts], kind="stable")]:
            gap = int(offsets[j]) - top
            if gap >= sizes[k] and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, int(offsets[j] + sizes[j]))
        offsets[k] = top if best is None else best
        placed[k] = True
    return [int(o) for o in offsets]


def _blocks(label: str, node: int, intervals: tuple[tuple[int, int], ...], size: int,
            instance: int = -1) -> list[Lifetime]:
    """One block per device interval; a value paged out and back gets a suffix per stay."""
    suffix = len(intervals) > 1
    return [Lifetime(f"{label}.{i}" if suffix else label, node, first, last, size, instance)
            for i, (first, last) in enumerate(intervals)]


#: How often a solve aimed at an arena lowers its live-bytes budget by the fragmentation it found.
ARENA_ROUNDS = 4
#: The same for a plan that executes in its arenas (``coop.plan(..., arena=True)``): its footprint adds what a
#: step allocates beside the arenas (measured per round), which moves as the schedule recomputes more.
EXECUTION_ROUNDS = 6


def next_live_budget(live_budget: int, live_peak: int, arena_peak: int, arena_budget: int) -> int:
    """The live-bytes budget to solve at next when a schedule's best-fit arena peak exceeds the arena.

    Aims the live peak below what this schedule's fragmentation ratio allows, and strictly lower
    than this round's budget (by at least the overflow), so rounds never repeat a solve.

    Parameters
    ----------
    live_budget : int
        This round's live-bytes budget.
    live_peak : int
        The schedule's live peak.
    arena_peak : int
        Its best-fit arena peak, above ``arena_budget``.
    arena_budget : int
        The arena's size.

    Returns
    -------
    int
        ``min(live_budget - (arena_peak - arena_budget), live_peak * arena_budget // arena_peak)``.
    """
    return min(live_budget - (arena_peak - arena_budget), live_peak * arena_budget // arena_peak)


__all__ = [
    "ARENA_ALIGNMENT",
    "ARENA_ROUNDS",
    "EXECUTION_ROUNDS",
    "Lifetime",
    "Placement",
    "best_fit_placement",
    "exact_placement",
    "execution_placement",
    "next_live_budget",
    "packed_placement",
    "place",
    "schedule_lifetimes",
]
