"""The result of a capture: the Graph, the joint fx module, and what a replay needs.

A replay (the static executor, the dynamic fallback) runs :attr:`Captured.module`'s program in
some order and hands its flat outputs back here: :meth:`Captured.write_back` is the one place
that turns them into what eager ``loss.backward()`` leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from coop.errors import CaptureError
from coop.graph import Graph
from coop.graph_capture.alternatives import ImplProgram
from coop.graph_capture.batch import BatchLayout, positional_batch
from coop.graph_capture.context import TrainingContext
from coop.graph_capture.fsdp import Sharding
from coop.graph_capture.lower import output_nodes

#: How a replay's gradients reach ``.grad`` when not by plain accumulation: ``release(params, grads)``
#: (a DistributedDataParallel reducer, :class:`coop.runtime.executor.GradientSync`).
GradientRelease = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


@dataclass
class Captured:
    """A captured training step.

    ``graph`` is the coop Graph; ``module`` the fx GraphModule of the joint step, whose flat
    inputs are ``placeholders`` (``(kind, name)`` with kind param/frozen/buffer/input; ``name``
    the dotted name in the model, or the label ``batch[i]`` of a batch tensor) and whose flat
    outputs are the loss, the gradient of each parameter in ``grad_names`` and the new value of
    each buffer in ``buffer_names``. ``fx_names[node_id]`` lists the fx nodes a Graph node owns:
    the storage-producing node first, then the folded views/getitems in program order.
    """

    graph: Graph
    module: fx.GraphModule
    placeholders: list[tuple[str, str]]
    grad_names: list[str]
    buffer_names: list[str]
    fx_names: dict[int, list[str]]
    owner_of: dict[str, int]
    node_flops: dict[int, int]
    batch_shapes: list[tuple[tuple[int, ...], torch.dtype]] = field(default_factory=list)
    capture_s: float = 0.0
    context: TrainingContext | None = None  # what the step was captured in (None: not recorded)
    #: MONeT's alternatives (capture(..., alternatives=True)): node id -> implementation name -> the fx
    #: program that replaces the node's owning fx node, and optional value id -> the program computing it.
    impl_fx: dict[int, dict[str, ImplProgram]] = field(default_factory=dict)
    optional_fx: dict[int, ImplProgram] = field(default_factory=dict)
    #: how the model is called from the batch's tensors (keyword arguments, nesting, non-tensor values); None:
    #: ``model(*batch)`` (:mod:`coop.graph_capture.batch`)
    batch_layout: BatchLayout | None = None
    #: the model's FSDP units where FSDP shards it (:mod:`coop.graph_capture.fsdp`): the parameter placeholders are
    #: shards and the gradient outputs (``grad_names``: one per unit) are the reduced shards FSDP keeps in ``.grad``
    sharding: Sharding | None = None

    @property
    def layout(self) -> BatchLayout:
        """The batch layout the step was captured with (positional tensors where none was recorded)."""
        if self.batch_layout is None:
            self.batch_layout = positional_batch(tuple(torch.empty(shape, dtype=dtype, device="meta")
                                                       for shape, dtype in self.batch_shapes)).layout
        return self.batch_layout

    @property
    def flops(self) -> int:
        """Total FLOPs of one step (forward + backward), FlopCounterMode's formulas."""
        return sum(self.node_flops.values())

    # ---------------------------------------------------------------- flat outputs
    @property
    def loss_index(self) -> int:
        """Position of the loss among the flat outputs (always first)."""
        return 0

    @property
    def grad_slice(self) -> slice:
        """Positions of the parameter gradients (``grad_names`` order) among the flat outputs."""
        return slice(1, 1 + len(self.grad_names))

    @property
    def buffer_slice(self) -> slice:
        """Positions of the new buffer values (``buffer_names`` order) among the flat outputs."""
        start = 1 + len(self.grad_names)
        return slice(start, start + len(self.buffer_names))

    def output_nodes(self) -> list[fx.Node | None]:
        """The fx nodes of the flat outputs (None for a constant output): loss, gradients, buffers."""
        return output_nodes(self.module.graph)

    def write_back(self, model: nn.Module, outputs: Sequence[Any], release: GradientRelease | None = None,
                   state: Mapping[str, torch.Tensor] | None = None) -> Any:
        """The one write-back of a replayed step into ``model``; returns the loss.

        New buffer values (BatchNorm statistics) are copied in once. Gradients add to ``.grad``
        as ``loss.backward()`` would, so micro-batches accumulate (a parameter the loss does not reach has no
        gradient output, None, and its ``.grad`` is left as it was); with ``release`` (a DDP
        reducer) they are handed to it instead, which accumulates and all-reduces them. ``state`` is
        :meth:`model_state` of ``model`` when the caller already has it (one walk of the module tree per step).
        """
        params = buffers = state if state is not None else self.model_state(model)
        with torch.no_grad():
            for name, value in zip(self.buffer_names, outputs[self.buffer_slice], strict=True):
                if value is not buffers[name]:
                    buffers[name].copy_(value)
        grads = list(outputs[self.grad_slice])
        if self.sharding is not None:  # the step's reduce-scatters handed the gradients to FSDP already
            if release is None:
                raise CaptureError("a step of an FSDP-sharded model hands its gradients to FSDP as it runs; replay it "
                                   "through coop.plan, whose step finishes FSDP's backward")
            release([], grads)
            return outputs[self.loss_index]
        targets = [params[name] for name in self.grad_names]
        if release is not None:
            release(targets, grads)
            return outputs[self.loss_index]
        with torch.no_grad():
            for param, grad in zip(targets, grads, strict=True):
                if grad is None:  # a parameter the loss does not reach: eager leaves its .grad as it was
                    continue
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad += grad
        return outputs[self.loss_index]

    # ---------------------------------------------------------------- flat inputs
    def flat_inputs(self, model: nn.Module, batch: tuple[torch.Tensor, ...],
                    state: Mapping[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """The module's flat inputs for this model's current tensors (``state``: :meth:`model_state`, when the
        caller already has it) and a batch."""
        return flat_values(self.placeholders, state if state is not None else self.model_state(model), batch)

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers by name (their names never collide), in one walk of its modules;
        under FSDP (``sharding``) each sharded parameter is the rank's padded local shard the step reads."""
        state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        if self.sharding is not None:
            state.update(self.sharding.shard_state())
        return state

    def constants(self) -> list[torch.Tensor]:
        """Constant tensors of the traced module (caller-owned ``buffer`` nodes named ``constant:*``)."""
        return [getattr(self.module, n.target) for n in self.module.graph.nodes if n.op == "get_attr"]

    def run(self, model: nn.Module, *batch: torch.Tensor) -> list:
        """Run the captured module (program order) on real tensors: flat outputs."""
        with torch.no_grad():
            return self.module(*self.flat_inputs(model, batch))


def batch_positions(placeholders: Sequence[tuple[str, str]]) -> list[int]:
    """Index of each batch tensor's placeholder among the flat inputs, ``batch[0]`` first.

    The trace lays the batch out after the model's state, in batch order
    (:func:`coop.graph_capture.trace.flat_names`): the i-th ``input`` placeholder is ``batch[i]``.

    Parameters
    ----------
    placeholders : sequence of (str, str)
        ``(kind, name)`` of each flat placeholder, in order.

    Returns
    -------
    list of int
        The positions of the ``input`` placeholders, in order.
    """
    return [position for position, (kind, _) in enumerate(placeholders) if kind == "input"]


def flat_values(placeholders: Sequence[tuple[str, str]], state: Mapping[str, torch.Tensor],
                batch: Sequence[Any]) -> list[Any]:
    """The flat inputs of a captured step: ``state`` (parameters, buffers by name) and the batch.

    Parameters
    ----------
    placeholders : sequence of (str, str)
        ``(kind, name)`` of each flat placeholder, in order.
    state : Mapping of str to torch.Tensor
        Parameters and buffers by name; every non-``input`` placeholder's name must be in it.
    batch : sequence
        The batch, one value per ``input`` placeholder.

    Returns
    -------
    list
        One value per placeholder, in placeholder order.
    """
    values: list[Any] = [None if kind == "input" else state[name] for kind, name in placeholders]
    for position, value in zip(batch_positions(placeholders), batch, strict=True):
        values[position] = value
    return values
