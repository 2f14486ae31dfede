"""Checkmate's MILP and its LP rounding (coop.formulations.checkmate.milp) on small graphs."""

from __future__ import annotations

import io
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError, SolverError
from coop.formulations import solve
from coop.formulations.checkmate.milp import checkmate, checkmate_lp
from coop.formulations.core.progress import Progress, stderr_progress
from coop.graph import Graph
from coop.schedule import simulate, validate
from tests.bruteforce import least_peak, optimal_cost
from tests.strategies import random_graphs

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def chain_with_skips() -> Graph:
    """A forward chain of 4 whose activations the backward chain reads (a tiny training step)."""
    nodes = [
        {"id": 100, "name": "x", "mem": 2, "cost": 0, "kind": "input"},
        {"id": 0, "name": "f0", "inputs": [100], "mem": 4, "cost": 1},
        {"id": 1, "name": "f1", "inputs": [0], "mem": 4, "cost": 2},
        {"id": 2, "name": "f2", "inputs": [1], "mem": 4, "cost": 3},
        {"id": 3, "name": "f3", "inputs": [2], "mem": 4, "cost": 1},
        {"id": 4, "name": "loss", "inputs": [3], "mem": 1, "cost": 1},
        {"id": 5, "name": "g3", "inputs": [4, 2], "mem": 4, "cost": 1, "kind": "backward"},
        {"id": 6, "name": "g2", "inputs": [5, 1], "mem": 4, "cost": 1, "kind": "backward"},
        {"id": 7, "name": "g1", "inputs": [6, 0], "mem": 4, "cost": 1, "kind": "backward"},
        {"id": 8, "name": "g0", "inputs": [7, 100], "mem": 2, "cost": 1, "kind": "backward"},
    ]
    return Graph.model_validate({"name": "chain", "nodes": nodes, "outputs": [4, 8]})


def assert_fits(graph: Graph, result, budget: int) -> None:
    """The returned schedule is legal, within budget, and its reported numbers are the simulator's."""
    assert result.schedule is not None
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    sim = simulate(graph, result.schedule)
    assert result.simulation.peak == sim.peak <= budget
    assert result.objective == pytest.approx(sim.cost)


# -------------------------------------------------------------------- the MILP
def test_store_all_budget_gives_the_baseline_cost():
    graph = chain_with_skips()
    result = checkmate(graph, baseline_peak(graph))
    assert result.status == "optimal"
    assert_fits(graph, result, baseline_peak(graph))
    assert result.simulation.cost == graph.baseline_cost
    assert result.bound == pytest.approx(graph.baseline_cost)
    assert result.gap == 0.0


def test_tight_budget_forces_recomputation():
    graph = chain_with_skips()
    budget = min_budget(graph) + 2
    assert budget < baseline_peak(graph)
    result = checkmate(graph, budget)
    assert result.status == "optimal"
    assert_fits(graph, result, budget)
    assert result.simulation.cost > graph.baseline_cost
    assert result.simulation.recomputations > 0


def test_below_min_budget_is_infeasible():
    graph = chain_with_skips()
    result = checkmate(graph, min_budget(graph) - 1)
    assert result.status == "infeasible" and result.schedule is None
    assert "below min_budget" in result.message


@pytest.mark.parametrize("solver", ["cbc", "scip", "highs", "cp-sat"])
def test_solvers_agree_on_the_optimum(solver):
    graph = chain_with_skips()
    # min_budget is met exactly on this graph (checked by the simulator in assert_fits).
    budgets = [min_budget(graph), min_budget(graph) + 1, min_budget(graph) + 3, baseline_peak(graph) - 1]
    # The reference is the brute force over Checkmate's staged space, not one of the solvers.
    reference = [optimal_cost(graph, b, "staged") for b in budgets]
    assert reference == [23.0, 13.0, 13.0, 13.0]
    for budget, expected in zip(budgets, reference):
        result = checkmate(graph, budget, solver=solver)
        assert result.status == "optimal", (solver, budget, result.message)
        assert_fits(graph, result, budget)
        assert result.objective == pytest.approx(expected), (solver, budget)


