"""Regressions for what benchmarks/bench_fuzz.py found in the MILP plumbing and the CLI (issue 11).

1. CBC's lower bound was read from its result summary, printed with three decimals: a proven
   0.00095467587 came back as 0.001, above the optimum. Oracles: Python's own formatting of
   known numbers, and optima proven by a second solver (HiGHS) with a long time limit.
2. ``coop validate`` crashed (exit 3) on a schedule file whose budget is a huge integer.
3. HiGHS printed its banner on stdout before ``coop solve --json``'s JSON.
4. Time limits of 1 s or less never started checkmate or checkmate-lp, even on tiny graphs.
5. Checkmate's "infeasible" message named a space smaller than the one it searches.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.cli import main
from coop.formulations import solve
from coop.formulations.checkmate.milp import checkmate, checkmate_lp
from coop.formulations.heuristics.fast_schedules import peak_shaving_schedule
from coop.formulations.milp.backends import LinearModel, solve_milp
from coop.formulations.milp.pulp_backends import _cbc_bound, _printed_lower_bound
from coop.graph import Graph
from coop.schedule import Schedule, schedule_to_json, validate
from tests.benchmark_module import load_benchmark

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_fuzz() -> ModuleType:
    """The benchmark's graph generator: the graphs it found the bugs on."""
    return load_benchmark("bench_fuzz")


def chain_graph() -> Graph:
    """Input x, a forward chain a -> b -> c -> loss and its backward: 8 nodes, hand-checkable."""
    nodes = [
        {"id": 0, "name": "x", "mem": 4, "cost": 0, "kind": "input"},
        {"id": 1, "name": "a", "inputs": [0], "mem": 8, "cost": 1.0},
        {"id": 2, "name": "b", "inputs": [1], "mem": 8, "cost": 1.0},
        {"id": 3, "name": "c", "inputs": [2], "mem": 8, "cost": 1.0},
        {"id": 4, "name": "loss", "inputs": [3], "mem": 1, "cost": 1.0},
        {"id": 5, "name": "gc", "inputs": [4, 2], "mem": 8, "cost": 2.0, "kind": "backward"},
        {"id": 6, "name": "gb", "inputs": [5, 1], "mem": 8, "cost": 2.0, "kind": "backward"},
        {"id": 7, "name": "ga", "inputs": [6, 0], "mem": 2, "cost": 2.0, "kind": "backward"},
    ]
    return Graph.model_validate({"name": "chain", "nodes": nodes, "outputs": [4, 7], "meta": {"mem_unit": "bytes"}})


# ---------------------------------------------------------------------------- 1. CBC's bound
#: The end of CBC's log for bench_fuzz graph 298 (seed 0, 60 nodes) at budget 434751, stopped at
#: 2 s. HiGHS and SCIP prove the optimum of the same model 0.018964045660934306, i.e.
#: 0.00095467587364018 above the objective's constant 0.018009369787294126 (what CBC sees).
CBC_LOG_TAIL = """\
Cbc0010I After 0 nodes, 1 on tree, 0.001336221 best solution, best possible 0.00095467587 (1.50 seconds)
Cbc0020I Exiting on maximum time
Cbc0005I Partial search - best objective 0.001336221 (best possible 0.00095467587), took 940 iterations and 0 nodes (1.52 seconds)
Cbc0035I Maximum depth 0, 225 variables fixed on reduced cost

Result - Stopped on time limit

Objective value:                0.00133622
Lower bound:                    0.001
Gap:                            0.40
Enumerated nodes:               0
"""
CBC_MODEL_OPTIMUM = 0.018964045660934306 - 0.018009369787294126


def test_cbc_bound_of_fuzz_graph_298_is_not_above_its_optimum() -> None:
    bound = _cbc_bound(CBC_LOG_TAIL)
    assert bound is not None
    assert bound <= CBC_MODEL_OPTIMUM
    assert bound > 0.00095467  # the search messages' digits are used, not the summary's 0.000


def test_cbc_bound_from_the_summary_alone_is_rounded_down() -> None:
    summary_only = "Result - Stopped on time limit\n\nObjective value: 0.00133622\nLower bound:     0.001\n"
    bound = _cbc_bound(summary_only)
    assert bound is not None and bound <= 0.0005  # 0.001 may stand for anything in [0.0005, 0.0015)
    assert _cbc_bound("Result - Stopped on time limit\nNo feasible solution found\n") is None
    assert _cbc_bound("Lower bound: -100000000000000007629769841091887003294964970946560.000\n") is None


