"""coop in a plain Accelerate loop (issue 28, item 2): ``loss = coop_step(batch)`` in place of
``loss = model(**batch).loss; accelerator.backward(loss)`` inside ``accelerator.accumulate(model)``: BERT-tiny from a
config (dropout on), 64 synthetic examples, gradient accumulation 2, 3 optimizer steps (AdamW, clipping); the divided
losses, every gradient the optimizer applies and the final weights torch.equal to the loop without coop."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

pytest.importorskip("accelerate", reason="the Accelerate step needs accelerate (pip install coop-remat[transformers])")

from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from coop.errors import LastResortWarning
from coop.integrations.accelerate import CoopBackward
from tests.integration_models import bert_tiny, synthetic_dataset

STEPS = 3
ACCUMULATION = 2


@pytest.fixture(params=[{"formulation": "checkpoint-all"}, pytest.param({"time_limit": 10}, marks=pytest.mark.slow)],
                ids=["checkpoint-all", "auto"])
def options(request: pytest.FixtureRequest) -> dict:
    """The plan's options: the fast tier plans with a baseline (no solver time; at 0.6 it recomputes), the slow tier
    with auto's ladder (10 s of solver time a round); the Accelerate step's path and the oracles are the same."""
    return request.param


def run(with_coop: bool, options: dict | None = None):
    set_seed(7)
    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, cpu=True)
    model = bert_tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(synthetic_dataset(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    coop_step = CoopBackward(accelerator, model, 0.6, **(options or {}))
    losses, gradients = [], []
    for batch in loader:
        with accelerator.accumulate(model):
            if with_coop:
                loss = coop_step(batch)
            else:
                loss = model(**batch).loss
                accelerator.backward(loss)
                loss = loss.detach() / ACCUMULATION  # what accelerator.backward back-propagated
            losses.append(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            optimizer.step()
            optimizer.zero_grad()
        if len(gradients) == STEPS:
            break
    return model, losses, gradients, coop_step


def test_a_coop_step_in_an_accelerate_loop_is_bit_identical_at_0_6_of_the_peak(options: dict) -> None:
    model, losses, gradients, _ = run(with_coop=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="coop")
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        coop_model, coop_losses, coop_gradients, coop_step = run(with_coop=True, options=options)
    plan = coop_step.plan
    assert plan.simulation.recomputations > 0, plan.note
    assert plan.predicted_peak <= plan.budget <= math.ceil(0.6 * plan.baseline_peak)
    assert len(coop_losses) == len(losses) == STEPS * ACCUMULATION
    for index, (loss, expected) in enumerate(zip(coop_losses, losses, strict=True)):
        assert torch.equal(loss, expected), f"micro-batch {index}"
    for step, (grads, expected) in enumerate(zip(coop_gradients, gradients, strict=True)):
        assert grads.keys() == expected.keys()
        for name in expected:
            assert torch.equal(grads[name], expected[name]), f"optimizer step {step}: gradient of {name}"
    for (name, param), expected in zip(coop_model.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(param, expected), f"final weight {name}"
