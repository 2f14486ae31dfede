"""Which rounds of the measured re-solve count against ``rounds`` (coop.compiled.refit.fit_measured).

The compiler, the meter and the observation are stand-ins here, so the rounds' held bytes are set by hand: round 0
holds 1,100 B against a budget of 1,000 B and its buffers show a value never written; the Graph with that value
inlined is refused below its floor (as ResNet's at 0.7: min_budget 2,249,576 B against 2,246,305 B), and the Graph
with every value written holds 990 B. That refused round compiles nothing, so with ``rounds=2`` the written Graph
still gets its round and the step returned holds within the budget.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from coop.compiled import refit
from coop.compiled.observed import Observation
from coop.errors import CoopError, OverBudgetError

BUDGET = 1_000
#: what the stand-in step holds: round 0's Graph, and the Graph with every value written
HELD_FIRST, HELD_WRITTEN = 1_100, 990


class _Step:
    """A stand-in compiled module: its plan, what its step holds, or the refusal its compilation raises."""

    def __init__(self, held: int | None, overhead: float = 0.0, solver_overhead: float = 0.0,
                 planned_at: tuple[int, int] | None = None) -> None:
        self.held = held
        plan = SimpleNamespace(requested=BUDGET, budget=BUDGET, peak=BUDGET, solver_overhead=solver_overhead,
                               joint=SimpleNamespace(graph=SimpleNamespace(nodes=[], name="g", caller_owned_bytes=0)),
                               overhead=overhead,
                               result=SimpleNamespace(simulation=SimpleNamespace(overhead=overhead)))
        # planned_at: the (floor, budget) the partitioner planned a refused graph at (None: refused before planning)
        floor, budget = planned_at or (None, None)
        part = SimpleNamespace(plans=[plan], last_floor=floor, last_budget=budget)
        self.coop_record = SimpleNamespace(pin=None, layout_optimization=False, horizontal_fusion=False,
                                           addmm_folds=False, partitioner=part, plans=[plan], rounds=[], observed_peak=lambda plan: None)


def _compile_with(shave: int, observation: Observation | None, requested: int | None) -> _Step:
    if observation is not None and observation.inline:
        return _Step(None)  # refused below its floor when the step first runs
    return _Step(HELD_FIRST if observation is None else HELD_WRITTEN)


def _warm_up(module: _Step, *args: Any) -> list[int]:
    if module.held is None:
        raise CoopError("budget 1,000 B is below min_budget 1,040 B of graph 'g'")
    return [1]


def _observe(record: Any, plan: Any, previous: Observation | None, scratch: dict[str, int],
             keep_writing: bool = False) -> Observation:
    return Observation() if keep_writing else Observation(inline=frozenset({"never_written"}))


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refit, "warm_up", _warm_up)
    monkeypatch.setattr(refit, "held_bytes", lambda module, batch, loss_fn: module.held)
    monkeypatch.setattr(refit, "step_seconds", lambda module, batch, loss_fn: 0.1)
    monkeypatch.setattr(refit, "_measured_scratch", lambda *args: {})
    monkeypatch.setattr(refit, "_observe", _observe)


@pytest.mark.usefixtures("stand_ins")
def test_the_refused_inlined_round_leaves_the_written_graph_its_round() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a round within the budget is returned, without a warning
        returned = refit.fit_measured(_compile_with, batch=None, loss_fn=None, rounds=2)
    rounds = returned.coop_record.rounds
    assert [r.measured_peak for r in rounds] == [HELD_FIRST, None, HELD_WRITTEN]
    assert rounds[1].reason.startswith("no plan") and "every value written" in rounds[2].reason
    assert returned.held == HELD_WRITTEN <= BUDGET


@pytest.mark.usefixtures("stand_ins")
def test_one_round_stays_one_compilation() -> None:
    """rounds=1: round 0 only, over its budget: refused with the numbers, the step that held least on the error."""
    with pytest.raises(OverBudgetError, match=r"held at least 1,100 B against its budget 1,000 B \(100 B over\)") as err:
        refit.fit_measured(_compile_with, batch=None, loss_fn=None, rounds=1)
    assert (err.value.held, err.value.budget) == (HELD_FIRST, BUDGET)
    assert [r.measured_peak for r in err.value.compiled.coop_record.rounds] == [HELD_FIRST]


@pytest.mark.usefixtures("stand_ins")
@pytest.mark.parametrize(("solver_overhead", "compilations"), [(0.0, 1), (0.05, 2)])
def test_only_the_solvers_own_recomputation_starts_a_slack_round(solver_overhead: float, compilations: int) -> None:
    """A plan within its budget whose recomputation is all inline_saved's moves (overhead 0.05, the solver's own 0)
    has nothing a larger budget buys back: one compilation. The same plan with the solver recomputing: a slack
    round (its budget raised by the 100 B the step left)."""
    budgets: list[int | None] = []

    def compile_with(shave: int, observation: Observation | None, requested: int | None) -> _Step:
        budgets.append(shave)
        return _Step(BUDGET - 100, overhead=0.05, solver_overhead=solver_overhead)

    refit.fit_measured(compile_with, batch=None, loss_fn=None, rounds=3)
    assert len(budgets) == compilations


@pytest.mark.usefixtures("stand_ins")
def test_a_round_planned_on_observed_buffers_and_still_over_is_also_planned_below_its_excess(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round shows new buffers and holds 100 B over: round 1 is planned on round 0's buffers at the same
    budget; round 2, after a round that had the buffers and still missed, also 100 B below the budget."""
    shaves: list[int] = []
    seen = iter(range(100))
    monkeypatch.setattr(refit, "_observe", lambda *args, **kwargs: Observation(scratch=((f"v{next(seen)}", 8),)))
    monkeypatch.setattr(refit, "min_budget", lambda graph: 0)

    def compile_with(shave: int, observation: Observation | None, requested: int | None) -> _Step:
        shaves.append(shave)
        return _Step(BUDGET + 100)

    with pytest.raises(OverBudgetError, match="against its budget"):
        refit.fit_measured(compile_with, batch=None, loss_fn=None, rounds=3)
    assert shaves == [0, 0, 100]


