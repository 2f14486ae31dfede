"""Batches as people pass them (issue 28, item 1): a dict of keyword arguments, a tuple, a single tensor, nested
containers and non-tensor flags; no ``loss_fn`` where the model returns ``.loss`` or a scalar. The oracle is eager
PyTorch on a deep copy of the model: ``model(**batch).loss.backward()``, compared with ``torch.equal``."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import coop
from coop.errors import CaptureError, CoopError, LastResortWarning

STEPS = 3


def small_bert() -> nn.Module:
    """A 2-layer BERT for masked LM from a config: random weights, nothing downloaded."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=64,
                        intermediate_size=64, max_position_embeddings=64)
    return BertForMaskedLM(config).train()


def bert_batch(generator: torch.Generator, padded: bool = True) -> dict[str, torch.Tensor]:
    """What a data collator yields: token ids, an attention mask (the last quarter padded), labels (the ids)."""
    ids = torch.randint(0, 64, (4, 32), generator=generator)
    mask = torch.ones(4, 32, dtype=torch.long)
    if padded:
        mask[:, 24:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def assert_same_gradients(model: nn.Module, eager: nn.Module, what: str) -> None:
    for (name, param), reference in zip(model.named_parameters(), eager.parameters(), strict=True):
        if reference.grad is None:
            assert param.grad is None or not param.grad.any(), f"{what}: {name}"
        else:
            assert torch.equal(param.grad, reference.grad), f"{what}: gradient of {name}"


def test_a_dict_batch_without_loss_fn_steps_like_eager_over_adamw_steps() -> None:
    """``coop.plan(bert, 0.6, {"input_ids", "attention_mask", "labels"})`` and ``plan.step(batch)``: loss and every
    gradient torch.equal to ``model(**batch).loss.backward()`` over 3 AdamW steps (dropout on, same seeds)."""
    model = small_bert()
    eager = copy.deepcopy(model)
    data = torch.Generator().manual_seed(1)
    plan = coop.plan(model, 0.6, bert_batch(data), formulation="chen-greedy", time_limit=10)
    assert plan.formulation == "chen-greedy" and plan.simulation.recomputations > 0, plan.note
    assert plan.predicted_peak <= plan.budget < plan.baseline_peak
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    for step in range(STEPS):
        batch = bert_batch(data, padded=step != 2)  # the last step's mask has no padding at all
        torch.manual_seed(100 + step)
        loss = plan.step(batch) if step != 1 else plan.step(**batch)  # as coop.plan got it, or spread
        torch.manual_seed(100 + step)
        reference = eager(**batch).loss
        reference.backward()
        assert torch.equal(loss, reference.detach()), f"step {step}: loss {loss.item()} != {reference.item()}"
        assert_same_gradients(model, eager, f"step {step}")
        optimizer.step(), eager_optimizer.step()
        optimizer.zero_grad(), eager_optimizer.zero_grad()
    for param, reference in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param, reference)


class Flagged(nn.Module):
    """A model taking a nested batch and flags: ``inputs`` a dict holding a tensor and a list of a tensor and
    None, a float ``scale`` and a bool ``gate``; returns a scalar loss."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.second = nn.Linear(16, 1)

    def forward(self, inputs: dict, target: torch.Tensor, scale: float = 1.0, gate: bool = True) -> torch.Tensor:
        hidden = self.first(inputs["x"] * scale)
        extra, nothing = inputs["extra"]
        assert nothing is None
        hidden = torch.relu(hidden) if gate else torch.tanh(hidden)
        out = self.second(hidden + extra).squeeze(-1)
        return (out - target).square().mean()


def flagged_batch(generator: torch.Generator, gate: bool = True) -> dict:
    return {"inputs": {"x": torch.randn(6, 8, generator=generator), "extra": [torch.randn(6, 16, generator=generator),
                                                                             None]},
            "target": torch.randn(6, generator=generator), "scale": 0.5, "gate": gate}


def eager_step(eager: nn.Module, batch: dict) -> torch.Tensor:
    loss = eager(**batch)
    loss.backward()
    return loss.detach()


def test_nested_batches_with_flags_step_like_eager_and_a_flag_change_replans_with_a_warning() -> None:
    torch.manual_seed(0)
    model = Flagged()
    eager = copy.deepcopy(model)
    data = torch.Generator().manual_seed(2)
    plan = coop.plan(model, "1MiB", flagged_batch(data), formulation="store-all")  # room for online eviction
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the planned flags: the plan's own program, no warning
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        batch = flagged_batch(data)
        assert torch.equal(plan.step(batch), eager_step(eager, batch))
    assert_same_gradients(model, eager, "planned flags")
    other = flagged_batch(data, gate=False)
    with pytest.warns(UserWarning, match=r"batch\['gate'\] is False, the plan was made with True.*online eviction"):
        loss = plan.step(other)
    assert torch.equal(loss, eager_step(eager, other))  # tanh, not the captured relu: the step was captured again
    assert_same_gradients(model, eager, "changed flag")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # that flag's plan is kept: no second warning
        warnings.simplefilter("ignore", LastResortWarning)  # unsearched but within budget: not checked here
        again = flagged_batch(data, gate=False)
        assert torch.equal(plan.step(**again), eager_step(eager, again))
    assert_same_gradients(model, eager, "changed flag, again")


def test_a_flag_change_replans_a_dynamic_plan_with_a_warning() -> None:
    torch.manual_seed(0)
    model = Flagged()
    eager = copy.deepcopy(model)
    data = torch.Generator().manual_seed(3)
    plan = coop.plan(model, "1MiB", flagged_batch(data), formulation="dynamic")
    other = flagged_batch(data)
    other["scale"] = 2.0  # a constant of the captured program: the same ops, another argument
    with pytest.warns(UserWarning, match=r"batch\['scale'\] is 2.0, the plan was made with 0.5"):
        loss = plan.step(other)
    assert torch.equal(loss, eager_step(eager, other))
    assert_same_gradients(model, eager, "dynamic, changed flag")


class Scalar(nn.Module):
    """``model(x)`` or ``model(x, y)`` returns a scalar loss: no loss_fn needed."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.relu(self.layer(x))
        return (out if y is None else out - y).square().mean()


