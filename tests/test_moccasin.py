"""Moccasin (Bartan et al. 2023) on CP-SAT: legality, fit, optimality on tiny graphs, statuses."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.formulations.core.solving_order import solving_graph
from coop.formulations.heuristics import baselines
from coop.formulations.heuristics.fast_schedules import improve_by_local_search, peak_shaving_schedule
from coop.formulations.intervals.slots import SlotProblem, sufficient_horizon, sufficient_intervals
from coop.formulations.moccasin.intervals import moccasin, schedule_intervals
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.schedule import Schedule, prompt_order, simulate, validate
from tests.bruteforce import least_peak, least_peak_schedule, optimal_cost
from tests.strategies import random_graphs

FAST = {"time_limit": 10.0, "threads": 1}


def _chain_with_skips(n: int = 6) -> Graph:
    """A forward chain with a backward pass reading every forward value: remat pays off."""
    nodes = [{"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0.0}]
    for i in range(1, n + 1):
        nodes.append({"id": i, "name": f"f{i}", "inputs": [i - 1], "mem": 4, "cost": float(i)})
    previous = n
    for j, i in enumerate(range(n, 0, -1)):
        node_id = n + 1 + j
        inputs = [previous] if previous == i else [previous, i]
        nodes.append({"id": node_id, "name": f"b{i}", "kind": "backward", "inputs": inputs, "mem": 4, "cost": 1.0})
        previous = node_id
    return Graph.model_validate({"name": "chain", "nodes": nodes, "outputs": [previous]})


def test_store_all_budget_is_optimal_without_search() -> None:
    graph = _chain_with_skips()
    result = moccasin(graph, baseline_peak(graph), **FAST)
    assert result.status == "optimal"
    assert result.simulation.cost == graph.baseline_cost


def test_tight_budget_fits_and_objective_matches_simulation() -> None:
    graph = _chain_with_skips()
    budget = math.ceil(0.7 * baseline_peak(graph))
    assert budget >= min_budget(graph)
    result = moccasin(graph, budget, **FAST)
    assert result.status == "optimal"
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert result.objective == pytest.approx(result.simulation.cost)
    assert result.bound == pytest.approx(result.objective)
    assert result.simulation.cost > graph.baseline_cost  # the budget forces a recomputation
    # The brute force over in-order schedules (moccasin keeps the order on a training step).
    assert result.simulation.cost == optimal_cost(graph, budget, "in_order") == 30.0


def test_beats_or_ties_every_baseline_that_fits() -> None:
    graph = _chain_with_skips(8)
    for fraction in (0.6, 0.8):
        budget = max(min_budget(graph), math.ceil(fraction * baseline_peak(graph)))
        result = moccasin(graph, budget, **FAST)
        assert result.found and result.simulation.peak <= budget
        fitting = 0
        for name in ("store_all", "checkpoint_all", "chen_sqrt", "chen_greedy"):
            baseline = getattr(baselines, name)(graph, budget)
            if baseline.schedule is not None and simulate(graph, baseline.schedule).peak <= budget:
                fitting += 1
                assert result.simulation.cost <= simulate(graph, baseline.schedule).cost + 1e-9, name
        assert fitting == 3, fraction  # all but store-all fit at 60% and 80%: the comparison ran


def test_matches_brute_force_on_tiny_graph() -> None:
    graph = _chain_with_skips(3)
    budget = min_budget(graph)
    # The independent brute force (tests/bruteforce.py) over every schedule: f1 is recomputed once.
    brute = optimal_cost(graph, budget, "all")
    assert brute == optimal_cost(graph, budget, "in_order") == graph.baseline_cost + 1 == 10.0
    result = moccasin(graph, budget, max_intervals=3, keep_order=False, extra_slots=3, **FAST)
    assert result.status == "optimal"
    assert validate(graph, result.schedule, budget).ok
    assert result.simulation.cost == brute


def test_below_min_budget_is_infeasible_with_a_reason() -> None:
    graph = _chain_with_skips()
    result = moccasin(graph, min_budget(graph) - 1, **FAST)
    assert result.status == "infeasible" and result.schedule is None
    assert "below min_budget" in result.message


def test_budget_between_lower_bound_and_true_minimum_gets_a_clear_status() -> None:
    # y and z both read x and the join reads both: any order holds x, y and z at once (30), while
    # the single-step lower bound is only 21. A budget of 25 is legal to ask for but unreachable.
    nodes = [
        {"id": 0, "name": "x", "mem": 10, "cost": 1.0},
        {"id": 1, "name": "y", "inputs": [0], "mem": 10, "cost": 1.0},
        {"id": 2, "name": "z", "inputs": [0], "mem": 10, "cost": 1.0},
        {"id": 3, "name": "join", "inputs": [1, 2], "mem": 1, "cost": 1.0},
    ]
    graph = Graph.model_validate({"name": "diamond", "nodes": nodes})
    assert min_budget(graph) == 21 and baseline_peak(graph) == 30 and least_peak(graph) == 30
    result = moccasin(graph, 25, max_intervals=2, **FAST)
    assert result.status == "infeasible" and result.schedule is None
    assert "25" in result.message and "least peak 30" in result.message


def test_progress_reports_incumbent_and_bound() -> None:
    graph = _chain_with_skips()
    reports = []
    moccasin(graph, math.ceil(0.7 * baseline_peak(graph)), progress=reports.append, **FAST)
    assert reports and reports[-1].final
    assert reports[-1].incumbent is not None and reports[-1].bound is not None


def test_peak_shaving_fits_published_graph(moccasin_dir) -> None:
    graph = load_graph(moccasin_dir / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json")
    budget = math.ceil(0.8 * baseline_peak(graph))
    schedule = peak_shaving_schedule(graph, budget)
    assert schedule is not None and validate(graph, schedule, budget).ok
    intervals, slots = schedule_intervals(graph, schedule)
    assert slots == schedule.compute_count
    assert sum(len(v) for v in intervals.values()) == schedule.compute_count


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=8), fraction=st.sampled_from([0.5, 0.75, 1.0]))
def test_random_graphs_fit_and_never_beat_the_lower_bounds(graph: Graph, fraction: float) -> None:
    budget = max(min_budget(graph), math.ceil(fraction * baseline_peak(graph)))
    result = moccasin(graph, budget, max_intervals=2, time_limit=5.0, threads=1)
    in_order = optimal_cost(graph, budget, "in_order")  # brute force over the space "optimal" speaks of
    if in_order is not None:
        assert result.status == "optimal", result.message  # up to 8 nodes: proven well within 5 s
    if result.found:
        verdict = validate(graph, result.schedule, budget)
        assert verdict.ok, verdict.reason
        assert result.simulation.cost >= graph.baseline_cost - 1e-9
        if result.status == "optimal":
            assert in_order is None or result.simulation.cost <= in_order
    else:  # up to 8 nodes the feasibility question proves it: never "unknown" here
        assert in_order is None and result.status == "infeasible", result.message


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=4), fraction=st.sampled_from([0.5, 0.7, 0.85]))
def test_optimal_means_no_cheaper_in_order_schedule(graph: Graph, fraction: float) -> None:
    budget = max(min_budget(graph), math.ceil(fraction * baseline_peak(graph)))
    result = moccasin(graph, budget, time_limit=5.0, threads=1)
    # Independent brute force (tests/bruteforce.py): in-order schedules, and all schedules.
    in_order, optimum = optimal_cost(_ordered(graph), budget, "in_order"), optimal_cost(graph, budget, "all")
    if in_order is None:
        # Nothing in order fits; only a warm start from outside the space could. Without one, the
        # feasibility question proves that nothing of the space fits.
        assert result.found or result.status == "infeasible", result.message
        assert not result.found or optimum is not None
    else:
        assert result.status == "optimal", result.message
    if result.found:
        assert validate(graph, result.schedule, budget).ok
        assert optimum is not None and optimum <= result.simulation.cost
        assert in_order is None or result.simulation.cost <= in_order


def test_sufficient_intervals_bound_recomputations_by_cost_and_readers() -> None:
    graph = _chain_with_skips(4)
    problem = SlotProblem.build(graph, baseline_peak(graph))
    no_slack = sufficient_intervals(problem, 0.0)
    assert all(limit == 1 for limit in no_slack.values())  # no extra cost: nothing is recomputed
    some = sufficient_intervals(problem, 2.0)
    assert some[1] == 3 and some[2] == 2 and some[3] == 1  # f1 costs 1, f2 costs 2, f3 costs 3
    unbounded = sufficient_intervals(problem, None)
    # Without a cost bound only the readers bound the computations: never below the bounded limits.
    assert all(unbounded[v] >= some[v] for v in problem.order)
    assert sufficient_horizon(problem, some, 2.0) == len(problem.order) + 2  # two f1 recomputations


def test_restricted_model_gives_nodes_dearer_than_the_slack_one_interval() -> None:
    from coop.formulations.moccasin.intervals import _Incumbent, _model_shape, _Settings

    graph = _chain_with_skips(6)
    budget = baseline_peak(graph) - 8  # the optimum recomputes 3 units' worth: f4..f6 are dearer than that
    problem = SlotProblem.build(graph, budget)
    warm = moccasin(graph, budget, **FAST)
    assert warm.schedule is not None
    incumbent = _Incumbent("test", warm.schedule, warm.simulation)
    slack = warm.simulation.cost - graph.baseline_cost
    settings = _Settings(10.0, 1, 0, 3, True, None, False, {})  # C = 3, restricted model (no proof)
    intervals, per_node, _, covers = _model_shape(problem, incumbent, settings)
    assert not covers
    dear = [v for v in problem.order if graph.node(v).cost > slack]
    cheap = [v for v in problem.order if 0 < graph.node(v).cost <= slack / 2 and problem.recomputable[v]]
    assert dear and cheap
    for v in dear:  # a better schedule never recomputes them: one interval unless the warm start has more
        assert per_node[v] == len(intervals[v]) == 1
    assert all(per_node[v] >= 2 for v in cheap)


def test_local_search_never_worsens_and_fits(moccasin_dir) -> None:
    graph = load_graph(moccasin_dir / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json")
    budget = math.ceil(0.8 * baseline_peak(graph))
    start = peak_shaving_schedule(graph, budget)
    assert start is not None
    improved = improve_by_local_search(graph, budget, start, time_limit=2.0)
    verdict = validate(graph, improved, budget)
    assert verdict.ok, verdict.reason
    assert verdict.cost <= simulate(graph, start).cost + 1e-9


def test_a_model_too_large_for_the_time_limit_is_not_built_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from coop.formulations.moccasin import intervals as module

    graph = _chain_with_skips(6)
    budget = math.ceil(0.6 * baseline_peak(graph))
    monkeypatch.setattr(module, "MODEL_MAX_INTERVALS", 3)
    result = moccasin(graph, budget, time_limit=5.0, threads=1, local_search=0.0)
    assert result.status == "feasible" and result.schedule is not None
    assert validate(graph, result.schedule, budget).ok
    assert "CP-SAT not run" in result.message and result.extra["cp_sat_status"] == "NOT_RUN"


def _op_with_two_extra_outputs() -> Graph:
    """x -> op (two extra outputs, e.g. layer norm's mean and rstd) -> r (random) -> y; the backward reads all."""
    return Graph.model_validate({"name": "two-extras", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0},
        {"id": 1, "name": "op", "inputs": [0], "mem": 8, "cost": 2, "workspace": 2},
        {"id": 2, "name": "mean", "inputs": [1], "mem": 1, "cost": 0, "output_of": 1, "recomputable": False},
        {"id": 3, "name": "rstd", "inputs": [1], "mem": 1, "cost": 0, "output_of": 1, "recomputable": False},
        {"id": 4, "name": "r", "inputs": [1], "mem": 1, "cost": 1, "recomputable": False, "random": True},
        {"id": 5, "name": "s", "inputs": [0], "mem": 1, "cost": 1, "recomputable": False, "random": True},
        {"id": 8, "name": "big", "inputs": [0], "mem": 30, "cost": 1},
        {"id": 6, "name": "y", "inputs": [4, 5, 8], "mem": 8, "cost": 2},
        {"id": 9, "name": "z", "inputs": [6], "mem": 20, "cost": 1},
        {"id": 7, "name": "g", "inputs": [9, 1, 2, 3, 4], "mem": 1, "cost": 1, "kind": "backward"},
        {"id": 10, "name": "g2", "inputs": [7, 8], "mem": 1, "cost": 1, "kind": "backward"},
    ], "outputs": [10]})


