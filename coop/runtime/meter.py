"""An independent meter of live tensor bytes while code runs (DESIGN.md, runtime).

On CPU, :class:`MemoryMeter` is a TorchDispatchMode that sees every aten op's outputs, counts
each new storage once (keyed by its StorageImpl) and drops it when the last tensor that holds it
dies (a weakref finalizer per tensor, a reference count per storage). The peak is taken right
after each op's outputs exist, before its dead inputs are released by the caller: the same
moment the simulator measures (resident values + the new output). Tensors that exist before the
meter starts (parameters, the batch) are invisible to it: pass them to :meth:`track` to count
them as the Graph counts its caller-owned values.

Storages allocated inside :func:`host_pool` (the host tier used for paging) are counted in a
separate pool (``host_peak_bytes``) and never against the device peak. On CUDA the device peak
is ``torch.cuda.max_memory_allocated`` relative to the start.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Self

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_HOST = threading.local()


@contextlib.contextmanager
def host_pool() -> Iterator[None]:
    """Allocations made inside belong to the host tier (paging), not to device memory."""
    previous = getattr(_HOST, "active", False)
    _HOST.active = True
    try:
        yield
    finally:
        _HOST.active = previous


def in_host_pool() -> bool:
    return getattr(_HOST, "active", False)


class MemoryMeter(TorchDispatchMode):
    """Measure the peak of live tensor bytes (each storage once) while the block runs.

    >>> with MemoryMeter() as meter:
    ...     meter.track(*model.parameters())
    ...     loss = step()
    >>> meter.peak_bytes
    """

    def __init__(self, use_cuda: bool | None = None) -> None:
        super().__init__()
        self.use_cuda = torch.cuda.is_available() if use_cuda is None else use_cuda
        self.current_bytes = 0
        self.peak_bytes = 0
        self.host_current_bytes = 0
        self.host_peak_bytes = 0
        self._refs: dict[int, int] = {}  # storage key -> live tensors seen holding it
        self._sizes: dict[int, tuple[int, bool]] = {}  # storage key -> (bytes, on host tier)
        self._cuda_base = 0

    # ---------------------------------------------------------------- bookkeeping
    def track(self, *tensors: torch.Tensor) -> None:
        """Count tensors created outside the meter (parameters, batch) as live."""
        for tensor in tensors:
            self._see(tensor, host=False)
        self._update_peak()

    def _see(self, tensor: torch.Tensor, host: bool) -> None:
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self._refs:
            self._refs[key] = 0
            nbytes = storage.nbytes()
            self._sizes[key] = (nbytes, host)
            if host:
                self.host_current_bytes += nbytes
                self.host_peak_bytes = max(self.host_peak_bytes, self.host_current_bytes)
            else:
                self.current_bytes += nbytes
        self._refs[key] += 1
        weakref.finalize(tensor, self._release, key)

    def _release(self, key: int) -> None:
        count = self._refs.get(key)
        if count is None:
            return
        if count > 1:
            self._refs[key] = count - 1
            return
        del self._refs[key]
        nbytes, host = self._sizes.pop(key)
        if host:
            self.host_current_bytes -= nbytes
        else:
            self.current_bytes -= nbytes

    def _update_peak(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        host = in_host_pool()
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._see(tensor, host=host)
        self._update_peak()
        return out

    def __enter__(self) -> Self:
        if self.use_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._cuda_base = torch.cuda.memory_allocated()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.use_cuda:
            torch.cuda.synchronize()
            self.cuda_peak_bytes = torch.cuda.max_memory_allocated() - self._cuda_base

    def reset_peak(self) -> None:
        """Start a new peak measurement from the bytes live now."""
        self.peak_bytes = self.current_bytes
        self.host_peak_bytes = self.host_current_bytes
