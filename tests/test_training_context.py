"""The training context a plan was captured in is honoured by plan.step.

The oracle is eager PyTorch run in the context of the step: ``loss.backward()`` under the same
``torch.autocast``, train/eval mode, frozen parameters and deterministic setting. A plan stepped
in its own context must be bit-identical to it; stepped in another one it must either warn and
still be bit-identical to eager in the new context, or stop with one ContextError line.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
from torch import nn

import coop
from coop.errors import CaptureError, CoopError, LastResortWarning
from coop.formulations import BASELINES
from coop.zoo import build
from tests.plan_budgets import accepted_budget

BF16 = {"device_type": "cpu", "dtype": torch.bfloat16}


def autocast(enabled: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(**BF16, enabled=enabled)


def eager_loss(model: nn.Module, batch: tuple[torch.Tensor, ...], context=contextlib.nullcontext) -> torch.Tensor:
    """PyTorch's AMP recipe: the forward (and loss) inside ``context``, the backward outside it."""
    with context():
        loss = model(*batch)
    loss.backward()
    return loss.detach()


def assert_steps_equal_eager(model, eager, plan, batch, context, steps: int = 2) -> None:
    """``steps`` SGD steps in ``context``: loss, gradients, buffers and parameters equal eager's."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    for step in range(steps):
        torch.manual_seed(step)
        expected = eager_loss(eager, batch, context)
        torch.manual_seed(step)
        with context():
            loss = plan.step(*batch)
        assert torch.equal(loss, expected), step
        for (name, param), eager_param in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (param.grad is None) == (eager_param.grad is None), name
            assert param.grad is None or torch.equal(param.grad, eager_param.grad), (step, name)
        for buffer, eager_buffer in zip(model.buffers(), eager.buffers(), strict=True):
            assert torch.equal(buffer, eager_buffer), step
        for opt in (optimizer, eager_optimizer):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param, eager_param)


def planned(name: str = "transformer", budget: float = 0.9, formulation: str = "chen-greedy", capture_autocast=False):
    model, batch, _ = build(name)
    eager = copy.deepcopy(model)
    with autocast(capture_autocast):
        plan = coop.plan(model, budget, batch, formulation=formulation)
    return model, eager, plan, batch


@pytest.mark.parametrize("formulation", ["chen-greedy", "dynamic"])
def test_captured_and_stepped_under_autocast_equal_eager_autocast(formulation: str) -> None:
    budget = 0.9 if formulation != "dynamic" else 1.0  # online eviction needs room for fragmentation
    model, eager, plan, batch = planned(budget=budget, formulation=formulation, capture_autocast=True)
    assert plan.formulation.startswith(formulation)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same context: no re-plan
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        assert_steps_equal_eager(model, eager, plan, batch, lambda: autocast(True))


@pytest.mark.parametrize("formulation", ["chen-greedy", "dynamic"])
def test_stepped_under_autocast_it_was_not_captured_in_warns_and_equals_eager_autocast(formulation: str) -> None:
    budget = 0.9 if formulation != "dynamic" else 1.0  # online eviction needs room for fragmentation
    model, eager, plan, batch = planned(budget=budget, formulation=formulation, capture_autocast=False)
    with pytest.warns(UserWarning, match=r"autocast is on for cpu \(bfloat16\), the plan was captured with off"):
        assert_steps_equal_eager(model, eager, plan, batch, lambda: autocast(True))


def test_the_backward_runs_outside_autocast_as_in_pytorchs_amp_recipe() -> None:
    """``with torch.autocast(...): plan.step(...)`` equals the recipe's forward under autocast and backward outside it
    (torch.amp docs: "Backward passes under autocast are not recommended"). GPT-2 in bfloat16 on CPU gets other
    gradient bits when its backward runs under autocast too, so the test can tell the two apart."""
    model, batch, loss_fn = build("gpt2")
    inside, outside = copy.deepcopy(model), copy.deepcopy(model)

    def loss_of(module: nn.Module) -> torch.Tensor:
        return loss_fn(module, *batch) if loss_fn is not None else module(*batch)

    torch.manual_seed(0)
    with autocast(True):
        loss_of(inside).backward()
    torch.manual_seed(0)
    with autocast(True):
        recipe = loss_of(outside)
    recipe.backward()
    assert not all(torch.equal(a.grad, b.grad) for a, b in zip(inside.parameters(), outside.parameters(), strict=True))
    with autocast(True):
        plan = coop.plan(model, 1.0, batch, loss_fn=loss_fn, formulation="store-all")
        torch.manual_seed(0)
        loss = plan.step(*batch)
    assert torch.equal(loss, recipe.detach())
    for (name, param), expected in zip(model.named_parameters(), outside.parameters(), strict=True):
        assert torch.equal(param.grad, expected.grad), name


def test_captured_under_autocast_stepped_outside_it_warns_and_equals_eager_float32() -> None:
    """Without the check the replay would silently compute autocast's bfloat16 numbers here."""
    model, eager, plan, batch = planned(budget=1.0, capture_autocast=True)
    with pytest.warns(UserWarning, match="autocast is off, the plan was captured with on"):
        assert_steps_equal_eager(model, eager, plan, batch, contextlib.nullcontext)
    with autocast(True), warnings.catch_warnings():  # its own context: its own schedule, no warning
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        plan.step(*batch)