def test_each_extra_output_starts_at_its_own_slot_so_the_order_is_kept() -> None:
    from coop.formulations.intervals.model import first_computations_in_order
    from coop.formulations.moccasin.intervals import schedule_intervals

    graph = _op_with_two_extra_outputs()
    intervals, _ = schedule_intervals(graph, Schedule.from_order(graph.order))
    assert intervals[2][0][0] != intervals[3][0][0]  # mean and rstd are taken at different slots
    assert first_computations_in_order(intervals, SlotProblem.build(graph, baseline_peak(graph)).order)


def test_random_ops_keep_their_order_even_without_keep_order() -> None:
    graph = _op_with_two_extra_outputs()
    budget = baseline_peak(graph) - 20  # big must be freed before z and rebuilt for g
    assert budget >= min_budget(graph)
    first = moccasin(graph, budget, time_limit=5.0, threads=1)
    assert first.found and first.simulation.recomputations >= 1
    # A warm start that draws s before r (legal for the simulator, wrong for the replay's RNG: the validator
    # refuses it at the step that first draws s).
    sequence = [step.node for step in first.schedule.steps if step.op == "compute"]
    i, j = sequence.index(4), sequence.index(5)
    sequence[i], sequence[j] = sequence[j], sequence[i]
    swapped = Schedule.from_order(sequence)
    assert simulate(graph, swapped).peak <= budget
    check = validate(graph, swapped, budget)
    assert not check.ok and check.step == min(i, j) and "random op first drawn out of graph.order" in check.reason
    result = moccasin(graph, budget, time_limit=5.0, threads=1, keep_order=False, hint=swapped, local_search=0.0)
    assert result.found
    firsts = list(dict.fromkeys(s.node for s in result.schedule.steps if s.op == "compute"))
    assert firsts.index(4) < firsts.index(5)


