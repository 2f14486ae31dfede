"""The eager-PyTorch oracle shared by tests of plans that choose implementations: train a plan and a deep copy
of the model side by side and compare every loss, gradient and parameter bit for bit, with the meter's peak."""

from __future__ import annotations

import torch
from torch import nn

from coop.runtime.meter import MemoryMeter


def assert_steps_equal_eager(trained, model: nn.Module, eager: nn.Module, batch: tuple, steps: int = 3) -> None:
    """``steps`` AdamW steps of ``trained`` (a coop plan of ``model``) against ``eager`` (an untouched deep copy
    of ``model`` whose forward returns the loss): losses, gradients and parameters torch.equal after every
    step, and the metered peak of each planned step within the plan's prediction."""
    optimizer, eager_optimizer = torch.optim.AdamW(model.parameters()), torch.optim.AdamW(eager.parameters())
    for step in range(steps):
        flat = trained.captured.flat_inputs(model, batch)
        with MemoryMeter() as meter:
            meter.track(*flat, *trained.captured.constants())
            loss = trained.step(*batch)
        eager_loss = eager(*batch)
        eager_loss.backward()
        assert torch.equal(loss, eager_loss.detach()) and meter.peak_bytes <= trained.predicted_peak, step
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), (step, name)
        optimizer.step(), eager_optimizer.step()
        optimizer.zero_grad(), eager_optimizer.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager.parameters(), strict=True))


def assert_step_equals_eager(loss: torch.Tensor, eager_loss: torch.Tensor, model: nn.Module, eager: nn.Module,
                             step: int) -> None:
    """One step's loss and every gradient of ``model`` torch.equal to eager's (``eager_loss`` after its backward)."""
    assert torch.equal(loss, eager_loss.detach()), step
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), (step, name)
