"""coop's Lightning callback (issue 28, item 2): a LightningModule training BERT-tiny (from a config, dropout on) on a
64-example synthetic dataset with accumulate_grad_batches=2 for 3 optimizer steps (AdamW, gradient clipping), with
``callbacks=[CoopCallback(0.6)]`` against the same script without it: every micro-batch's loss (``outputs["loss"]``),
every gradient the optimizer sees and the final weights torch.equal."""

from __future__ import annotations

import functools
import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from coop.errors import CoopError, LastResortWarning
from tests.integration_models import bert_tiny, synthetic_dataset

STEPS = 3
ACCUMULATION = 2


@pytest.fixture(params=[{"formulation": "checkpoint-all"}, pytest.param({"time_limit": 10}, marks=pytest.mark.slow)],
                ids=["checkpoint-all", "auto"])
def options(request: pytest.FixtureRequest) -> dict:
    """The plan's options: the fast tier plans with a baseline (no solver time; at 0.6 it recomputes), the slow tier
    with auto's ladder (10 s of solver time a round); the callback's path and the oracles are the same."""
    return request.param


@functools.cache
def lightning() -> SimpleNamespace:
    """Lightning, coop's callback and this file's module and callback classes, made when a test first runs: importing
    Lightning takes about 6 s, which the pytest-xdist worker that does not run this file no longer pays at collection."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = pytest.importorskip("pytorch_lightning", reason="the Lightning callback needs lightning or "
                                 "pytorch-lightning (pip install coop-remat[lightning])")
    from coop.integrations.lightning import CoopCallback  # its class derives from Lightning's

    class MaskedLM(pl.LightningModule):
        """BERT-tiny for masked LM as a LightningModule: the step returns the model's ``.loss``."""

        def __init__(self) -> None:
            super().__init__()
            self.model = bert_tiny()

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Recorder(pl.Callback):
        def __init__(self) -> None:
            self.gradients: list[dict[str, torch.Tensor]] = []
            self.losses: list[torch.Tensor] = []

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.gradients.append({n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None})

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.losses.append(outputs["loss"].clone())

    return SimpleNamespace(pl=pl, MaskedLM=MaskedLM, Recorder=Recorder, CoopCallback=CoopCallback)


def run(with_coop: bool, precision: str = "32-true", options: dict | None = None):
    """The script; ``with_coop`` adds the callback (with the plan's ``options``). Returns the module, the recorder
    and the coop callback."""
    pl = lightning().pl
    pl.seed_everything(7, verbose=False)
    module = lightning().MaskedLM()
    recorder = lightning().Recorder()
    coop_callback = lightning().CoopCallback(0.6, **(options or {}))
    loader = DataLoader(synthetic_dataset(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7))
    trainer = pl.Trainer(max_steps=STEPS, accumulate_grad_batches=ACCUMULATION, gradient_clip_val=1.0,
                         accelerator="cpu", devices=1, precision=precision, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[recorder, *([coop_callback] if with_coop else [])])
    trainer.fit(module, loader)
    return module, recorder, coop_callback


def assert_same_training(coop_run, plain_run) -> None:
    module, recorder, _ = coop_run
    eager, reference, _ = plain_run
    assert len(recorder.losses) == len(reference.losses) == STEPS * ACCUMULATION
    for index, (loss, expected) in enumerate(zip(recorder.losses, reference.losses, strict=True)):
        assert torch.equal(loss, expected), f"micro-batch {index}: loss {loss.item()} != {expected.item()}"
    assert len(recorder.gradients) == len(reference.gradients) == STEPS
    for step, (grads, expected) in enumerate(zip(recorder.gradients, reference.gradients, strict=True)):
        assert grads.keys() == expected.keys()
        for name in expected:
            assert torch.equal(grads[name], expected[name]), f"optimizer step {step}: gradient of {name}"
    for (name, param), expected in zip(module.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(param, expected), f"final weight {name}"


def test_a_coop_callback_trains_bit_identically_at_0_6_of_the_peak(options: dict) -> None:
    plain = run(with_coop=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="coop")  # no re-plan, no online fallback
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        coop_run = run(with_coop=True, options=options)
    plan = coop_run[2].plan
    assert plan.simulation.recomputations > 0, plan.note
    assert plan.predicted_peak <= plan.budget <= math.ceil(0.6 * plan.baseline_peak)
    assert plan.step_footprint <= plan.budget, plan.note
    assert "training_step" not in coop_run[0].__dict__  # the module's own step is given back after fit
    assert_same_training(coop_run, plain)


def test_bf16_mixed_precision_is_captured_and_bit_identical(options: dict) -> None:
    plain = run(with_coop=False, precision="bf16-mixed")
    coop_run = run(with_coop=True, precision="bf16-mixed", options=options)
    assert_same_training(coop_run, plain)


def test_manual_optimization_is_refused_in_one_line() -> None:
    module = lightning().MaskedLM()
    module.automatic_optimization = False
    callback = lightning().CoopCallback(0.6, time_limit=10)
    trainer = lightning().pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                     enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    with pytest.raises(CoopError, match="manual optimization") as caught:
        trainer.fit(module, DataLoader(synthetic_dataset(8), batch_size=8))
    assert "\n" not in str(caught.value)