# -------------------------------------------------------------------- infeasibility, proven quickly
#: The feasibility question gets a quarter of the limit (2 s) and answers tiny graphs in ~0.1 s; the margin is
#: for a loaded machine (a proof cut off would read "unknown" and fail).
QUICK = {"time_limit": 8.0, "threads": 1, "lp_warm_start": False}
BELOW = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _space(graph: Graph) -> str:
    """The brute-force space moccasin's claims speak about (keep_order defaults to has_backward), over
    :func:`_ordered` graph."""
    return "in_order" if graph.has_backward else "all"


def _ordered(graph: Graph) -> Graph:
    """The graph in the order moccasin solves in (the deferred order where it lowers the store-all peak)."""
    return solving_graph(graph)[0]


def _first_computations(schedule: Schedule) -> list[int]:
    return list(dict.fromkeys(step.node for step in schedule.steps if step.op == "compute"))


def _assert_below_its_space(graph: Graph, budget: int) -> None:
    """Below the least peak of moccasin's space: a proof of infeasibility, or (only when a schedule
    outside the space fits) a legal schedule from a warm start that is indeed outside it."""
    result = moccasin(graph, budget, **QUICK)
    assert result.status != "unknown", result.message  # tiny graphs: the proof takes ~0.1 s
    if result.status == "infeasible":
        assert result.schedule is None and optimal_cost(_ordered(graph), budget, _space(graph)) is None
        if budget >= min_budget(graph):
            assert result.extra["feasibility"]["status"] == "INFEASIBLE", result.extra
        return
    assert least_peak(graph, "all") <= budget, result.message  # only a schedule outside the space fits
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert _first_computations(result.schedule) != list(prompt_order(graph))


