"""A schedule's predicted memory timeline as a PyTorch memory snapshot, for memory_viz.

PyTorch records its allocator's history (``torch.cuda.memory._record_memory_history`` and
``torch.cuda.memory._snapshot``) as a pickled dict that https://pytorch.org/memory_viz and
``torch.cuda._memory_viz`` read: ``segments``, the memory the allocator holds at the end, block by block
(``{"device", "address", "total_size", "stream", "blocks": [{"address", "size", "requested_size", "state",
"frames"}], ...}``), and ``device_traces``, per device the allocation events in order (``{"action": "alloc" |
"free_requested" | "free_completed", "addr", "size", "stream", "frames"}``, each frame
``{"filename", "line", "name"}``).

:func:`memory_viz_snapshot` writes the step a schedule *predicts* in that format, from the one simulator
(:func:`coop.schedule.simulate`: every value's device intervals, the caller-owned values', each step's
workspace) with addresses from the best-fit placement of those blocks
(:func:`coop.runtime.placement.best_fit_placement`, one address space per device). Each block is
allocated at the first step it counts and freed after the last; within a step allocations come before frees,
so the bytes live after a step's allocations are the simulator's ``memory`` at that step and the most bytes
live over a device's trace are its peak (the plan's predicted peak on a one-device step). Values resident at
the end (caller-owned values, the step's outputs) are never freed: they are the ``active_allocated`` blocks of
the segments. Frames name the step (``filename``: ``"step"``, ``line``: the step's index) and the op that
allocates or frees the value, then the value itself (``filename``: the graph's name, ``line``: its node id).
No ``category`` is written: memory_viz's page fails on categories without an ``"unknown"`` one.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from coop.graph import Graph, Node, device_order
from coop.runtime.placement import Lifetime, best_fit_placement
from coop.schedule import Schedule, Simulation, Step

#: Where each device's address space starts in the snapshot (memory_viz prints addresses in hex): device i at
#: ``(i + 1) * DEVICE_ADDRESS_STRIDE``, far apart so that no two devices' addresses meet.
DEVICE_ADDRESS_STRIDE = 1 << 40


def memory_viz_snapshot(graph: Graph, schedule: Schedule, simulation: Simulation | None = None) -> dict[str, Any]:
    """The predicted step of ``schedule`` as a PyTorch memory snapshot (``segments`` and ``device_traces``).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs (a plan's ``graph``: random draws recomputable).
    simulation : Simulation or None
        ``simulate(graph, schedule)`` where the caller holds it (a plan's ``simulation``); computed when None.

    Returns
    -------
    dict of str to Any
        ``{"segments": [...], "device_traces": [[...], ...]}``: one segment and one trace per device with
        bytes, accelerators first by name (``cuda:0`` is device 0, as in PyTorch's snapshots), then the CPU (an
        imported graph's one device, or a CPU-only step's, is device 0).

    Raises
    ------
    ScheduleError
        When the schedule is illegal and ``simulation`` is None.
    """
    placement = best_fit_placement(graph, schedule, simulation=simulation)
    devices = sorted(placement.devices, key=lambda device: (device in (None, "cpu"), device_order(device)))
    index = {device: position for position, device in enumerate(devices)}
    last_step = len(schedule.steps) - 1
    traces: list[list[tuple[int, int, int, int, dict[str, Any]]]] = [[] for _ in devices]
    resident: list[list[tuple[int, Lifetime]]] = [[] for _ in devices]
    for k, (block, offset) in enumerate(zip(placement.lifetimes, placement.offsets, strict=True)):
        device = index[block.device]
        address = (device + 1) * DEVICE_ADDRESS_STRIDE + offset
        alloc = _event("alloc", address, block.size, _frames(graph, schedule, block, block.start, freed=False))
        traces[device].append((block.start, 0, k, 0, alloc))
        if _resident_at_end(graph, block, last_step):
            resident[device].append((offset, block))
            continue
        frames = _frames(graph, schedule, block, block.end, freed=True)
        traces[device].append((block.end, 1, k, 0, _event("free_requested", address, block.size, frames)))
        traces[device].append((block.end, 1, k, 1, _event("free_completed", address, block.size, frames)))
    arena_peaks = placement.arena_peaks
    segments = [_segment(device_index, (device_index + 1) * DEVICE_ADDRESS_STRIDE, arena_peaks[device],
                         resident[device_index], graph, schedule)
                for device_index, device in enumerate(devices)]
    device_traces = [[entry for *_, entry in sorted(trace, key=lambda item: item[:4])] for trace in traces]
    return {"segments": segments, "device_traces": device_traces}


def write_memory_viz(path: str | Path, graph: Graph, schedule: Schedule,
                     simulation: Simulation | None = None) -> dict[str, Any]:
    """Pickle :func:`memory_viz_snapshot` to ``path``: drag the file onto https://pytorch.org/memory_viz.

    Parameters
    ----------
    path : str or Path
        The file to write (``.pickle``, as ``torch.cuda.memory._dump_snapshot`` writes).
    graph : Graph
        The graph the schedule runs.
    simulation : Simulation or None
        As for :func:`memory_viz_snapshot`.

    Returns
    -------
    dict of str to Any
        The snapshot written.
    """
    snapshot = memory_viz_snapshot(graph, schedule, simulation)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as file:
        pickle.dump(snapshot, file)
    return snapshot


def _event(action: str, address: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": address, "size": size, "stream": 0, "frames": frames}


def _resident_at_end(graph: Graph, block: Lifetime, last_step: int) -> bool:
    """Caller-owned values and outputs still on the device after the last step (workspaces never are)."""
    node = graph.node(block.node)
    workspace = block.instance < 0 and not node.caller_owned
    return not workspace and block.end >= last_step and (node.caller_owned or block.node in graph.outputs)


def _frames(graph: Graph, schedule: Schedule, block: Lifetime, step: int, *, freed: bool) -> list[dict[str, Any]]:
    """What allocates (``freed`` False, at the block's first step) or frees (after its last) the block."""
    node = graph.node(block.node)
    what = _freed_by(graph, schedule, block, step) if freed else _allocated_by(graph, schedule, block, step)
    value = "workspace" if block.instance < 0 and not node.caller_owned else f"{node.kind} value"
    return [{"filename": "step", "line": step, "name": what},
            {"filename": graph.name, "line": node.id, "name": f"{value} {node.name}"}]


def _allocated_by(graph: Graph, schedule: Schedule, block: Lifetime, step: int) -> str:
    node = graph.node(block.node)
    at = schedule.steps[step] if 0 <= step < len(schedule.steps) else None
    if node.caller_owned and (at is None or at.node != node.id):
        return f"caller-owned {node.kind} {node.name} (resident before the step)"
    if block.instance < 0 and not node.caller_owned:
        return f"workspace of {_describe(graph, at)}" if at is not None else "workspace"
    if at is not None and at.node == node.id:
        return _describe(graph, at)
    if node.output_of is not None:  # an extra output counts from the step after its op's
        producer = graph.node(node.output_of)
        return f"{_describe(graph, Step(op='compute', node=producer.id))}, extra output {node.name}"
    return f"{node.name} at {_describe(graph, at)}" if at is not None else node.name


def _freed_by(graph: Graph, schedule: Schedule, block: Lifetime, step: int) -> str:
    node = graph.node(block.node)
    steps = schedule.steps
    at = steps[step] if 0 <= step < len(steps) else None
    if block.instance < 0 and not node.caller_owned:
        return f"end of {_describe(graph, at)}" if at is not None else "end of its step"
    after = steps[step + 1] if step + 1 < len(steps) else None
    if after is not None and after.node == node.id and after.op in ("free", "page_out"):
        return _describe(graph, after)
    return f"after {_describe(graph, at)}: last use of {node.name}" if at is not None else f"end of {node.name}"


def _describe(graph: Graph, step: Step) -> str:
    node: Node = graph.node(step.node)
    if step.op != "compute":
        return f"{step.op} {node.name}"
    op = f" ({node.op})" if node.op and node.op != node.name else ""
    impl = f" [{step.impl}]" if step.impl is not None else ""
    return f"compute {node.name}{op}{impl}"


def _segment(device: int, address: int, total_size: int, resident: list[tuple[int, Lifetime]], graph: Graph,
             schedule: Schedule) -> dict[str, Any]:
    """The device's address space at the end: its resident blocks at their offsets, inactive gaps between."""
    blocks: list[dict[str, Any]] = []
    cursor = 0
    for offset, block in sorted(resident, key=lambda item: item[0]):
        if offset > cursor:
            blocks.append({"address": address + cursor, "size": offset - cursor, "requested_size": 0,
                           "state": "inactive", "frames": []})
        blocks.append({"address": address + offset, "size": block.size, "requested_size": block.size,
                       "state": "active_allocated",
                       "frames": _frames(graph, schedule, block, block.start, freed=False)})
        cursor = offset + block.size
    if total_size > cursor:
        blocks.append({"address": address + cursor, "size": total_size - cursor, "requested_size": 0,
                       "state": "inactive", "frames": []})
    allocated = sum(block.size for _, block in resident)
    return {"device": device, "address": address, "total_size": total_size, "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}


__all__ = ["DEVICE_ADDRESS_STRIDE", "memory_viz_snapshot", "write_memory_viz"]
