"""POET's interval model (coop.formulations.poet.intervals) against independent oracles.

* A brute-force search written here from contract 2 (coop.schedule's docstring) (:func:`optimal_schedule_with_paging`): every
  legal schedule in any first-compute order, with page-outs and page-ins of computed values anywhere (never of
  caller-owned values, which poet keeps on the device), priced from the profile's raw numbers
  (tests/test_poet.py's ``prices_by_hand``). Its optimum is a lower bound on every schedule the interval model
  can return; where its optimal schedule lies inside the restricted model (at most C intervals per value, the
  model's slots, first computes in order) and CP-SAT proves the model optimal, the two are equal.
* tests/bruteforce_paging.py (POET's staged space) is *not* a lower bound for the interval model, which pages
  between any two computes: only the broad optimum <= the staged one is checked.
* A hand-counted graph where only paging fits (a value that cannot be recomputed), cross-checked with poet's MILP.
* A synthetic training graph above poet's max_nodes: the interval model runs, validates, fits and never loses
  to the warm start.
"""

from __future__ import annotations

import heapq
import itertools
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import min_budget
from coop.device_profiles import DeviceProfile, load_device_profile, profile_from_dict
from coop.formulations.poet.intervals import poet_intervals
from coop.formulations.poet.milp import poet
from coop.graph import Graph
from coop.schedule import validate
from tests.bruteforce import Found, _tiny
from tests.bruteforce_paging import optimal_paging_schedule
from tests.strategies import random_graphs
from tests.test_poet import budget_between, prices_by_hand, profiles, recount

MAX_INTERVALS = 3


# -------------------------------------------------------------------- the broad oracle
def optimal_schedule_with_paging(graph: Graph, budget: int, compute: dict, page_in: dict, page_out: dict
                                 ) -> Found | None:
    """The cheapest legal schedule (contract 2) whose peak fits ``budget``, any first-compute order, paging any
    computed value at any point: uniform-cost search over (device, computed, host) bitmasks.

    A page-out moves a value off the device (nothing counts at that step that did not before); a page-in moves
    it back (memory then = caller-owned + device values, which must fit); recomputing a paged-out value drops
    its host copy; a compute needs its inputs on the device, memory = caller-owned + device + output + workspace;
    an extra output comes with its op's first compute (the op's workspace covers it) and is never recomputed.
    """
    tiny = _tiny(graph)
    prices = [[float(table[i]) for i in tiny.ids] for table in (compute, page_in, page_out)]
    if tiny.owned_bytes > budget:
        return None
    start = (0, 0, 0)
    best = {start: 0.0}
    parents: dict = {start: None}
    counter = itertools.count()
    queue = [(0.0, next(counter), start, 0)]
    while queue:
        cost, _, state, peak = heapq.heappop(queue)
        if best[state] < cost:
            continue
        device, computed, _ = state
        if computed == tiny.everything and tiny.outputs & ~device == 0:
            return Found(cost, peak, _steps(parents, state))
        for step, price, memory, after in _moves(tiny, state, prices):
            if memory is not None and memory > budget:
                continue
            if after not in best or cost + price < best[after]:
                best[after] = cost + price
                parents[after] = (state, step)
                heapq.heappush(queue, (cost + price, next(counter), after, max(peak, memory or 0)))
    return None


def _moves(tiny, state, prices):
    device, computed, host = state
    compute, page_in, page_out = prices
    for p in range(tiny.size):
        bit = 1 << p
        if device & bit:
            yield ("free", tiny.ids[p]), 0.0, None, (device & ~bit, computed, host)
            yield ("page_out", tiny.ids[p]), page_out[p], None, (device & ~bit, computed, host | bit)
        if host & bit:
            after = device | bit
            yield ("page_in", tiny.ids[p]), page_in[p], tiny.owned_bytes + tiny.bytes_of(after), (after, computed,
                                                                                                 host & ~bit)
        first = not computed & bit
        if tiny.extra[p] or device & bit or tiny.needs[p] & ~device or (not first and not tiny.recomputable[p]):
            continue
        made = bit | (tiny.extras_of[p] if first else 0)
        memory = tiny.owned_bytes + tiny.bytes_of(device) + tiny.mem[p] + tiny.workspace[p]
        yield ("compute", tiny.ids[p]), compute[p], memory, (device | made, computed | made, host & ~made)


def _steps(parents: dict, state) -> tuple:
    steps = []
    while parents[state] is not None:
        state, step = parents[state]
        steps.append(step)
    return tuple(reversed(steps))


def inside_the_model(graph: Graph, steps: tuple, horizon: int) -> bool:
    """Whether the interval model (C = MAX_INTERVALS) holds this schedule: per value at most C intervals (each
    compute or page-in starts one), at most ``horizon`` slots, first computes in order."""
    starts = {}
    for op, node in steps:
        if op in ("compute", "page_in"):
            starts[node] = starts.get(node, 0) + 1
    extras = {n.id for n in graph.nodes if n.output_of is not None}
    if any(count > MAX_INTERVALS for count in starts.values()):
        return False
    computes = sum(op == "compute" for op, _ in steps)
    if computes + 1 > horizon:
        return False
    firsts = [n for n in dict.fromkeys(node for op, node in steps if op == "compute") if n not in extras]
    order = [n for n in graph.order if n not in extras]
    return not graph.has_backward or firsts == order


