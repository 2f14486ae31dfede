"""Paging on a side copy stream (issue 14, item 3): page-outs to pinned host memory and page-ins
overlapped with compute.

**Opt-in.** Measured on an H200 (BENCHMARKS.md, bench_cuda): GPT-2 at 1.05x its minimum budget, 1.62x
eager's step where the same schedule on the compute stream took 4.97x, but 1.15x its budget reserved. ``Executor(..., copy_stream=True)`` /
``coop.plan(..., copy_stream=True)`` turn it on; the default (False) replays page-outs and page-ins
as ``non_blocking`` copies on the compute stream, which stream order makes safe. Both make the very
same copies, :func:`coop.runtime.paging.page_out` / :func:`~coop.runtime.paging.page_in` (the value's
whole storage, its dtype, shape, strides, storage offset and exact device kept; the host buffer
pinned by the caller's flag, set where the value's device is CUDA); this module only decides on which
stream they run and who waits for them. Only values on an accelerator are paged: the validator
(:func:`coop.schedule.simulate`, :meth:`coop.graph.Graph.pageable`) refuses a schedule that pages a
host value of a CUDA step (a 0-d CPU scalar, the CPU philox seed of efficient attention), for which
``torch.cuda.current_stream`` raises ``ValueError: Expected a cuda device, but got: cpu`` (issue 22).

The protocol below has been checked only on CPU, against a recording fake of the stream/event API
(``tests/test_copy_stream.py``: a happens-before checker over the recorded log, with a mutation
check that removing any wait is caught; the checker learns when each storage is freed, as the caching
allocator does, and requires a block used on another stream to be waited for by its own stream before it
is freed; the fake refuses a CPU device as torch.cuda does, and the replay's CPU tensors stand for
``cuda:0`` only where a test says so).

The protocol, for one compute stream ``C`` (the current stream when the step runs) and one side
stream ``S`` per :class:`CopyStream`:

- **page-out v** (:meth:`CopyStream.page_out`): an event recorded on ``C`` right after the
  producer of ``v`` was enqueued, ``S`` waits on it (so the D2H copy reads a complete value), the
  copy ``v -> pinned host`` runs ``non_blocking`` on ``S``, an event is recorded after it and ``C``
  waits on that event before the replay drops ``v``: a page-out frees ``v``'s bytes for what comes
  next (Contract 2), so the block must serve ``C``'s next allocation at once, and ``C``'s later
  kernels are ordered after the copy by the wait (no ``record_stream`` is needed). An earlier
  protocol let ``C`` run on and ``record_stream``'ed ``v`` onto ``S``: the caching allocator took
  the block back only once the copy had finished, and an allocation in between reserved a new block
  (DELTA's GPT-2 step at 0.5 on an H200: 1.29x its budget reserved, 2026-11-26). The pinned host
  block is itself safe: ``copy_`` records the block's use on ``S`` in PyTorch's caching host
  allocator, which reuses the block only after that event.
- **page-in v** (:meth:`CopyStream.page_in`): the device storage is allocated on ``C`` (the
  current stream), from ``C``'s pool, where the value will be read and freed; an event recorded on
  ``C`` right after the allocation is waited for by ``S`` (the block may have served kernels queued
  on ``C`` before: the copy writes it only after them), the H2D copy runs ``non_blocking`` on ``S``,
  and an event is recorded after the copy. :meth:`CopyStream.wait` makes ``C`` wait on that event;
  the replay calls it right before the first program op that reads the value (its first consumer, or
  a view of it), as late as the schedule allows, so the copy overlaps the compute in between, and,
  for a value freed unread, right before it drops the value. Either way ``C`` has waited for the copy
  before the block can return to ``C``'s pool, so every later user of the block on ``C`` comes after
  the copy: no ``record_stream``. An earlier protocol ``record_stream``'ed the storage onto ``S``:
  the caching allocator then keeps a freed block until an event recorded on ``S`` *at the free*
  completes, after every copy queued on ``S`` by then (the prefetches queued ahead among them), while
  the host runs ahead of the device, so allocations in between reserved new blocks (suspected cause of
  the copy-stream replays reserving 1.2-1.35x their budget on an H200, 2026-11-26; not yet measured
  after this change). An earlier one still allocated the storage inside ``torch.cuda.stream(S)``
  (PyTorch's ``recordStream`` workflow): blocks of ``S``'s pool, once freed, serve only ``S``'s
  allocations, so the two pools together reserved more than the budget (DELTA's ResNet-50 step at
  0.5 on an H200: 1.41x its budget reserved, 2026-11-26).
- **the host copy**: a page-in reads the pinned host copy that a page-out wrote. Both copies are
  enqueued on the same stream ``S``, in schedule order, so the D2H copy completes before the H2D
  copy starts (stream order); no event is needed for it and the host never reads the copy.

What a GPU run must still measure: the overlap itself (step time against copies on the compute
stream), and the reserved bytes against the budget (bench_cuda's ``allocator`` counters).

The stream API is injectable (:class:`StreamAPI`; :class:`TorchCudaStreams` is torch.cuda's), so
the protocol is tested on CPU with a fake that records every record, wait and copy.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from coop.errors import ContextError, NeedsCudaError, ScheduleError
from coop.graph_capture import Captured
from coop.runtime.paging import HostCopy, page_in, page_in_storage, page_out
from coop.schedule import Schedule


def require_cuda() -> None:
    """Refuse ``copy_stream=True`` where torch sees no CUDA device (a one-line NeedsCudaError with the fix)."""
    if not torch.cuda.is_available():
        raise NeedsCudaError("copy_stream=True needs CUDA, and this torch sees no CUDA device; drop copy_stream "
                           "(without CUDA paging copies to a host pool on the compute stream)")


class StreamAPI(Protocol):
    """The stream and event operations the paging protocol uses (torch.cuda's, or a test's recording fake)."""

    def current_stream(self, device: torch.device) -> Any:
        """The stream the replay's compute runs on."""

    def new_stream(self, device: torch.device) -> Any:
        """A fresh side stream for the copies."""

    def new_event(self) -> Any:
        """A fresh event, with ``record(stream)``."""

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``stream`` current inside the block (allocations and kernels go to it)."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream``'s later work wait for ``event``'s last record."""



