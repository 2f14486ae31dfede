"""plan.benchmark (issue 42, item 4): the plan's step against eager's on the same model, alternating, median of each
side after warm-up, threads stated; the model and the random generators put back; predicted beside measured.

The oracles are independent of the code under test: a fake clock whose steps advance it by hand-chosen seconds
(medians computed here by hand), the order of the calls as recorded by the steps themselves, and snapshots of the
model's tensors taken before the run and compared with ``torch.equal``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import coop
from coop.errors import OptionError
from coop.planner.benchmark import StepBenchmark, alternate


class Net(nn.Module):
    """A small step with buffers (BatchNorm), random draws (dropout) and a parameter the loss does not reach."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.25)
        self.last = nn.Linear(16, 1)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.norm(self.first(x))))
        return nn.functional.mse_loss(self.last(h), y)


def make() -> tuple[Net, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return Net(), (torch.randn(32, 8), torch.randn(32, 1))


@pytest.fixture(scope="module")
def planned():
    model, batch = make()
    return model, batch, coop.plan(model, "1MiB", batch, formulation="checkpoint-all", time_limit=5, progress=False)


class FakeClock:
    """Seconds that move only when a step says so; counts its readings."""

    def __init__(self) -> None:
        self.now = 0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return self.now


# ------------------------------------------------------------------ (a) alternation and the medians, by hand
def test_alternate_runs_plan_then_eager_and_times_only_after_warm_up() -> None:
    clock, order = FakeClock(), []
    plan_seconds, eager_seconds = iter([100, 100, 5, 1, 9, 3, 7]), iter([100, 100, 2, 4, 2, 8, 6])

    def plan_step() -> None:
        order.append("plan")
        clock.now += next(plan_seconds)

    def eager_step() -> None:
        order.append("eager")
        clock.now += next(eager_seconds)

    released = []
    plan_times, eager_times = alternate(plan_step, eager_step, steps=5, warmup=2, timer=clock,
                                        before=lambda: released.append(len(order)))
    assert order == ["plan", "eager"] * 7
    assert released == list(range(14))  # released before every step, warm-up ones included
    assert (plan_times, eager_times) == ([5, 1, 9, 3, 7], [2, 4, 2, 8, 6])  # the warm-up's 100 s are not timed
    assert clock.readings == 2 * 2 * 5


def test_plan_benchmark_alternates_on_the_real_plan_and_takes_medians(planned, monkeypatch) -> None:
    model, batch, plan = planned
    clock, order = FakeClock(), []
    plan_seconds, eager_seconds = iter([50, 5, 1, 9, 3, 7]), iter([50, 2, 4, 2, 8, 6])
    original_step = plan.step

    def plan_step(*args, **kwargs):
        assert all(p.grad is None for p in model.parameters())  # released before the step
        order.append("plan")
        clock.now += next(plan_seconds)
        return original_step(*args, **kwargs)

    def eager_forward(module, inputs) -> None:
        assert all(p.grad is None for p in model.parameters())
        order.append("eager")
        clock.now += next(eager_seconds)

    monkeypatch.setattr(plan, "step", plan_step)
    hook = model.register_forward_pre_hook(eager_forward)
    try:
        result = plan.benchmark(batch, steps=5, warmup=1, threads=1, timer=clock)
    finally:
        hook.remove()
    assert order == ["plan", "eager"] * 6
    assert clock.readings == 20
    # by hand: plan [5, 1, 9, 3, 7] -> 5 s, eager [2, 4, 2, 8, 6] -> 4 s, 5 / 4 - 1 = 25 %
    assert (result.plan_ms, result.eager_ms, result.measured_overhead) == (5000.0, 4000.0, 0.25)
    assert result.plan_times_ms == (5000.0, 1000.0, 9000.0, 3000.0, 7000.0)
    assert (result.threads, result.steps, result.warmup) == (1, 5, 1)
    assert result.predicted_overhead == plan.predicted_overhead
    predicted = f"{100 * plan.predicted_overhead:.1f} %"
    assert str(result) == (f"predicted {predicted}, measured 25.0 % (plan 5000.0 ms, eager 4000.0 ms: median of 5 "
                           "alternating steps after 1 warm-up, 1 thread)")


def test_an_even_number_of_steps_takes_the_mean_of_the_middle_two() -> None:
    clock = FakeClock()
    plan_seconds, eager_seconds = iter([4, 1, 3, 10]), iter([2, 2, 6, 1])

    def step(seconds):
        def run() -> None:
            clock.now += next(seconds)
        return run

    plan_times, eager_times = alternate(step(plan_seconds), step(eager_seconds), steps=4, warmup=0, timer=clock)
    assert sorted(plan_times)[1:3] == [3, 4] and sorted(eager_times)[1:3] == [2, 2]  # medians 3.5 and 2


# ------------------------------------------------------------------ (b) the model as it was
def snapshot(model: nn.Module) -> dict[str, object]:
    return {"params": [p.detach().clone() for p in model.parameters()],
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "buffers": [b.clone() for b in model.buffers()], "rng": torch.get_rng_state(),
            "threads": torch.get_num_threads()}


def assert_same(before: dict, after: dict) -> None:
    assert all(torch.equal(a, b) for a, b in zip(before["params"], after["params"], strict=True))
    for a, b in zip(before["grads"], after["grads"], strict=True):
        assert (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
    assert all(torch.equal(a, b) for a, b in zip(before["buffers"], after["buffers"], strict=True))
    assert torch.equal(before["rng"], after["rng"]) and before["threads"] == after["threads"]


def test_the_benchmark_puts_back_parameters_gradients_buffers_rng_and_threads(planned) -> None:
    model, batch, plan = planned
    model.first.weight.grad = torch.randn_like(model.first.weight)  # a gradient with values, the others None
    model.last.bias.grad = torch.randn_like(model.last.bias)
    eager = copy.deepcopy(model)  # a Parameter's deepcopy leaves its .grad behind: copy those too
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        q.grad = None if p.grad is None else p.grad.clone()
    kept_grad = model.first.weight.grad
    torch.manual_seed(7)
    other_threads = 2 if torch.get_num_threads() == 1 else 1  # the count the benchmark must put back differs
    before = snapshot(model)
    seen = []
    hook = model.norm.register_forward_hook(lambda *_: seen.append(model.norm.num_batches_tracked.item()))
    try:
        result = plan.benchmark(batch, steps=2, warmup=1, threads=other_threads)
    finally:
        hook.remove()
    # the steps did move the buffers: each eager forward sees its own count and the plan step's before it
    assert seen == [before["buffers"][2].item() + 2 * k + 2 for k in range(3)]
    assert_same(before, snapshot(model))
    assert model.first.weight.grad is kept_grad and model.unused.weight.grad is None
    assert result.threads == other_threads and result.plan_ms > 0 and result.eager_ms > 0
    # training goes on as if no benchmark ran: the next planned step equals eager's on the untouched copy
    torch.manual_seed(3)
    loss = plan.step(batch)
    torch.manual_seed(3)
    eager_loss = eager(*batch)
    eager_loss.backward()
    assert torch.equal(loss, eager_loss.detach())
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), eager.buffers(), strict=True))
    model.zero_grad(set_to_none=True)