# -------------------------------------------------------------------- (1) random graphs, random profiles
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=5), fraction=st.sampled_from([0.0, 0.0, 0.1, 0.3, 0.6]), profile=profiles(),
       warm_start=st.booleans())
def test_interval_model_against_the_bruteforce_optimum(graph: Graph, fraction: float, profile: DeviceProfile,
                                                       warm_start: bool) -> None:
    budget = budget_between(graph, fraction)
    prices = prices_by_hand(graph, profile, "energy")
    oracle = optimal_schedule_with_paging(graph, budget, *prices)
    staged = optimal_paging_schedule(graph, budget, *prices)
    if staged is not None:  # POET's staged space lies inside the broad one
        assert oracle is not None and oracle.cost <= staged.cost + 1e-9 * max(1.0, staged.cost)
    result = poet_intervals(graph, budget, device_profile=profile, max_intervals=MAX_INTERVALS,
                            warm_start=warm_start, time_limit=10, threads=1)
    status = result.extra["cp_sat_status"]
    assert status in ("OPTIMAL", "INFEASIBLE"), result.message  # a timeout on 5 nodes fails here
    inside = oracle is not None and inside_the_model(graph, oracle.steps, result.extra["horizon"])
    if result.schedule is None:
        assert not inside and status == "INFEASIBLE" and result.status == "unknown", result.message
        return
    assert result.status == "feasible" and result.bound <= result.objective  # never "optimal": a restricted model
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    assert result.objective == pytest.approx(recount(graph, result, prices), rel=1e-9, abs=1e-12)
    assert oracle is not None and result.objective >= oracle.cost - 1e-9 * max(1.0, oracle.cost)
    if inside:
        assert status == "OPTIMAL", result.message
        assert result.objective == pytest.approx(oracle.cost, rel=1e-6, abs=1e-9)


# -------------------------------------------------------------------- (2) only paging fits
def _dropout_graph() -> Graph:
    """x -> a (100 B, a random op: never recomputed) -> b -> c -> big (100 B) -> gb (reads big and a)."""
    return Graph.model_validate({"name": "dropout", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 0, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 100, "cost": 50, "recomputable": False},
        {"id": 2, "name": "b", "inputs": [1], "mem": 20, "cost": 1},
        {"id": 3, "name": "c", "inputs": [2], "mem": 20, "cost": 1},
        {"id": 4, "name": "big", "inputs": [3], "mem": 100, "cost": 1},
        {"id": 5, "name": "gb", "inputs": [4, 1], "mem": 10, "cost": 1, "kind": "backward"}], "outputs": [5]})


HAND = profile_from_dict({"source": "hand", "flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0,
                          "memory_power_w": 1.0, "pagein_latency_s": 1.0, "pageout_latency_s": 1.0,
                          "pagein_bytes_per_s": 100.0, "pageout_bytes_per_s": 100.0})


def test_only_paging_fits_and_the_interval_model_finds_it_alone() -> None:
    """At 210 B, big's step would hold a + c + big = 220 B with a resident, and a cannot be recomputed: a must be
    paged out before big and back in for gb. Hand count: peak at gb's step = big + a + gb = 210 B; energy = 54 J
    of compute (50 + 4 x 1) + 2 x (1 s + 100 B / 100 B/s) x 1 W of paging = 58 J. No warm start: CP-SAT alone."""
    graph = _dropout_graph()
    result = poet_intervals(graph, 210, device_profile=HAND, warm_start=False, time_limit=10, threads=1)
    assert result.extra["source"] == "interval model" and result.extra["warm_start"] is None
    assert result.objective == pytest.approx(58.0) and result.simulation.peak == 210
    ops = [(s.op, s.node) for s in result.schedule.steps]
    assert ops.count(("page_out", 1)) == ops.count(("page_in", 1)) == 1
    assert ops.index(("page_out", 1)) < ops.index(("compute", 4)) < ops.index(("page_in", 1)) < ops.index(("compute", 5))
    assert validate(graph, result.schedule, 210).ok
    milp = poet(graph, 210, device_profile=HAND, time_limit=30, threads=1)  # a second model agrees
    assert milp.status == "optimal" and milp.objective == pytest.approx(58.0)
    remat_only = poet_intervals(graph, 210, device_profile=HAND, paging=False, time_limit=10, threads=1)
    # without paging, a is resident at big's step (gb, after big, reads it): 220 B, proven before any model runs
    assert remat_only.schedule is None and remat_only.status == "infeasible"
    assert "use at least 220" in remat_only.message


