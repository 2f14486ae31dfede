"""``auto`` is the best of what coop has (issue 40): blocks and per-layer are rungs wherever repeated blocks are
found, blocks first on a large step, and the result lists every rung (time spent, status, overhead)."""

from __future__ import annotations

import math

from coop.budget import baseline_peak, min_budget
from coop.formulations import solve
from coop.formulations.ladder.auto import formulation_ladder, repeated_blocks
from coop.schedule import validate
from tests.test_blocks import repeated_chain as repeated_step


def test_on_a_large_step_with_repeated_blocks_blocks_is_the_first_rung_and_checkmate_none() -> None:
    large, small = repeated_step(30), repeated_step(3)
    assert len(large.order) > 120 and repeated_blocks(large) and repeated_blocks(small)
    budget = math.ceil(0.6 * baseline_peak(large))
    assert formulation_ladder(large, budget) == ["blocks", "moccasin"]
    assert formulation_ladder(small, math.ceil(0.8 * baseline_peak(small)))[0] == "checkmate"  # small: exact first


def test_auto_lists_every_rung_with_its_time_status_and_overhead() -> None:
    graph = repeated_step(30)
    budget = max(min_budget(graph), math.ceil(0.6 * baseline_peak(graph)))
    result = solve(graph, budget, "auto", time_limit=6.0, threads=1)
    assert result.schedule is not None and validate(graph, result.schedule, budget).ok
    names = [rung.formulation for rung in result.rungs]
    assert names[-2:] == ["blocks", "moccasin"] and names[0] in ("store-all", "checkpoint-all", "chen-sqrt",
                                                                   "chen-greedy", "per-layer")
    blocks_rung = result.rungs[-2]
    assert blocks_rung.status in ("feasible", "optimal") and blocks_rung.overhead is not None
    assert 0 < blocks_rung.wall_s and blocks_rung.limit_s <= 6.0
    assert result.simulation.overhead <= min(r.overhead for r in result.rungs if r.overhead is not None) + 1e-12
    assert all(rung.line() in result.message for rung in result.rungs)
    assert result.extra["auto_tried"] == {rung.formulation: rung.status for rung in result.rungs}


def test_on_a_large_graph_checkpoint_all_is_built_only_where_no_other_baseline_fits(monkeypatch) -> None:
    """checkpoint-all's schedule has O(n^2) steps (seconds on a thousand nodes) and is the costliest baseline:
    auto's candidates skip it where another baseline fits, and still fall back on it where none does."""
    from coop.formulations.ladder import auto as auto_module

    ran: list[str] = []
    real = auto_module.run_solver

    def recording(graph, budget, name, options=None, **keywords):
        ran.append(name)
        return real(graph, budget, name, options, **keywords)

    monkeypatch.setattr(auto_module, "run_solver", recording)
    graph = repeated_step(30)
    roomy = math.ceil(0.9 * baseline_peak(graph))
    auto_module.cheapest_fitting_baseline(graph, roomy, costly_last=True)
    assert "checkpoint-all" not in ran and "chen-greedy" in ran
    ran.clear()
    auto_module.cheapest_fitting_baseline(graph, roomy)
    assert "checkpoint-all" in ran  # the planner's call: every baseline, as before