@pytest.mark.usefixtures("stand_ins")
def test_a_re_solve_that_reached_the_measured_floor_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 0 holds 100 B over; its buffers show scratch that lifts the Graph's floor to 960 B, so the round planned
    100 B below the budget (at 900 B) is planned at that floor and has no schedule there (as bench_cuda's quick ResNet
    at 0.5 on CPU: oneDNN's convolution scratch charged, the floor 1,826,016 B above the 1,656,564 B the excess asked
    for). The refusal names that floor instead of asking for more time."""
    monkeypatch.setattr(refit, "_observe", lambda *args, **kwargs: Observation(scratch=(("conv", 60),)))
    monkeypatch.setattr(refit, "min_budget", lambda graph: 900)
    steps = iter([_Step(BUDGET + 100), _Step(BUDGET + 100), _Step(None, planned_at=(960, 960)),
                  _Step(None, planned_at=(960, 960))])

    with pytest.raises(OverBudgetError, match=r"reached its floor \(960 B\) and had no schedule there") as err:
        refit.fit_measured(lambda *args: next(steps), batch=None, loss_fn=None, rounds=3)
    assert err.value.floor == 960 and err.value.held == BUDGET + 100
    assert "more time_limit" not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.usefixtures("stand_ins")
def test_a_re_solve_refused_above_its_floor_names_no_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same refusals planned above the floor (a time-out at 950 B, floor 900 B): no floor is named."""
    monkeypatch.setattr(refit, "_observe", lambda *args, **kwargs: Observation(scratch=(("conv", 60),)))
    monkeypatch.setattr(refit, "min_budget", lambda graph: 800)
    steps = iter([_Step(BUDGET + 100), _Step(BUDGET + 100), _Step(None, planned_at=(900, 950)),
                  _Step(None, planned_at=(900, 950))])

    with pytest.raises(OverBudgetError, match="more time_limit or more rounds") as err:
        refit.fit_measured(lambda *args: next(steps), batch=None, loss_fn=None, rounds=3)
    assert err.value.floor is None