@SETTINGS
@given(graph=random_graphs(max_nodes=7), fraction=st.floats(0.0, 1.0))
def test_random_graphs_cbc_and_cp_sat_agree_and_fit(graph, fraction):
    least, peak = min_budget(graph), baseline_peak(graph)
    budget = least + math.floor(fraction * (peak - least))
    cbc = checkmate(graph, budget, solver="cbc")
    cp_sat = checkmate(graph, budget, solver="cp-sat")
    staged = optimal_cost(graph, budget, "staged")  # brute force over Checkmate's space
    for result in (cbc, cp_sat):
        if staged is None:
            assert result.status == "infeasible" and result.schedule is None, result.message
        else:
            assert result.status == "optimal", result.message
            assert_fits(graph, result, budget)
            assert result.objective == pytest.approx(staged)
    if budget >= peak:  # store-all fits, so the optimum is exactly the baseline cost
        assert cbc.status == "optimal" and cbc.objective == pytest.approx(graph.baseline_cost)


@SETTINGS
@given(graph=random_graphs(max_nodes=7), fraction=st.floats(0.0, 1.0))
def test_optimum_is_no_worse_than_the_baselines(graph, fraction):
    from coop.formulations import BASELINES, solve

    least, peak = min_budget(graph), baseline_peak(graph)
    budget = least + math.floor(fraction * (peak - least))
    optimum = checkmate(graph, budget, solver="cbc")
    for name in BASELINES:
        baseline = solve(graph, budget, name)
        if baseline.schedule is None or baseline.simulation.peak > budget:
            continue
        if _first_computes(graph, baseline.schedule) != list(graph.order):
            continue  # Checkmate's stages follow graph.order; other first-compute orders are out of its space
        assert optimum.status == "optimal", (name, budget)
        assert optimum.objective <= baseline.simulation.cost + 1e-9, name


@SETTINGS
@given(graph=random_graphs(max_nodes=7), fraction=st.floats(0.0, 1.0), solver=st.sampled_from(["highs", "cp-sat", "cbc"]))
def test_cost_limit_keeps_the_optimum_and_proves_nothing_cheaper_exists(graph, fraction, solver):
    least, peak = min_budget(graph), baseline_peak(graph)
    budget = least + math.floor(fraction * (peak - least))
    optimum = checkmate(graph, budget, solver="cbc")
    if optimal_cost(graph, budget, "staged") is None:  # brute force: nothing of Checkmate's space fits
        assert optimum.status == "infeasible", optimum.message
        return
    assert optimum.status == "optimal", optimum.message
    at_optimum = checkmate(graph, budget, solver=solver, cost_limit=optimum.objective)
    assert at_optimum.status == "optimal"
    assert_fits(graph, at_optimum, budget)
    assert at_optimum.objective == pytest.approx(optimum.objective)
    below = checkmate(graph, budget, solver=solver, cost_limit=optimum.objective - 0.5)  # integral costs
    assert below.status == "infeasible", below.message
    assert f"at a cost of at most {optimum.objective - 0.5:g}" in below.message


def _first_computes(graph: Graph, schedule) -> list[int]:
    seen: list[int] = []
    for step in schedule.steps:
        if step.op == "compute" and step.node not in seen:
            seen.append(step.node)
    return seen