# ------------------------------------------------------------------ (c) predicted beside measured
def test_summary_shows_the_measured_overhead_beside_the_predicted_only_after_a_run() -> None:
    model, batch = make()
    plan = coop.plan(model, "1MiB", batch, formulation="checkpoint-all", time_limit=5, progress=False)
    keys = list(plan.summary())
    assert plan.summary()["measured_overhead"] is None and plan.summary()["benchmark"] is None
    assert "measured" not in repr(plan)
    clock = FakeClock()
    original_step = plan.step

    def slow_step(*args, **kwargs):
        clock.now += 3
        return original_step(*args, **kwargs)

    plan.step = slow_step
    hook = model.register_forward_pre_hook(lambda *_: setattr(clock, "now", clock.now + 2))
    try:
        result = plan.benchmark(batch, steps=3, warmup=0, timer=clock)
    finally:
        hook.remove()
    summary = plan.summary()
    assert list(summary) == keys  # no key added or dropped, only filled in
    assert summary["measured_overhead"] == result.measured_overhead == 0.5  # 3 s against 2 s
    assert summary["predicted_overhead"] == plan.predicted_overhead
    assert summary["benchmark"]["threads"] == torch.get_num_threads() == result.threads
    json.dumps(summary)
    assert "measured 50.0%" in repr(plan)


def test_a_dynamic_plan_is_benchmarked_with_no_prediction() -> None:
    model, batch = make()
    plan = coop.plan(model, "1MiB", batch, formulation="dynamic", progress=False)
    result = plan.benchmark(batch, steps=1, warmup=1)
    assert isinstance(result, StepBenchmark) and result.predicted_overhead is None
    assert str(result).startswith("predicted n/a, measured ")
    assert plan.summary()["measured_overhead"] == result.measured_overhead


# ------------------------------------------------------------------ (d) refusals
@pytest.mark.parametrize(("arguments", "fix"), [
    ({"steps": 0}, "steps=1 or more"), ({"steps": 2.5}, "steps=1 or more"), ({"steps": True}, "steps=1 or more"),
    ({"warmup": -1}, "warmup=0"), ({"threads": 0}, "threads=1 or more"), ({"threads": -2}, "threads=None"),
])
def test_bad_arguments_are_refused_in_one_line_naming_the_fix(planned, arguments, fix) -> None:
    model, batch, plan = planned
    before = snapshot(model)
    with pytest.raises(OptionError, match=fix) as refused:
        plan.benchmark(batch, **arguments)
    assert "\n" not in str(refused.value)
    assert_same(before, snapshot(model))
    assert plan.last_benchmark is None or plan.last_benchmark.steps >= 1