@st.composite
def _fans(draw: st.DrawFn) -> Graph:
    """x -> 2 or 3 branches (chains of 1 or 2 nodes) -> join, no backward: every order must hold
    several branch values next to x or each other, so the least peak often exceeds min_budget
    (random_graphs without a backward part rarely draw that). Sizes and costs are small integers;
    at most one node is a random op (the brute force knows no draw order)."""
    sizes = st.integers(0, 20)
    nodes = [{"id": 0, "name": "x", "mem": draw(sizes), "cost": draw(st.integers(0, 5))}]
    tails = []
    for branch in range(draw(st.integers(2, 3))):
        previous = 0
        for depth in range(draw(st.integers(1, 2)) if len(nodes) < 4 else 1):
            node_id = len(nodes)
            nodes.append({"id": node_id, "name": f"b{branch}.{depth}", "inputs": [previous], "mem": draw(sizes),
                          "cost": draw(st.integers(0, 5))})
            previous = node_id
        tails.append(previous)
    nodes.append({"id": len(nodes), "name": "join", "inputs": tails, "mem": draw(sizes), "cost": 1})
    random_op = draw(st.sampled_from([None, *range(len(nodes))]))
    if random_op is not None:
        nodes[random_op]["recomputable"] = False
    return Graph.model_validate({"name": "fan", "nodes": nodes})


