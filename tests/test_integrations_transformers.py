"""coop's Hugging Face Trainer integration (issue 28, item 2): a Trainer script that enables coop with one line
(``enable(trainer, 0.6)``) against the same script without it: BERT-tiny from a config (dropout on), a 64-example
synthetic dataset, gradient accumulation 2, 3 optimizer steps (AdamW, linear schedule, gradient clipping): every
micro-batch's loss and every gradient the optimizer sees torch.equal, and the final weights torch.equal."""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="the Trainer integration needs transformers (coop-remat[transformers])")
if importlib.util.find_spec("accelerate") is None:
    pytest.skip("transformers' Trainer needs accelerate (pip install coop-remat[transformers])", allow_module_level=True)

from transformers import Trainer, TrainerCallback, TrainingArguments

from coop.errors import CoopError, LastResortWarning
from coop.integrations.transformers import CoopTrainer, enable
from tests.integration_models import bert_tiny, synthetic_dataset

STEPS = 3
ACCUMULATION = 2


@pytest.fixture(params=[{"formulation": "checkpoint-all"}, pytest.param({"time_limit": 10}, marks=pytest.mark.slow)],
                ids=["checkpoint-all", "auto"])
def options(request: pytest.FixtureRequest) -> dict:
    """The plan's options: the fast tier plans with a baseline (no solver time; at 0.6 it recomputes), the slow tier
    with auto's ladder (10 s of solver time a round); the Trainer's path and the oracles are the same."""
    return request.param


class Recorder(TrainerCallback):
    """The gradients the optimizer is about to apply, at every optimizer step."""

    def __init__(self) -> None:
        self.gradients: list[dict[str, torch.Tensor]] = []
        self.model = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.gradients.append({name: p.grad.clone() for name, p in self.model.named_parameters()
                               if p.grad is not None})


def arguments(tmp_path, **extra) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                             gradient_accumulation_steps=ACCUMULATION, max_steps=STEPS, learning_rate=1e-3,
                             max_grad_norm=1.0, seed=7, report_to="none", save_strategy="no", logging_strategy="no",
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, **extra)


def run(tmp_path, with_coop: bool, trainer_class=Trainer, options: dict | None = None, **extra):
    """The training script; ``with_coop`` adds its one line (with the plan's ``options``). Returns the model, its
    gradients, losses, trainer."""
    model = bert_tiny()
    recorder = Recorder()
    recorder.model = model
    kwargs = {"coop_budget": 0.6, "coop_options": dict(options or {})} if trainer_class is CoopTrainer \
        else {}
    trainer = trainer_class(model=model, args=arguments(tmp_path, **extra), train_dataset=synthetic_dataset(),
                            callbacks=[recorder], **kwargs)
    if with_coop:
        enable(trainer, 0.6, **(options or {}))  # the one line
    losses = []
    step = trainer.training_step
    trainer.training_step = lambda *a, **k: losses.append(step(*a, **k)) or losses[-1]
    trainer.train()
    return model, recorder.gradients, losses, trainer


def assert_same_training(coop_run, plain_run) -> None:
    model, gradients, losses, _ = coop_run
    eager, eager_gradients, eager_losses, _ = plain_run
    assert len(losses) == len(eager_losses) == STEPS * ACCUMULATION
    for index, (loss, reference) in enumerate(zip(losses, eager_losses, strict=True)):
        assert torch.equal(loss, reference), f"micro-batch {index}: loss {loss.item()} != {reference.item()}"
    assert len(gradients) == len(eager_gradients) == STEPS
    for step, (grads, reference) in enumerate(zip(gradients, eager_gradients, strict=True)):
        assert grads.keys() == reference.keys()
        for name in reference:
            assert torch.equal(grads[name], reference[name]), f"optimizer step {step}: gradient of {name}"
    for (name, param), reference in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(param, reference), f"final weight {name}"


def test_one_line_enables_coop_in_a_trainer_script_bit_identical_at_0_6_of_the_peak(tmp_path, options) -> None:
    plain = run(tmp_path / "plain", with_coop=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="coop")  # no re-plan, no online fallback: one plan throughout
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        coop_run = run(tmp_path / "coop", with_coop=True, options=options)
    plan = coop_run[3].coop_step.plan
    assert plan.simulation.recomputations > 0, plan.note
    assert plan.predicted_peak <= plan.budget <= math.ceil(0.6 * plan.baseline_peak)
    assert plan.step_footprint <= plan.budget, plan.note  # the step as run (caller-owned values + allocations)
    assert_same_training(coop_run, plain)


def test_coop_trainer_subclass_matches_the_plain_trainer(tmp_path, options) -> None:
    plain = run(tmp_path / "plain", with_coop=False)
    coop_run = run(tmp_path / "coop", with_coop=False, trainer_class=CoopTrainer, options=options)
    plan = coop_run[3].coop_step.plan
    assert plan.predicted_peak <= plan.budget <= math.ceil(0.6 * plan.baseline_peak)
    assert_same_training(coop_run, plain)


# 45 s on 2 loaded cores (three Trainer runs); the fast tier keeps the capture under bf16 autocast and its oracle
# (tests/test_integrations_lightning.py::test_bf16_mixed_precision_is_captured_and_bit_identical) and this Trainer's
# path (test_one_line_enables_coop_in_a_trainer_script_bit_identical_at_0_6_of_the_peak)
@pytest.mark.slow
def test_bf16_autocast_is_captured_and_bit_identical(tmp_path, options) -> None:
    """``bf16=True``: Accelerate wraps the model's forward in ``torch.autocast("cpu", torch.bfloat16)``; coop captures
    the casts inside it (the run's losses differ from fp32 training's, so autocast was on) and replays them."""
    fp32_losses = run(tmp_path / "fp32", with_coop=False)[2]
    plain = run(tmp_path / "plain", with_coop=False, bf16=True)
    assert not all(torch.equal(a, b) for a, b in zip(plain[2], fp32_losses, strict=True))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="coop")
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        coop_run = run(tmp_path / "coop", with_coop=True, options=options, bf16=True)
    assert_same_training(coop_run, plain)


def test_fp16_loss_scaling_is_refused_in_one_line(tmp_path) -> None:
    trainer = Trainer(model=bert_tiny(), args=arguments(tmp_path), train_dataset=synthetic_dataset())
    enable(trainer, 0.6, time_limit=10)
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu")  # what fp16=True sets up on a GPU
    with pytest.raises(CoopError, match="fp16 loss scaling") as caught:
        trainer.train()
    assert "\n" not in str(caught.value)