def test_non_recomputable_nodes_are_computed_once():
    graph = chain_with_skips()
    data = graph.to_dict()
    for node in data["nodes"]:
        if node["name"] in ("f1", "f2"):  # e.g. dropout: replay must not draw again
            node["recomputable"] = False
    graph = Graph.model_validate(data)
    free_run = checkmate(chain_with_skips(), min_budget(graph) + 2)
    assert free_run.simulation.recomputations > 0
    least = least_peak(graph, "staged")  # brute force: pinning f1 and f2 raises it above the free graph's floor
    assert min_budget(chain_with_skips()) < least < baseline_peak(graph)
    assert min_budget(graph) <= least_peak(graph, "all") <= least  # the floor counts what is pinned, never more
    for budget in range(min_budget(chain_with_skips()), baseline_peak(graph) + 1):
        result = checkmate(graph, budget)
        if budget < least:
            assert result.status == "infeasible", (budget, result.message)
            continue
        assert result.status == "optimal"
        assert_fits(graph, result, budget)
        assert result.objective == optimal_cost(graph, budget, "staged")
        computes = [s.node for s in result.schedule.steps if s.op == "compute"]
        assert computes.count(1) == 1 and computes.count(2) == 1


def test_outputs_are_resident_at_the_end_and_workspace_counts():
    graph = chain_with_skips()
    data = graph.to_dict()
    for node in data["nodes"]:
        if node["name"] == "g1":
            node["workspace"] = 6
    with_workspace = Graph.model_validate(data)
    budget = baseline_peak(with_workspace)
    result = checkmate(with_workspace, budget)
    assert result.status == "optimal"
    assert_fits(with_workspace, result, budget)
    # g1's step holds g2 (4), f0 (4), the input x (2), g1 (4) and its workspace (6): 20, the least
    # peak of every schedule (brute force), met by the MILP only if it counts the workspace there.
    assert min_budget(with_workspace) == least_peak(with_workspace, "staged") == 20
    tighter = checkmate(with_workspace, 20)
    assert tighter.status == "optimal"
    assert_fits(with_workspace, tighter, 20)
    assert tighter.objective == optimal_cost(with_workspace, 20, "staged")
    assert checkmate(with_workspace, 19).status == "infeasible"


def test_progress_reports_start_and_end(capsys):
    reports: list[Progress] = []
    checkmate(chain_with_skips(), 30, progress=reports.append)
    assert len(reports) >= 2 and reports[-1].final
    assert reports[-1].incumbent == pytest.approx(reports[-1].bound)
    stream = io.StringIO()
    printer = stderr_progress(stream)
    printer(Progress(0.1, None, None, "start"))
    printer(Progress(0.2, 10.0, 9.0, "skipped: within a second"))
    printer(Progress(0.3, 10.0, 10.0, "end", final=True))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "gap 0.00%" in lines[1]


def test_cp_sat_reports_incumbents_through_the_callback():
    reports: list[Progress] = []
    checkmate(chain_with_skips(), min_budget(chain_with_skips()) + 2, solver="cp-sat", progress=reports.append)
    assert any("incumbent" in r.message for r in reports)


# -------------------------------------------------------------------- bad input
def test_refuses_graphs_above_max_nodes():
    with pytest.raises(SolverError, match="max_nodes=5.*moccasin"):
        checkmate(chain_with_skips(), 100, max_nodes=5)


def test_unknown_solver_and_option_and_missing_commercial_solver():
    graph = chain_with_skips()
    with pytest.raises(SolverError, match="unknown MILP solver"):
        checkmate(graph, 30, solver="nope")
    with pytest.raises(CoopError, match="formulation 'checkmate' has no option 'bogus'"):
        solve(graph, 30, "checkmate", bogus=1)
    try:
        import pulp

        has_gurobi = pulp.GUROBI().available() or pulp.GUROBI_CMD().available()
    except Exception:  # noqa: BLE001
        has_gurobi = False
    if not has_gurobi:
        with pytest.raises(SolverError, match="gurobi is not available"):
            checkmate(graph, 30, solver="gurobi")


