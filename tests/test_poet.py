"""POET (coop.formulations.poet.milp) against independent oracles.

* a brute-force search of POET's space (tests/bruteforce_paging.py: staged schedules with paging
  between stages), priced from the profile's raw numbers by the README's formulas: poet's proven
  optimum equals it;
* Checkmate solved by a second solver (HiGHS) when paging is priced out: poet equals it;
* the one validator on every schedule poet returns, and an energy recount by hand;
* POET's published graphs: energy <= min(remat only, paging only), never increasing with the budget;
* a captured model at a budget where Checkmate (HiGHS) proves remat alone infeasible: poet pages,
  and the executor replays it with gradients equal to eager and the device peak <= predicted.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from coop import capture
from coop.budget import baseline_peak, min_budget
from coop.device_profiles import DeviceProfile, profile_from_dict
from coop.errors import CoopError
from coop.formulations import solve
from coop.formulations.poet.milp import poet
from coop.graph import Graph
from coop.schedule import validate
from tests.bruteforce_paging import optimal_paging_schedule
from tests.strategies import random_graphs
from tests.tiers import check, examples

POET_DIR = Path(__file__).resolve().parents[1] / "graphs" / "poet"
ORACLE = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIMIT = {"time_limit": 30.0, "threads": 1}


@st.composite
def profiles(draw: st.DrawFn) -> DeviceProfile:
    """Random profiles in which paging is sometimes cheaper than recomputing a tiny graph's nodes (cost 0..10)."""
    positive = st.sampled_from([0.01, 0.05, 0.5, 1.0, 2.0, 7.0])
    return profile_from_dict({
        "source": "hypothesis", "flops_per_s": draw(positive), "flops_per_joule": draw(positive), "power_w": 1.0,
        "memory_power_w": draw(positive), "pagein_latency_s": draw(positive), "pageout_latency_s": draw(positive),
        "pagein_bytes_per_s": draw(st.sampled_from([1.0, 4.0, 100.0, 1000.0])),
        "pageout_bytes_per_s": draw(st.sampled_from([1.0, 4.0, 100.0, 1000.0]))})


def prices_by_hand(graph: Graph, profile: DeviceProfile, objective: str) -> tuple[dict, dict, dict]:
    """POET's formulas (graphs/poet/README.md), written here from the profile's raw SI numbers."""
    watts = profile.flops_per_s / profile.flops_per_joule if objective == "energy" else 1.0
    paging_watts = profile.memory_power_w if objective == "energy" else 1.0
    compute, page_in, page_out = {}, {}, {}
    for node in graph.nodes:
        compute[node.id] = node.cost * watts
        page_in[node.id] = (profile.pagein_latency_s + node.mem / profile.pagein_bytes_per_s) * paging_watts
        page_out[node.id] = (profile.pageout_latency_s + node.mem / profile.pageout_bytes_per_s) * paging_watts
    return compute, page_in, page_out


def recount(graph: Graph, result, prices: tuple[dict, dict, dict]) -> float:
    compute, page_in, page_out = prices
    table = {"compute": compute, "page_in": page_in, "page_out": page_out, "free": {}}
    return sum(table[step.op].get(step.node, 0.0) for step in result.schedule.steps)


def budget_between(graph: Graph, fraction: float) -> int:
    least, peak = min_budget(graph), baseline_peak(graph)
    return least + math.floor(fraction * (peak - least))


#: 12 graphs in the fast tier, 30 in the slow one (tests/tiers.py)
@examples(12, 30)
def test_poet_proves_the_bruteforce_optimum(examples: int) -> None:
    check(_poet_proves_the_bruteforce_optimum, examples, ORACLE, graph=random_graphs(max_nodes=5),
          fraction=st.sampled_from([0.0, 0.0, 0.1, 0.2, 0.4, 0.7, 1.0]), profile=profiles(),
          objective=st.sampled_from(["energy", "time"]))


def _poet_proves_the_bruteforce_optimum(graph: Graph, fraction: float, profile: DeviceProfile,
                                        objective: str) -> None:
    budget = budget_between(graph, fraction)
    prices = prices_by_hand(graph, profile, objective)
    oracle = optimal_paging_schedule(graph, budget, *prices)
    result = solve(graph, budget, "poet", objective=objective, device_profile=profile, **LIMIT)
    if oracle is None:
        assert result.extra.get("milp_status") == "infeasible", result.message
        if result.schedule is None:
            return
    else:
        assert result.extra["milp_status"] == "optimal", result.message  # a timeout on 5 nodes fails here
        assert result.extra["milp_objective"] == pytest.approx(oracle.cost, rel=1e-6, abs=1e-9)
        assert result.objective <= oracle.cost + 1e-9 * max(1.0, oracle.cost)  # a warm start may lie outside the space
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert result.simulation.peak == verdict.peak
    assert result.objective == pytest.approx(recount(graph, result, prices), rel=1e-9, abs=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=6), fraction=st.floats(0.0, 1.0))
