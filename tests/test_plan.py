"""coop.plan: replay equals eager PyTorch over optimizer steps; peaks fall with the budget."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import coop
from coop import capture
from coop.errors import CoopError, SolveTimeoutError
from coop.formulations import BASELINES
from coop.runtime.meter import MemoryMeter
from coop.zoo import build
from tests.plan_budgets import accepted_budget, held_budget

MODELS = ("mlp", "cnn", "transformer")


def eager_step(model, batch, loss_fn) -> torch.Tensor:
    out = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    loss.backward()
    return loss.detach()


@functools.cache
def baseline_peak_of(name: str, formulation: str) -> int:
    """The least budget at which a baseline's own plan is kept on a zoo model (default size): its schedule's peak
    with the generator states it saves, or what its step holds where kernels' scratch makes that larger. One baseline
    at a time, on a model of its own (the same bytes as the four planned in turn on one model, 2026-11-30): a test
    that plans one baseline pays for its plan alone (the transformer's four took 6.4 s)."""
    return held_budget(*build(name), formulation)


def baseline_peaks(name: str) -> dict[str, int]:
    """:func:`baseline_peak_of` for every baseline."""
    return {f: baseline_peak_of(name, f) for f in BASELINES}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("formulation", BASELINES)
def test_three_optimizer_steps_equal_eager(name: str, formulation: str) -> None:
    model, batch, loss_fn = build(name)
    eager = copy.deepcopy(model)
    budget = baseline_peak_of(name, formulation)
    plan = coop.plan(model, budget, batch, loss_fn=loss_fn, formulation=formulation)
    assert plan.formulation == formulation, plan.summary()["note"]  # its own schedule, not a fallback
    assert plan.predicted_peak <= budget
    assert_three_steps_equal_eager(model, eager, batch, loss_fn, plan)


@pytest.mark.parametrize(
    ("name", "formulation"),
    # the moccasin plans (19 s for the cnn, 33 s for the transformer on 2 loaded cores) in the slow tier: cnn-checkmate
    # keeps coop.plan's solver path, the replay and the meter, and test_executor's moccasin case a moccasin schedule's
    # replay equal to the capture within its metered prediction, in the fast tier
    [("cnn", "checkmate"), pytest.param("cnn", "moccasin", marks=pytest.mark.slow),
     pytest.param("transformer", "moccasin", marks=pytest.mark.slow)],
)
def test_solver_plans_replay_equal_to_eager_within_the_predicted_peak(name: str, formulation: str) -> None:
    """Issue 4: the solvers' schedules replay with bit-identical gradients, metered <= predicted, no slack."""
    model, batch, loss_fn = build(name)
    eager = copy.deepcopy(model)
    graph = capture(model, batch, loss_fn).graph
    budget = max(coop.min_budget(graph), int(0.8 * coop.baseline_peak(graph)))
    # the MILP runs to its limit and the replay is what is judged: 2 s (19.2 s at 10 s, two rounds; 8.0 s at 4 s,
    # checkmate's schedule either way, 2026-11-29; at 2 and 5 s the same plan, 183,124 B at 9.08 % overhead, the same
    # two rounds, 2026-11-30)
    plan = coop.plan(model, budget, batch, loss_fn=loss_fn, formulation=formulation, time_limit=2)
    assert plan.formulation == formulation, plan.summary()["note"]
    assert plan.predicted_peak <= budget < plan.baseline_peak
    assert_three_steps_equal_eager(model, eager, batch, loss_fn, plan)
    assert metered_peak(plan, batch) <= plan.predicted_peak


def assert_three_steps_equal_eager(model, eager, batch, loss_fn, plan) -> None:
    """Loss, every gradient, buffer and parameter equal eager's bit for bit over 3 SGD steps."""
    name, formulation = plan.graph.name, plan.formulation
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        torch.manual_seed(100 + step)
        eager_loss = eager_step(eager, batch, loss_fn)
        torch.manual_seed(100 + step)
        loss = plan.step(*batch)
        assert torch.equal(loss, eager_loss), (name, formulation, step)
        for (param_name, param), eager_param in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert torch.equal(param.grad, eager_param.grad), (name, formulation, step, param_name)
        for buffer, eager_buffer in zip(model.buffers(), eager.buffers(), strict=True):
            assert torch.equal(buffer, eager_buffer)
        optimizer.step()
        eager_optimizer.step()
        optimizer.zero_grad()
        eager_optimizer.zero_grad()
    for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param, eager_param)




