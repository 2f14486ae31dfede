"""The result of a capture: the Graph, the joint fx module, and what a replay needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx, nn

from coop.graph import Graph
from coop.graph_capture.context import TrainingContext


@dataclass
class Captured:
    """A captured training step.

    ``graph`` is the coop Graph; ``module`` the fx GraphModule of the joint step, whose flat
    inputs are ``placeholders`` (``(kind, name)`` with kind param/frozen/buffer/input; ``name``
    the dotted name in the model or ``batch[i]``) and whose flat outputs are the loss, the
    gradient of each parameter in ``grad_names`` and the new value of each buffer in
    ``buffer_names``. ``fx_names[node_id]`` lists the fx nodes a Graph node owns: the
    storage-producing node first, then the folded views/getitems in program order.
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

    @property
    def flops(self) -> int:
        """Total FLOPs of one step (forward + backward), FlopCounterMode's formulas."""
        return sum(self.node_flops.values())

    @property
    def loss_index(self) -> int:
        """Position of the loss among the flat outputs (always first)."""
        return 0

    @property
    def grad_slice(self) -> slice:
        return slice(1, 1 + len(self.grad_names))

    @property
    def buffer_slice(self) -> slice:
        start = 1 + len(self.grad_names)
        return slice(start, start + len(self.buffer_names))

    def flat_inputs(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """The module's flat inputs for this model's current tensors and a batch."""
        state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        values = []
        for kind, name in self.placeholders:
            values.append(batch[int(name[6:-1])] if kind == "input" else state[name])
        return values

    def constants(self) -> list[torch.Tensor]:
        """Constant tensors of the traced module (caller-owned ``buffer`` nodes named ``constant:*``)."""
        return [getattr(self.module, n.target) for n in self.module.graph.nodes if n.op == "get_attr"]

    def run(self, model: nn.Module, *batch: torch.Tensor) -> list:
        """Run the captured module (program order) on real tensors: flat outputs."""
        with torch.no_grad():
            return self.module(*self.flat_inputs(model, batch))