def test_eval_mode_and_frozen_parameters_are_replanned_and_equal_eager() -> None:
    model, eager, plan, batch = planned("cnn", budget=1.0, formulation="store-all")
    for module in (model, eager):
        module.eval()
    with pytest.warns(UserWarning, match="modules in eval mode are <model>"):
        assert_steps_equal_eager(model, eager, plan, batch, contextlib.nullcontext)
    for module in (model, eager):
        module.train()
        module.head.weight.requires_grad_(False)
    with pytest.warns(UserWarning, match="parameters or buffers changed .head.weight"):
        assert_steps_equal_eager(model, eager, plan, batch, contextlib.nullcontext)
    assert model.head.weight.grad is None


def test_deterministic_algorithms_keep_the_static_plan_when_the_program_is_the_same() -> None:
    model, eager, plan, batch = planned("mlp", budget=1.0, formulation="store-all")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not before)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
            assert_steps_equal_eager(model, eager, plan, batch, contextlib.nullcontext)
    finally:
        torch.use_deterministic_algorithms(before)
    assert list(plan._by_context.values()) == [None]  # re-captured once, same program: the plan stands


@pytest.mark.parametrize("block", [torch.no_grad, torch.inference_mode])
def test_gradients_disabled_stop_with_one_line(block) -> None:
    model, _, plan, batch = planned("mlp", budget=1.0, formulation="store-all")
    with block(), pytest.raises(CoopError, match="gradients disabled") as error:
        plan.step(*batch)
    assert "\n" not in str(error.value)
    assert all(p.grad is None for p in model.parameters())


def test_another_device_stops_with_one_line() -> None:
    _, _, plan, batch = planned("mlp", budget=1.0, formulation="store-all")
    with pytest.raises(CoopError, match=r"tensors on cpu, meta, the plan was made for cpu; make a new plan") as error:
        plan.step(*(t.to("meta") for t in batch))
    assert "\n" not in str(error.value)


def test_a_context_whose_step_does_not_fit_the_budget_stops_with_one_line() -> None:
    """Captured under autocast at the least budget a baseline meets, the float32 step cannot fit: one line."""
    model, batch, _ = build("transformer")
    with autocast(True):
        graph = coop.capture(model, batch).graph.with_random_replay()
        peaks = {name: accepted_budget(graph, name) for name in BASELINES}
        formulation = min(peaks, key=peaks.__getitem__)
        plan = coop.plan(model, peaks[formulation], batch, formulation=formulation)
    with pytest.raises(CoopError, match="autocast is off.*does not fit the plan's budget.*make a new plan") as error:
        plan.step(*batch)
    assert "\n" not in str(error.value)


def wrapped_models() -> dict[str, tuple[nn.Module, str]]:
    from torch.distributed.fsdp import FSDPModule

    model, _, _ = build("mlp")
    sharded = copy.deepcopy(model)  # fully_shard on a layer but not on the model (FSDP2 is planned from its root)
    sharded.layers[0].__class__ = type("FSDPLinear", (FSDPModule, type(sharded.layers[0])), {})  # what it does
    inner = copy.deepcopy(model)
    inner.layers[0] = nn.DataParallel(inner.layers[0])
    return {
        "data-parallel": (nn.DataParallel(copy.deepcopy(model)), "DataParallel"),
        "data-parallel inside": (inner, r"DataParallel \(submodule 'layers.0'\)"),
        "compiled": (torch.compile(copy.deepcopy(model)), r"torch.compile'd module.*model._orig_mod"),
        "fsdp2 below the root": (sharded, r"apply fully_shard to the whole model too \(submodule 'layers.0'"),
    }


@pytest.mark.parametrize("name", ["data-parallel", "data-parallel inside", "compiled", "fsdp2 below the root"])
def test_wrappers_coop_cannot_honour_are_refused_with_one_line(name: str) -> None:
    model, pattern = wrapped_models()[name]
    _, batch, _ = build("mlp")
    with pytest.raises(CaptureError, match=pattern) as error:
        coop.plan(model, 1.0, batch, strict=True)  # strict: a compiled module is refused, not planned with a warning
    assert "\n" not in str(error.value)


def test_a_saved_plan_loaded_in_another_context_names_it(tmp_path) -> None:
    model, _, plan, _ = planned("mlp", budget=1.0, formulation="store-all", capture_autocast=True)
    path = tmp_path / "plan.json"
    plan.save(path)
    with autocast(True):
        assert coop.load_plan(path, model).schedule == plan.schedule
    with pytest.raises(CoopError, match=r"another training context \(autocast was \[\['cpu', 'bfloat16'\]\]") as error:
        coop.load_plan(path, model)
    assert "\n" not in str(error.value)


def test_dynamic_plan_recaptures_a_batch_of_other_shapes_with_a_warning() -> None:
    # 1.5 x the peak: room for the generator states the online step saves beside the smaller batch's arena (above
    # the peak a budget is given in bytes: a fraction is at most 1.0)
    model, batch, _ = build("mlp")
    above_the_peak = -(-3 * coop.baseline_peak(coop.capture(model, batch).graph) // 2)
    model, eager, plan, batch = planned("mlp", budget=above_the_peak, formulation="dynamic")
    smaller = tuple(t[:4] for t in batch)
    with pytest.warns(UserWarning, match=r"the batch has shapes \[\[4, 32\], \[4\]\], the plan was made for"):
        assert_steps_equal_eager(model, eager, plan, smaller, contextlib.nullcontext)
