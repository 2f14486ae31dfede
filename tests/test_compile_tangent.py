"""The loss's gradient is held to the end of the compiled backward, and a budget of the whole peak fits.

Autograd hands the compiled backward its gradients as the arguments of one call, held until it returns; a Graph
that frees the loss's gradient after its last reader plans 4 B less than the step holds, and ``coop.compile`` at
1.0 of the peak missed its budget by those 4 B in every round (a plain install's first call, 2026-12-01).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

import coop
from tests.independent_meter import HeldBytes

BATCH, IN, HIDDEN, OUT = 16, 64, 128, 10
F32 = 4


class _MeanSquareStep(nn.Module):
    """Linear-ReLU-Linear whose forward returns the loss (a scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.m = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x).pow(2).mean()


def _hand_counted_peak() -> int:
    """The step's peak, counted by hand: at the first layer's weight gradient, what is held is the parameters, the
    batch, the three gradients written so far and the one being written, the ReLU's masked gradient, the loss
    and its gradient."""
    parameters = (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT) * F32
    batch = BATCH * IN * F32
    gradients = parameters
    masked = BATCH * HIDDEN * F32
    loss_and_its_gradient = 2 * F32
    return parameters + batch + gradients + masked + loss_and_its_gradient


def test_a_budget_of_the_whole_peak_fits_the_compiled_step_as_the_allocator_measures_it() -> None:
    torch.manual_seed(0)
    model, batch = _MeanSquareStep(), torch.randn(BATCH, IN)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = coop.compile(model, 1.0, example_batch=(batch,), rounds=1, time_limit=10)
    plan = compiled.coop_record.plans[-1]
    assert plan.baseline_peak == _hand_counted_peak(), compiled.coop_record.summary()
    for _ in range(2):
        compiled(batch).backward()
    model.zero_grad(set_to_none=True)
    with HeldBytes(held=[*model.parameters(), batch]) as meter:
        compiled(batch).backward()
    assert meter.peak_bytes == _hand_counted_peak(), compiled.coop_record.summary()
