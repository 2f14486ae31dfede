"""Arena replay: every planned value of a step lives at its planned offset in one persistent buffer per device.

A static plan knows each value's size, birth and death before the step runs, and
:func:`coop.runtime.placement.execution_placement` gives every instance an address (best fit,
Zhang et al. 2023, "Coop: Memory is not a Commodity", applied to a static schedule; blocks rounded
to :data:`~coop.runtime.placement.ARENA_ALIGNMENT` bytes, extra outputs placed from their op's
step). :class:`ArenaProgramBuilder` writes the executor's replay program so that each value is an
``as_strided`` view of one uint8 buffer per device, at its offset, with the dtype, shape and
strides the eager kernel gives it. The buffer is allocated once, at the plan's first step, and
reused by every later step (fixed addresses: what a CUDA graph needs), so a step allocates nothing
the plan does not count.

**One buffer per device, the caller's values in none.** Each value's device is its traced value's
(``Node.device``, which must agree): a CUDA step's host scalars and RNG seeds are placed in the CPU
buffer, never in the CUDA one, and each device's buffer is its own arena's size
(:attr:`ArenaProgram.arenas`, the placement's ``arena_peaks``). Caller-owned values (parameters,
buffers, the batch) stay in the caller's storages: the execution placement gives them no address, so
no buffer reserves room for them a second time.

**What a step holds** (:meth:`ArenaProgram.footprint`): the caller-owned values, the buffers (arenas, the
scratch region after each arena, the loss's two slots) and what the step allocates beside them. That last
part is measured, not modelled (:func:`measure_outside`: a kernel's internal scratch, the 0-d tensors that
wrap Python numbers, the generator states a replayed random op saves, the copies a kernel's first call
makes), because no graph says how many bytes oneDNN's convolution reorders through.
:func:`coop.planner.plan.plan` with ``arena=True`` compares that total with the budget.

How each op writes its result into its view (out kernels, the functional ops' own bodies in place,
kernels handed the views as their output allocations, or compute then copy) is
:mod:`coop.runtime.arena_kernels`; what allocates outside the arena is reported in
:attr:`ArenaProgram.transients` and :attr:`ArenaProgram.kernel_copies`. That interception runs CPU
kernels only: on CUDA most ops would compute outside the arena and be copied in (measured on an H100:
1.16-1.30x the prediction at 1.33-1.58x eager time, a crash on GPT-2), so the planner refuses an arena
plan of a step with values on an accelerator (:func:`coop.planner.plan.refuse_arena_off_cpu`) and uses
the ordinary replay there; the builder still writes a mixed-device program (tests read its code).

A recomputation's discarded extra outputs (batch-norm statistics, max-pool indices) are written
into that step's workspace block of the placement (the simulator counts them there) or into the
scratch region after the arena.

**Outputs and ``.grad``.** The loss is copied into one of two persistent slots after the arena (used in
turn, so that the previous step's loss, which a training loop still holds, survives; a slot is reused
only when nothing holds it, else the loss is a fresh copy). A gradient is not copied: a new ``.grad`` is
an alias of the arena block the step computed it in (a tensor of its own on the buffer's storage), so the
buffer holds each gradient once, where the simulator counts it. Before the next step overwrites the
arena, :meth:`ArenaProgram.run` moves every alias the caller still holds (a ``.grad`` kept by
``zero_grad(set_to_none=False)`` or by gradient accumulation, a reference kept to it) onto a storage of
its own with ``set_``: the same tensor object with the same values, now the caller's memory, as eager
PyTorch holds it (``moved_out`` counts those bytes). A view taken of a handed-out gradient cannot be
moved; the step then runs on a new buffer and leaves the old one to those views (``new_buffers``). A
gradient for a parameter that already has a ``.grad`` is handed back as a view of the arena and added
into that ``.grad`` at once. The budget therefore bounds a step that starts with the previous ``.grad``
values released (``zero_grad()``, the default); accumulated ``.grad`` values are held beside it, as in
eager PyTorch. Values that :meth:`Executor.run_flat` returns as arena views (new buffer values, gradients
added into an existing ``.grad``) are valid until the next step; the replay is not reentrant.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from coop.errors import CoopError
from coop.graph_capture import Captured
from coop.runtime.arena_kernels import (
    COMPOSITES,
    COPIES,
    FILLS,
    KERNEL_OUTPUT_OPS,
    OUT_IN_PLACE,
    SCALAR_OUT,
    WORKSPACE_OPS,
    batch_norm_into,
    bernoulli_mask_op,
    embedding_backward_into,
    embedding_into,
    into_views,
    kernel_into,
    kernel_site,
    safe_softmax_into,
    same_device_copy,
    tensor_leaves,
    view_extent,
)
from coop.runtime.arena_program import ArenaProgram, OutputSlot, Transient, aligned, measure_outside
from coop.runtime.paging import page_in
from coop.runtime.placement import Placement, schedule_lifetimes
from coop.runtime.program_builder import ProgramBuilder
from coop.schedule import Schedule, Simulation, Step

aten = torch.ops.aten


def check_placement(captured: Captured, graph: Any, schedule: Schedule, placement: Placement,
                    simulation: Simulation | None = None) -> None:
    """Refuse (one CoopError line) a placement that is not this schedule's execution placement or overlaps.

    Parameters
    ----------
    graph : Graph
        The Graph ``schedule`` is legal on.
    schedule : Schedule
        The schedule the arena replay runs.
    placement : Placement
        The placement to check (:func:`coop.runtime.placement.execution_placement` of ``schedule``).
    simulation : Simulation or None
        ``simulate(graph, schedule)`` where the caller holds it; computed when absent.
    """
    if not isinstance(placement, Placement):
        raise CoopError(f"placement= takes a Placement from coop.runtime.placement.execution_placement, not "
                        f"{type(placement).__name__}")
    alignment = int(placement.extra.get("alignment", 1) or 1)
    if alignment < 16 or not placement.extra.get("extras_from_op"):
        raise CoopError("arena replay needs a placement made by coop.runtime.placement.execution_placement "
                        f"(aligned blocks, extra outputs from their op's step); this one has alignment {alignment}")
    expected, _ = schedule_lifetimes(graph, schedule, alignment=alignment, extras_from_op=True, caller_owned=False,
                                     simulation=simulation)
    if expected != placement.lifetimes or len(placement.offsets) != len(expected):
        raise CoopError("arena placement was made for another schedule or places caller-owned values (its blocks "
                        "differ from this schedule's); place the executor's own schedule (executor.schedule) with "
                        "execution_placement")
    top = sum(placement.arena_peaks.values())
    if placement.arena_peak < top:
        raise CoopError(f"arena of {placement.arena_peak} bytes is too small for its placement, whose blocks reach "
                        f"{top} bytes on their devices; use the placement's own arena_peak")
    if any(o % alignment for o in placement.offsets) or any(o < 0 for o in placement.offsets):
        raise CoopError(f"arena placement has offsets that are negative or not multiples of its alignment {alignment}")
    placement.check()


class ArenaProgramBuilder(ProgramBuilder):
    """The replay program builder (:class:`~coop.runtime.program_builder.ProgramBuilder`) writing each planned
    value into its view of the device's buffer.

    It overrides :meth:`start` (one buffer per device after the flat inputs), :meth:`run_step` (the step and
    the instance it computes, from ``simulation``), :meth:`emit` (a value owned by the node computed now is
    written into its planned view) and :meth:`page_in` (a paged value comes back into its block).

    Parameters
    ----------
    captured, graph, replayed
        As for :class:`~coop.runtime.program_builder.ProgramBuilder`.
    simulation : Simulation
        ``simulate(graph, schedule)`` of the schedule built: its instances name the placed blocks.
    placement : Placement
        The schedule's execution placement (:func:`coop.runtime.placement.execution_placement`).
    """

    page_whole_storage = False  # a value's storage is the whole buffer: page only the bytes the value spans

    def __init__(self, captured: Captured, graph: Any, replayed: set[int], simulation: Simulation,
                 placement: Placement) -> None:
        super().__init__(captured, graph, replayed)
        placed = [(b, o) for b, o in zip(placement.lifetimes, placement.offsets, strict=True)
                  if b.instance >= 0 or b.label.startswith("workspace")]
        self.arena_sizes: dict[str, int] = {}  # device -> bytes of its arena (the highest address placed there)
        self.block: dict[tuple[int, int], tuple[int, int]] = {}  # (instance, first step) -> (offset, size)
        self.workspace_block: dict[int, tuple[int, int]] = {}  # step -> (offset, size) of its workspace block
        self.workspace_device: dict[int, str] = {}
        for b, o in placed:
            device = self._block_device(b)
            self.arena_sizes[device] = max(self.arena_sizes.get(device, 0), o + b.size)
            if b.instance >= 0:
                self.block[(b.instance, b.start)] = (o, b.size)
            else:
                self.workspace_block[b.start], self.workspace_device[b.start] = (o, b.size), device
        self.simulation = simulation
        self.instance_at = {inst.computed_at: k for k, inst in enumerate(simulation.instances)}
        self.instances_of: dict[int, list[int]] = {}
        for k, inst in enumerate(simulation.instances):
            self.instances_of.setdefault(inst.node, []).append(k)
        self.current: dict[int, int] = {}  # graph node -> its resident instance
        self.owner = {self.by_name[names[0]]: node_id for node_id, names in captured.fx_names.items()
                      if not captured.graph.node(node_id).caller_owned}
        self.step = -1
        self.node_id = -1
        self.first = False
        self.arenas: dict[str, fx.Node] = {}
        self.bases: dict[tuple[str, torch.dtype], fx.Node] = {}
        self.transients: list[Transient] = []
        self.in_place_ops = 0
        self.scratch_sizes: dict[str, int] = {}  # device -> bytes of the scratch region after its arena
        self.kernel_sites: list[int] = []  # KernelOutputs call sites (kernel_into)

    def _block_device(self, block: Any) -> str:
        """The device whose arena holds ``block``: its traced value's, which must be the one the Graph records."""
        names = self.captured.fx_names.get(block.node) or []
        leaves = tensor_leaves(self.by_name[names[0]].meta.get("val")) if names else []
        traced = str(leaves[0].device) if leaves else None
        if traced is not None and block.device is not None and block.device != traced:
            raise CoopError(f"arena block {block.label} is placed on {block.device}, but its traced value lives on "
                            f"{traced}; the Graph's Node.device is wrong")
        return traced or block.device or "cpu"

    # ---------------------------------------------------------------- the buffer
    def start(self) -> None:
        super().start()
        devices = sorted({str(v.device) for node in self.owner for v in tensor_leaves(node.meta.get("val"))}
                         | set(self.arena_sizes))
        last = [n for n in self.program.nodes if n.op == "placeholder"][-1]
        for device in devices:  # the buffers come in after the flat inputs (ArenaProgram.run)
            with self.program.inserting_after(last):
                last = self.arenas[device] = self.program.placeholder(f"coop_arena_{device.replace(':', '_')}")

    def view_at(self, offset: int, size: int, fake: torch.Tensor, device: str | None = None) -> fx.Node:
        """An fx value: the view of the buffer at ``offset`` shaped like the eager value ``fake`` (on ``device``
        when ``fake`` is a meta tensor standing for a scratch value)."""
        device, dtype = device or str(fake.device), fake.dtype
        extent = view_extent(fake.shape, fake.stride(), dtype) + fake.storage_offset() * fake.element_size()
        if fake.numel() and extent > size:
            raise CoopError(f"arena block of {size} bytes at offset {offset} cannot hold a {list(fake.shape)} "
                            f"{dtype} value ({extent} bytes); the graph's mem for it is wrong")
        if offset % fake.element_size():
            raise CoopError(f"arena offset {offset} is not aligned to {dtype}")
        base = self.bases.get((device, dtype))
        if base is None:
            base = self.program.call_function(aten.view.dtype, (self.arenas[device], dtype))
            self.bases[(device, dtype)] = base
        return self.program.call_function(aten.as_strided.default, (base, list(fake.shape), list(fake.stride()),
                                                                     offset // fake.element_size()))

    def scratch(self, fakes: list[torch.Tensor], offset: int | None = None, size: int | None = None,
                device: str = "cpu") -> list[fx.Node]:
        """Views for values an op needs only while it runs, packed into the region at ``offset`` of ``size``
        bytes (this step's workspace block), or else into the scratch region after the arena (grown to fit)."""
        sizes = [aligned(view_extent(f.shape, f.stride(), f.dtype) + f.storage_offset() * f.element_size())
                 for f in fakes]
        if offset is None or size is None or sum(sizes) > size:
            offset, size = aligned(self.arena_sizes.get(device, 0)), sum(sizes)
            self.scratch_sizes[device] = max(self.scratch_sizes.get(device, 0), size)
        views, at = [], offset
        for fake, nbytes in zip(fakes, sizes, strict=True):
            views.append(self.view_at(at, nbytes, fake, device))
            at += nbytes
        return views

    # ---------------------------------------------------------------- steps
    def run_step(self, index: int, step: Step) -> None:
        """Keep the step, and for a compute the node and the instance it computes, while the step is built."""
        self.step = index
        if step.op != "compute":
            super().run_step(index, step)
            return
        self.node_id, self.first = step.node, step.node not in self.computed
        if index in self.instance_at:
            self.current[step.node] = self.instance_at[index]
        self.compute(index, step.node)  # no implementation: build_arena_program refuses a schedule that names one
        self.node_id = -1

    def emit(self, node: fx.Node) -> None:
        if self.owner.get(node) != self.node_id or node.op != "call_function" or node.target is operator.getitem:
            super().emit(node)
            return
        fake = node.meta.get("val")
        views = self._views(node, fake)
        if views is None:
            super().emit(node)
            return
        self._write(node, fake, views)

    def _views(self, node: fx.Node, fake: Any) -> list[fx.Node | None] | None:
        """Per output (one, or each element of a tuple), its arena view or None; None if nothing is placed."""
        instance = self.instance_at.get(self.step)
        if instance is None or (instance, self.step) not in self.block:
            return None
        offset, size = self.block[(instance, self.step)]
        if isinstance(fake, torch.Tensor):
            return [self.view_at(offset, size, fake)]
        if not isinstance(fake, (tuple, list)) or not tensor_leaves(fake) or not all(
                isinstance(v, torch.Tensor) or v is None for v in fake):
            raise CoopError(f"arena replay cannot place the outputs of {node.name} ({node.target}): "
                            f"{type(fake).__name__}")
        primary = next(i for i, v in enumerate(fake) if isinstance(v, torch.Tensor))
        views: list[fx.Node | None] = [None] * len(fake)
        views[primary] = self.view_at(offset, size, fake[primary])
        if self.first:
            for user in node.users:
                if user.target is operator.getitem and user.args[1] != primary:
                    extra = self.captured.owner_of[user.name]
                    if self.graph_node(extra).output_of != self.node_id:
                        continue
                    for k in self.instances_of.get(extra, []):
                        if (k, self.step) in self.block:
                            views[user.args[1]] = self.view_at(*self.block[(k, self.step)], fake[user.args[1]])
        return views

    def graph_node(self, node_id: int) -> Any:
        return self.schedule_graph.node(node_id)

    def _write(self, node: fx.Node, fake: Any, views: list[fx.Node | None]) -> None:
        """Run ``node`` so that its placed outputs land in their views (in place, or compute then copy)."""
        if node.target in KERNEL_OUTPUT_OPS and tensor_leaves(fake)[0].device.type == "cpu":
            args = fx.node.map_arg(node.args, self.lookup)
            kwargs = dict(fx.node.map_arg(node.kwargs, self.lookup))
            views = self._complete(fake, views) if isinstance(fake, (tuple, list)) else views
            site = kernel_site()
            self.kernel_sites.append(site)
            self.env[node] = self.program.call_function(kernel_into, (site, node.target, tuple(views), *args), kwargs)
            self.in_place_ops += 1
            return
        if node.target not in WORKSPACE_OPS:
            call = self._rewrite(node, fake, self._complete(fake, views))
            if call is not None:
                self.env[node] = self.program.call_function(*call)
                self.in_place_ops += 1
                return
        super().emit(node)
        computed = self.env[node]
        self.env[node] = self.program.call_function(into_views, (computed, tuple(views)))
        self.transients.append(Transient(self.step, self.node_id, str(node.target),
                                         tuple(self._transient_bytes(fake))))

    def _complete(self, fake: Any, views: list[fx.Node | None]) -> list[fx.Node | None]:
        """Views for the outputs nothing keeps (a recomputation's extra outputs): this step's workspace block
        (where the simulator counts them) or the scratch region."""
        missing = [i for i, v in enumerate(views) if v is None and isinstance(fake[i], torch.Tensor)]
        if not missing or fake[missing[0]].device.type != "cpu":
            return views
        workspace = self.workspace_block.get(self.step, (None, None))
        if self.workspace_device.get(self.step) != str(fake[missing[0]].device):
            workspace = (None, None)
        places = self.scratch([fake[i] for i in missing], *workspace, device=str(fake[missing[0]].device))
        completed = list(views)
        for i, view in zip(missing, places, strict=True):
            completed[i] = view
        return completed

    def _rewrite(self, node: fx.Node, fake: Any, views: list[fx.Node | None]) -> tuple | None:
        """(target, args, kwargs) of a call that writes ``node``'s outputs straight into ``views``, or None."""
        target = node.target
        leaves = tensor_leaves(fake)
        if any(v is None for v in views) or leaves[0].device.type != "cpu":
            return self._copy_or_fill(node, fake, views)
        args = fx.node.map_arg(node.args, self.lookup)
        kwargs = dict(fx.node.map_arg(node.kwargs, self.lookup))
        out = OUT_IN_PLACE.get(target)
        if out is not None:
            names = [a.name for a in out._schema.arguments if a.is_out]
            kwargs.update(zip(names, views, strict=True))
            return out, args, kwargs
        if target in COMPOSITES:
            return COMPOSITES[target], (views[0], *args), kwargs
        if target in SCALAR_OUT:
            return SCALAR_OUT[target], args, {"out": views[0]}
        if target is aten.relu.default:  # the CPU relu kernel is clamp_min(x, 0)
            return aten.clamp_min.out, (args[0], 0), {"out": views[0]}
        if target in (aten.arange.default, aten.arange.start, aten.arange.start_step):
            bounds = [0, *node.args[:1], 1] if target is aten.arange.default else [*node.args, 1][:3]
            return aten.arange.start_out, tuple(bounds), {"out": views[0]}
        if target is aten.embedding.default and fake.is_contiguous() and node.args[0].meta["val"].dim() == 2:
            (indices,) = self._contiguous_inputs(node.args[1:2], args[1:2])
            return embedding_into, (views[0], args[0], indices), {}
        if target is aten.embedding_dense_backward.default and not node.args[4] and fake.is_contiguous():
            grad, indices = self._contiguous_inputs(node.args[:2], args[:2])
            return embedding_backward_into, (views[0], grad, indices, *args[2:]), {}
        if target is aten._native_batch_norm_legit_functional.default and len(views) == 5 and not kwargs:
            return batch_norm_into, (tuple(views), *args), {}
        if target is aten._safe_softmax.default and len(args) == 2 and not kwargs and fake.numel():
            dim = args[1] % fake.dim()
            reduced = torch.empty([1 if d == dim else n for d, n in enumerate(fake.shape)], dtype=fake.dtype)
            scratch = self.scratch([reduced, reduced.to(torch.bool)])
            return safe_softmax_into, (views[0], *scratch, args[0], dim), {}
        return self._copy_or_fill(node, fake, views)

    def _contiguous_inputs(self, inputs: tuple, values: tuple) -> list[fx.Node]:
        """Each input as is where it is contiguous, else copied into scratch (what the kernel's own
        ``.contiguous()`` would allocate)."""
        fakes = [i.meta["val"] for i in inputs]
        copies = iter(self.scratch([torch.empty(f.shape, dtype=f.dtype, device="meta") for f in fakes
                                    if not f.is_contiguous()]))
        return [value if fake.is_contiguous() else self.program.call_function(aten.copy_.default, (next(copies), value))
                for fake, value in zip(fakes, values, strict=True)]

    def _copy_or_fill(self, node: fx.Node, fake: Any, views: list[fx.Node | None]) -> tuple | None:
        """Copies, constant fills and coop's dropout draw, on any device."""
        target = node.target
        if not isinstance(fake, torch.Tensor) or views[0] is None:
            return None
        if target in COPIES and same_device_copy(node, fake):
            return aten.copy_.default, (views[0], self.lookup(node.args[0])), {}
        if target in FILLS:
            return aten.fill_.Scalar, (views[0], FILLS[target](node.args, node.kwargs)), {}
        if target is bernoulli_mask_op():  # the custom op's own body: empty(size, bool).bernoulli_(p)
            return aten.bernoulli_.float, (views[0], node.args[1]), {}
        return None

    def _transient_bytes(self, fake: Any) -> list[int]:
        """Bytes of each storage a computed node allocates (the Graph's probed bytes for a single output)."""
        if isinstance(fake, torch.Tensor):
            return [self.graph_node(self.node_id).mem]
        return [t.untyped_storage().nbytes() for t in tensor_leaves(fake)]

    def page_in(self, index: int, node_id: int) -> None:
        """Bring a paged value back into its block for this stay (caller-owned values stay the caller's)."""
        if self.captured.graph.node(node_id).caller_owned:
            return
        base = self.base_of(node_id)
        block = self.block.get((self.current[node_id], index))
        if block is None:
            super().page_in(index, node_id)
            return
        view = self.view_at(*block, base.meta["val"])
        self.env[base] = self.program.call_function(page_in, (self.hosts.pop(node_id),),  # layout and device checked
                                                    {"into": view})
        for node in self.rederived_views(node_id, base):  # re-derive the value's views, as the ordinary page_in does
            super().emit(node)

    def output_slots(self) -> dict[int, list[OutputSlot]]:
        """Two slots after the arena and scratch for the loss, used in turn (a training loop holds the last loss
        while the next step runs); gradients need none: they are handed out in the arena."""
        node = self.captured.output_nodes()[self.captured.loss_index]
        fake = node.meta.get("val") if node is not None else None
        if not isinstance(fake, torch.Tensor):
            return {}
        device = str(fake.device)
        offset = aligned(self.arena_sizes.get(device, 0)) + self.scratch_sizes.get(device, 0)
        size = aligned(view_extent(fake.shape, fake.stride(), fake.dtype))
        return {self.captured.loss_index: [OutputSlot(device, offset + k * size, tuple(fake.shape),
                                                      tuple(fake.stride()), fake.dtype) for k in range(2)]}

    def result(self) -> ArenaProgram:
        params = {name: k for k, (kind, name) in enumerate(self.captured.placeholders) if kind == "param"}
        grad_params = {self.captured.grad_slice.start + k: params[name] for k, name in
                       enumerate(self.captured.grad_names) if name in params}
        nodes = self.captured.output_nodes()
        grad_outputs = [index for index in range(self.captured.grad_slice.start, self.captured.grad_slice.stop)
                        if nodes[index] is not None and isinstance(nodes[index].meta.get("val"), torch.Tensor)]
        return ArenaProgram(self.arena_sizes, sorted(self.arenas), self.transients, self.in_place_ops,
                            self.scratch_sizes, self.output_slots(), grad_params, self.kernel_sites, grad_outputs)


def build_arena_program(captured: Captured, graph: Any, schedule: Schedule, simulation: Simulation,
                        replayed: set[int], placement: Placement) -> tuple[fx.GraphModule, ArenaProgram]:
    """The replay program of ``schedule`` (already legal on ``graph``) writing into one buffer per device.

    Parameters
    ----------
    graph : Graph
        The Graph ``schedule`` is legal on.
    schedule : Schedule
        The schedule replayed (an executor's: extra outputs taken at their op's step).
    simulation : Simulation
        ``simulate(graph, schedule)``: it names the instances the placement places, and checks the placement.
    replayed : set[int]
        The random nodes the schedule recomputes (:func:`coop.runtime.program_builder.replayed_draws`).
    placement : Placement
        The schedule's execution placement (:func:`coop.runtime.placement.execution_placement`).

    Returns
    -------
    tuple[fx.GraphModule, ArenaProgram]
        The program, and what it allocates and the buffers it keeps.
    """
    chosen = next((s for s in schedule.steps
                   if s.op == "compute" and (s.impl is not None or graph.node(s.node).optional)), None)
    if chosen is not None:
        raise CoopError("arena replay does not run operator implementations (MONeT) yet: the schedule computes "
                        f"{chosen}; replay it without arena=True, or plan with another formulation")
    check_placement(captured, graph, schedule, placement, simulation)
    builder = ArenaProgramBuilder(captured, graph, replayed, simulation, placement)
    module = builder.run(schedule)
    return module, builder.result()


__all__ = ["ArenaProgram", "ArenaProgramBuilder", "OutputSlot", "Transient", "build_arena_program",
           "check_placement", "measure_outside"]
