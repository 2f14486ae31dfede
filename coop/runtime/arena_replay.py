"""Arena replay: every planned value of a step lives at its planned offset in one buffer per device.

A static plan knows each value's size, birth and death before the step runs, and
:func:`coop.online.static_arena.execution_placement` gives every instance an address (best fit,
Zhang et al. 2023, "Coop: Memory is not a Commodity", applied to a static schedule; blocks rounded
to :data:`~coop.online.static_arena.ARENA_ALIGNMENT` bytes, extra outputs placed from their op's
step). :class:`ArenaProgramBuilder` writes the executor's replay program so that the step
allocates one uint8 buffer per device of the arena's size and materializes each value as an
``as_strided`` view at its offset, with the dtype, shape and strides the eager kernel gives it.

How a value gets into its view was measured per op on the zoo models and transformers GPT-2,
BERT, Llama, ViT, MobileNetV2 and ResNet (CPU, torch 2.13; the issue-15 report has the table):

* **Out kernels.** An op whose ``.out`` overload has a native CPU kernel that writes the given
  tensor and allocates nothing (``torch.profiler`` memory events, and the out tensor keeps its
  data pointer) runs as ``op.out(..., out=view)``: :data:`OUT_IN_PLACE`, bit-identical to the
  functional call. Many ``.out`` overloads (``convolution``, ``relu``, ``native_layer_norm``,
  ``native_batch_norm_backward``, ``embedding``, ``mul.Scalar`` ...) are generated wrappers
  (CompositeExplicitAutograd) that call the functional op and copy its result: the transient
  allocation would happen inside the kernel, where no meter sees it, so they are not used.
* **Copies.** ``clone``, ``lift_fresh_copy`` and same-device ``_to_copy`` are ``view.copy_(x)``.
* **Compute, then copy.** Every other op runs as in the ordinary replay and its result is copied
  into the view; the op's own output is a transient allocation that lives for that one op. These
  transients are not in the plan's simulation, so they are reported, never hidden:
  :attr:`ArenaProgram.transients` lists each with its step, op and bytes, and
  ``predicted_peak`` adds the largest to the arena and the caller-owned bytes.

The outputs of the step (loss, gradients, new buffers) are views into the step's arena: the arena
is released when the last of them dies (``optimizer.zero_grad()`` setting ``.grad`` to None).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from coop.errors import CoopError
from coop.graph_capture import Captured
from coop.online.static_arena import Placement, schedule_lifetimes
from coop.runtime.executor import _ProgramBuilder, _Unavailable
from coop.schedule import Schedule, Simulation

aten = torch.ops.aten

#: Functional op -> ``.out`` overload measured to write ``out`` in place and allocate nothing on CPU.
OUT_IN_PLACE: dict[Any, Any] = {
    aten._log_softmax.default: aten._log_softmax.out,
    aten._log_softmax_backward_data.default: aten._log_softmax_backward_data.out,
    aten._softmax.default: aten._softmax.out,
    aten._softmax_backward_data.default: aten._softmax_backward_data.out,
    aten.add.Tensor: aten.add.out,
    aten.addmm.default: aten.addmm.out,
    aten.bitwise_not.default: aten.bitwise_not.out,
    aten.bmm.default: aten.bmm.out,
    aten.cat.default: aten.cat.out,
    aten.cos.default: aten.cos.out,
    aten.gather.default: aten.gather.out,
    aten.gelu.default: aten.gelu.out,
    aten.gelu_backward.default: aten.gelu_backward.grad_input,
    aten.hardtanh.default: aten.hardtanh.out,
    aten.hardtanh_backward.default: aten.hardtanh_backward.grad_input,
    aten.le.Tensor: aten.le.Tensor_out,
    aten.max_pool2d_with_indices.default: aten.max_pool2d_with_indices.out,
    aten.max_pool2d_with_indices_backward.default: aten.max_pool2d_with_indices_backward.grad_input,
    aten.mm.default: aten.mm.out,
    aten.mul.Tensor: aten.mul.out,
    aten.neg.default: aten.neg.out,
    aten.nll_loss_backward.default: aten.nll_loss_backward.grad_input,
    aten.nll_loss_forward.default: aten.nll_loss_forward.output,
    aten.pow.Tensor_Scalar: aten.pow.Tensor_Scalar_out,
    aten.silu.default: aten.silu.out,
    aten.silu_backward.default: aten.silu_backward.grad_input,
    aten.sin.default: aten.sin.out,
    aten.sum.dim_IntList: aten.sum.IntList_out,
    aten.tanh.default: aten.tanh.out,
    aten.tanh_backward.default: aten.tanh_backward.grad_input,
    aten.threshold_backward.default: aten.threshold_backward.grad_input,
    aten.tril.default: aten.tril.out,
    aten.where.self: aten.where.self_out,
}

#: Ops whose result is a plain copy of their (first) input: written with ``view.copy_(input)``.
COPIES = {aten.clone.default, aten.lift_fresh_copy.default, aten._to_copy.default}

#: Ops that make a constant tensor: written with ``view.fill_(value)``; the value from the op's arguments.
FILLS: dict[Any, Callable[[tuple, dict], Any]] = {
    aten.ones.default: lambda args, kwargs: 1,
    aten.ones_like.default: lambda args, kwargs: 1,
    aten.zeros.default: lambda args, kwargs: 0,
    aten.zeros_like.default: lambda args, kwargs: 0,
    aten.full.default: lambda args, kwargs: args[1],
    aten.scalar_tensor.default: lambda args, kwargs: args[0],
}

#: Ops with a Python-number operand whose functional form wraps the number and calls the tensor op's
#: kernel: written with that op's in-place ``.out`` kernel on the same wrapped number.
SCALAR_OUT = {aten.mul.Scalar: aten.mul.out, aten.div.Scalar: aten.div.out}


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
class ArenaProgram:
    """What an arena replay allocates: ``arena_bytes`` per device, and the transients it reports."""

    arena_bytes: int
    base: int  # the placement's address of the arena's first byte (caller-owned values sit below it)
    devices: list[str]
    transients: list[Transient]
    in_place_ops: int  # fx nodes written straight into the arena (out kernels and copies)

    @property
    def max_transient(self) -> int:
        return max((t.nbytes for t in self.transients), default=0)


def check_placement(captured: Captured, graph: Any, schedule: Schedule, placement: Placement) -> None:
    """Refuse (one CoopError line) a placement that is not this schedule's execution placement or overlaps."""
    if not isinstance(placement, Placement):
        raise CoopError(f"arena= takes a Placement from coop.online.static_arena.execution_placement, not "
                        f"{type(placement).__name__}")
    alignment = int(placement.extra.get("alignment", 1) or 1)
    if alignment < 16 or not placement.extra.get("extras_from_op"):
        raise CoopError("arena replay needs a placement made by coop.online.static_arena.execution_placement "
                        f"(aligned blocks, extra outputs from their op's step); this one has alignment {alignment}")
    expected, _ = schedule_lifetimes(graph, schedule, alignment=alignment, extras_from_op=True)
    if expected != placement.lifetimes or len(placement.offsets) != len(expected):
        raise CoopError("arena placement was made for another schedule (its blocks differ from this schedule's); "
                        "place the executor's own schedule (executor.schedule) with execution_placement")
    top = max((o + b.size for o, b in zip(placement.offsets, expected, strict=True)), default=0)
    if placement.arena_peak < top:
        raise CoopError(f"arena of {placement.arena_peak} bytes is too small for its placement, whose blocks reach "
                        f"{top} bytes; use the placement's own arena_peak")
    if any(o % alignment for o in placement.offsets) or any(o < 0 for o in placement.offsets):
        raise CoopError(f"arena placement has offsets that are negative or not multiples of its alignment {alignment}")
    placement.check()