@settings(max_examples=300, deadline=None)
@given(value=st.floats(-1e12, 1e12, allow_nan=False), spec=st.sampled_from([".3f", ".2f", "g", ".8g", ".11g", ".3e"]))
def test_a_printed_number_is_lowered_below_every_value_it_may_stand_for(value: float, spec: str) -> None:
    text = format(value, spec)
    lowered = _printed_lower_bound(text)
    assert lowered is not None and lowered <= value, (value, text, lowered)


#: bench_fuzz graphs (seed 0, at most 40 nodes) on which CBC stops early at 0.3 s on this machine,
#: and HiGHS proves the optimum in a few seconds; the budget is a third of the way from the least
#: feasible budget to the baseline peak.
SHORT_LIMIT_GRAPHS = (19, 20, 98, 144)


# graphs 20 and 144 in the fast tier (40 s for the four on 2 loaded cores; these two reported the most bounds at 1 s),
# the four in the slow tier
@pytest.mark.parametrize("graphs", [SHORT_LIMIT_GRAPHS[1::2], pytest.param(SHORT_LIMIT_GRAPHS, marks=pytest.mark.slow)],
                         ids=["fast", "full"])
def test_short_limit_bounds_never_exceed_the_optimum_proven_by_highs(bench_fuzz: ModuleType,
                                                                     graphs: tuple[int, ...]) -> None:
    bounds_checked = 0
    for index in graphs:
        graph = bench_fuzz.make_graph(0, index, 40)
        least, peak = min_budget(graph), baseline_peak(graph)
        budget = least + (peak - least) // 3
        oracle = checkmate(graph, budget, solver="highs", time_limit=60, threads=1)
        assert oracle.status == "optimal", (index, oracle.status, oracle.message)
        assert oracle.objective is not None
        for solver in ("cbc", "scip", "cp-sat"):
            result = checkmate(graph, budget, solver=solver, time_limit=1.0, threads=1)
            if result.bound is None:
                continue
            assert result.bound <= oracle.objective + 1e-9 * abs(oracle.objective), (index, solver, result.bound)
            bounds_checked += 1
    # The property was checked on many solves (a solve cut off before its first bound reports none): two of three per
    # graph on a quiet machine; under a load of 6 on 2 cores three of six on graphs 20 and 144, one of six on 19 and 98
    # (2026-11-29), so one per graph is asked. Whether CBC stops early depends on the machine's speed; the rounding of the bound it then
    # prints is checked without timing in tests/test_checkmate.py::test_cbc_bound_is_read_from_its_log.
    assert bounds_checked >= len(graphs), bounds_checked


def _fuzz_case(bench_fuzz: ModuleType, seed: int, index: int) -> tuple[Graph, int]:
    """bench_fuzz's graph and budget of case ``index`` under ``seed`` (default 60-node graphs)."""
    graph = bench_fuzz.make_graph(seed, index, 60)
    return graph, bench_fuzz.draw_budget(random.Random(f"case/{seed}/{index}"), graph)


@pytest.mark.parametrize("seed, index", [(5, 153), (7, 39)])
def test_cbc_optimum_is_exact_on_a_model_costed_in_seconds(bench_fuzz: ModuleType, seed: int, index: int) -> None:
    """CBC's default cutoff increment (1e-5) pruned the optimum, 9e-6 cheaper than the schedule it
    called optimal (seed 5, graph 153); its pre-processing fixed variables wrongly and called a
    schedule optimal that cost more than store-all's, which fits (seed 7, graph 39). HiGHS and
    SCIP, with their own tolerances, are the oracle."""
    graph, budget = _fuzz_case(bench_fuzz, seed, index)
    cbc = checkmate(graph, budget, solver="cbc", time_limit=30, threads=1)
    for oracle in ("highs", "scip"):
        proof = checkmate(graph, budget, solver=oracle, time_limit=30, threads=1)
        assert proof.status == "optimal" and proof.objective is not None, proof.message
        assert cbc.status == "optimal" and cbc.objective == pytest.approx(proof.objective, rel=1e-9, abs=0)


def test_cbc_never_calls_a_feasible_model_infeasible_when_its_time_runs_out(bench_fuzz: ModuleType) -> None:
    """CBC's pre-processing says "infeasible" when its time limit interrupts it (seed 5, graph 158,
    at 0.8-1 s on this machine). Oracle: the peak-shaving heuristic's schedule (no solver), checked
    in Checkmate's space by the benchmark's own test and within the budget by the validator."""
    graph, budget = _fuzz_case(bench_fuzz, 5, 158)
    witness = peak_shaving_schedule(graph, budget)
    assert witness is not None
    assert bench_fuzz.in_checkmate_space(graph, witness)
    assert validate(graph, witness, budget).ok
    for time_limit in (0.6, 0.8, 1.0, 1.2):
        result = checkmate(graph, budget, solver="cbc", time_limit=time_limit, threads=1)
        assert result.status != "infeasible", (time_limit, result.message)


