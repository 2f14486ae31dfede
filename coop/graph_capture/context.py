"""The training context a step is captured in: autocast, grad mode, devices, deterministic kernels, module modes.

A captured program bakes its context in, so a replay equals eager PyTorch only in that context;
:meth:`TrainingContext.mismatch` decides, per field, whether another context is re-planned for or refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from coop.errors import ContextError

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
        named = [*model.named_parameters(), *model.named_buffers()]  # one walk of the module tree for both uses
        tensors = [*(t for _, t in named), *(t for t in batch if isinstance(t, torch.Tensor))]
        state = tuple((name, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.requires_grad)
                      for name, t in named)
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