class ArenaProgramBuilder(_ProgramBuilder):
    """The executor's program builder, writing each planned value into its view of the step's arena."""

    def __init__(self, captured: Captured, graph: Any, replayed: set[int], simulation: Simulation,
                 placement: Placement) -> None:
        super().__init__(captured, graph, replayed)
        placed = [(b, o) for b, o in zip(placement.lifetimes, placement.offsets, strict=True) if b.instance >= 0]
        self.base = min((o for _, o in placed), default=0)
        self.arena_bytes = max((o + b.size for b, o in placed), default=0) - self.base
        self.block = {(b.instance, b.start): (o - self.base, b.size) for b, o in placed}
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

    # ---------------------------------------------------------------- the arena
    def start(self) -> None:
        super().start()
        devices = sorted({str(v.device) for node in self.owner for v in _tensor_leaves(node.meta.get("val"))})
        size = -(-self.arena_bytes // 64) * 64
        for device in devices:
            self.arenas[device] = self.program.call_function(
                aten.empty.memory_format, ([size],), {"dtype": torch.uint8, "device": torch.device(device)})

    def view_at(self, offset: int, size: int, fake: torch.Tensor) -> fx.Node:
        """An fx value: the view of the arena at ``offset`` shaped like the eager value ``fake``."""
        device, dtype = str(fake.device), fake.dtype
        extent = fake.element_size() * (fake.storage_offset() + 1 + sum((s - 1) * st for s, st in
                                                                          zip(fake.shape, fake.stride()) if s))
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

    # ---------------------------------------------------------------- steps
    def run(self, schedule: Schedule) -> fx.GraphModule:
        self.start()
        for index, step in enumerate(schedule.steps):
            self.step = index
            if step.op == "compute":
                self.node_id, self.first = step.node, step.node not in self.computed
                if index in self.instance_at:
                    self.current[step.node] = self.instance_at[index]
                self.compute(index, step.node)
                self.node_id = -1
            elif step.op == "free":
                self.drop(step.node, f"freed at step {index}")
            elif step.op == "page_out":
                self.page_out(step.node)
            else:
                self.page_in_arena(index, step.node)
        return self.finish()

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
        if not isinstance(fake, (tuple, list)) or not _tensor_leaves(fake) or not all(
                isinstance(v, torch.Tensor) or v is None for v in fake):
            raise CoopError(f"arena replay cannot place the outputs of {node.name} ({node.target}): "
                            f"{type(fake).__name__}")
        primary = next(i for i, v in enumerate(fake) if isinstance(v, torch.Tensor))
        views: list[fx.Node | None] = [None] * len(fake)
        views[primary] = self.view_at(offset, size, fake[primary])
        if not self.first:
            return views  # a recomputation drops its extra outputs: they stay transient
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
        """Run ``node`` so that its placed outputs land in their views (out kernel, copy, or compute then copy)."""
        target = node.target
        out = OUT_IN_PLACE.get(target)
        if out is not None and str(_tensor_leaves(fake)[0].device) == "cpu" and all(v is not None for v in views):
            names = [a.name for a in out._schema.arguments if a.is_out]
            args = fx.node.map_arg(node.args, self.lookup)
            kwargs = dict(fx.node.map_arg(node.kwargs, self.lookup))
            kwargs.update(zip(names, views, strict=True))
            self.env[node] = self.program.call_function(out, args, kwargs)
            self.in_place_ops += 1
            return
        in_place = self._in_place(node, fake, views)
        if in_place is not None:
            self.env[node] = self.program.call_function(*in_place)
            self.in_place_ops += 1
            return
        super().emit(node)
        computed = self.env[node]
        self.env[node] = self.program.call_function(_into_views, (computed, tuple(views)))
        self.transients.append(Transient(self.step, self.node_id, str(target), tuple(self._transient_bytes(fake))))

    def _in_place(self, node: fx.Node, fake: Any, views: list[fx.Node | None]) -> tuple | None:
        """(target, args, kwargs) of a call that writes a single-output node straight into its view, or None."""
        target = node.target
        if not isinstance(fake, torch.Tensor) or views[0] is None:
            return None
        args = fx.node.map_arg(node.args, self.lookup)
        if target in COPIES and _same_device_copy(node, fake):
            return aten.copy_.default, (views[0], args[0]), {}
        if target in FILLS:
            return aten.fill_.Scalar, (views[0], FILLS[target](node.args, node.kwargs)), {}
        if target in SCALAR_OUT and fake.device.type == "cpu":
            return SCALAR_OUT[target], args, {"out": views[0]}
        if target is aten.relu.default and fake.device.type == "cpu":  # the CPU relu kernel is clamp_min(x, 0)
            return aten.clamp_min.out, (args[0], 0), {"out": views[0]}
        if target is bernoulli_mask_op():  # the custom op's own body: empty(size, bool).bernoulli_(p)
            return aten.bernoulli_.float, (views[0], node.args[1]), {}
        return None

    def _transient_bytes(self, fake: Any) -> list[int]:
        """Bytes of each storage a computed node allocates (the Graph's probed bytes for a single output)."""
        if isinstance(fake, torch.Tensor):
            return [self.graph_node(self.node_id).mem]
        return [t.untyped_storage().nbytes() for t in _tensor_leaves(fake)]

    def page_in_arena(self, index: int, node_id: int) -> None:
        """Bring a paged value back into its block for this stay (caller-owned values stay the caller's)."""
        if self.captured.graph.node(node_id).caller_owned:
            return
        base = self._base(node_id)
        block = self.block.get((self.current[node_id], index))
        if block is None:
            self.page_in(node_id)
            return
        view = self.view_at(*block, base.meta["val"])
        self.env[base] = self.program.call_function(aten.copy_.default, (view, self.hosts.pop(node_id)))
        for node in self.group(node_id):  # re-derive the value's views, as the ordinary page_in does
            if self.position[node] > self.position[base] and all(
                a in self.env and not isinstance(self.env[a], _Unavailable) for a in node.all_input_nodes
            ):
                super().emit(node)

    def result(self) -> ArenaProgram:
        return ArenaProgram(self.arena_bytes, self.base, sorted(self.arenas), self.transients, self.in_place_ops)


def _same_device_copy(node: fx.Node, fake: torch.Tensor) -> bool:
    source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return (isinstance(source, torch.Tensor) and source.device == fake.device and fake.layout == torch.strided
            and source.shape == fake.shape)


def bernoulli_mask_op() -> Any:
    """coop's bool dropout draw (:mod:`coop.graph_capture.random_ops`), registered when capture is imported."""
    return torch.ops.coop.bernoulli_mask.default


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _into_views(computed: Any, views: tuple[torch.Tensor | None, ...]) -> Any:
    """Copy a computed value (a tensor or a tuple) into its arena views; unplaced outputs stay as computed."""
    if isinstance(computed, torch.Tensor):
        return views[0].copy_(computed)
    return tuple(c if v is None or c is None else v.copy_(c) for v, c in zip(views, computed, strict=True))


def build_arena_program(captured: Captured, graph: Any, schedule: Schedule, simulation: Simulation,
                        replayed: set[int], placement: Placement) -> tuple[fx.GraphModule, ArenaProgram]:
    """The replay program of ``schedule`` (already legal on ``graph``) writing into one arena per device."""
    chosen = next((s for s in schedule.steps if s.op == "compute" and (s.impl is not None or graph.node(s.node).optional)),
                  None)
    if chosen is not None:
        raise CoopError(f"arena replay does not run operator implementations (MONeT) yet: the schedule computes {chosen}; "
                        "replay it without arena=True, or plan with another formulation")
    check_placement(captured, graph, schedule, placement)
    builder = ArenaProgramBuilder(captured, graph, replayed, simulation, placement)
    module = builder.run(schedule)
    return module, builder.result()


__all__ = ["COPIES", "OUT_IN_PLACE", "ArenaProgram", "ArenaProgramBuilder", "Transient", "build_arena_program",
           "check_placement"]
