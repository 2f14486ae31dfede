"""Paging copies: a value to the host tier and back, its layout and device kept exactly (issue 22).

One pair of functions serves every replay that pages (the ordinary fx replay of
:mod:`coop.runtime.executor`, the side copy stream of :mod:`coop.runtime.copy_stream`, the arena
replay of :mod:`coop.runtime.arena_replay`), on every device:

- :func:`page_out` copies the value's whole storage, byte for byte, into a host uint8 buffer
  (pinned when the caller asks for it) and records what the bytes cannot say: dtype, shape,
  stride, storage offset and the exact ``torch.device``, index included (:class:`HostCopy`).
- :func:`page_in` allocates a storage of the same byte size on that very device, copies the bytes
  back and returns the value as a view of it with the recorded dtype, shape, stride and offset;
  or, with ``into``, writes the value into a tensor the caller placed (the arena's block).

Why the whole storage and not ``torch.empty(shape)`` + ``copy_``: that makes a contiguous value,
so a transposed, sliced (storage offset), expanded (stride 0) or channels-last value came back
with other strides, and an fx node that views it the way the captured program did failed on a
GPU ("view size is not compatible with input tensor's size and stride"); ``.to("cuda")`` also
sent a value of ``cuda:1`` to ``cuda:0``. The Graph counts a value as its storage bytes (contract
1), so moving the storage moves exactly what the simulator moves.

Whether the host buffer is pinned is the caller's flag (:func:`pin_host_copy` decides it from the
device, in one place); a copy never branches on the device itself. Host buffers are allocated
inside :func:`coop.runtime.meter.host_pool`, so the memory meter counts them apart from the device.

A :class:`HostPool` is a host tier of fixed capacity allocated once, up front: page-outs given one carve
their buffers from it (address-ordered, best fit, :class:`coop.online.arena.Arena`) instead of allocating.
On a CPU-only step, where the "device" and the host tier are one memory, that keeps the tier apart for any
meter: the pool exists before the step, so the allocator sees only device-tier allocations during it, and the
pool says how many host bytes the step held (:attr:`HostPool.peak_bytes`).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from coop.online.arena import Arena
from coop.runtime.meter import host_pool


def pin_host_copy(device: torch.device) -> bool:
    """Whether a value paged out from ``device`` goes to pinned host memory.

    On CUDA, where a pinned buffer makes the D2H and H2D copies asynchronous (``non_blocking``), and nowhere else
    (a CPU value pages to plain memory).

    Returns
    -------
    bool
        True for a CUDA device.
    """
    return device.type == "cuda"


@dataclass(frozen=True)
class HostCopy:
    """A value on the host tier: the bytes of its whole storage and the metadata to rebuild it on its device."""

    data: torch.Tensor  # uint8, one byte per storage byte, on the host
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    device: torch.device  # where the value came from and goes back to, index included
    pinned: bool  # the host buffer is pinned: the copies back run non_blocking

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def host_view(self) -> torch.Tensor:
        """The value as it lies in the host buffer (same dtype, shape, stride and offset), without copying."""
        return _typed_view(self.data, self.dtype, self.shape, self.stride, self.storage_offset)


class HostPool:
    """A host tier of ``capacity`` bytes: one buffer allocated once (pinned when ``pin``), carved per page-out.

    A carved buffer goes back to the pool when the last reference to it dies (the :class:`HostCopy` holding it),
    as a storage would go back to the allocator. A page-out that finds no room gets a buffer of its own
    (:attr:`overflow_bytes` counts them), so a pool too small costs memory outside it, never a failed step.
    """

    def __init__(self, capacity: int, *, pin: bool = False) -> None:
        self.capacity = max(int(capacity), 1)
        with host_pool():
            self.buffer = torch.empty(self.capacity, dtype=torch.uint8, device="cpu", pin_memory=pin)
        self.pin = pin
        self._arena = Arena(self.capacity)
        self._tags = 0
        self.overflows = 0
        self.overflow_bytes = 0

    @property
    def used_bytes(self) -> int:
        """Bytes of the pool held by live host copies now."""
        return self._arena.used

    @property
    def peak_bytes(self) -> int:
        """The most bytes of the pool held at once."""
        return self._arena.peak_used

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A uint8 buffer of ``nbytes`` carved from the pool (an empty one for 0 bytes); None when it has no room.

        Parameters
        ----------
        nbytes : int
            The size of the buffer.

        Returns
        -------
        torch.Tensor or None
            The buffer, returned to the pool when it dies; None when no free block of the pool fits.
        """
        if nbytes == 0:
            return self.buffer[:0]
        self._tags += 1
        tag = self._tags
        start = self._arena.allocate(nbytes, tag, record=False)
        if start is None:
            self.overflows += 1
            self.overflow_bytes += nbytes
            return None
        data = self.buffer[start:start + nbytes]
        weakref.finalize(data, self._arena.free, tag)
        return data

    def page_out(self, value: torch.Tensor, *, pin: bool, non_blocking: bool, whole_storage: bool = True) -> HostCopy:
        """:func:`page_out` into this pool (a replay program's call target).

        Parameters
        ----------
        value : torch.Tensor
            The value to page out.
        pin : bool
            Whether the host buffer is pinned (the pool is used only where its pinning is the same).
        non_blocking : bool
            Whether the copy to the host is asynchronous.
        whole_storage : bool
            As :func:`page_out`'s.

        Returns
        -------
        HostCopy
            The host copy, its bytes carved from the pool where it has room.
        """
        return page_out(value, pin=pin, non_blocking=non_blocking, whole_storage=whole_storage, pool=self)