class TorchCudaStreams:
    """The default :class:`StreamAPI`: torch.cuda's streams and events."""

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)



@dataclass
class PagedOut:
    """A value on the host tier (:class:`~coop.runtime.paging.HostCopy`) and the event after its D2H copy."""

    host: HostCopy
    copied: Any


@dataclass
class PendingPageIn:
    """A page-in whose H2D copy is queued on the side stream; :meth:`CopyStream.wait` hands out its value."""

    value: torch.Tensor
    copied: Any


class CopyStream:
    """Page-outs and page-ins of one replay on a side stream, the compute stream waiting only where a
    paged-in value is first read. Streams are made lazily, per device, on the first page-out.

    The copies are :mod:`coop.runtime.paging`'s, as in the ordinary replay (the whole storage, layout and
    device kept); this class adds only where they run and who waits for them."""

    def __init__(self, api: StreamAPI | None = None) -> None:
        self.api: StreamAPI = api if api is not None else TorchCudaStreams()
        self._side: dict[torch.device, Any] = {}

    def side_stream(self, device: torch.device) -> Any:
        """The copy stream of ``device`` (one per device, made on first use)."""
        if device not in self._side:
            self._side[device] = self.api.new_stream(device)
        return self._side[device]

    def page_out(self, value: torch.Tensor, *, pin: bool) -> PagedOut:
        """Queue the D2H copy of ``value`` on the side stream after its producer; the compute stream waits for it.
        ``pin``: the host buffer is pinned (the caller's decision, :func:`coop.runtime.paging.pin_host_copy`).

        A page-out frees its value's block for what the compute stream allocates next (Contract 2: a
        ``page_out`` step frees the value's bytes; an online eviction makes room for the allocation that follows
        it), so the compute stream waits for the copy, and the block, once the caller drops the value, serves the
        compute stream's next allocation at once: its later kernels are ordered after the copy by the wait, no
        ``record_stream`` needed. The first protocol let the compute stream run on and ``record_stream``'ed the
        value onto the side stream: the allocator took the block back only once the copy had finished, and an
        allocation in between reserved a new one (DELTA on GPT-2 at half its peak on an H200: 1.29x its budget
        reserved, 2026-11-26). The simulator's model is the same (:mod:`coop.online.delta_sim`: the allocation
        that needed the room waits for the copy); page-ins still overlap the compute."""
        api = self.api
        compute, side = api.current_stream(value.device), self.side_stream(value.device)
        produced = api.new_event()
        produced.record(compute)  # after the producer, which the replay enqueued before this call
        api.wait_event(side, produced)
        with api.stream(side):
            host = page_out(value, pin=pin, non_blocking=True)
        copied = api.new_event()
        copied.record(side)
        api.wait_event(compute, copied)  # the block is free for the compute stream once the copy has read it
        return PagedOut(host, copied)

    def page_in(self, paged: PagedOut) -> PendingPageIn:
        """Queue the H2D copy of a paged-out value on the side stream, into a storage of the compute stream's pool.

        The storage is allocated on the compute stream, where the value will be read and freed: a storage from
        the side stream's pool would stay in that pool when freed, where no compute-stream allocation can reuse
        it, and the two pools together would reserve more than the budget (a DELTA ResNet-50 step on an H200
        reserved 1.41x its budget so). The side stream waits for an event recorded after the allocation (the
        kernels that last used that block on the compute stream come first). The caller must pass the result to
        :meth:`wait` before the value is read or dropped, whichever comes first: then the compute stream has
        waited for the copy before the block can serve anything else, and no ``record_stream`` holds the block
        back. The D2H copy that wrote ``paged.host`` was queued earlier on the same side stream, so stream order
        runs it first."""
        api = self.api
        host = paged.host
        compute, side = api.current_stream(host.device), self.side_stream(host.device)
        storage = page_in_storage(host)
        allocated = api.new_event()
        allocated.record(compute)
        api.wait_event(side, allocated)
        with api.stream(side):
            value = page_in(host, non_blocking=True, storage=storage)
        copied = api.new_event()
        copied.record(side)
        return PendingPageIn(value, copied)

    def wait(self, pending: PendingPageIn) -> torch.Tensor:
        """The paged-in value, for the compute stream: called right before its first reader, or before the replay
        drops a value it never read (the block returns to the compute stream's pool only after this wait)."""
        api = self.api
        compute = api.current_stream(pending.value.device)
        api.wait_event(compute, pending.copied)  # its storage is the compute stream's own (page_in): no record_stream
        return pending.value