def test_with_paging_priced_out_poet_equals_checkmate_solved_by_another_solver(graph: Graph, fraction: float) -> None:
    budget = budget_between(graph, fraction)
    # One page costs more than recomputing every node in every stage could: paging never pays.
    priced_out = profile_from_dict({
        "source": "test", "flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0, "memory_power_w": 1.0,
        "pagein_latency_s": 1e3 * (1 + graph.baseline_cost) * len(graph.nodes) ** 2,
        "pageout_latency_s": 1e3 * (1 + graph.baseline_cost) * len(graph.nodes) ** 2,
        "pagein_bytes_per_s": 1.0, "pageout_bytes_per_s": 1.0})
    checkmate = solve(graph, budget, "checkmate", solver="highs", **LIMIT)
    result = solve(graph, budget, "poet", objective="time", device_profile=priced_out, **LIMIT)
    if checkmate.status == "infeasible":  # poet's own remat-only model must agree with HiGHS's proof
        assert "remat-only model: infeasible" in result.extra["models"], result.extra
        return
    assert checkmate.status == "optimal", checkmate.message
    assert result.extra["milp_status"] == "optimal", result.message
    assert result.extra["milp_objective"] == pytest.approx(checkmate.objective, rel=1e-6, abs=1e-9)
    assert result.objective <= checkmate.objective + 1e-9
    assert not any(step.op in ("page_in", "page_out") for step in result.schedule.steps)
    assert validate(graph, result.schedule, budget).ok


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=9), fraction=st.floats(0.0, 1.0), profile=profiles(),
       objective=st.sampled_from(["energy", "time"]), runtime_budget=st.sampled_from([None, 1.5, 3.0]))
def test_every_poet_schedule_validates_and_meets_its_budgets(graph: Graph, fraction: float, profile: DeviceProfile,
                                                             objective: str, runtime_budget: float | None) -> None:
    budget = budget_between(graph, fraction)
    result = solve(graph, budget, "poet", objective=objective, device_profile=profile, runtime_budget=runtime_budget,
                   time_limit=10, threads=1)
    if result.schedule is None:
        assert result.status in ("infeasible", "unknown"), result.message
        return
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    prices = prices_by_hand(graph, profile, "time")
    if runtime_budget is not None:
        assert recount(graph, result, prices) <= runtime_budget * graph.baseline_cost * (1 + 1e-6) + 1e-9


def _hand_graph() -> Graph:
    return Graph.model_validate({"name": "hand", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 0, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 100, "cost": 50},
        {"id": 2, "name": "b", "inputs": [1], "mem": 20, "cost": 1},
        {"id": 3, "name": "c", "inputs": [2], "mem": 20, "cost": 1},
        {"id": 4, "name": "big", "inputs": [3], "mem": 100, "cost": 1},
        {"id": 5, "name": "gb", "inputs": [4, 1], "mem": 10, "cost": 1, "kind": "backward"}], "outputs": [5]})


def test_a_hand_counted_paging_win() -> None:
    """x -> a (100 B) -> b -> c -> big -> gb (reads big and a): recomputing a costs 50 J; paging it out and
    back costs 2 x (1 s + 100 B / 100 B/s) x 1 W = 4 J. At 210 B a must leave the device while big is made."""
    graph = _hand_graph()
    profile = profile_from_dict({"source": "hand", "flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0,
                                 "memory_power_w": 1.0, "pagein_latency_s": 1.0, "pageout_latency_s": 1.0,
                                 "pagein_bytes_per_s": 100.0, "pageout_bytes_per_s": 100.0})
    budget = 210  # min_budget: gb's step holds big + a + gb
    result = solve(graph, budget, "poet", device_profile=profile, **LIMIT)
    assert result.status == "optimal", result.message
    # Baseline order: a stays through b, c, big: a + c + big = 220 > 210 at big's step. Page a out after b
    # (a + b = 120 then b + c, c + big, page a in: big + a = 200, then gb: 210): 54 J of compute + 4 J.
    assert result.objective == pytest.approx(54 + 4)
    assert [s.op for s in result.schedule.steps].count("page_out") == 1
    remat = solve(graph, budget, "poet", device_profile=profile, paging=False, **LIMIT)
    assert remat.objective == pytest.approx(54 + 50)  # recompute a instead
    assert validate(graph, result.schedule, budget).ok