def page_out(value: torch.Tensor, *, pin: bool, non_blocking: bool, whole_storage: bool = True,
             pool: HostPool | None = None) -> HostCopy:
    """Copy ``value``'s whole storage to a host buffer (pinned when ``pin``), keeping what rebuilds it exactly.

    Parameters
    ----------
    value : torch.Tensor
        The value to page out: strided, without a lazy conjugate or negative bit.
    pin : bool
        Whether the host buffer is pinned.
    non_blocking : bool
        Whether the copy to the host is asynchronous.
    whole_storage : bool
        False for values that share one storage with others by design (the arena replay's buffer): only the
        bytes from the value's first element to its last are copied, and the value comes back at storage offset 0
        of a storage of that size (its strides, dtype and device kept).
    pool : HostPool or None
        Where the host buffer is carved from (a buffer of its own when None, when the pool's pinning is not ``pin``,
        or when the pool has no room).

    Returns
    -------
    HostCopy
        The host bytes with the dtype, shape, stride, storage offset, device and pinning to rebuild the value.

    Raises
    ------
    ValueError
        For a tensor that is not strided, or has a lazy conjugate or negative bit.
    """
    _check_pageable(value)
    if whole_storage:
        source, offset = _storage_bytes(value), value.storage_offset()
    else:
        span = _span_elements(tuple(value.shape), tuple(value.stride()))
        source, offset = value.as_strided((span,), (1,), value.storage_offset()).view(torch.uint8), 0
    with host_pool():
        data = pool.take(source.numel()) if pool is not None and pool.pin == pin else None
        if data is None:
            data = torch.empty(source.numel(), dtype=torch.uint8, device="cpu", pin_memory=pin)
        data.copy_(source, non_blocking=non_blocking)
    return HostCopy(data, value.dtype, tuple(value.shape), tuple(value.stride()), offset, value.device, pin)


def page_in_storage(host: HostCopy) -> torch.Tensor:
    """An uninitialised storage on ``host.device`` for the bytes of ``host`` (uint8), allocated on the current
    stream: what :func:`page_in` copies into (``storage=``) when the copy runs on another stream.

    Parameters
    ----------
    host : HostCopy
        The paged-out value.

    Returns
    -------
    torch.Tensor
        ``host.nbytes`` uninitialised bytes on ``host.device``.
    """
    return torch.empty(host.nbytes, dtype=torch.uint8, device=host.device)


