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

import ast
import re
from collections.abc import Iterable
from pathlib import Path
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




# ------------------------------------------------------------------ the host tier counted apart
COOP = Path(__file__).resolve().parents[1] / "coop"


def host_tier_functions() -> set[tuple[str, str]]:
    """(file, function) of every coop function whose body enters ``host_pool()`` (read from coop's source, so a new
    one is found too): what it allocates is the host tier (paging buffers, saved generator states)."""
    found: set[tuple[str, str]] = set()
    for path in COOP.rglob("*.py"):
        for function in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    isinstance(node, ast.With) and any(_enters_host_pool(item.context_expr) for item in node.items)
                    for node in ast.walk(function)):
                found.add((str(path.resolve()), function.name))
    return found


def _enters_host_pool(expression: ast.expr) -> bool:
    if not isinstance(expression, ast.Call):
        return False
    target = expression.func
    return (isinstance(target, ast.Name) and target.id == "host_pool") or (
        isinstance(target, ast.Attribute) and target.attr == "host_pool")


class TieredHeldBytes:
    """:class:`HeldBytes` with the host tier counted apart: on CPU the "device" and the host are one memory.

    Every allocation and free of the CPU allocator, with the Python frames around it (``torch.profiler``,
    ``with_stack=True``); an allocation made under a coop function that enters ``host_pool()`` is host memory
    (``host_peak_bytes``), every other one device memory (``device_peak_bytes``, ``held`` storages included).
    A free is matched to its allocation by address; frees of storages allocated before the block are ignored.
    """

    def __init__(self, held: Iterable[Any] = ()) -> None:
        self.held_bytes = storage_bytes(held)
        self.device_block_peak = 0
        self.host_peak_bytes = 0
        self.host_allocations: list[int] = []
        self._host_functions = host_tier_functions()
        self._is_host: dict[str, bool] = {}
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True)

    def __enter__(self) -> Self:
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)
        allocation, python = torch._C._profiler._ExtraFields_Allocation, torch._C._profiler._ExtraFields_PyCall
        events = []
        stack = list(self._profile.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            stack.extend(event.children)
            if isinstance(event.extra_fields, allocation):
                host, parent = False, event.parent
                while parent is not None and not host:
                    host = isinstance(parent.extra_fields, python) and self._host_frame(parent.name)
                    parent = parent.parent
                events.append((event.start_time_ns, event.extra_fields.ptr, event.extra_fields.alloc_size, host))
        live: dict[int, tuple[int, bool]] = {}
        device = host_bytes = 0
        for _, address, size, host in sorted(events, key=lambda item: item[0]):
            if size > 0:
                live[address] = (size, host)
            elif address in live:
                size, host = live.pop(address)
                size = -size
            else:
                continue
            if host:
                host_bytes += size
                self.host_peak_bytes = max(self.host_peak_bytes, host_bytes)
                if size > 0:
                    self.host_allocations.append(size)
            else:
                device += size
                self.device_block_peak = max(self.device_block_peak, device)

    def _host_frame(self, name: str) -> bool:
        if name not in self._is_host:  # the Python tracer names a frame 'FILE(LINE): FUNCTION'
            match = re.match(r"^(?P<file>.*)\(\d+\): (?P<function>\S+)$", name)
            self._is_host[name] = bool(match) and (
                str(Path(match["file"]).resolve()), match["function"]) in self._host_functions
        return self._is_host[name]

    @property
    def device_peak_bytes(self) -> int:
        """``held`` + the most device-tier bytes allocated inside the block and held at once."""
        return self.held_bytes + self.device_block_peak


__all__ = ["HeldBytes", "TieredHeldBytes", "host_tier_functions", "storage_bytes"]