# ---------------------------------------------------------------------------- 2. huge budgets in schedule files
@pytest.mark.parametrize("budget", [10**30, 2**60 + 1])
def test_validate_refuses_a_huge_schedule_budget_with_one_line(budget: int, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    graph = chain_graph()
    graph_path, schedule_path = tmp_path / "chain.json", tmp_path / "schedule.json"
    graph.save(graph_path)
    document = schedule_to_json(graph, Schedule.from_order(graph.order), budget=10**6, formulation="order")
    document["budget"] = budget
    schedule_path.write_text(json.dumps(document))
    status = main(["validate", str(graph_path), str(schedule_path)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and "budget" in lines[0] and "2**60" in lines[0], err


def test_validate_accepts_the_largest_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = chain_graph()
    graph_path, schedule_path = tmp_path / "chain.json", tmp_path / "schedule.json"
    graph.save(graph_path)
    document = schedule_to_json(graph, Schedule.from_order(graph.order), budget=2**60, formulation="order")
    schedule_path.write_text(json.dumps(document))
    assert main(["validate", str(graph_path), str(schedule_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


# ---------------------------------------------------------------------------- 3. stdout is JSON only
@pytest.mark.parametrize("formulation, solver", [("checkmate-lp", None), ("checkmate", "highs"),
                                                 ("checkmate", "scip"), ("checkmate", "cp-sat"),
                                                 ("checkmate", "cbc")])
def test_solve_json_stdout_is_one_json_document(formulation: str, solver: str | None, tmp_path: Path) -> None:
    graph_path = tmp_path / "chain.json"
    chain_graph().save(graph_path)
    argv = [sys.executable, "-m", "coop", "solve", str(graph_path), "--budget", "28", "-f", formulation,
            "--time-limit", "10", "--json"] + (["--solver", solver] if solver else [])
    done = subprocess.run(argv, check=False, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the whole of stdout, nothing before or after
    assert report["formulation"] == formulation


def test_verbose_solver_log_goes_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    model = LinearModel()
    x, y = model.add_var("x"), model.add_var("y")
    model.add_row([(x, 1.0), (y, 1.0)], ">=", 1.0)
    model.objective = [(x, 2.0), (y, 3.0)]
    quiet = solve_milp(model, "highs", time_limit=5, threads=1)
    out, err = capfd.readouterr()
    assert (quiet.status, quiet.objective) == ("optimal", 2.0)
    assert out == "" and "HiGHS" not in err
    loud = solve_milp(model, "highs", time_limit=5, threads=1, verbose=True)
    out, err = capfd.readouterr()
    assert loud.objective == 2.0 and out == "" and "HiGHS" in err


# ---------------------------------------------------------------------------- 4. short time limits
#: The chain's baseline peak is 29 (x, a, b, c and loss resident while loss is computed); at 28
#: something must be recomputed. The optimum at each budget comes from a second backend with a
#: long limit (SCIP for HiGHS, HiGHS for the others).
CHAIN_BUDGETS = (28, 29)


@pytest.fixture(scope="module")
def chain_optima() -> dict[tuple[str, int], float]:
    """(backend under test, budget) -> the optimum proven by the other backend with a 30 s limit."""
    optima = {}
    for budget in CHAIN_BUDGETS:
        for oracle in ("highs", "scip"):
            proof = checkmate(chain_graph(), budget, solver=oracle, time_limit=30, threads=1)
            assert proof.status == "optimal" and proof.objective is not None, proof.message
            for tested in ("cbc", "highs", "scip", "cp-sat"):
                if tested != oracle and (tested != "scip" or oracle == "highs"):
                    optima.setdefault((tested, budget), proof.objective)
    return optima


@pytest.mark.parametrize("solver", ["cbc", "highs", "scip", "cp-sat"])
@pytest.mark.parametrize("time_limit", [0.2, 0.5, 1.0])
def test_checkmate_solves_a_small_graph_within_a_short_limit(solver: str, time_limit: float,
                                                             chain_optima: dict[tuple[str, int], float]) -> None:
    assert baseline_peak(chain_graph()) == 29 and min_budget(chain_graph()) <= 28
    for budget in CHAIN_BUDGETS:
        # One retry: on the 2-core CI machine under the other worker's load, CBC's process once overran a 1 s limit
        # in its root LP on this 29-byte graph (2026-11-27); a second overrun in a row fails.
        for _ in range(2):
            result = checkmate(chain_graph(), budget, solver=solver, time_limit=time_limit, threads=1)
            if result.status == "optimal":
                break
            assert result.status == "unknown" and "time limit" in result.message, (budget, result.message)
        assert result.status == "optimal", (budget, result.message)
        assert result.objective == pytest.approx(chain_optima[(solver, budget)])
        # the deadline's contract (issue 40: 1.1 x the limit + 2 s, CBC's process start-up included); the measured walls
        # are BENCHMARKS.md's time table (a tighter bound here failed under a loaded CI machine: cp-sat 1.17 s of 0.2)
        assert result.wall_s <= 1.1 * time_limit + 2, result.wall_s


# 0.2 s was too short under a loaded CI machine (75 of 100 roundings tried, none fitting: 'unknown', 2026-11-26)
@pytest.mark.parametrize("time_limit", [0.5, 1.0, 2.0])
def test_checkmate_lp_runs_within_a_short_limit(time_limit: float, chain_optima: dict[tuple[str, int], float]) -> None:
    result = checkmate_lp(chain_graph(), 28, time_limit=time_limit)
    assert result.status == "feasible", result.message
    assert result.simulation is not None and result.simulation.peak <= 28
    optimum = chain_optima[("cbc", 28)]
    assert result.bound is not None and result.bound <= optimum + 1e-9 <= result.objective + 2e-9


def test_checkmate_reports_unknown_when_no_time_is_left() -> None:
    result = checkmate(chain_graph(), 28, solver="cbc", time_limit=1e-9)
    assert result.status == "unknown" and "time limit" in result.message


# ---------------------------------------------------------------------------- 5. the infeasible message
def test_infeasible_message_names_the_extra_output_restriction(bench_fuzz: ModuleType) -> None:
    graph = bench_fuzz.make_graph(0, 3, 10)  # 5 computed nodes; both the MILP and its LP are infeasible
    budget = min_budget(graph)
    for result in (checkmate(graph, budget, solver="highs", time_limit=10), checkmate_lp(graph, budget, time_limit=10)):
        assert result.status == "infeasible", result.message
        assert "\n" not in result.message and str(budget) in result.message
        assert "frontier-advancing" in result.message and "extra output" in result.message
        assert "nothing recomputed" in result.message


@pytest.mark.parametrize("solver", ["highs", "scip", "cbc", "cp-sat"])
def test_a_hinted_milp_solves_on_every_backend(solver: str) -> None:
    """OR-Tools 9.15's HiGHS crashed the process (SIGSEGV) on any SetHint; a hint must never cost the process.
    Oracle: the optimum of min x + 2y subject to x + y >= 1 over binaries is 1 (x = 1), counted by hand."""
    from coop.formulations.milp.backends import LinearModel, solve_milp

    model = LinearModel()
    x, y = model.add_var("x"), model.add_var("y")
    model.add_row([(x, 1.0), (y, 1.0)], ">=", 1.0)
    model.objective = [(x, 1.0), (y, 2.0)]
    model.hint = {x: 0.0, y: 1.0}  # feasible but not optimal
    solution = solve_milp(model, solver, time_limit=10.0, threads=1)
    assert solution.status == "optimal" and solution.objective == pytest.approx(1.0)


def test_poet_claims_no_proof_for_a_schedule_outside_its_stage_space(bench_fuzz: ModuleType) -> None:
    """bench_fuzz seed 0, graph 9937 (m0, time): the paging heuristic's schedule costs 12352.0013 s while POET's
    stage MILP proves 12352.0137 s over its own space; poet called the heuristic's schedule optimal (or, when
    the MILP stopped early, stated the MILP's bound, above the returned cost). Oracle: a bound can never exceed the cost of a schedule in hand (its price is
    re-summed here from the profile's numbers, not taken from poet)."""
    from coop.device_profiles import load_device_profile

    graph, _ = _fuzz_case(bench_fuzz, 0, 9937)
    result = solve(graph, 5811, "poet", device_profile="m0", objective="time", time_limit=60, threads=1)
    profile = load_device_profile("m0")
    seconds = sum(
        graph.node(s.node).cost if s.op == "compute"
        else (profile.pagein_latency_s + graph.node(s.node).mem / profile.pagein_bytes_per_s) if s.op == "page_in"
        else (profile.pageout_latency_s + graph.node(s.node).mem / profile.pageout_bytes_per_s) if s.op == "page_out"
        else 0.0 for s in result.schedule.steps)
    assert result.objective == pytest.approx(seconds, rel=1e-12)
    assert result.bound is not None and result.bound <= seconds
    # the returned schedule beats the MILP's optimum over POET's space, so that optimum proves nothing about it
    assert result.extra["milp_status"] == "optimal" and result.extra["milp_objective"] > seconds
    assert result.status == "feasible", result.message