def page_in(host: HostCopy, *, non_blocking: bool | None = None, into: torch.Tensor | None = None,
            storage: torch.Tensor | None = None) -> torch.Tensor:
    """The paged-out value back on ``host.device``.

    A new storage of the same bytes (``storage``, from :func:`page_in_storage`, where given), viewed with the
    recorded dtype, shape, stride and storage offset; or, with ``into``, the value written there.

    Parameters
    ----------
    host : HostCopy
        The paged-out value (:func:`page_out`).
    non_blocking : bool or None
        Whether the copy back is asynchronous; None: where the host buffer is pinned.
    into : torch.Tensor or None
        A tensor of the same dtype, shape and device (e.g. the arena's block for it) to write the value into.
    storage : torch.Tensor or None
        The uint8 storage to copy the bytes into (:func:`page_in_storage`); None: a new one.

    Returns
    -------
    torch.Tensor
        The rebuilt value, or ``into`` holding it.

    Raises
    ------
    ValueError
        When ``into``'s dtype, shape or device differs from the paged-out value's.
    """
    non_blocking = host.pinned if non_blocking is None else non_blocking
    if into is not None:
        return _page_into(host, into, non_blocking)
    data = page_in_storage(host) if storage is None else storage
    data.copy_(host.data, non_blocking=non_blocking)
    return _typed_view(data, host.dtype, host.shape, host.stride, host.storage_offset)


def _page_into(host: HostCopy, into: torch.Tensor, non_blocking: bool) -> torch.Tensor:
    if (into.dtype, tuple(into.shape), into.device) != (host.dtype, host.shape, host.device):
        raise ValueError(f"cannot page a {host.dtype} {list(host.shape)} value of {host.device} into a {into.dtype} "
                         f"{list(into.shape)} tensor on {into.device}")
    if tuple(into.stride()) != host.stride:  # another layout: an element-wise copy keeps the values
        return into.copy_(host.host_view(), non_blocking=non_blocking)
    # the same layout: copy the bytes the value spans, gaps and repeated (stride 0) elements included
    span = _span_elements(host.shape, host.stride)
    size = host.dtype.itemsize
    first = host.storage_offset * size
    target = into.as_strided((span,), (1,), into.storage_offset()).view(torch.uint8)
    target.copy_(host.data[first:first + span * size], non_blocking=non_blocking)
    return into


def _check_pageable(value: torch.Tensor) -> None:
    if value.layout is not torch.strided:
        raise ValueError(f"coop pages strided tensors only, not a {value.layout} one")
    if value.is_conj() or value.is_neg():
        raise ValueError("coop does not page a tensor with a lazy conjugate or negative bit; resolve it first")


def _storage_bytes(value: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``value`` (a view: nothing is copied or allocated)."""
    nbytes, size = value.untyped_storage().nbytes(), value.element_size()
    if nbytes % size == 0:  # views only (no storage is swapped under a tensor, as set_ would do)
        return value.as_strided((nbytes // size,), (1,), 0).view(torch.uint8)
    return torch.empty(0, dtype=torch.uint8, device=value.device).set_(value.untyped_storage())


def _typed_view(data: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...],
                storage_offset: int) -> torch.Tensor:
    """The bytes of ``data`` (a whole storage) seen as a ``dtype`` tensor of this shape, stride and offset."""
    if data.numel() % dtype.itemsize == 0:
        return data.view(dtype).as_strided(shape, stride, storage_offset)
    return torch.empty(0, dtype=dtype, device=data.device).set_(data.untyped_storage(), storage_offset, shape, stride)


def _span_elements(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a strided value's first to its last (0 for an empty value)."""
    if math.prod(shape) == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))


__all__ = ["HostCopy", "HostPool", "page_in", "page_in_storage", "page_out", "pin_host_copy"]
