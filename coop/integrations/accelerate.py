"""Accelerate's own training loop on a coop plan: ``loss = coop_step(batch)`` in place of
``loss = model(**batch).loss; accelerator.backward(loss)``.

:class:`CoopBackward` plans on the first batch it gets; the captured loss is the model's (or ``loss_fn``'s) divided by
``accelerator.gradient_accumulation_steps``, exactly what ``accelerator.backward`` back-propagates, so inside
``accelerator.accumulate(model)`` the gradients, the skipped optimizer steps and ``clip_grad_norm_`` behave as without
coop. It returns that divided loss. Refused in one line: DeepSpeed, FSDP, Megatron-LM, fp16 loss scaling
(GradScaler), several processes. (The Hugging Face Trainer has its own path: :mod:`coop.integrations.transformers`.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from coop.errors import CoopError
from coop.integrations import rng_untouched
from coop.planner.plan import plan as make_plan


class CoopBackward:
    """Forward + ``accelerator.backward`` of one batch through a coop plan made on the first batch.

    Parameters
    ----------
    accelerator : accelerate.Accelerator
        The accelerator the loop uses (its ``gradient_accumulation_steps`` divides the loss, as its ``backward`` does).
    model : nn.Module
        The model ``accelerator.prepare`` returned.
    budget : str or float
        The plan's memory budget (:func:`coop.plan`).
    loss_fn : callable or None
        ``loss_fn(model, batch)`` returns the loss; None: the model's output (or its ``.loss``) on the batch (a dict:
        keyword arguments, a tuple or list: positional ones, else one argument).
    **plan_options : Any
        Passed to :func:`coop.plan`.
    """

    def __init__(self, accelerator: Any, model: nn.Module, budget: str | float,
                 loss_fn: Callable[..., torch.Tensor] | None = None, **plan_options: Any) -> None:
        self.accelerator = accelerator
        self.model = model
        self.budget = budget
        self.loss_fn = loss_fn
        self.plan_options = plan_options
        self.plan: Any = None

    def __call__(self, batch: Any) -> torch.Tensor:
        """Run the step on ``batch``; gradients accumulate into ``p.grad``; returns the divided loss, detached."""
        refuse_unsupported(self.accelerator)
        step_batch = {"batch": batch, "divisor": int(self.accelerator.gradient_accumulation_steps)}
        if self.plan is None:
            user_loss = self.loss_fn

            def loss_fn(model: nn.Module, batch: Any, divisor: int) -> torch.Tensor:
                if user_loss is not None:
                    loss = user_loss(model, batch)
                else:
                    output = model(**batch) if isinstance(batch, Mapping) else \
                        model(*batch) if isinstance(batch, tuple | list) else model(batch)
                    loss = output if isinstance(output, torch.Tensor) else output["loss"] \
                        if isinstance(output, Mapping) else output.loss
                return loss / divisor  # as accelerator.backward divides it

            # capture and the plan's measuring run draw random numbers: the loop's stream stays untouched
            with rng_untouched():
                self.plan = make_plan(self.model, self.budget, step_batch, loss_fn=loss_fn, **self.plan_options)
        return self.plan.step(step_batch).detach()


def refuse_unsupported(accelerator: Any) -> None:
    """Stop with one CoopError line where ``accelerator`` is set up for something coop's step cannot run.

    Parameters
    ----------
    accelerator : accelerate.Accelerator
        The loop's accelerator.

    Raises
    ------
    CoopError
        DeepSpeed, FSDP, Megatron-LM, fp16 loss scaling, several processes.
    """
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    refused = [
        (accelerator.scaler is not None, "fp16 loss scaling (GradScaler); use mixed_precision='bf16'"),
        (kind.upper() in {"DEEPSPEED", "FSDP", "MEGATRON_LM"}, f"{kind} (it runs its own backward or shards)"),
        (accelerator.num_processes > 1, "several processes (untested here; use coop.plan with DDP)"),
    ]
    for hit, what in refused:
        if hit:
            raise CoopError(f"coop's Accelerate step cannot run {what}; call accelerator.backward without coop there")
