"""The measure-and-re-solve rounds of coop.plan (coop/planner/rounds.py), shown in the summary, and the simulations
one plan runs (issue 44: a plan at 0.8 with checkmate simulated its step 20 times, 16 of them in a re-solve below
min_budget that fell back through all four baselines)."""

from __future__ import annotations

import json
import sys
import warnings

import pytest

import coop
import coop.schedule
from coop.errors import InfeasibleError
from coop.planner import solving
from coop.zoo import build


@pytest.fixture(scope="module")
def cnn_step():
    model, batch, loss_fn = build("cnn")
    return model, batch, loss_fn, coop.capture(model, batch, loss_fn=loss_fn)


@pytest.fixture(scope="module")
def counted_plan(cnn_step):
    """One plan at 0.8 with checkmate, and how many times the plan itself called the one simulator: a round whose solve
    timed out falls back through the baselines (:func:`solving.cheapest_fitting_baseline`), which simulate their own
    searches (12-16 calls), and whether it does is a race with the machine's load (21 calls under a load of 7 on 2
    cores, 2026-11-29): those calls are counted apart."""
    model, batch, loss_fn, captured = cnn_step
    original, fallback = coop.schedule.simulate, solving.cheapest_fitting_baseline
    calls: list[bool] = []  # one per call: whether a baseline fallback made it
    falling_back: list[int] = []

    def counted(*args, **kwargs):
        calls.append(bool(falling_back))
        return original(*args, **kwargs)

    def counted_fallback(*args, **kwargs):
        falling_back.append(1)
        try:
            return fallback(*args, **kwargs)
        finally:
            falling_back.pop()

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        for name, module in list(sys.modules.items()):
            if name.startswith("coop") and getattr(module, "simulate", None) is original:
                patch.setattr(module, "simulate", counted)
        patch.setattr(solving, "cheapest_fitting_baseline", counted_fallback)
        warnings.simplefilter("ignore")  # where kernels' scratch exceeds the budget the plan warns (not judged here)
        # the MILP runs to its limit and keeps its first incumbent (the same rounds at 4 s as at 20 s, measured
        # under a load of 7 on 2 cores; at 1, 2 and 5 s the same two rounds, a solve then a measured-scratch round,
        # under a load of 6, 2026-11-30): a short limit, as the rounds and the count are what is judged
        plan = coop.plan(model, 0.8, batch, loss_fn=loss_fn, captured=captured, formulation="checkmate",
                         time_limit=2)
    return plan, calls.count(False)


def test_the_summary_lists_every_solve_with_its_reason_budget_and_measure(counted_plan) -> None:
    plan, _ = counted_plan
    rounds = plan.summary()["rounds"]
    json.dumps(rounds)  # saved with the plan
    assert rounds[0]["name"] == "solve" and rounds[0]["budget"] == plan.budget
    assert all(set(r) == {"name", "reason", "budget", "measured", "modelled", "outcome", "seconds"} and r["reason"]
               for r in rounds)
    assert {r["name"] for r in rounds} <= {"solve", "generator states", "measured scratch", "reserved excess"}
    assert all(r["modelled"] is None for r in rounds)  # a CPU step: the CUDA allocator's model does not apply
    if plan.step_footprint is not None:  # a CPU step is measured: the plan's own measure is one round's
        assert plan.step_footprint in [r["measured"] for r in rounds]


def test_one_plan_simulates_its_step_a_handful_of_times(counted_plan) -> None:
    _, simulations = counted_plan
    assert 0 < simulations <= 8, simulations


def test_below_min_budget_no_baseline_is_tried(cnn_step, monkeypatch) -> None:
    model, _, loss_fn, captured = cnn_step
    monkeypatch.setattr(solving, "cheapest_fitting_baseline", lambda *a, **k: pytest.fail("a baseline was tried"))
    below = coop.min_budget(captured.graph) - 1
    with pytest.raises(InfeasibleError, match="min_budget"):
        solving.solve_within(model, captured, below, formulation="checkmate", time_limit=5, loss_fn=loss_fn,
                             wrapper=None)