# -------------------------------------------------------------------- LP rounding
@SETTINGS
@given(graph=random_graphs(max_nodes=7), fraction=st.floats(0.0, 1.0))  # <= 13 computed nodes with extras: brute-forceable
def test_lp_rounding_returns_only_fitting_schedules(graph, fraction):
    least, peak = min_budget(graph), baseline_peak(graph)
    budget = least + math.floor(fraction * (peak - least))
    result = checkmate_lp(graph, budget, random_roundings=4)
    staged = optimal_cost(graph, budget, "staged")  # brute force over the space the LP relaxes
    if result.found:
        assert result.status == "feasible"
        assert_fits(graph, result, budget)
        # LP bound <= the optimum <= a rounding's cost.
        assert staged is not None
        assert result.bound <= staged + 1e-6
        assert staged <= result.objective + 1e-9
    else:
        assert result.status in ("unknown", "infeasible") and result.message
        if result.status == "infeasible":  # an infeasible relaxation proves the space empty
            assert staged is None
    if budget >= peak:  # store-all is a rounding of the relaxation's all-ones retention
        assert result.found and result.objective == pytest.approx(graph.baseline_cost)


def test_lp_rounding_at_the_baseline_peak_keeps_everything():
    graph = chain_with_skips()
    result = checkmate_lp(graph, baseline_peak(graph))
    assert result.status == "feasible"
    assert result.objective == pytest.approx(graph.baseline_cost)


# -------------------------------------------------------------------- memory scaling, time limits
def test_coarse_memory_levels_stay_within_budget_but_claim_no_proof():
    graph = chain_with_skips()
    budget = min_budget(graph) + 5
    exact = checkmate(graph, budget, solver="cp-sat")
    coarse = checkmate(graph, budget, solver="cp-sat", memory_levels=7)
    assert exact.status == "optimal" and exact.extra["memory_exact"]
    assert not coarse.extra["memory_exact"]
    # Budget 19 in 7 levels: a unit of ceil(17 / 7) = 3 bytes, so 4-byte values take 2 units and
    # the 17 bytes left after x only 5 units: g2's step (g3, f1 and g2: 6 units) cannot fit, so
    # the coarse model is infeasible, which proves nothing about the exact one (optimal above).
    assert coarse.status == "unknown" and coarse.schedule is None
    assert "memory_levels" in coarse.message


def test_cbc_bound_is_read_from_its_log():
    from coop.formulations.milp.pulp_backends import _cbc_bound

    log = "Result - Stopped on time limit\n\nObjective value:                12.5\nLower bound:                    10.25\nGap: 0.2\n"
    bound = _cbc_bound(log)  # printed rounded: anything printed as 10.25 is at least 10.245
    assert bound is not None and 10.245 - 1e-9 <= bound <= 10.245
    assert _cbc_bound("Result - Optimal solution found\n") is None


def test_time_limited_solve_reports_a_consistent_status(moccasin_dir):
    from coop.graph_files import load_graph

    graph = load_graph(moccasin_dir / "fcn_8_vgg_32_416_608_3_train_nx.json")
    budget = math.ceil(0.7 * baseline_peak(graph))
    result = checkmate(graph, budget, solver="cp-sat", time_limit=1.0)
    assert result.wall_s < 30
    # Each status must be self-consistent; a proof of infeasibility would be wrong: the baseline
    # chen-greedy schedule fits this budget.
    assert solve(graph, budget, "chen-greedy").extra["fits"]
    if result.status == "unknown":
        assert result.schedule is None and result.message
    else:
        assert result.status in ("optimal", "feasible"), result.status
        assert_fits(graph, result, budget)
        assert result.bound is not None and result.bound <= result.objective + 1e-6
        assert result.objective >= graph.baseline_cost
        assert result.gap == 0.0 if result.status == "optimal" else result.gap >= 0


# -------------------------------------------------------------------- LP robustness on real magnitudes
def _rescaled(graph: Graph, mem_factor: int, cost_factor: float) -> Graph:
    """The same graph in bytes (~1e6) and seconds (~1e-6), the magnitudes of a captured model."""
    data = graph.model_dump()
    for node in data["nodes"]:
        node["mem"] *= mem_factor
        node["workspace"] *= mem_factor
        node["cost"] *= cost_factor
    return Graph.model_validate(data)