def metered_peak(plan, batch) -> int:
    flat = plan.captured.flat_inputs(plan.model, batch)
    with MemoryMeter() as meter:
        meter.track(*flat, *plan.captured.constants())
        plan.step(*batch)
    plan.model.zero_grad(set_to_none=True)
    return meter.peak_bytes


@pytest.mark.parametrize("name", ("cnn", "transformer"))
def test_measured_peak_falls_with_the_budget(name: str) -> None:
    model, batch, loss_fn = build(name)
    full = coop.plan(model, baseline_peaks(name)["store-all"], batch, loss_fn=loss_fn)
    tight_budget = min(baseline_peaks(name).values())
    tight = coop.plan(model, tight_budget, batch, loss_fn=loss_fn, time_limit=2)  # the best baseline fits it
    assert tight.predicted_peak < full.predicted_peak
    full_peak, tight_peak = metered_peak(full, batch), metered_peak(tight, batch)
    assert full_peak <= full.predicted_peak
    assert tight_peak <= tight.predicted_peak
    assert tight_peak < full_peak


def test_summary_timeline_save_and_load(tmp_path) -> None:
    model, batch, loss_fn = build("cnn")
    eager = copy.deepcopy(model)
    # 2 s: the summary, timeline and plan file are judged, not the schedule (at 10 s auto's re-solve below the
    # measured scratch spent all 10 s for the same kind of plan)
    plan = coop.plan(model, 1.0, batch, loss_fn=loss_fn, time_limit=2)
    summary = plan.summary()
    assert summary["baseline_peak"] == plan.baseline_peak and summary["predicted_peak"] <= summary["budget"]
    timeline = plan.memory_timeline()
    assert max(timeline["plan"]) == plan.predicted_peak and max(timeline["baseline"]) == plan.baseline_peak
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = coop.load_plan(path, model)
    assert loaded.schedule == plan.schedule
    assert (loaded.budget, loaded.formulation) == (plan.budget, plan.formulation)
    torch.manual_seed(1)
    loss = loaded.step(*batch)
    torch.manual_seed(1)
    assert torch.equal(loss, eager_step(eager, batch, loss_fn))
    for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param.grad, eager_param.grad)
    other, _, _ = build("cnn", hidden=4)
    with pytest.raises(CoopError, match="different model or batch shape"):
        coop.load_plan(path, other)


def test_batch_of_another_shape_runs_under_online_eviction_with_a_warning() -> None:
    """Issue 3/5: a batch of unplanned shapes runs the dynamic fallback, says so, and equals eager."""
    model, batch, loss_fn = build("transformer", batch=4)
    eager = copy.deepcopy(model)
    plan = coop.plan(model, 0.8, batch, loss_fn=loss_fn, formulation="chen-greedy")
    smaller = tuple(t[:2] for t in batch)
    torch.manual_seed(7)
    with pytest.warns(UserWarning, match="online eviction"):
        loss = plan.step(*smaller)
    torch.manual_seed(7)
    reference = eager_step(eager, smaller, loss_fn)
    assert torch.equal(loss, reference)
    for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param.grad, eager_param.grad)
    with pytest.raises(CoopError, match="batch tensors"):
        plan.step(batch[0])


def test_dynamic_formulation_trains_like_eager_within_its_budget() -> None:
    model, batch, loss_fn = build("transformer", layers=4, hidden=32, batch=4, seq=32)
    eager = copy.deepcopy(model)
    dynamic = coop.plan(model, 0.6, batch, loss_fn=loss_fn, formulation="dynamic")
    assert dynamic.formulation.startswith("dynamic") and dynamic.budget < dynamic.baseline_peak
    for step in range(2):
        torch.manual_seed(step)
        loss = dynamic.step(*batch)
        torch.manual_seed(step)
        assert torch.equal(loss, eager_step(eager, batch, loss_fn))
        for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
            assert torch.equal(param.grad, eager_param.grad)
    assert dynamic.summary()["last_step"]["recomputations"] > 0  # the budget made it evict and recompute


