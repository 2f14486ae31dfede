"""What the CUDA caching allocator reserves for a step: the bytes a process really holds on the device.

Contract 3 (:mod:`coop.budget`) bounds what the process holds, and on CUDA that is the caching allocator's reserved
memory, not the live bytes the simulator predicts: blocks are rounded, segments fragment. Expandable segments
(:mod:`coop.runtime.allocator`) bring reserved close to allocated, not onto it: on an H200 (torch 2.11,
BENCHMARKS.md bench_cuda) ordinary replays at half the baseline peak reserved 1.029x (GPT-2) and 1.048x
(ResNet-50) their budget while allocating exactly the prediction. So ``coop.plan`` measures a CUDA step's
reserved peak on the example batch (:func:`reserved_step_peak`) and re-solves below the budget by what it
exceeds (:func:`coop.planner.plan`).

The measure is the one the GPU acceptance command reports (``benchmarks/bench_cuda.py``, ``reserved``): after
``empty_cache``, one step (what it leaves allocated for later steps stays), ``empty_cache`` again, the peak
statistics reset, a second, warm step; the peak of reserved bytes during it above what was allocated before the
first. The allocator's counters are injectable (:class:`AllocatorCounters`), so the procedure is tested on CPU
against a fake that keeps the allocator's books. Where no device can be run, :func:`modelled_step_reserved` predicts
the same quantity from the schedule alone, with the CPU model of the allocator
(:mod:`coop.runtime.cuda_allocator_model`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch

from coop.graph import Graph, derived_from_graph
from coop.runtime.cuda_allocator_model import Alloc, predict_reserved, schedule_events
from coop.schedule import Schedule


class AllocatorCounters(Protocol):
    """The caching allocator's calls the measure makes (``torch.cuda``'s, on one device)."""

    def synchronize(self) -> None:
        """Wait for the device's queued work."""

    def empty_cache(self) -> None:
        """Release the cached blocks that no tensor holds."""

    def memory_allocated(self) -> int:
        """Bytes held by tensors now."""

    def reset_peak_memory_stats(self) -> None:
        """Start the peak statistics afresh."""

    def max_memory_reserved(self) -> int:
        """The most bytes reserved since the last reset."""


class TorchCudaCounters:
    """The default :class:`AllocatorCounters`: ``torch.cuda``'s, on ``device``."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def memory_allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def max_memory_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)


def reserved_step_peak(run: Callable[[], Any], counters: AllocatorCounters) -> int:
    """The most bytes the allocator reserved during a warm run of ``run``, above what was allocated before.

    Parameters
    ----------
    run : callable
        One step; called twice (the first leaves what later steps keep, the second is measured).
    counters : AllocatorCounters
        The allocator's counters (:class:`TorchCudaCounters` on CUDA).

    Returns
    -------
    int
        ``max_memory_reserved`` during the second run, after ``empty_cache``, minus ``memory_allocated`` before
        the first: every reserved byte but those of tensors that existed before (the caller-owned values among
        them, which the caller adds back as the Graph counts them).
    """
    counters.synchronize()
    counters.empty_cache()
    before = counters.memory_allocated()
    run()
    counters.synchronize()
    counters.empty_cache()
    counters.reset_peak_memory_stats()
    run()
    counters.synchronize()
    return counters.max_memory_reserved() - before


def cuda_counters(devices: tuple[str | None, ...]) -> TorchCudaCounters | None:
    """The counters of a step's one CUDA device where torch sees it; None for a step on no CUDA device or on
    several (then nothing is measured and the plan says so).

    Parameters
    ----------
    devices : tuple of str or None
        The devices of the step's values (:attr:`coop.graph.Graph.devices`).

    Returns
    -------
    TorchCudaCounters or None
        The counters, or None.
    """
    cuda = {torch.device(d) for d in devices if d is not None and d.startswith("cuda")}
    if len(cuda) != 1 or not torch.cuda.is_available():
        return None
    return TorchCudaCounters(next(iter(cuda)))


@derived_from_graph
def modelled_step_reserved(graph: Graph, schedule: Schedule, *, expandable: bool = True,
                           private_pool: bool = False) -> int:
    """The allocator model's counterpart of :func:`reserved_step_peak`: the most bytes reserved during one replay of
    ``schedule``, above what the caller-owned values hold before it, predicted on the CPU.

    The caller-owned values are allocated first (their blocks, rounded, are "what was allocated before"), then the
    schedule's allocations and frees (:func:`~coop.runtime.cuda_allocator_model.schedule_events`) are replayed from
    an empty cache. One step from an empty cache, not a warm second one: what a first step leaves allocated for the
    next (gradients) is not modelled. Computed once per graph, schedule and setting (the rounds of ``coop.plan`` and
    the meta plan's note ask for the same one).

    Parameters
    ----------
    graph : Graph
        The step's graph (``mem`` in bytes).
    expandable : bool
        Whether the allocator runs with expandable segments (:func:`coop.runtime.allocator.prepare_allocator`
        turns them on for a CUDA step unless the user chose otherwise).
    private_pool : bool
        Whether the step's allocations come from a CUDA graph's private pool (:mod:`coop.runtime.graph_replay`),
        which keeps ordinary segments whatever the setting; the caller-owned values stay in the default pool.

    Returns
    -------
    int
        The model's peak reserved bytes minus the block bytes of the caller-owned values.
    """
    events = schedule_events(graph, schedule)
    owned = set(graph.caller_owned_ids)
    leading = next((i for i, e in enumerate(events) if not (isinstance(e, Alloc) and e.node in owned)), len(events))
    if private_pool:
        events = [*events[:leading], *(dataclasses.replace(e, pool=1) if isinstance(e, Alloc) else e
                                       for e in events[leading:])]
    prediction = predict_reserved(events, expandable=expandable)
    before = prediction.active[leading - 1] if leading else 0
    return prediction.peak_reserved - before


__all__ = ["AllocatorCounters", "TorchCudaCounters", "cuda_counters", "modelled_step_reserved", "reserved_step_peak"]