def copy_stream_for(captured: Captured, schedule: Schedule, option: bool | StreamAPI | None,
                    placement: Any = None) -> CopyStream | None:
    """The copy stream an Executor pages on for ``option``, or a one-line refusal.

    Parameters
    ----------
    captured : Captured
        The captured step; its fx values tell where the paged values live.
    schedule : Schedule
        The schedule replayed; it must page (``page_out``/``page_in``) a computed value.
    option : bool or StreamAPI or None
        The executor's ``copy_stream``: False or None for copies on the compute stream, True for torch.cuda's
        streams, or a :class:`StreamAPI` to use instead (then neither CUDA nor the values' devices are checked).
    placement : Any
        The executor's placement (an arena replay); anything but None is refused with a copy stream.

    Returns
    -------
    CopyStream or None
        The copy stream, or None when ``option`` is False or None.

    Raises
    ------
    ContextError
        When ``option`` is True and torch sees no CUDA device, or a paged value was captured off CUDA.
    ScheduleError
        When the schedule pages no computed value, or an arena replay is asked for as well.
    """
    if option is False or option is None:
        return None
    if option is True:
        require_cuda()
    paged = {step.node for step in schedule.steps if step.op in ("page_out", "page_in")
             and not captured.graph.node(step.node).caller_owned}
    if not paged:
        raise ScheduleError("copy_stream=True needs a schedule that pages, and this one has no page_out/page_in of a "
                            "computed value; drop copy_stream, or plan with formulation='poet' and a device_profile")
    if placement is not None:
        raise ScheduleError("copy_stream=True does not combine with an arena replay yet; drop copy_stream or placement")
    if option is not True:
        return CopyStream(option)
    values = {node.name: node.meta.get("val") for node in captured.module.graph.nodes}
    for node_id in sorted(paged):
        for name in captured.fx_names.get(node_id, ()):
            value = values.get(name)
            if isinstance(value, torch.Tensor) and value.device.type != "cuda":
                raise ContextError(f"copy_stream=True pages CUDA values, but node {node_id} ({name}) was captured on "
                                   f"{value.device}; capture the step on CUDA or drop copy_stream")
    return CopyStream()
