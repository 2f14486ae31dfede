"""Hugging Face ``Trainer`` on a coop plan: ``enable(trainer, 0.6)`` is the one line that turns it on.

The plan is made on the first batch ``training_step`` sees and every micro-batch runs ``plan.step`` in place of
``compute_loss`` + ``accelerator.backward``: the captured loss is exactly what the Trainer back-propagates
(``compute_loss`` with its ``num_items_in_batch``, then divided by the gradient accumulation steps where the Trainer
divides, and by Accelerate's own accumulation steps where ``accelerator.backward`` does), so the gradients that land
in ``p.grad`` are eager's bit for bit and the Trainer's accumulation, clipping, optimizer and scheduler run unchanged.
The Trainer's mixed precision (``bf16=True``: Accelerate wraps the model's forward in ``torch.autocast``) is captured
with its casts. What coop cannot run is refused in one line when the first step starts: DeepSpeed, FSDP, fp16 loss
scaling (GradScaler), several processes or GPUs, context parallelism, SageMaker model parallelism, LOMO optimizers.
The divisors are part of the plan's batch (as flags), so a last accumulation group of another size is captured
again for them (coop warns), never replayed with the wrong scale.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import Trainer

from coop.errors import CoopError
from coop.integrations import rng_untouched
from coop.planner.plan import plan as make_plan


class CoopStep:
    """``Trainer.training_step`` through a coop plan made on the first micro-batch.

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

    def __call__(self, trainer: Any, model: nn.Module, inputs: dict[str, Any],
                 num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """One micro-batch's forward + backward, as ``Trainer.training_step`` runs it; returns the scaled loss."""
        refuse_unsupported(trainer)
        model.train()
        if hasattr(trainer.optimizer, "train") and callable(trainer.optimizer.train):
            trainer.optimizer.train()
        inputs = trainer._prepare_inputs(inputs)
        batch = {"inputs": dict(inputs), "num_items_in_batch": num_items_in_batch,
                 "divisors": _divisors(trainer, num_items_in_batch)}
        with trainer.compute_loss_context_manager():
            if self.plan is None:
                # capture and the plan's measuring run draw random numbers: the Trainer's stream stays untouched
                with rng_untouched():
                    self.plan = make_plan(model, self.budget, batch, loss_fn=_trainer_loss(trainer),
                                          **self.plan_options)
            loss = self.plan.step(batch)
        return loss.detach()


def _divisors(trainer: Any, num_items_in_batch: torch.Tensor | int | None) -> tuple[int, ...]:
    """What ``training_step`` and ``accelerator.backward`` divide the loss by, in their order (1s left out)."""
    scaled = getattr(trainer, "loss_is_scaled_for_ga", None)  # a Trainer attribute since transformers 5.19
    if scaled is None:
        scaled = (trainer.model_accepts_loss_kwargs and num_items_in_batch is not None) \
            or trainer.compute_loss_func is not None
    steps = getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
    divisors = [] if scaled else [int(steps)]
    divisors.append(int(trainer.accelerator.gradient_accumulation_steps))
    return tuple(d for d in divisors if d != 1)


def _trainer_loss(trainer: Any) -> Any:
    def loss_fn(model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any, divisors: tuple[int, ...]) -> Any:
        loss = trainer.compute_loss(model, dict(inputs), num_items_in_batch=num_items_in_batch)
        for divisor in divisors:
            loss = loss / divisor
        return loss

    return loss_fn


def refuse_unsupported(trainer: Any) -> None:
    """Stop with one CoopError line where the Trainer is set up for something coop's step cannot run.

    Parameters
    ----------
    trainer : transformers.Trainer
        The Trainer about to run a step.

    Raises
    ------
    CoopError
        DeepSpeed, FSDP, fp16 loss scaling, several processes or GPUs, context or SageMaker model parallelism, LOMO.
    """
    accelerator = trainer.accelerator
    refused = [
        (getattr(trainer, "is_deepspeed_enabled", False), "DeepSpeed (it runs its own backward)"),
        (getattr(trainer, "is_fsdp_enabled", False), "FSDP (coop plans unsharded parameters)"),
        (accelerator.scaler is not None, "fp16 loss scaling (GradScaler); use bf16=True, which coop captures"),
        (trainer.args.n_gpu > 1, "DataParallel over several GPUs"),
        (accelerator.num_processes > 1, "several processes (untested with the Trainer; use coop.plan with DDP)"),
        (getattr(trainer, "get_cp_size", lambda: 1)() > 1, "context parallelism"),
        (getattr(accelerator, "has_lomo_optimizer", False), "LOMO optimizers (they step inside backward)"),
    ]
    try:
        from transformers.trainer import is_sagemaker_mp_enabled  # lazy: only where the Trainer module has it
        refused.append((is_sagemaker_mp_enabled(), "SageMaker model parallelism"))
    except ImportError:
        pass
    for hit, what in refused:
        if hit:
            raise CoopError(f"coop's Trainer integration cannot run {what}; train without coop.integrations there")


def enable(trainer: Trainer, budget: str | float, **plan_options: Any) -> Trainer:
    """Turn coop on for ``trainer``: its ``training_step`` runs through a plan made on the first micro-batch.

    Parameters
    ----------
    trainer : transformers.Trainer
        Any Trainer (or subclass) instance, before ``train()``.
    budget : str or float
        The memory budget (:func:`coop.plan`: bytes, ``"6GiB"``, or a fraction of the no-remat peak such as 0.6).
    **plan_options : Any
        Passed to :func:`coop.plan`.

    Returns
    -------
    transformers.Trainer
        ``trainer`` itself; the plan is ``trainer.coop_step.plan`` once the first step ran.
    """
    step = CoopStep(budget, **plan_options)
    trainer.coop_step = step
    trainer.training_step = lambda model, inputs, num_items_in_batch=None: step(trainer, model, inputs,
                                                                                 num_items_in_batch)
    return trainer


class CoopTrainer(Trainer):
    """A ``Trainer`` whose steps run through coop: ``CoopTrainer(..., coop_budget=0.6)``.

    Parameters
    ----------
    *args : Any
        As for ``transformers.Trainer``.
    coop_budget : str or float
        The memory budget (:func:`coop.plan`).
    coop_options : dict or None
        Passed to :func:`coop.plan`.
    **kwargs : Any
        As for ``transformers.Trainer``.
    """

    def __init__(self, *args: Any, coop_budget: str | float = 0.6, coop_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.coop_step = CoopStep(coop_budget, **(coop_options or {}))

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """``Trainer.training_step`` through the coop plan (:class:`CoopStep`)."""
        return self.coop_step(self, model, inputs, num_items_in_batch)
