"""The result of a capture: the Graph, the joint fx module, and what a replay needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx, nn

from coop.errors import CoopError
from coop.graph import Graph


class ContextError(CoopError):
    """A step run in a training context its plan cannot honour (the message names the difference and the fix)."""


#: Device types whose autocast state a context records (autocast is per device type).
AUTOCAST_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class TrainingContext:
    """The ambient settings a training step was captured in, which change what eager PyTorch computes.

    The captured program bakes them in (autocast's casts, dropout and batch-norm training
    behaviour, the devices its constants live on), so a replay is only eager-identical in the
    context it was captured in. :meth:`mismatch` decides, per field, whether a step in another
    context can be re-planned or must stop.
    """

    autocast: tuple[tuple[str, str], ...]  # (device type, dtype) for each device type with autocast enabled
    grad_enabled: bool  # torch.is_grad_enabled() and not inference mode
    devices: tuple[str, ...]  # devices of the parameters, buffers and batch tensors
    deterministic: bool  # torch.are_deterministic_algorithms_enabled()
    eval_modules: tuple[str, ...]  # modules in eval mode (dropout and batch norm behave differently)
    state: tuple[tuple[str, tuple[int, ...], str, bool], ...]  # (name, shape, dtype, requires_grad) per tensor

    @classmethod
    def current(cls, model: nn.Module, batch: tuple[torch.Tensor, ...] = ()) -> TrainingContext:
        """The context a step of ``model`` on ``batch`` would run in right now."""
        autocast = tuple((device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
                         for device in AUTOCAST_DEVICES if torch.is_autocast_enabled(device))
        tensors = [*model.parameters(), *model.buffers(), *(t for t in batch if isinstance(t, torch.Tensor))]
        state = tuple((name, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.requires_grad)
                      for name, t in [*model.named_parameters(), *model.named_buffers()])
        return cls(
            autocast=autocast,
            grad_enabled=torch.is_grad_enabled() and not torch.is_inference_mode_enabled(),
            devices=tuple(sorted({str(t.device) for t in tensors})),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            eval_modules=tuple(name or "<model>" for name, m in model.named_modules() if not m.training),
            state=state,
        )

    def mismatch(self, current: TrainingContext) -> str:
        """'' when ``current`` is this context; else what differs, for a re-plan with a warning.

        Raises ContextError (one line, the difference and the fix) where no re-plan can help:

        * grad mode off (``torch.no_grad`` / ``inference_mode``): eager ``loss.backward()`` fails
          there too, so a training step in it is a mistake, not a context to plan for;
        * another device: the budget is bytes of the device the plan was made for, so a plan for
          the new device needs its own budget (and its own profile).

        Re-planned (captured again in the new context, same budget): autocast on/off or another
        autocast dtype (capture under autocast records its casts, and replays bit-identically to
        eager autocast), modules switched between train() and eval() (dropout and batch-norm
        statistics), parameters frozen, cast or resized, and the deterministic-algorithms setting
        (the kernels follow it at run time; a re-capture proves the program is unchanged).
        """
        if not current.grad_enabled:
            raise ContextError("plan.step ran with gradients disabled (torch.no_grad or torch.inference_mode), where "
                               "no training step can run; call it outside that block (use the model itself to evaluate)")
        if current.devices != self.devices:
            raise ContextError(f"plan.step got tensors on {', '.join(current.devices)}, the plan was made for "
                               f"{', '.join(self.devices)}; make a new plan with coop.plan after moving the model and batch")
        return "; ".join(self._differences(current))

    def _differences(self, current: TrainingContext) -> list[str]:
        changes = []
        if current.autocast != self.autocast:
            changes.append(f"autocast is {_autocast_text(current.autocast)}, the plan was captured with "
                           f"{_autocast_text(self.autocast)}")
        if current.eval_modules != self.eval_modules:
            changes.append(f"modules in eval mode are {_names_text(current.eval_modules)}, the plan was captured "
                           f"with {_names_text(self.eval_modules)}")
        if current.state != self.state:
            changed = next(new for new, old in zip(current.state, self.state, strict=False) if new != old) \
                if len(current.state) == len(self.state) else None
            what = f" ({changed[0]} is now {list(changed[1])} {changed[2]}, requires_grad={changed[3]})" if changed else ""
            changes.append(f"the model's parameters or buffers changed{what}")
        if current.deterministic != self.deterministic:
            changes.append(f"torch.use_deterministic_algorithms is {current.deterministic}, the plan was captured with "
                           f"{self.deterministic}")
        return changes


def _autocast_text(autocast: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"on for {device} ({dtype})" for device, dtype in autocast) if autocast else "off"


def _names_text(names: tuple[str, ...]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "") if names else "none"


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