def test_poet_above_max_nodes_runs_the_interval_model_and_says_so() -> None:
    graph = _dropout_graph()
    result = poet(graph, 210, device_profile=HAND, max_nodes=3, time_limit=10, threads=1)
    assert "above max_nodes=3" in result.message and "ran the interval model" in result.message
    assert result.status == "feasible" and result.bound == pytest.approx(54.0)
    assert result.objective == pytest.approx(58.0) and validate(graph, result.schedule, 210).ok


# -------------------------------------------------------------------- (3) a graph above max_nodes
def _training_chain(layers: int) -> Graph:
    """A training step of ``layers`` blocks: forward x_i = f(x_{i-1}), every fourth one not recomputable (a random
    op); backward g_i reads g_{i+1} and x_{i-1}; the output is the last gradient."""
    nodes = [{"id": 0, "name": "batch", "kind": "input", "mem": 64, "cost": 0}]
    forward = []
    for i in range(1, layers + 1):
        previous = forward[-1] if forward else 0
        nodes.append({"id": i, "name": f"x{i}", "inputs": [previous], "mem": 64 + 32 * (i % 3), "cost": 1e-4 * (1 + i % 5),
                      "recomputable": i % 4 != 0})
        forward.append(i)
    grads, upstream = [], forward[-1]
    for k, i in enumerate(reversed(forward)):
        gid = 10_000 + i
        reads = [upstream, forward[-k - 2] if k + 1 < len(forward) else 0]
        nodes.append({"id": gid, "name": f"g{i}", "inputs": sorted(set(reads)), "mem": 64, "cost": 2e-4,
                      "kind": "backward"})
        grads.append(gid)
        upstream = gid
    return Graph.model_validate({"name": f"chain{layers}", "nodes": nodes, "outputs": [grads[-1]]})


#: In the slow tier (it runs to its limit): test_poet_above_max_nodes_runs_the_interval_model_and_says_so keeps the path
#: (poet above max_nodes runs the interval model) and a hand-counted oracle in the fast tier.
@pytest.mark.slow
def test_above_max_nodes_the_interval_model_solves_a_large_graph_in_seconds() -> None:
    graph = _training_chain(170)  # 340 computed nodes, above poet's default max_nodes = 300
    assert len(graph.order) > 300
    budget = min_budget(graph) + 96
    tic = time.perf_counter()
    # 30 s: the warm starts took 6.5 s on 2 quiet cores (the paging heuristic, the only one that fits here, 2 s; the
    # remat-only Moccasin its quarter of the limit), and the model (about 3 s to build) is built only where twice that
    # is left (issue 40: the limit is kept, not overrun): at 15 s a load of 7 on 2 cores left too little (2026-11-29)
    limit = 30
    result = poet(graph, budget, device_profile="a100-pcie4", time_limit=limit, threads=2)
    wall = time.perf_counter() - tic
    assert "above max_nodes=300" in result.message and result.extra["model"] == "poet-intervals"
    assert result.schedule is not None and result.status == "feasible", result.message
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    prices = prices_by_hand(graph, load_device_profile("a100-pcie4"), "energy")
    assert result.objective == pytest.approx(recount(graph, result, prices), rel=1e-9)
    assert result.objective <= result.extra["warm_start_objective"] * (1 + 1e-12)
    assert result.bound <= result.objective
    assert wall < 1.1 * limit + 2, wall  # the deadline kept (BENCHMARKS.md's time table holds the measured walls)


def test_paging_the_extra_outputs_of_multi_output_ops_replays_bit_identically() -> None:
    """The interval model may page a multi-output op's extra outputs (layer norm's mean / rstd, nll_loss's total
    weight): each one paged out right after it is taken and paged back in before its first reader replays with
    the eager step's loss and gradients (oracle: the captured eager step, same RNG seed: the model has dropout)."""
    import torch

    from coop.graph_capture import capture
    from coop.runtime.executor import Executor, replay_graph
    from coop.schedule import Schedule, Step
    from coop.zoo import build

    model, batch, loss_fn = build("transformer", layers=1, hidden=16, heads=2, batch=2, seq=8)
    captured = capture(model, batch, loss_fn)
    graph = replay_graph(captured)
    order = list(graph.order)
    first_read = {}
    for k, v in enumerate(order):
        for i in graph.node(v).inputs:
            first_read.setdefault(i, k)
    paged = [n.id for n in graph.nodes if n.output_of is not None and first_read.get(n.id, -1) > order.index(n.id) + 1]
    assert len(paged) >= 6
    steps = []
    for k, v in enumerate(order):
        steps += [Step(op="page_in", node=e) for e in paged if first_read[e] == k]
        steps.append(Step(op="compute", node=v))
        steps += [Step(op="page_out", node=v)] if v in paged else []
    torch.manual_seed(0)
    reference = captured.run(model, *batch)
    torch.manual_seed(0)
    outputs = Executor(captured, Schedule(steps=tuple(steps))).run_flat(captured.flat_inputs(model, batch))
    assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
