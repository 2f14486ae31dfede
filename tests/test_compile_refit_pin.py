"""The measured re-solve runs the rounds after a miss in inductor's order in coop's order (coop.compiled.refit).

The compiler, the meter and the observation are stand-ins, so what each round holds is set by hand: in inductor's
order the step holds 1,100 B against a budget of 1,000 B (its scheduler ran a recomputation early, as the tied MLP
of tests/test_compile_observed.py at 0.5 held 2,516,488 B against 2,277,892 B), in coop's order 990 B.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from coop.compiled import refit
from coop.compiled.observed import Observation
from coop.compiled.record import CompileRound
from coop.errors import OverBudgetError

BUDGET = 1_000
#: what the stand-in step holds in inductor's order and in coop's
HELD_INDUCTORS, HELD_COOPS = 1_100, 990


class _Step:
    """A stand-in compiled module: its plan, what its step holds, and whether its kernels ran in coop's order."""

    def __init__(self, held: int, pinned: bool) -> None:
        self.held = held
        plan = SimpleNamespace(requested=BUDGET, budget=BUDGET, peak=BUDGET - 10, solver_overhead=0.0,
                               joint=SimpleNamespace(graph=SimpleNamespace(nodes=[], name="g", caller_owned_bytes=0)),
                               overhead=0.0, result=SimpleNamespace(simulation=SimpleNamespace(overhead=0.0)))
        self.coop_record = SimpleNamespace(layout_optimization=False, horizontal_fusion=False, addmm_folds=False,
                                           partitioner=SimpleNamespace(plans=[plan]), plans=[plan], rounds=[],
                                           observed_peak=lambda plan: None, pin=object() if pinned else None)


class _Compiler:
    """``compile_with`` and ``pin_after_miss`` of one coop.compile: the observations it was given, per round."""

    def __init__(self) -> None:
        self.pinned = False
        self.given: list[tuple[int, Observation | None, bool]] = []

    def compile_with(self, shave: int, observation: Observation | None, requested: int | None) -> _Step:
        self.given.append((shave, observation, self.pinned))
        return _Step(HELD_COOPS if self.pinned else HELD_INDUCTORS, self.pinned)

    def pin(self) -> None:
        self.pinned = True


@pytest.fixture(autouse=True)
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refit, "warm_up", lambda module, *args: [1])
    monkeypatch.setattr(refit, "held_bytes", lambda module, batch, loss_fn: module.held)
    monkeypatch.setattr(refit, "step_seconds", lambda module, batch, loss_fn: 0.1)
    monkeypatch.setattr(refit, "_measured_scratch", lambda *args: {"mm": 64})
    monkeypatch.setattr(refit, "_observe", lambda record, plan, previous, scratch, keep_writing=False:
                        Observation(inline=frozenset({"tanh"})).with_scratch(scratch))
    monkeypatch.setattr(refit, "min_budget", lambda graph: 0)


def test_a_miss_in_inductors_order_is_planned_again_in_coops_order_at_the_same_shave() -> None:
    """Round 0 misses in inductor's order; round 1 runs in coop's order, at shave 0, on the measured scratch only
    (the buffers inductor kept in its own order are not those of coop's order), and is the round returned."""
    compiler = _Compiler()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a round within the budget is returned, without a warning
        returned = refit.fit_measured(compiler.compile_with, batch=None, loss_fn=None, rounds=3,
                                      pin_after_miss=compiler.pin)
    rounds: list[CompileRound] = returned.coop_record.rounds
    assert [(r.measured_peak, r.pinned) for r in rounds] == [(HELD_INDUCTORS, False), (HELD_COOPS, True)]
    assert "coop's order" in rounds[1].reason and "100 B over" in rounds[1].reason
    assert compiler.given[1] == (0, Observation(scratch=(("mm", 64),)), True)
    assert returned.held == HELD_COOPS


def test_without_the_switch_every_round_stays_in_inductors_order() -> None:
    """``pin_after_miss=None`` (coop.compile's ``pin=False``): the misses are planned again on the buffers inductor
    kept, and every round still misses: refused, the step that held least on the error."""
    compiler = _Compiler()
    with pytest.raises(OverBudgetError, match="held at least 1,100 B against its budget 1,000 B") as err:
        refit.fit_measured(compiler.compile_with, batch=None, loss_fn=None, rounds=3)
    assert all(not pinned for _, _, pinned in compiler.given)
    assert not any(r.pinned for r in err.value.compiled.coop_record.rounds)


def test_the_switch_happens_once() -> None:
    """A step that misses in coop's order too is not switched again: the rounds after it are planned on its buffers
    (and below the excess), in coop's order; the miss in inductor's order is not one of the three ``rounds``."""
    compiler = _Compiler()

    def always_over(shave: int, observation: Observation | None, requested: int | None) -> _Step:
        compiler.given.append((shave, observation, compiler.pinned))
        return _Step(HELD_INDUCTORS, compiler.pinned)

    calls: list[Any] = []

    def pin() -> None:
        calls.append(1)
        compiler.pin()

    with pytest.raises(OverBudgetError, match="against its budget"):
        refit.fit_measured(always_over, batch=None, loss_fn=None, rounds=3, pin_after_miss=pin)
    assert calls == [1]
    assert [pinned for _, _, pinned in compiler.given] == [False, True, True, True]
    assert compiler.given[2][1] is not None and compiler.given[2][1].inline == frozenset({"tanh"})


