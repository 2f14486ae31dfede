"""Plan files (coop/planner/plan_files.py): what a plan file records and why a load is refused, in one line."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import coop
from coop.errors import CoopError


class Net(nn.Module):
    """A model whose forward takes the inputs only: the loss is ``loss_fn``'s."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.second = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def test_a_plan_made_with_a_loss_fn_names_loss_fn_when_loaded_without_one(tmp_path) -> None:
    """issue 40: such a load failed inside the model ("Net.forward() takes 2 positional arguments but 3 were
    given"); the file records that a loss_fn made the loss, and the load names ``loss_fn=``."""
    torch.manual_seed(0)
    model, batch = Net(), (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    path = tmp_path / "plan.json"
    coop.plan(model, 1.0, batch, loss_fn=cross_entropy, formulation="store-all").save(path)
    assert json.loads(path.read_text())["loss_fn"] == "cross_entropy"
    with pytest.raises(CoopError) as refused:
        coop.load_plan(path, model)
    message = str(refused.value)
    assert "loss_fn=" in message and "cross_entropy" in message and "\n" not in message
    loaded = coop.load_plan(path, model, loss_fn=cross_entropy)  # with it, the plan loads and steps
    assert isinstance(loaded.step(*batch), torch.Tensor)


def test_a_plan_made_without_a_loss_fn_records_none(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(16, 4))
    batch = (torch.randn(8, 16),)
    path = tmp_path / "plan.json"

    class Summed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).sum()

    summed = Summed()
    coop.plan(summed, 1.0, batch, formulation="store-all").save(path)
    assert json.loads(path.read_text())["loss_fn"] is None
    assert coop.load_plan(path, summed).schedule is not None
