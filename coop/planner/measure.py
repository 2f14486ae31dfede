"""What a planned step holds, measured by running it once on the example batch: the rounds' measurements.

:func:`measure_ordinary_step` reads the ordinary replay (the CPU allocator's reports, or what the CUDA caching
allocator reserves); :func:`measure_arena_step` places a schedule in arenas and measures what the arena replay
allocates beside them. Each returns the bytes (None where they cannot be measured) and a note that itemises them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from coop.budget import format_memory
from coop.graph import Graph
from coop.graph_capture.meta import weightless
from coop.runtime.allocator import AllocatorAssumption
from coop.runtime.arena_replay import measure_outside
from coop.runtime.meter import cpu_allocation_peak
from coop.runtime.placement import execution_placement
from coop.runtime.reserved import cuda_counters, modelled_step_reserved, reserved_step_peak

#: (footprint in bytes or None when it cannot be measured, what it consists of)
Measured = tuple[int | None, str]

#: The example batch's flat inputs of the step, made anew for each measured run.
FlatInputs = Callable[[], list[torch.Tensor]]


def measure_ordinary_step(candidate: Any, live_budget: int, *, flat: FlatInputs,
                          allocator: AllocatorAssumption | None = None) -> Measured:
    """Run one step of a plan's ordinary replay on the example batch and count every byte it holds at its peak.

    On a CPU step: the CPU allocator's own reports (:func:`coop.runtime.meter.cpu_allocation_peak`: kernels'
    internal scratch such as oneDNN's convolution reorders included) above the caller-owned values. On a step with
    values on one CUDA device: what the caching allocator reserves for a warm step
    (:func:`coop.runtime.reserved.reserved_step_peak`, the measure of the GPU acceptance command) plus the
    caller-owned values. A meta-device model planned for CUDA runs nothing: the note gives the allocator model's
    prediction (:func:`modelled_ordinary_step`, on which the rounds already acted). Not measured (None, the note says
    why): a model on the meta device, an FSDP-sharded step,
    another accelerator, a schedule that pages (on a CPU-only step its host copies are CPU allocations too, so the
    CPU allocator's sum would count the host tier as held), and a step run while another profiler is recording.
    The plan's ``step_footprint`` is set where it is measured.

    Parameters
    ----------
    candidate : Plan
        The plan whose replay runs.
    live_budget : int
        The live-bytes budget it was solved within (for the note).
    flat : callable
        Makes the step's flat inputs.
    allocator : AllocatorAssumption or None
        What the plan assumed of the CUDA allocator (:func:`coop.runtime.allocator.prepare_allocator`).

    Returns
    -------
    tuple of (int or None, str)
        The bytes held, and a note itemising them.
    """
    graph = candidate.graph
    size = functools.partial(format_memory, graph=graph)
    solved = f"solved within a live-bytes budget of {size(live_budget)}"
    if weightless(candidate.model):
        modelled = modelled_ordinary_step(candidate, allocator)
        if modelled is not None:  # nothing runs: the CUDA caching allocator's model says what the step would reserve
            owned = graph.caller_owned_bytes
            return None, (f"held bytes not measured: the model is on the meta device; the CUDA allocator model "
                          f"predicts {size(modelled)} reserved = caller-owned {size(owned)} + "
                          f"{size(modelled - owned)} for the step; {solved}")
        return None, f"held bytes not measured: the model is on the meta device (no weights); {solved}"
    if candidate.captured.sharding is not None:
        return None, (f"held bytes not measured: a step of an FSDP-sharded model runs collectives and hands its "
                      f"gradients to FSDP; {solved}")
    if graph.has_accelerator:
        counters = cuda_counters(graph.devices)
        if counters is None:
            return None, f"held bytes not measured: the step runs on an accelerator other than one CUDA device; {solved}"
        index = counters.device.index if counters.device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index]):  # the measured steps draw from a copy of the generators
            reserved = reserved_step_peak(lambda: candidate.replay.run_flat(flat()), counters)
        owned = graph.caller_owned_bytes
        candidate.step_footprint = owned + reserved
        pool = " (its CUDA graph's private pool included)" if candidate.graph_replay is not None else ""
        return owned + reserved, (f"held {size(owned + reserved)} = caller-owned {size(owned)} + what the CUDA "
                                  f"allocator reserved for the step{pool} {size(reserved)} (a warm step on the example "
                                  f"batch; predicted live {size(candidate.predicted_peak)}), {solved}")
    if any(step.op == "page_out" for step in candidate.schedule.steps):
        return None, ("held bytes not measured: the schedule pages, and on a CPU-only step the host copies share the "
                      f"CPU allocator; {solved}")
    peak = cpu_allocation_peak(functools.partial(candidate.executor.run_flat, flat()))
    if peak is None:
        return None, f"held bytes NOT measured: another profiler was running; {solved}"
    owned = graph.caller_owned_bytes
    candidate.step_footprint = owned + peak
    return owned + peak, (f"held {size(owned + peak)} = caller-owned {size(owned)} + the step's allocations "
                          f"{size(peak)} (predicted live {size(candidate.predicted_peak)} + kernel scratch measured on "
                          f"the example batch at {torch.get_num_threads()} threads), {solved}")


def modelled_ordinary_step(candidate: Any, allocator: AllocatorAssumption | None) -> int | None:
    """What the CUDA caching allocator's CPU model predicts a plan's ordinary replay holds: the caller-owned values plus
    :func:`coop.runtime.reserved.modelled_step_reserved` of its schedule, under the expandable-segments setting
    ``allocator`` assumed. The rounds of ``coop.plan`` re-solve below its excess before any step runs, so a CUDA plan
    meets its budget in modelled reserved bytes first and the measured re-solve is left what the model misses.
    Compared with an H200's reserved bytes (BENCHMARKS.md, bench_cuda; schedules re-solved on CPU, so the same order
    of magnitude, not the same steps) the model predicted 1.006-1.082x the live peak where the device reserved
    1.03-1.16x: less on four of five rows, 0.4 % more on ResNet-50 at 0.7 (1.044x against 1.04x). So acting on it
    seldom lowers a budget further than the device would, and the measured rounds still follow.

    With the copy stream (:mod:`coop.runtime.copy_stream`) the events are the same: a page-in's block is allocated
    on the compute stream, from its pool, and no block is ``record_stream``-ed onto the side stream.
    A CUDA graph replay (``candidate.graph_replay``) allocates the step in its private pool, of ordinary segments:
    the ResNet-50 schedule of BENCHMARKS.md's comparison at 0.5 is modelled at 1.42x its live step peak there
    against 1.06x with expandable segments (an H200 reserved 1.5x for the pool of run 7's resnet/cuda-graph/0.5).

    Returns
    -------
    int or None
        The bytes, or None where the model does not apply: no CUDA value, the allocator's setting unknown (another
        backend), an FSDP-sharded step.
    """
    graph = candidate.graph
    if not graph.has_accelerator or allocator is None or allocator.expandable_segments is None:
        return None
    if candidate.captured.sharding is not None:
        return None
    return graph.caller_owned_bytes + modelled_step_reserved(graph, candidate.schedule,
                                                             expandable=bool(allocator.expandable_segments),
                                                             private_pool=candidate.graph_replay is not None)


def measure_arena_step(candidate: Any, live_budget: int, *, flat: FlatInputs) -> Measured:
    """Place a plan's schedule in arenas, switch it to the arena replay and measure one step.

    What the step allocates beside the arenas is measured by :func:`coop.runtime.arena_replay.measure_outside`;
    the footprint is the caller-owned values plus the buffers plus that.

    Parameters
    ----------
    candidate : Plan
        The plan; it replays in arenas afterwards (``use_arena``).
    live_budget : int
        The live-bytes budget it was solved within (for the note).
    flat : callable
        Makes the step's flat inputs.

    Returns
    -------
    tuple of (int, str)
        The arena replay's footprint, and the note that itemises it.
    """
    placement = execution_placement(candidate.graph, candidate.executor.schedule,
                                    simulation=candidate.executor.simulation)
    candidate.use_arena(placement)
    program = candidate.executor.arena_program
    owned = candidate.graph.caller_owned_bytes
    measure_outside(program, functools.partial(candidate.executor.run_flat, flat()))
    footprint = program.footprint(owned)
    return footprint, _arena_note(candidate, placement, live_budget)


def _footprint_items(program: Any, owned: int, graph: Graph, live_budget: int) -> str:
    """An arena replay's footprint, item by item: ``"X = caller-owned A + arenas B + ..."``."""
    size = functools.partial(format_memory, graph=graph)
    if program.outside_peak is not None:
        how = f"measured on the example batch at {program.outside_threads} threads"
    else:
        how = ("NOT measured: another profiler was running; kernels' internal scratch is not in it, only the largest "
               "transient is")
    outside = program.outside_peak if program.outside_peak is not None else program.max_transient
    return (f"{size(program.footprint(owned))} = caller-owned {size(owned)} + arenas {size(program.arena_bytes)} + "
            f"scratch {size(program.scratch_bytes)} + output slots {size(program.slot_bytes)} + allocated beside them "
            f"{size(outside)} ({how}), solved within a live-bytes budget of {size(live_budget)}")


def _arena_note(candidate: Any, placement: Any, live_budget: int) -> str:
    """What an arena plan holds at its peak, item by item (the plan's note, or why it was refused)."""
    graph = candidate.graph
    program = candidate.executor.arena_program
    size = functools.partial(format_memory, graph=graph)
    note = (f"arena footprint {_footprint_items(program, graph.caller_owned_bytes, graph, live_budget)}; "
            f"{placement.method} placement")
    if program.transients:  # ops whose kernel allocates its own output: their workspace, computed then copied in
        note += (f"; {len(program.transients)} ops allocate their own output as workspace outside the arena "
                 f"(largest {size(program.max_transient)})")
    return note
