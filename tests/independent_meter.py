"""An independent meter of the CPU bytes a block of code holds: PyTorch's own allocator instrumentation.

coop's :mod:`coop.runtime.meter` sees the storages aten ops return (a TorchDispatchMode); it is blind to what
a kernel allocates below the Python dispatch key (its internal scratch) and to allocations coop's own
code makes around the dispatcher. This meter shares nothing with coop: it reads the allocation and free
events the CPU allocator reports to ``torch.profiler`` (``profile_memory=True``): every
``c10::CPUAllocator`` allocation and free with its size, a kernel's internal scratch included (oneDNN's
convolution workspace shows up as events inside ``aten::mkldnn_convolution``). The running sum of those
events, in the order they happened, is the bytes allocated inside the block and still held; its maximum
is the block's peak.

Storages that exist before the block (the parameters, the batch, an arena buffer made by an earlier step)
are invisible to the profiler: pass them as ``held`` and they are counted once each (by storage), on top
of the block's running sum. A pre-existing storage freed inside the block is not subtracted (the profiler
does not know its size), so the peak is never below the truth.

>>> with HeldBytes(held=[*model.parameters(), *batch]) as meter:
...     loss = step()
>>> meter.peak_bytes   # held + the block's peak of allocated bytes
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Self

import torch
from torch.profiler import ProfilerActivity, profile


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct CPU storages behind ``tensors`` (a storage shared by several views counted once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values())


class HeldBytes:
    """Peak CPU bytes held while the block runs: ``held`` storages + the running sum of the allocator's events."""

    def __init__(self, held: Iterable[Any] = ()) -> None:
        self.held_bytes = storage_bytes(held)
        self.events: list[int] = []  # signed sizes of the allocator's events, in order (+ allocation, - free)
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self) -> Self:
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)
        memory = [e for e in self._profile.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
        self.events = [e.nbytes() for e in sorted(memory, key=lambda e: e.start_ns())]

    @property
    def block_peak_bytes(self) -> int:
        """The largest number of bytes allocated inside the block and held at once."""
        running = peak = 0
        for nbytes in self.events:
            running += nbytes
            peak = max(peak, running)
        return peak

    @property
    def allocations(self) -> list[int]:
        """The size of every allocation inside the block, in order."""
        return [n for n in self.events if n > 0]

    @property
    def peak_bytes(self) -> int:
        return self.held_bytes + self.block_peak_bytes


__all__ = ["HeldBytes", "storage_bytes"]