def test_the_miss_that_switched_leaves_rounds_to_plan_below_the_excess(monkeypatch: pytest.MonkeyPatch) -> None:
    """BERT at 0.5 in bench_compile (no extern scratch measured): inductor's order 100 B over, coop's order 50 B over,
    the round planned on its buffers still 20 B over; the switched round is not one of the three ``rounds``, so a
    fourth is planned 20 B below the budget (the measured excess) and, holding 990 B, is returned."""
    monkeypatch.setattr(refit, "_measured_scratch", lambda *args: {})
    helds = [1_100, 1_050, 1_020, 990]
    compiler = _Compiler()

    def compile_with(shave: int, observation: Observation | None, requested: int | None) -> _Step:
        compiler.given.append((shave, observation, compiler.pinned))
        return _Step(helds[len(compiler.given) - 1], compiler.pinned)

    returned = refit.fit_measured(compile_with, batch=None, loss_fn=None, rounds=3,
                                  pin_after_miss=compiler.pin)
    assert [(shave, pinned) for shave, _, pinned in compiler.given] == [(0, False), (0, True), (0, True), (20, True)]
    assert compiler.given[1][1] is None and compiler.given[2][1] is not None  # round 2 on the buffers round 1 kept
    assert returned.held == 990
    assert "below the measured excess" in returned.coop_record.rounds[3].reason


class _LayoutStep(_Step):
    """A stand-in round compiled with inductor's channels-last layout, whose copies of caller-owned convolution
    inputs hold ``copies`` bytes."""

    def __init__(self, held: int, pinned: bool, copies: int) -> None:
        super().__init__(held, pinned)
        self.coop_record.layout_optimization = not pinned
        self.coop_record.plans[0].layout_copies = copies


def _layout_rounds(helds: list[int], copies: int) -> tuple[list[tuple[int, bool]], Any]:
    """fit_measured over stand-in rounds holding ``helds`` in turn: the (shave, pinned) each was compiled with."""
    given: list[tuple[int, bool]] = []
    pinned = [False]

    def compile_with(shave: int, observation: Observation | None, requested: int | None) -> _Step:
        given.append((shave, pinned[0]))
        return _LayoutStep(helds[len(given) - 1], pinned[0], copies)

    def pin() -> str:
        pinned[0] = True
        return "with the kernels in coop's order and without inductor's channels-last layout"

    try:
        returned = refit.fit_measured(compile_with, batch=None, loss_fn=None, rounds=3,
                                      pin_after_miss=pin)
    except OverBudgetError as exc:
        returned = exc
    return given, returned


def test_a_miss_the_layout_copies_explain_is_planned_below_in_inductors_order_and_layout() -> None:
    """Round 0 holds 100 B over its budget with 150 B of channels-last copies: round 1 is planned 110 B lower (what
    the step held above its plan's predicted 990 B), still in inductor's order and layout (not pinned), and is
    returned when it fits."""
    given, returned = _layout_rounds([1_100, 995, 995, 995], copies=150)
    assert given[:2] == [(0, False), (110, False)]
    rounds: list[CompileRound] = returned.coop_record.rounds
    assert not rounds[1].pinned and "channels-last copies" in rounds[1].reason and "copies of the caller-owned convolution inputs: 150 B" in rounds[1].reason
    assert returned.held == 995


def test_a_miss_larger_than_the_layout_copies_switches_to_coops_order_at_once() -> None:
    """100 B over with 50 B of copies: the copies cannot explain it, so round 1 is pinned at the same shave."""
    given, _ = _layout_rounds([1_100, 990, 990, 990], copies=50)
    assert given[:2] == [(0, False), (0, True)]


def test_a_second_miss_after_the_layout_shave_switches_to_coops_order() -> None:
    """The shaved round in inductor's layout misses again: the next round is pinned (the shave is tried once)."""
    given, _ = _layout_rounds([1_100, 1_050, 990, 990, 990], copies=150)
    assert [pinned for _, pinned in given[:3]] == [False, False, True]
    assert given[1][0] == 110


def test_a_miss_the_floor_leaves_no_room_to_plan_below_switches_to_coops_order_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies explain the 100 B over, but the Graph's floor (950 B) leaves 50 B to plan below where the step held
    110 B above its plan: a round clamped to the floor would hold as much over, so round 1 is pinned at once."""
    monkeypatch.setattr(refit, "min_budget", lambda graph: 950)
    given, _ = _layout_rounds([1_100, 990, 990, 990], copies=150)
    assert given[:2] == [(0, False), (0, True)]