@settings(BELOW, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(graph=random_graphs(max_nodes=6))
def test_one_unit_below_the_in_order_least_peak_nothing_of_the_space_fits(graph: Graph) -> None:
    least = least_peak(_ordered(graph), "in_order")
    assume(least - 1 >= min_budget(graph))  # else the lower bound alone answers; ~1 draw in 8 passes
    _assert_below_its_space(graph, least - 1)
    at_least = moccasin(graph, least, **QUICK)
    assert at_least.found, at_least.message
    verdict = validate(graph, at_least.schedule, least)
    assert verdict.ok, verdict.reason


@BELOW
@given(graph=_fans())
def test_one_unit_below_the_least_peak_of_any_order_is_infeasible(graph: Graph) -> None:
    # Free order (no backward part): moccasin's space is every schedule whose random ops draw in
    # the captured order; with at most one random op that is every schedule.
    assert len(graph.random_draws) <= 1 and not graph.has_backward
    least = least_peak(graph, "all")
    assume(least - 1 >= min_budget(graph))  # else the lower bound alone answers
    result = moccasin(graph, least - 1, **QUICK)
    assert result.status == "infeasible" and result.schedule is None, result.message
    at_least = moccasin(graph, least, **QUICK)
    assert at_least.found and validate(graph, at_least.schedule, least).ok, at_least.message


@settings(BELOW, max_examples=40)
@given(graph=st.one_of(random_graphs(max_nodes=6), _fans()), data=st.data())
def test_infeasible_means_the_brute_force_of_its_space_finds_nothing(graph: Graph, data: st.DataObject) -> None:
    least = least_peak(_ordered(graph), _space(graph))
    low = min(min_budget(graph), least)
    budget = data.draw(st.integers(low, least), label="budget")
    result = moccasin(graph, budget, **QUICK)
    if result.status == "infeasible":
        assert optimal_cost(_ordered(graph), budget, _space(graph)) is None, result.message
    elif budget == least:
        assert result.found and validate(graph, result.schedule, budget).ok, result.message
    else:
        _assert_below_its_space(graph, budget)


def _diamond() -> Graph:
    """No backward part: any order holds x, y and z at once (30); min_budget is only 21."""
    return Graph.model_validate({"name": "diamond", "nodes": [
        {"id": 0, "name": "x", "mem": 10, "cost": 1.0},
        {"id": 1, "name": "y", "inputs": [0], "mem": 10, "cost": 1.0},
        {"id": 2, "name": "z", "inputs": [0], "mem": 10, "cost": 1.0},
        {"id": 3, "name": "join", "inputs": [1, 2], "mem": 1, "cost": 1.0},
    ]})


def test_infeasible_message_names_the_space_and_the_least_peak() -> None:
    graph = _diamond()
    assert min_budget(graph) == 21
    result = moccasin(graph, 29, **QUICK)
    assert result.status == "infeasible", result.message
    assert result.message.startswith("no schedule in any order fits budget 29 (least peak 30)")
    assert least_peak_schedule(graph, "all").peak == 30


def test_a_feasibility_model_too_large_is_skipped_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from coop.formulations.intervals import feasibility as slot_feasibility

    graph = _diamond()
    monkeypatch.setattr(slot_feasibility, "FEASIBILITY_MAX_CELLS", 1)
    result = moccasin(graph, 29, **QUICK)
    assert result.schedule is None and result.status in ("infeasible", "unknown")
    assert result.extra["feasibility"]["status"] == "NOT_RUN"
    assert "skipped" in result.extra["feasibility"]["reason"]


def _ten_nodes_optimum_18() -> Graph:
    """Drawn by hypothesis: the optimum costs 18 (brute force, all schedules and in order), one
    recomputation of fwd5 (cost 9) over the baseline cost 9, at budget 44."""
    nodes = [
        {"id": 38, "name": "fwd0", "mem": 17, "cost": 0}, {"id": 49, "name": "fwd1", "mem": 0, "cost": 0},
        {"id": 11, "name": "fwd2", "inputs": [38, 49], "mem": 15, "cost": 0},
        {"id": 72, "name": "fwd3", "inputs": [38, 49], "mem": 12, "cost": 0},
        {"id": 80, "name": "fwd4", "mem": 12, "cost": 0}, {"id": 90, "name": "fwd5", "mem": 14, "cost": 9},
        {"id": 93, "name": "fwd1.extra", "inputs": [49], "mem": 0, "cost": 0, "recomputable": False, "output_of": 49},
        {"id": 94, "name": "fwd2.extra", "inputs": [11], "mem": 0, "cost": 0, "recomputable": False, "output_of": 11},
        {"id": 92, "name": "bwd0", "inputs": [90], "mem": 0, "cost": 0, "kind": "backward"},
        {"id": 75, "name": "bwd1", "inputs": [92, 38, 72, 11], "mem": 0, "cost": 0, "kind": "backward"},
    ]
    return Graph(name="ten", nodes=nodes, outputs=(92, 75, 90), order=(38, 49, 11, 72, 80, 90, 93, 94, 92, 75))


def test_moccasin_proves_the_optimum_of_a_ten_node_graph() -> None:
    """The proof takes about 2.5 s on one idle thread (38 intervals) and over 5 s on a loaded
    machine, so the limit is generous: a timeout fails this test, it never passes on one."""
    graph = _ten_nodes_optimum_18()
    assert optimal_cost(graph, 44, "in_order") == 18.0
    result = moccasin(graph, 44, max_intervals=2, time_limit=60.0, threads=1)
    assert result.objective == 18.0
    assert result.status == "optimal", result.message


def test_the_warm_start_hint_is_feasible_on_a_graph_with_outputs() -> None:
    """CP-SAT itself is the oracle: with every variable fixed to its hinted value the model must stay feasible.
    The hint once ended an output's last interval at the warm start's last slot, while the model retains
    outputs to ``horizon - 1`` (past it when the horizon has slack): INFEASIBLE on every captured graph (the zoo's
    CNN here, captured in 0.4 s; GPT-2's capture and solve took 10 times as long)."""
    from coop.graph_capture import capture
    from coop.zoo import build

    model, batch, loss_fn = build("cnn")
    graph = capture(model, batch, loss_fn).graph.with_random_replay()
    assert graph.outputs
    budget = math.ceil(0.7 * baseline_peak(graph))
    result = moccasin(graph, budget, time_limit=20.0, threads=1, prove=False,
                      cp_sat_parameters={"fix_variables_to_their_hinted_value": True})
    assert result.extra.get("warm_start") is not None, result.message
    assert [r["status"] for r in result.extra["rounds"]] == ["OPTIMAL"], result.extra["rounds"]
