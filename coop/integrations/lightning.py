"""Lightning on a coop plan: ``Trainer(callbacks=[CoopCallback(0.6)])`` is the one line that turns it on.

The callback plans the ``LightningModule``'s step on the first batch ``training_step`` gets and from then on runs
``plan.step`` in its place: the captured loss is ``training_step(batch, batch_idx)`` (or its ``"loss"``) divided by
``accumulate_grad_batches``, exactly the tensor Lightning back-propagates (Lightning's own division is skipped for it), so the gradients that land in ``p.grad`` are
eager's bit for bit. Lightning zeroes gradients between ``training_step`` and ``backward``, so the step's gradients
are held until the module's ``backward``, which adds them (as autograd does) in place of back-propagating; Lightning's
accumulation, clipping, optimizer and scheduler run unchanged. ``precision="bf16-mixed"`` (autocast around
``training_step``) is captured with its casts. Refused in one line when fitting starts: manual optimization, fp16
loss scaling (``precision="16-mixed"``), and any strategy but a single device (DDP, FSDP, DeepSpeed).

What a replay does not run is the step's Python: ``self.log`` inside ``training_step`` is skipped under coop (log
from ``on_train_batch_end``, whose ``outputs["loss"]`` is the step's loss), and the step is captured at the first
``batch_idx``, so it must not branch on it. Works with ``lightning.pytorch`` and ``pytorch_lightning`` (either or both installed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from coop.errors import CoopError
from coop.integrations import rng_untouched
from coop.planner.plan import plan as make_plan


def _callback_bases() -> tuple[type, ...]:
    """``Callback`` of each Lightning installed: ``lightning.pytorch`` and ``pytorch_lightning`` are separate copies
    whose Trainers accept only their own callbacks, so the callback derives from both where both are there (the
    ``lightning`` extra installs ``pytorch-lightning``)."""
    bases = []
    try:
        import pytorch_lightning  # lazy: an optional extra

        bases.append(pytorch_lightning.Callback)
    except ImportError:
        pass
    try:
        import lightning.pytorch  # lazy: an optional extra

        bases.append(lightning.pytorch.Callback)
    except ImportError:
        pass
    if not bases:
        raise ImportError("coop.integrations.lightning needs Lightning: pip install coop-remat[lightning]")
    return tuple(bases)


class CoopCallback(*_callback_bases()):
    """Runs a ``LightningModule``'s ``training_step`` + backward through a coop plan made on the first batch.

    Parameters
    ----------
    budget : str or float
        The plan's memory budget, as :func:`coop.plan` reads it (``0.6``: 0.6 of the step's no-remat peak).
    **plan_options : Any
        Passed to :func:`coop.plan` (``formulation``, ``time_limit``, ...).
    """

    def __init__(self, budget: str | float, **plan_options: Any) -> None:
        self.budget = budget
        self.plan_options = plan_options
        self.plan: Any = None
        # (parameter, the gradient coop's step computed), held from training_step to backward
        self._pending: list[tuple[nn.Parameter, torch.Tensor | None]] = []
        self._loss: torch.Tensor | None = None  # the last normalized loss coop's step returned

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse what coop cannot run, then route the module's ``training_step`` and ``backward`` through coop."""
        refuse_unsupported(trainer, pl_module)
        original_step, original_backward = pl_module.training_step, pl_module.backward

        def training_step(batch: Any, batch_idx: int, *rest: Any) -> torch.Tensor:
            return self._step(trainer, pl_module, original_step, batch, batch_idx, *rest)

        def backward(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if loss.requires_grad:  # not a loss coop returned
                original_backward(loss, *args, **kwargs)
            else:
                self._accumulate()

        pl_module.training_step, pl_module.backward = training_step, backward
        # Lightning divides training_step's loss by accumulate_grad_batches; coop's step returns it divided already
        loop = trainer.fit_loop.epoch_loop.automatic_optimization
        base = loop.output_result_cls
        callback = self

        class Normalized(base):
            @classmethod
            def from_training_step_output(cls, output: Any, normalize: int = 1) -> Any:
                if output is not None and output is callback._loss:
                    return cls(output)
                return super().from_training_step_output(output, normalize)

        loop.output_result_cls = Normalized

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Give the module its own ``training_step`` and ``backward`` back."""
        for name in ("training_step", "backward"):
            pl_module.__dict__.pop(name, None)
        trainer.fit_loop.epoch_loop.automatic_optimization.__dict__.pop("output_result_cls", None)

    def _step(self, trainer: Any, pl_module: nn.Module, original: Any, batch: Any, batch_idx: int,
              *rest: Any) -> torch.Tensor:
        divisor = int(trainer.accumulate_grad_batches)
        # Lightning's precision plugin runs training_step under autocast and backward outside it: the captured
        # step enters autocast around training_step only, and plan.step runs with it off
        autocast = ambient_autocast()
        step_batch = {"batch": batch, "divisor": divisor, "autocast": autocast}
        if self.plan is None:
            def loss_fn(model: nn.Module, batch: Any, divisor: int, autocast: tuple[tuple[str, str], ...]) -> Any:
                with _autocast(autocast, True):
                    output = original(batch, batch_idx, *rest)
                loss = output["loss"] if isinstance(output, Mapping) else output
                return loss / divisor  # as Lightning's ClosureResult normalizes it

            # capture and the plan's measuring run draw random numbers: Lightning's stream stays untouched
            with rng_untouched(), _no_logging(pl_module), _autocast(autocast, False):
                self.plan = make_plan(pl_module, self.budget, step_batch, loss_fn=loss_fn, **self.plan_options)
        # Lightning zeroes the gradients between training_step and backward (on an accumulation window's first
        # batch): the step's gradients wait, and backward adds them as autograd's AccumulateGrad would
        params = [p for p in pl_module.parameters() if p.requires_grad]
        held = [p.grad for p in params]
        for param in params:
            param.grad = None
        with _autocast(autocast, False):
            loss = self.plan.step(step_batch)
        self._pending = [(param, param.grad) for param in params]
        for param, grad in zip(params, held, strict=True):
            param.grad = grad
        self._loss = loss.detach()
        return self._loss

    def _accumulate(self) -> None:
        """Add the gradients of the last step into ``p.grad`` (set where None), as eager's backward does."""
        for param, grad in self._pending:
            if grad is None:
                continue
            if param.grad is None:
                param.grad = grad
            else:
                param.grad.add_(grad)
        self._pending = []


def ambient_autocast() -> tuple[tuple[str, str], ...]:
    """(device type, dtype) of each device type with autocast on right now (cpu and cuda).

    Returns
    -------
    tuple of (str, str)
        E.g. ``(("cpu", "bfloat16"),)`` inside ``torch.autocast("cpu", torch.bfloat16)``; empty where it is off.
    """
    return tuple((device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
                 for device in ("cpu", "cuda") if torch.is_autocast_enabled(device))


@contextlib.contextmanager
def _autocast(autocast: tuple[tuple[str, str], ...], enabled: bool) -> Iterator[None]:
    """``autocast``'s device types with autocast on (at their dtypes) or off."""
    with contextlib.ExitStack() as stack:
        for device, dtype in autocast:
            stack.enter_context(torch.autocast(device, dtype=getattr(torch, dtype), enabled=enabled))
        yield


@contextlib.contextmanager
def _no_logging(module: Any) -> Iterator[None]:
    """``self.log`` and ``self.log_dict`` as no-ops while the step is traced (on fake tensors)."""
    module.log = module.log_dict = lambda *args, **kwargs: None
    try:
        yield
    finally:
        module.__dict__.pop("log", None)
        module.__dict__.pop("log_dict", None)


def refuse_unsupported(trainer: Any, pl_module: Any) -> None:
    """Stop with one CoopError line where the Lightning trainer is set up for something coop's step cannot run.

    Parameters
    ----------
    trainer : lightning.pytorch.Trainer
        The trainer about to fit.

    Raises
    ------
    CoopError
        Manual optimization, fp16 loss scaling, a strategy other than a single device.
    """
    strategy = type(trainer.strategy).__name__
    refused = [
        (not pl_module.automatic_optimization, "manual optimization (its training_step calls manual_backward)"),
        (getattr(trainer.precision_plugin, "scaler", None) is not None,
         "fp16 loss scaling (GradScaler); use precision='bf16-mixed', which coop captures"),
        (strategy != "SingleDeviceStrategy", f"the {strategy} (coop's callback runs on one device)"),
    ]
    for hit, what in refused:
        if hit:
            raise CoopError(f"coop's Lightning callback cannot run {what}; fit without CoopCallback there")
