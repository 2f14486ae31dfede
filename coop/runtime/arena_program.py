"""The arena replay's program at run time: :class:`ArenaProgram` owns one persistent buffer per device (arena,
scratch, the loss's two :class:`OutputSlot` s), hands the step's gradients out as aliases of it and moves
them out before the next step; :func:`measure_outside` measures what a step allocates beside the buffers.

How the program is written (every value at its planned offset) is :mod:`coop.runtime.arena_replay`, whose
docstring is the design; everything here is importable from there too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from coop.runtime.arena_kernels import COPIES_MADE, forget_sites, view_extent
from coop.runtime.meter import cpu_allocation_peak

ALIGN = 64  # bytes: every block, scratch piece and output slot starts on a multiple of it


@dataclass(frozen=True)
class Transient:
    """A value computed outside the arena and copied in: ``nbytes`` allocated for the op at ``step``."""

    step: int
    node: int
    op: str
    storages: tuple[int, ...]  # bytes of each storage the op allocates

    @property
    def nbytes(self) -> int:
        return sum(self.storages)


@dataclass
class OutputSlot:
    """A persistent place for the loss after the arena and scratch in its device's buffer (two, used in turn)."""

    device: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    handed: Any = None  # weak reference to the view last handed out
    users: int = 0  # buffer users that view adds (its views of views)

    def alive(self) -> bool:
        return self.handed is not None and self.handed() is not None

    def hand_out(self, buffer: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        before = _users(buffer)
        view = buffer.view(self.dtype).as_strided(self.shape, self.stride, self.offset // self.dtype.itemsize)
        view.copy_(value)
        self.users = _users(buffer) - before
        self.handed = weakref.ref(view)
        return view


def _users(buffer: torch.Tensor) -> int:
    """Tensors holding ``buffer``'s storage (its StorageImpl's reference count)."""
    return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata)


class ArenaProgram:
    """What an arena replay allocates, and the buffers it keeps: one per device, allocated at the first step.

    Device ``d``'s buffer holds its arena (``arenas[d]`` bytes: the placed values of that device), a scratch
    region (``scratches[d]``) and the loss's two slots. ``transients`` are the workspaces of ops that allocate
    their own output (:data:`WORKSPACE_OPS`). ``outside_peak`` is the most bytes a step was measured to
    allocate beside the buffers (:func:`measure_outside`; None until measured).

    Gradients are handed out where the step computed them: a new ``.grad`` is an alias of its arena block
    (a tensor of its own on the buffer's storage, not a view), so the step copies nothing and the buffer holds
    no second copy of them. At the next step :meth:`run` first moves every alias still held (a ``.grad``
    kept by ``zero_grad(set_to_none=False)`` or accumulation, or a reference the caller kept) out of the
    arena onto a storage of its own (``set_``: the same tensor object, the same values), as eager PyTorch
    would hold them; only where a view was taken of such a gradient (which ``set_`` cannot follow) does the
    step run on a new buffer, the old one left to the caller's views.
    """

    def __init__(self, arenas: dict[str, int], devices: list[str], transients: list[Transient],
                 in_place_ops: int, scratches: dict[str, int], slots: dict[int, list[OutputSlot]],
                 grad_params: dict[int, int], kernel_sites: list[int] | None = None,
                 grad_outputs: list[int] | None = None) -> None:
        self.arenas = {d: arenas.get(d, 0) for d in devices}
        self.devices = devices
        self.transients = transients
        self.in_place_ops = in_place_ops  # fx nodes written straight into the arena (out kernels, composites, copies)
        self.scratches = {d: scratches.get(d, 0) for d in devices}
        self.slots = slots  # flat output index of the loss -> its two slots
        self.grad_params = grad_params  # flat output index of a gradient -> flat input index of its parameter
        self.grad_outputs = grad_outputs if grad_outputs is not None else sorted(grad_params)  # handed out in place
        self.kernel_sites = kernel_sites or []  # kernel_into call sites of this program
        weakref.finalize(self, forget_sites, tuple(self.kernel_sites))
        self.buffers: dict[str, torch.Tensor] = {}
        self._idle_users: dict[str, int] = {}
        self._handed: dict[str, list[weakref.ref]] = {}  # device -> gradients handed out as aliases of its arena
        self.moved_out = 0  # bytes of held gradients moved out of the arena (the caller's, as in eager)
        self.new_buffers = 0  # buffers taken because a view of a handed-out gradient held the old one
        self.outside_peak: int | None = None
        self.outside_threads: int | None = None  # torch.get_num_threads() when outside_peak was measured

    @property
    def arena_bytes(self) -> int:
        """Bytes of every device's arena together."""
        return sum(self.arenas.values())

    @property
    def scratch_bytes(self) -> int:
        """Bytes of every device's scratch region together."""
        return sum(self.scratches.values())

    @property
    def kernel_copies(self) -> list[tuple[str, int]]:
        """(op, bytes) of each output a kernel put outside its view so far (copied in; the first call of a site,
        while KernelOutputs learns which allocation is the output)."""
        return [copy for site in self.kernel_sites for copy in COPIES_MADE.get(site, [])]

    @property
    def max_transient(self) -> int:
        return max((t.nbytes for t in self.transients), default=0)

    def buffer_bytes(self, device: str) -> int:
        """Bytes of ``device``'s buffer: arena, scratch and the loss's slots."""
        ends = [s.offset + aligned(view_extent(s.shape, s.stride, s.dtype)) for ss in self.slots.values() for s in ss
                if s.device == device]
        return max([aligned(self.arenas.get(device, 0)) + self.scratches.get(device, 0), *ends])

    @property
    def slot_bytes(self) -> int:
        """Bytes of the output slots (the loss's two) in every buffer."""
        return sum(self.buffer_bytes(d) - aligned(self.arenas[d]) - self.scratches[d] for d in self.devices)

    @property
    def total_buffer_bytes(self) -> int:
        """Bytes of every device's buffer together."""
        return sum(self.buffer_bytes(d) for d in self.devices)

    def footprint(self, caller_owned_bytes: int) -> int:
        """Every byte a step holds at its peak: the caller-owned values, the buffers (arenas, scratch, the loss's
        slots; the gradients are in the arenas) and what the step allocates beside them: the measured
        ``outside_peak``, else the largest transient (a lower estimate: kernels' internal scratch is not in it)."""
        outside = self.outside_peak if self.outside_peak is not None else self.max_transient
        return caller_owned_bytes + self.total_buffer_bytes + outside

    def run(self, forward: Callable, module: fx.GraphModule, flat: list[torch.Tensor]) -> list[Any]:
        """One step: the program on this plan's buffers, then the loss into a free slot and new ``.grad`` values
        handed out where they are."""
        for device in self.devices:
            if device in self.buffers:
                self._release(device)
            else:
                self._allocate(device)
        clean = {d: _users(b) == self._idle_users[d] + sum(s.users for ss in self.slots.values() for s in ss
                                                            if s.device == d and s.alive())
                 for d, b in self.buffers.items()}
        outputs = list(forward(module, *flat, *(self.buffers[d] for d in self.devices)))
        for index, slots in self.slots.items():
            value = outputs[index]
            if not isinstance(value, torch.Tensor):
                continue
            free = next((s for s in slots if clean[s.device] and not s.alive()), None)
            outputs[index] = free.hand_out(self.buffers[free.device], value) if free else value.clone()
        for index in self.grad_outputs:
            value = outputs[index]
            position = self.grad_params.get(index)
            if not isinstance(value, torch.Tensor) or (position is not None and flat[position].grad is not None):
                continue  # added into the existing .grad at once (Captured.write_back)
            outputs[index] = self._hand_out(value)
        return outputs

    def _allocate(self, device: str) -> None:
        self.buffers[device] = torch.empty(self.buffer_bytes(device), dtype=torch.uint8, device=device)
        self._idle_users[device] = _users(self.buffers[device])
        self._handed[device] = []
        for slots in self.slots.values():
            for slot in slots:
                if slot.device == device:
                    slot.handed, slot.users = None, 0

    def _release(self, device: str) -> None:
        """Free ``device``'s arena of the gradients handed out at the last step: move those still held out of it,
        or, where a view of one holds the buffer, take a new buffer and leave the old one to the caller."""
        buffer = self.buffers[device]
        storage = buffer.untyped_storage().data_ptr()
        held = [t for t in (ref() for ref in self._handed.get(device, [])) if t is not None
                and t.untyped_storage().data_ptr() == storage]  # still on the buffer (not set_ elsewhere by anyone)
        loss_users = sum(s.users for ss in self.slots.values() for s in ss if s.device == device and s.alive())
        if _users(buffer) > self._idle_users[device] + loss_users + len(held):
            self.new_buffers += 1
            self._allocate(device)
            return
        with torch.no_grad():
            for tensor in held:
                self.moved_out += tensor.numel() * tensor.element_size()
                tensor.set_(tensor.clone())
        self._handed[device] = []

    def _hand_out(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (a view of its arena block) as a tensor of its own on the buffer's storage (an alias, not a
        view: :meth:`_release` can move it out), remembered until the next step."""
        device = str(value.device)
        buffer = self.buffers.get(device)
        if buffer is None or value.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
            return value  # not in the arena (its own storage already)
        alias = torch.empty(0, dtype=value.dtype, device=value.device).set_(
            buffer.untyped_storage(), value.storage_offset(), value.shape, value.stride())
        self._handed[device].append(weakref.ref(alias))
        return alias


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ALIGN.

    Parameters
    ----------
    nbytes : int
        A size in bytes.

    Returns
    -------
    int
        The smallest multiple of ALIGN that is at least ``nbytes``.
    """
    return -(-nbytes // ALIGN) * ALIGN


def measure_outside(program: ArenaProgram, run: Callable[[], Any]) -> int | None:
    """Run one step and record the most CPU bytes it held beside the buffers in ``program.outside_peak``.

    What a step allocates outside its buffers cannot all be predicted from the graph: a kernel's internal
    scratch (oneDNN's convolution reorders its input and output through blocked-layout buffers of up to
    several times their size; batch norm's statistics), the 0-d tensors that wrap Python numbers, and an output
    a kernel puts outside its view at a call site's first call (:func:`coop.runtime.arena_kernels.kernel_into`,
    which learns there). The CPU allocator reports every allocation and free, with its size, to
    ``torch.profiler`` (``profile_memory=True``); the running sum of those events, less the buffers the step
    allocates first, is the step's outside peak. The step runs functionally (nothing is written back to the
    model) under a forked CPU generator, so the plan's first real step draws what eager PyTorch draws; buffers
    it allocated are released again (the plan's first step allocates them), while what the call sites
    learned stays. Measured at ``torch.get_num_threads()`` threads (kept in ``program.outside_threads``):
    oneDNN's backward scratch grows a little with the thread count.

    Parameters
    ----------
    program : ArenaProgram
        The arena program whose step is measured; its ``outside_peak`` and ``outside_threads`` are set.
    run : callable
        Runs one step: the executor's ``run_flat`` on the real example batch.

    Returns
    -------
    int or None
        The outside peak in bytes (also stored in ``program.outside_peak``); None (nothing recorded) while another
        profiler is running.
    """
    fresh = not program.buffers
    peak = cpu_allocation_peak(run)
    if peak is None:
        return None
    buffers = sum(program.buffer_bytes(d) for d in program.devices if torch.device(d).type == "cpu") if fresh else 0
    if fresh:
        program.buffers.clear()
        program._idle_users.clear()
    program.outside_peak = max(0, peak - buffers)
    program.outside_threads = torch.get_num_threads()
    return program.outside_peak