def test_lp_relaxation_is_unaffected_by_units():
    graph = chain_with_skips()
    scaled = _rescaled(graph, 1_000_003, 1e-6)  # a prime: no common divisor folds the bytes back
    least, peak = min_budget(graph), baseline_peak(graph)
    for budget in (least + 2, (least + peak) // 2):
        plain = checkmate_lp(graph, budget)
        rescaled = checkmate_lp(scaled, budget * 1_000_003)
        assert plain.status == rescaled.status == "feasible", (budget, plain.message, rescaled.message)
        assert rescaled.bound == pytest.approx(plain.bound * 1e-6, rel=1e-6)
        assert rescaled.objective == pytest.approx(plain.objective * 1e-6, rel=1e-9)
        assert_fits(scaled, rescaled, budget * 1_000_003)


def test_scaled_lp_maps_values_back():
    from coop.formulations.milp.backends import LinearModel, solve_lp_relaxation

    # min 1e-6 x + 2e-6 y  s.t.  3e6 x + 1e6 y >= 2e6,  0 <= y <= 1,  x continuous in [0, 5e6].
    model = LinearModel()
    x = model.add_var("x", "continuous", 0.0, 5e6)
    y = model.add_var("y")
    model.add_row([(x, 3e6), (y, 1e6)], ">=", 2e6)
    model.objective = [(x, 1e-6), (y, 2e-6)]
    model.objective_constant = 1.0
    result = solve_lp_relaxation(model, time_limit=10)
    assert result.status == "optimal"
    assert result.values == pytest.approx([2 / 3, 0.0], abs=1e-9)
    assert result.objective == pytest.approx(1.0 + 1e-6 * 2 / 3, rel=1e-12)


@pytest.mark.parametrize("solver", ["cbc", "scip", "highs", "cp-sat"])
def test_every_backend_keeps_a_binary_fixed_by_its_bounds(solver):
    from coop.formulations.milp.backends import LinearModel, solve_milp

    # max x + y over binaries with x fixed to 0 by its upper bound (as cost_limit fixes R entries).
    model = LinearModel()
    x = model.add_var("x", "binary", 0.0, 0.0)
    y = model.add_var("y")
    model.add_row([(x, 1.0), (y, 1.0)], "<=", 2.0)
    model.objective = [(x, -1.0), (y, -1.0)]
    # a trivial model solved at once; a generous limit, so that a machine too loaded to start CBC's process within
    # 10 s (once, under bench_mutants' parallel runs) does not read as a status other than optimal
    result = solve_milp(model, solver, time_limit=60, threads=1)
    assert result.status == "optimal", result.message
    assert result.values is not None and round(result.values[x]) == 0 and round(result.values[y]) == 1
    assert result.objective == pytest.approx(-1.0)


def test_lp_rounding_stops_at_its_time_limit_with_a_clear_status():
    graph = _rescaled(chain_with_skips(), 1_000_003, 1e-6)
    result = checkmate_lp(graph, min_budget(graph), time_limit=1e-3)
    assert result.status == "unknown" and result.schedule is None
    assert "time limit" in result.message and "not solved" in result.message
    assert result.wall_s < 5


def test_lp_rounding_fits_a_captured_cnn():
    pytest.importorskip("torch")
    from coop.graph_capture import capture
    from coop.zoo import build

    model, batch, loss_fn = build("cnn")
    graph = capture(model, batch, loss_fn=loss_fn).graph
    budget = math.ceil(0.7 * baseline_peak(graph))
    result = checkmate_lp(graph, budget, time_limit=30, random_roundings=4)
    assert result.status == "feasible", result.message
    assert_fits(graph, result, budget)
    assert result.bound <= result.objective + 1e-12
