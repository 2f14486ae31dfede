"""A torch.compile'd module (issue 28, item 3): coop plans its ``_orig_mod`` with a warning, or with ``strict=True``
refuses it in one line. The oracle is eager PyTorch on a deep copy of the uncompiled model."""

from __future__ import annotations

import copy

import pytest
import torch

import coop
from coop.errors import CaptureError
from coop.zoo import build


def test_a_compiled_module_is_planned_through_its_original_with_a_warning() -> None:
    model, batch, loss_fn = build("mlp")
    eager = copy.deepcopy(model)
    compiled = torch.compile(model)
    with pytest.warns(UserWarning, match=r"torch.compile'd module and plans its uncompiled model._orig_mod: coop's "
                                         r"replay replaces the compiled step.*strict=True"):
        plan = coop.plan(compiled, 1.0, batch, loss_fn=loss_fn, formulation="store-all")
    assert plan.model is model  # the parameters the compiled module trains
    for step in range(2):
        torch.manual_seed(step)
        loss = plan.step(*batch)
        torch.manual_seed(step)
        reference = eager(*batch) if loss_fn is None else loss_fn(eager, *batch)
        reference.backward()
        assert torch.equal(loss, reference.detach()), step
        for (name, param), other in zip(compiled.named_parameters(), eager.parameters(), strict=True):
            assert torch.equal(param.grad, other.grad), (step, name)


def test_strict_refuses_a_compiled_module_in_one_line() -> None:
    model, batch, loss_fn = build("mlp")
    with pytest.raises(CaptureError, match=r"^coop cannot plan a torch.compile'd module \(coop replays its own program "
                                           r"of the eager step\); pass the uncompiled module \(model._orig_mod\) to "
                                           r"coop.plan$") as error:
        coop.plan(torch.compile(model), 1.0, batch, loss_fn=loss_fn, formulation="store-all", strict=True)
    assert "\n" not in str(error.value)