def test_a_stopped_solve_states_the_baseline_energy_as_its_bound() -> None:
    """Every node of the hand graph is computed once at least: 54 J (a 50, b, c, big, gb 1 each at 1 J/s) is a
    proven bound even where the MILP is not run (max_nodes below the graph's size)."""
    graph = _hand_graph()
    profile = profile_from_dict({"source": "hand", "flops_per_s": 2.0, "flops_per_joule": 1.0, "power_w": 1.0,
                                 "memory_power_w": 1.0, "pagein_latency_s": 1.0, "pageout_latency_s": 1.0,
                                 "pagein_bytes_per_s": 100.0, "pageout_bytes_per_s": 100.0})
    result = solve(graph, 210, "poet", device_profile=profile, max_nodes=2, **LIMIT)
    assert result.status == "feasible"  # the interval model ran: a restricted model, never "optimal"
    assert result.bound == pytest.approx(2 * 54)  # 2 W while computing
    assert result.objective >= result.bound and result.gap is not None


# -------------------------------------------------------------------- POET's graphs
@pytest.fixture(scope="module")
def poet_dir() -> Path:
    if not POET_DIR.is_dir():
        pytest.skip(f"POET's exported graphs not found at {POET_DIR} (graphs/poet of the checkout)")
    return POET_DIR


# POET's transformer (28 s on 2 loaded cores) and the linear net's third budget (34 s for three on 2 loaded cores) in
# the slow tier: the linear net at two budgets keeps the three solves, the validation and the monotone energies in
# the fast tier
@pytest.mark.parametrize(("model", "platform", "fractions"), [("linear", "m4", (0.8, 1.0)),
                                                              pytest.param("linear", "m4", (0.8, 0.9, 1.0),
                                                                           marks=pytest.mark.slow),
                                                              pytest.param("transformer", "a72", (0.3, 0.6, 1.0),
                                                                           marks=pytest.mark.slow)])
def test_poet_beats_remat_only_and_paging_only_and_is_monotone(poet_dir: Path, model: str, platform: str,
                                                               fractions: tuple[float, ...]) -> None:
    from coop import load_graph

    graph = load_graph(poet_dir / f"poet_{model}_{platform}_b1.json")
    energies = []
    for fraction in fractions:
        budget = budget_between(graph, fraction)
        both = solve(graph, budget, "poet", device_profile=platform, **LIMIT)
        remat = solve(graph, budget, "poet", device_profile=platform, paging=False, **LIMIT)
        paging = solve(graph, budget, "poet", device_profile=platform, remat=False, **LIMIT)
        assert both.status == remat.status == paging.status == "optimal", (both.message, remat.message, paging.message)
        assert both.objective <= min(remat.objective, paging.objective) * (1 + 1e-9)
        assert validate(graph, both.schedule, budget).ok
        energies.append(both.objective)
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in itertools.pairwise(energies))


# -------------------------------------------------------------------- options
@pytest.mark.parametrize(("options", "needle"), [({"objective": "power"}, "objective 'power'"),
                                                 ({"runtime_budget": 0.5}, "runtime budget 0.5"),
                                                 ({"device_profile": "tpu-v9"}, "unknown device profile 'tpu-v9'")])
def test_bad_options_are_one_line(options: dict, needle: str) -> None:
    graph = Graph.model_validate({"name": "g", "nodes": [{"id": 0, "name": "a", "mem": 1, "cost": 1}], "outputs": [0]})
    with pytest.raises(CoopError) as caught:
        solve(graph, 10, "poet", **options)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_above_max_nodes_the_interval_model_runs_and_says_so() -> None:
    nodes = [{"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0}]
    nodes += [{"id": i, "name": f"f{i}", "inputs": [i - 1], "mem": 1, "cost": 1} for i in range(1, 8)]
    graph = Graph.model_validate({"name": "chain", "nodes": nodes, "outputs": [7]})
    result = solve(graph, 10, "poet", max_nodes=5)
    assert result.status == "feasible" and "max_nodes=5" in result.message and result.schedule is not None
    assert "ran the interval model" in result.message
    assert validate(graph, result.schedule, 10).ok


# -------------------------------------------------------------------- a captured model, replayed
def test_a_captured_model_below_the_remat_only_budget_pages_and_replays_exactly() -> None:
    """coop.plan(formulation="poet") at min_budget, where CP-SAT proves Checkmate (remat only) infeasible."""
    import copy

    import coop
    from coop.runtime.meter import MemoryMeter

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 7), nn.ReLU(), nn.Linear(7, 3))
    batch = (torch.randn(11, 5), torch.randn(11, 3))

    def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(m(x), y)

    eager = copy.deepcopy(model)
    captured = capture(model, batch, loss_fn)
    graph = captured.graph.with_random_replay()
    budget = min_budget(graph)
    # Checkmate's MILP solved by CP-SAT, its fastest prover here: under a load of 7 on 2 cores CP-SAT proved it
    # infeasible in 7 s, HiGHS in 44 s, CBC in 91 s, SCIP in 128 s (2026-11-29): a wide limit, never a pass
    remat_only = solve(graph, budget, "checkmate", solver="cp-sat", time_limit=180.0, threads=1)
    assert remat_only.status == "infeasible", remat_only.message  # proven: recomputation alone cannot
    # POET's MILPs end "unknown" at 10 s as at 3 s here; the schedule is its paging heuristic's either way (the same
    # schedule, 7 page-outs, at 1 and 3 s, 2026-11-30): 1 s
    plan = coop.plan(model, budget, batch, loss_fn=loss_fn, formulation="poet", device_profile="a100-pcie4",
                     time_limit=1, captured=captured)
    assert plan.formulation == "poet", plan.note
    assert any(step.op == "page_out" for step in plan.schedule.steps)
    verdict = validate(graph, plan.schedule, budget)
    assert verdict.ok, verdict.reason
    flat = captured.flat_inputs(model, batch)
    with MemoryMeter() as meter:
        meter.track(*flat, *captured.constants())
        plan.step(*batch)
    loss_fn(eager, *batch).backward()
    for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(param.grad, eager_param.grad)
    assert meter.peak_bytes <= plan.predicted_peak <= budget, meter.peak_op
    assert meter.host_peak_bytes > 0


