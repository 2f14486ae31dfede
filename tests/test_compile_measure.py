"""The measuring steps of coop.compile leave the user's random generator where it was (coop.compiled.measure).

Oracle: the CPU generator's state, read by torch before and after each measuring step of a module that draws a
dropout mask in its forward: a step that draws from the user's generator moves it, and the user's next draws (their
training's dropout masks) would differ from what they get without coop.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from coop.compiled.measure import extern_calls, held_bytes, step_seconds, warm_up


class DropoutSum(torch.nn.Module):
    """``sum(dropout(w * x))``: one Bernoulli draw from the CPU generator per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.w * x, 0.5, training=True).sum()


MEASURES: dict[str, Callable[[torch.nn.Module, torch.Tensor], object]] = {
    "held_bytes": lambda module, batch: held_bytes(module, batch, None),
    "step_seconds": lambda module, batch: step_seconds(module, batch, None, steps=2),
    "warm_up": lambda module, batch: warm_up(module, batch, None, compilations=lambda: 0),
    "extern_calls": lambda module, batch: extern_calls(module, batch, None),
}


@pytest.mark.parametrize("measure", sorted(MEASURES))
def test_a_measuring_step_leaves_the_cpu_generator_where_it_was(measure: str) -> None:
    module, batch = DropoutSum(), torch.ones(64)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    module(batch)  # the forward draws: the oracle's generator moves
    assert not torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(7)
    MEASURES[measure](module, batch)
    assert torch.equal(torch.get_rng_state(), before)
    assert module.w.grad is None
