"""An independent meter of live tensor bytes while code runs.

On CPU, :class:`MemoryMeter` is a TorchDispatchMode that sees every aten op's outputs, counts
each new storage once (keyed by its StorageImpl) and drops it when the last tensor that holds it
dies (a weakref finalizer per tensor, a reference count per storage). The peak is taken right
after each op's outputs exist, before its dead inputs are released by the caller: the same
moment the simulator measures (resident values + the new output). Tensors that exist before the
meter starts (parameters, the batch) are invisible to it: pass them to :meth:`track` to count
them as the Graph counts its caller-owned values.

The meter names the op at which the peak occurs (``peak_op``, with the op's index among those
it saw in ``peak_index``) and, with ``record=True``, keeps the live bytes after every op
(``timeline``), so a measurement above a prediction can be traced to the op that caused it.

Storages allocated inside :func:`host_pool` (the host tier used for paging) are counted in a
separate pool (``host_peak_bytes``) and never against the device peak. On CUDA each storage counts
the whole 512-byte blocks the caching allocator gives it (:func:`coop.graph_capture.cost.
allocator_bytes`, as capture counts them), and ``cuda_peak_bytes`` is the allocator's own
measure: ``torch.cuda.max_memory_allocated`` during the block minus what was allocated when it
started, plus the tracked (caller-owned) bytes, which were allocated before it: the quantity the
simulator predicts, workspaces of cuBLAS/cuDNN included.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Self

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from coop.graph_capture.cost import allocator_bytes, quiet_profile

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
    """Whether allocations made now belong to the host tier (inside :func:`host_pool`)."""
    return getattr(_HOST, "active", False)


def cpu_allocation_peak(run: Callable[[], Any]) -> int | None:
    """The most CPU bytes ``run`` held at once above what was allocated when it started.

    Read from the CPU allocator's own reports to ``torch.profiler`` (``profile_memory=True``): every allocation
    and free with its size, kernels' internal scratch included (oneDNN's convolution buffers), which a
    dispatch-level meter such as :class:`MemoryMeter` cannot see. ``run`` runs under a forked CPU generator, so the
    caller's random draws are untouched.

    Parameters
    ----------
    run : callable
        Called once with no arguments.

    Returns
    -------
    int or None
        The peak in bytes; None while another profiler is running (``run`` is not called then).
    """
    from torch.profiler import ProfilerActivity

    if torch._C._autograd._profiler_enabled():
        return None
    with torch.random.fork_rng(devices=[]), quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU),
                    key=lambda e: e.start_ns())
    running = peak = 0
    for event in events:
        running += event.nbytes()
        peak = max(peak, running)
    return peak


class MemoryMeter(TorchDispatchMode):
    """Measure the peak of live tensor bytes (each storage once) while the block runs.

    >>> import torch
    >>> weight = torch.ones(256, 256)  # 262,144 B, alive before the block: tracked
    >>> with MemoryMeter(use_cuda=False) as meter:
    ...     meter.track(weight)
    ...     hidden = weight @ weight  # 262,144 B more
    ...     total = hidden.sum()  # 4 B more: the peak, reached by the sum
    >>> meter.peak_bytes, meter.peak_op
    (524292, 'aten.sum.default')
    """

    def __init__(self, use_cuda: bool | None = None, record: bool = False) -> None:
        super().__init__()
        self.use_cuda = torch.cuda.is_available() if use_cuda is None else use_cuda
        self.record = record
        self.current_bytes = 0
        self.peak_bytes = 0
        self.peak_op = "track"  # the op whose outputs first reached peak_bytes ("track": the tracked values)
        self.peak_index = -1  # that op's index among the ops the meter saw (-1: none yet)
        self.ops_seen = 0
        self.timeline: list[tuple[str, int]] = []  # (op, live bytes right after it), with record=True
        self.host_current_bytes = 0
        self.host_peak_bytes = 0
        self.tracked_bytes = 0
        self.cuda_peak_bytes: int | None = None
        #: (op, bytes) of every new device storage the block allocated, in order (tracked tensors excluded)
        self.allocations: list[tuple[str, int]] = []
        self._op = "track"
        self._refs: dict[int, int] = {}  # storage key -> live tensors seen holding it
        self._sizes: dict[int, tuple[int, bool]] = {}  # storage key -> (bytes, on host tier)
        self._cuda_base = 0

    # ---------------------------------------------------------------- bookkeeping
    def track(self, *tensors: torch.Tensor) -> None:
        """Count tensors created before the meter started (parameters, batch) as live."""
        self._op = "track"
        for tensor in tensors:
            self.tracked_bytes += self._see(tensor, host=False)
        self._update_peak("track")

    def _see(self, tensor: torch.Tensor, host: bool) -> int:
        """Hold the tensor's storage; the bytes it adds (0 when another tensor already holds it)."""
        if tensor.device.type == "meta":
            return 0
        storage = tensor.untyped_storage()
        key = storage._cdata
        added = 0
        if key not in self._refs:
            self._refs[key] = 0
            added = allocator_bytes(storage.nbytes(), tensor.device)
            self._sizes[key] = (added, host)
            if host:
                self.host_current_bytes += added
                self.host_peak_bytes = max(self.host_peak_bytes, self.host_current_bytes)
            else:
                self.current_bytes += added
                if added and self._op != "track":
                    self.allocations.append((self._op, added))
        self._refs[key] += 1
        weakref.finalize(tensor, self._release, key)
        return 0 if host else added

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

    def _update_peak(self, op: str) -> None:
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self.peak_op = op
            self.peak_index = self.ops_seen - 1

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        host = in_host_pool()
        self._op = str(func)
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._see(tensor, host=host)
        self.ops_seen += 1
        name = str(func)
        self._update_peak(name)
        if self.record:
            self.timeline.append((name, self.current_bytes))
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
            self.cuda_peak_bytes = torch.cuda.max_memory_allocated() - self._cuda_base + self.tracked_bytes

    def reset_peak(self) -> None:
        """Start a new peak measurement from the bytes live now."""
        self.peak_bytes = self.current_bytes
        self.peak_op, self.peak_index = "reset", self.ops_seen - 1
        self.host_peak_bytes = self.host_current_bytes