@pytest.mark.parametrize("form", ["tensor", "tuple", "list"])
def test_a_single_tensor_a_tuple_and_a_list_step_like_eager(form: str) -> None:
    torch.manual_seed(0)
    model = Scalar()
    eager = copy.deepcopy(model)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    example = {"tensor": x, "tuple": (x, y), "list": [x, y]}[form]
    plan = coop.plan(model, 1.0, example, formulation="store-all")
    args = (x,) if form == "tensor" else (x, y)
    for call in (lambda: plan.step(example), lambda: plan.step(*args)):
        loss = call()
        reference = eager(*args)
        reference.backward()
        assert torch.equal(loss, reference.detach())
        assert_same_gradients(model, eager, form)


def test_a_saved_dict_plan_loads_and_steps_like_eager(tmp_path) -> None:
    torch.manual_seed(0)
    model = Flagged()
    eager = copy.deepcopy(model)
    data = torch.Generator().manual_seed(4)
    plan = coop.plan(model, 1.0, flagged_batch(data), formulation="store-all")
    plan.save(tmp_path / "plan.json")
    loaded = coop.load_plan(tmp_path / "plan.json", model)
    assert loaded.schedule == plan.schedule
    batch = flagged_batch(data)
    assert torch.equal(loaded.step(batch), eager_step(eager, batch))
    assert_same_gradients(model, eager, "loaded")


# ------------------------------------------------------------------ malformed batches: one line, the problem and the fix
def planned_flagged() -> tuple[coop.BasePlan, torch.Generator]:
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(5)
    return coop.plan(Flagged(), 1.0, flagged_batch(data), formulation="store-all"), data


@pytest.mark.parametrize(("leaf", "named"), [(object(), "object"), (np.zeros(3), "ndarray"), ({1, 2}, "set")])
def test_a_leaf_coop_cannot_pass_is_refused_at_plan_time_in_one_line(leaf: object, named: str) -> None:
    batch = flagged_batch(torch.Generator().manual_seed(6))
    batch["inputs"]["odd"] = leaf
    with pytest.raises(CaptureError, match=rf"batch\['inputs'\]\['odd'\] holds a {named}.*torch.as_tensor") as error:
        coop.plan(Flagged(), 1.0, batch, formulation="store-all")
    assert "\n" not in str(error.value)


def test_a_string_where_the_plan_has_a_tensor_is_refused_in_one_line() -> None:
    plan, data = planned_flagged()
    batch = flagged_batch(data)
    batch["target"] = "oops"
    with pytest.raises(CoopError, match=r"got 'oops' \(str\) at batch\['target'\], where the plan has a tensor; pass "
                                        r"the batch as coop.plan got it") as error:
        plan.step(batch)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("change", ["missing key", "extra tensor", "positional"])
def test_a_batch_of_another_structure_is_refused_in_one_line(change: str) -> None:
    plan, data = planned_flagged()
    batch = flagged_batch(data)
    if change == "missing key":
        del batch["target"]
    elif change == "extra tensor":
        batch["inputs"]["more"] = torch.zeros(1)
    with pytest.raises(CoopError, match=r"plan.step got .*the plan was made for .*make a new plan") as error:
        plan.step(*batch.values()) if change == "positional" else plan.step(batch)
    assert "\n" not in str(error.value)


def test_a_dict_batch_with_other_keys_than_strings_is_refused_in_one_line() -> None:
    with pytest.raises(CaptureError, match=r"mapping with the key 0, not a str.*pass a tuple") as error:
        coop.plan(Scalar(), 1.0, {0: torch.randn(4, 8)}, formulation="store-all")
    assert "\n" not in str(error.value)


def test_a_model_output_without_a_loss_names_the_fix() -> None:
    model = small_bert()
    batch = bert_batch(torch.Generator().manual_seed(7))
    del batch["labels"]
    with pytest.raises(CaptureError, match=r"MaskedLMOutput with loss None \(no labels in the batch\?\)") as error:
        coop.plan(model, 1.0, batch, formulation="store-all")
    assert "\n" not in str(error.value)