def test_budget_no_baseline_meets_is_a_time_out_not_a_proof() -> None:
    model, batch, _ = build("transformer")
    graph = capture(model, batch).graph
    least = coop.min_budget(graph)
    # each baseline's simulated peak with the generator states it saves (what the planner's fallback compares; never
    # above the budget its plan is kept at, baseline_peaks: the same four bytes on this model, 2026-11-30)
    best = min(accepted_budget(graph, f) for f in BASELINES)
    assert best > least  # precondition: no baseline reaches the least budget, so this test cannot pass vacuously
    # at min_budget itself nothing is proven: not InfeasibleError, but "no schedule found" with the best peak
    with pytest.raises(SolveTimeoutError, match="no schedule found.*best peak reached"):
        coop.plan(model, least, batch, formulation="store-all")


HF_SMALL = {
    "gpt2": {"layers": 2, "hidden": 32, "seq": 16},
    "bert": {"layers": 2, "hidden": 32, "seq": 16},
    "resnet": {"layers": 1, "hidden": 8, "image": 16},
}


#: The ResNet (340 nodes; 44-117 s on 2 cores) and BERT (36-45 s) in the slow tier: the fast tier keeps GPT-2 here
#: (the same baselines, replay and meter on a transformers model), every baseline on the conv net with batch norm
#: (test_three_optimizer_steps_equal_eager[*-cnn], test_measured_peak_falls_with_the_budget[cnn]) and the
#: transformers ResNet's and BERT's bit-identical replays (tests/test_arena_replay.py)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("resnet", "bert") else n
                                  for n in sorted(HF_SMALL)])
def test_transformers_models_replay_equal_to_eager_under_every_baseline(name: str) -> None:
    """Issue 3: GPT-2, BERT and ResNet from transformers configs, every baseline at a budget where it
    is feasible: bit-identical over 3 optimizer steps, metered peak <= predicted (no slack)."""
    model, batch, loss_fn = build(name, **HF_SMALL[name])
    graph = capture(model, batch, loss_fn).graph
    for formulation in BASELINES:
        budget = accepted_budget(graph, formulation)
        trained, eager = copy.deepcopy(model), copy.deepcopy(model)
        plan = coop.plan(trained, budget, batch, loss_fn=loss_fn, formulation=formulation)
        assert plan.formulation == formulation and plan.predicted_peak <= budget
        assert_three_steps_equal_eager(trained, eager, batch, loss_fn, plan)
        assert metered_peak(plan, batch) <= plan.predicted_peak, formulation


def test_budget_as_an_arena_size_bounds_the_best_fit_arena_peak() -> None:
    """Issue 5: with arena=True the budget bounds the address-ordered arena, fragmentation included."""
    from coop.runtime.placement import execution_placement

    model, batch, loss_fn = build("cnn", batch=8, hidden=16, layers=6)  # activations, not conv scratch, dominate
    graph = capture(model, batch, loss_fn).graph
    budget = int(0.85 * coop.baseline_peak(graph))
    # moccasin (its local-search warm start is a schedule at once, which CP-SAT did not improve on in 10 s a round;
    # CBC on Checkmate's MILP here needs about 10 s, so a loaded machine timed it out into a baseline fallback). The
    # arena's bound is the subject, not the search: at 1 s a round CP-SAT is not run (its model takes longer to
    # build) and each of the 4 rounds keeps moccasin's local-search schedule (5.5 s in all, 15.3 s at 3 s a round)
    plan = coop.plan(model, budget, batch, loss_fn=loss_fn, formulation="moccasin", time_limit=1, arena=True)
    assert plan.formulation == "moccasin", plan.note  # not a baseline fallback after a solver timeout
    arena_peak = execution_placement(plan.graph, plan.executor.schedule).arena_peak
    assert plan.summary()["arena_peak"] == arena_peak <= budget
    assert plan.predicted_peak <= plan.budget <= budget