def _free_recompute_graph() -> Graph:
    """Found by hypothesis: every node costs 0, so recomputing is free (0 J) while paging costs latency x power;
    a paging schedule and the recomputing optimum tie on compute cost, and only the energy tells them apart."""
    return Graph.model_validate({"name": "free-recompute", "order": [0, 2, 3, 1, 5, 6, 4], "nodes": [
        {"id": 0, "name": "fwd0", "mem": 0, "cost": 0}, {"id": 2, "name": "fwd2", "mem": 0, "cost": 0},
        {"id": 3, "name": "fwd3", "mem": 1, "cost": 0}, {"id": 1, "name": "fwd1", "mem": 1, "cost": 0},
        {"id": 5, "name": "fwd0.extra", "inputs": [0], "mem": 0, "cost": 0, "recomputable": False, "output_of": 0},
        {"id": 6, "name": "fwd1.extra", "inputs": [1], "mem": 0, "cost": 0, "recomputable": False, "output_of": 1},
        {"id": 4, "name": "bwd0", "inputs": [3], "mem": 0, "cost": 0, "kind": "backward"}]})


_SLOW_PAGING = profile_from_dict({"source": "hypothesis", "flops_per_s": 0.01, "flops_per_joule": 0.01, "power_w": 1.0,
                                  "memory_power_w": 0.01, "pagein_latency_s": 0.01, "pageout_latency_s": 0.01,
                                  "pagein_bytes_per_s": 1.0, "pageout_bytes_per_s": 1.0})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(graph=_free_recompute_graph(), fraction=0.0, profile=_SLOW_PAGING)
@given(graph=random_graphs(max_nodes=5), fraction=st.sampled_from([0.0, 0.2, 0.5]), profile=profiles())
def test_a_hinted_schedule_competes_on_the_objective(graph: Graph, fraction: float, profile: DeviceProfile) -> None:
    """With no MILP at all (max_nodes=0: the warm starts and the interval model), poet handed the brute-force optimum as a hint returns
    exactly its energy: hints compete on the objective, not on compute cost (a paging schedule's energy does not
    follow its compute cost). Oracle: tests/bruteforce_paging.py and the hand-written prices."""
    from coop.schedule import Schedule, Step

    budget = budget_between(graph, fraction)
    prices = prices_by_hand(graph, profile, "energy")
    oracle = optimal_paging_schedule(graph, budget, *prices)
    if oracle is None:
        return
    best = Schedule(steps=tuple(s if isinstance(s, Step) else Step(op=s[0], node=s[1]) for s in oracle.steps))
    from coop.formulations.heuristics.paging import paging_schedule

    # A paging schedule computes every node once (the least compute cost), so ranked by cost it would win over
    # an optimum that recomputes: the hints must compete on energy.
    paged = paging_schedule(graph, budget)
    hints = [paged, best] if paged is not None else [best]
    result = poet(graph, budget, device_profile=profile, max_nodes=0, hint=hints, time_limit=5, threads=1)
    assert result.status == "feasible" and result.schedule is not None
    assert result.extra["warm_start_objective"] == pytest.approx(oracle.cost, rel=1e-9, abs=1e-12)
    # the interval model (max_nodes=0) may page between any two computes, outside POET's staged space
    assert result.objective <= oracle.cost * (1 + 1e-9) + 1e-12
