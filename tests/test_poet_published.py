"""The re-implementation of POET's published MILP (benchmarks/poet_published.py) against independent oracles.

It is the reference that coop's ``poet`` is compared with in bench_poet, so it must be right itself:

* with ``semantics="coop"`` (every published difference switched to coop's, its docstring's list)
  its CBC optimum equals coop's poet optimum and the brute force of tests/bruteforce_paging.py
  (coop's space), with and without a runtime budget;
* with ``semantics="published"`` its optimum equals a brute force of the published space written
  here from the equations of graphs/poet/README.md (a dynamic program over stages);
* every solution converts to a schedule that coop's validator accepts within the budget, priced by
  hand from the profile's raw numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.poet_published import PublishedModelError, solve_published
from coop.budget import baseline_peak, min_budget
from coop.device_profiles import DeviceProfile, profile_from_dict
from coop.formulations.poet.milp import poet
from coop.graph import Graph
from coop.schedule import validate
from tests.bruteforce_paging import optimal_paging_schedule
from tests.tiers import check, examples

EXAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def poet_layout_graphs(draw: st.DrawFn, max_nodes: int) -> Graph:
    """A tiny training graph in POET's layout: a forward chain (with skips), then a backward chain
    whose gradients read forward values; every node computed, no caller-owned values, outputs or
    workspace. Long-lived forward values are what paging is for."""
    size = draw(st.integers(4, max_nodes))
    num_forward = draw(st.integers(2, size - 1))
    ids = draw(st.lists(st.integers(0, 99), min_size=size, max_size=size, unique=True))
    forward, nodes = ids[:num_forward], []
    for position, node_id in enumerate(ids):
        if position == 0:
            reads: list[int] = []
        elif position < num_forward:
            reads = [ids[position - 1]] + draw(st.sampled_from([[], [], [], [draw(st.sampled_from(ids[:position]))]]))
        else:  # a gradient reads the previous one and one saved forward value, as backpropagation does
            reads = [ids[position - 1], draw(st.sampled_from(forward))]
        nodes.append({"id": node_id, "name": f"n{position}", "kind": "forward" if position < num_forward else "backward",
                      "inputs": sorted(set(reads)), "mem": draw(st.integers(*(5, 20) if position < num_forward else (1, 5))),
                      "cost": float(draw(st.integers(0, 10))), "recomputable": draw(st.sampled_from([True, True, False]))})
    return Graph.model_validate({"name": "tiny", "nodes": nodes})


@st.composite
def profiles(draw: st.DrawFn) -> DeviceProfile:
    """Random profiles; in half of them paging is cheap next to recomputing (node costs 0..10), so that
    the paging rows of the model decide the optimum often."""
    positive = st.sampled_from([0.01, 0.05, 0.5, 1.0, 2.0, 7.0])
    cheap = draw(st.booleans())
    small = st.sampled_from([0.001, 0.01, 0.05]) if cheap else positive
    return profile_from_dict({
        "source": "hypothesis", "flops_per_s": draw(st.sampled_from([2.0, 7.0]) if cheap else positive),
        "flops_per_joule": draw(st.sampled_from([0.5, 1.0]) if cheap else positive), "power_w": 1.0,
        "memory_power_w": draw(small), "pagein_latency_s": draw(small), "pageout_latency_s": draw(small),
        "pagein_bytes_per_s": draw(st.sampled_from([100.0, 1000.0] if cheap else [1.0, 4.0, 100.0, 1000.0])),
        "pageout_bytes_per_s": draw(st.sampled_from([100.0, 1000.0] if cheap else [1.0, 4.0, 100.0, 1000.0]))})


def prices_by_hand(graph: Graph, profile: DeviceProfile, objective: str) -> tuple[dict, dict, dict]:
    """POET's prices (graphs/poet/README.md) from the profile's raw SI numbers."""
    watts = profile.flops_per_s / profile.flops_per_joule if objective == "energy" else 1.0
    paging_watts = profile.memory_power_w if objective == "energy" else 1.0
    compute = {n.id: n.cost * watts for n in graph.nodes}
    page_in = {n.id: (profile.pagein_latency_s + n.mem / profile.pagein_bytes_per_s) * paging_watts for n in graph.nodes}
    page_out = {n.id: (profile.pageout_latency_s + n.mem / profile.pageout_bytes_per_s) * paging_watts
                for n in graph.nodes}
    return compute, page_in, page_out


def budget_between(graph: Graph, fraction: float) -> int:
    least, peak = min_budget(graph), baseline_peak(graph)
    return least + math.floor(fraction * (peak - least))


def recount(graph: Graph, schedule, prices: tuple[dict, dict, dict]) -> float:
    table = {"compute": prices[0], "page_in": prices[1], "page_out": prices[2], "free": {}}
    return sum(table[step.op].get(step.node, 0.0) for step in schedule.steps)


def subsets(items: Iterable[int]) -> Iterable[frozenset[int]]:
    items = sorted(items)
    return (frozenset(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r))


def published_optimum(graph: Graph, budget: int, prices: tuple[dict, dict, dict]) -> float | None:
    """The cheapest solution of POET's published model, by a dynamic program over stages.

    Written from graphs/poet/README.md alone. State at the start of stage t: (S_RAM[t], S_SD[t]).
    A stage picks R[t] (t and any recomputable earlier positions whose inputs are computed in the
    stage or in S_RAM[t]), M_out[t] within S_RAM[t], and S_RAM[t+1] within S_RAM[t] | R[t] | S_SD[t]
    (M_in[t] = what S_RAM[t+1] takes from the slow tier); S_SD[t+1] = S_SD[t] | M_out[t] (never
    smaller: it costs nothing). Memory: U[t,0] = R[t,0] m_0 + sum S_RAM[t] m; U[t,k+1] = U[t,k] +
    R[t,k+1] m_{k+1} - the bytes of each input i of k freed after k (k computed, i not kept into
    t+1, no later consumer of i computed in the stage); 0 <= U <= budget.
    """
    order = list(graph.order)
    T, position = len(order), {node_id: p for p, node_id in enumerate(order)}
    nodes = [graph.node(i) for i in order]
    mem = [n.mem for n in nodes]
    preds = [sorted({position[u] for u in n.inputs}) for n in nodes]
    succs = [[v for v in range(T) if u in preds[v]] for u in range(T)]
    compute, page_in, page_out = ([table[i] for i in order] for table in prices)

    def fits(t: int, device: frozenset[int], computed: frozenset[int], keep: frozenset[int]) -> bool:
        used = (mem[0] if 0 in computed else 0) + sum(mem[i] for i in device)
        for k in range(t + 1):
            if not 0 <= used <= budget:
                return False
            if k < t:
                freed = sum(mem[i] for i in preds[k] if k in computed and i not in keep
                            and not any(k < j <= t and j in computed for j in succs[i]))
                used += (mem[k + 1] if k + 1 in computed else 0) - freed
        return True

    layer: dict[tuple[frozenset[int], frozenset[int]], float] = {(frozenset(), frozenset()): 0.0}
    for t in range(T):
        following: dict[tuple[frozenset[int], frozenset[int]], float] = {}
        for (device, host), cost in layer.items():
            for extra in subsets(i for i in range(t) if nodes[i].recomputable):
                computed = extra | {t}
                if any(u not in computed and u not in device for k in computed for u in preds[k]):
                    continue
                reachable = (device | computed | host) & frozenset(range(t + 1)) if t + 1 < T else frozenset()
                for outs in subsets(device - host):
                    for keep in subsets(reachable):
                        ins = keep - device - computed
                        if not ins <= host or not fits(t, device, computed, keep):
                            continue
                        total = (cost + sum(compute[k] for k in computed) + sum(page_in[i] for i in ins)
                                 + sum(page_out[i] for i in outs))
                        state = (keep, host | outs)
                        following[state] = min(following.get(state, math.inf), total)
        layer = following
    return min(layer.values()) if layer else None


def _with_coop_semantics_the_reference_equals_coop_poet_and_the_brute_force(
        graph: Graph, fraction: float, profile: DeviceProfile, objective: str, runtime_budget: float | None) -> None:
    budget = budget_between(graph, fraction)
    prices = prices_by_hand(graph, profile, objective)
    reference = solve_published(graph, budget, profile, objective=objective, runtime_budget=runtime_budget,
                                semantics="coop", time_limit=20)
    coop = poet(graph, budget, objective=objective, device_profile=profile, runtime_budget=runtime_budget,
                time_limit=20, threads=1)
    if runtime_budget is None:
        oracle = optimal_paging_schedule(graph, budget, *prices)
        assert (reference.status == "infeasible") == (oracle is None), reference.message
        if oracle is not None:
            assert reference.objective == pytest.approx(oracle.cost, rel=1e-6, abs=1e-9)
    if reference.status == "infeasible":
        assert coop.extra.get("milp_status") == "infeasible", coop.message
        return
    assert reference.status == "optimal", reference.message  # a timeout on 5 nodes fails here
    assert coop.extra["milp_status"] == "optimal", coop.message
    assert reference.objective == pytest.approx(coop.extra["milp_objective"], rel=1e-6, abs=1e-9)
    verdict = validate(graph, reference.schedule, budget)
    assert verdict.ok, verdict.reason
    # Under coop's semantics the converted schedule realizes exactly the model's pages.
    assert recount(graph, reference.schedule, prices) == pytest.approx(reference.objective, rel=1e-6, abs=1e-9)


#: 40 graphs in the slow tier, 15 in the fast one (tests/tiers.py)
@examples(15, 40)
def test_with_coop_semantics_the_reference_equals_coop_poet_and_the_brute_force(examples: int) -> None:
    check(_with_coop_semantics_the_reference_equals_coop_poet_and_the_brute_force, examples, EXAMPLES,
          graph=poet_layout_graphs(max_nodes=6), fraction=st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.2, 0.4, 1.0]),
          profile=profiles(), objective=st.sampled_from(["energy", "time"]),
          runtime_budget=st.sampled_from([None, None, 1.2, 2.0]))


@EXAMPLES
@given(graph=poet_layout_graphs(max_nodes=5), fraction=st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.2, 0.4, 1.0]),
       profile=profiles(), objective=st.sampled_from(["energy", "time"]))
def test_with_published_semantics_the_reference_equals_the_published_brute_force(
        graph: Graph, fraction: float, profile: DeviceProfile, objective: str) -> None:
    budget = budget_between(graph, fraction)
    prices = prices_by_hand(graph, profile, objective)
    oracle = published_optimum(graph, budget, prices)
    reference = solve_published(graph, budget, profile, objective=objective, time_limit=20)
    assert (reference.status == "infeasible") == (oracle is None), reference.message
    if oracle is None:
        return
    assert reference.status == "optimal", reference.message
    assert reference.objective == pytest.approx(oracle, rel=1e-6, abs=1e-9)
    verdict = validate(graph, reference.schedule, budget)
    assert verdict.ok, verdict.reason
    assert reference.peak == verdict.peak
    # coop pays a page-out again where the published slow-tier copy is reused: never less.
    coop_price = recount(graph, reference.schedule, prices)
    assert coop_price >= reference.objective - 1e-9 * max(1.0, oracle)
    assert (reference.energy_j if objective == "energy" else reference.time_s) == pytest.approx(coop_price, rel=1e-9)


def test_the_published_runtime_budget_counts_compute_only() -> None:
    """A chain whose only way under the budget is paging: compute-only counting admits it at factor 1,
    coop's counting (paging seconds too) does not."""
    nodes = [{"id": i, "name": f"n{i}", "kind": "forward", "inputs": [i - 1] if i else [], "mem": 10,
              "cost": 1.0} for i in range(3)]
    nodes.append({"id": 3, "name": "n3", "kind": "backward", "inputs": [0, 2], "mem": 0, "cost": 1.0})
    graph = Graph.model_validate({"name": "chain", "nodes": nodes})
    profile = profile_from_dict({"source": "test", "flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0,
                                 "memory_power_w": 1.0, "pagein_latency_s": 0.1, "pageout_latency_s": 0.1,
                                 "pagein_bytes_per_s": 1000.0, "pageout_bytes_per_s": 1000.0})
    # 20 B: n0 must leave the device while n2 runs and come back for n3; remat=False forbids recomputing it.
    published = solve_published(graph, 20, profile, runtime_budget=1.0, remat=False, time_limit=10)
    assert published.status == "optimal", published.message
    assert published.page_ins == 1 and published.page_outs == 1
    assert validate(graph, published.schedule, 20).ok
    strict = solve_published(graph, 20, profile, runtime_budget=1.0, remat=False, semantics="coop", time_limit=10)
    assert strict.status == "infeasible"


def test_graph_features_the_published_model_lacks_are_refused() -> None:
    graph = Graph.model_validate({"name": "owned", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "inputs": [], "mem": 4, "cost": 0.0, "recomputable": False},
        {"id": 1, "name": "y", "kind": "forward", "inputs": [0], "mem": 4, "cost": 1.0}]})
    with pytest.raises(PublishedModelError, match="caller-owned"):
        solve_published(graph, 100, "m4")


UNIT = profile_from_dict({"source": "test", "flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0,
                          "memory_power_w": 1.0, "pagein_latency_s": 0.1, "pageout_latency_s": 0.1,
                          "pagein_bytes_per_s": 1000.0, "pageout_bytes_per_s": 1000.0})
PAGE_10B = 0.1 + 10 / 1000.0  # joules to page 10 bytes in or out on UNIT (compute: 1 J per unit of cost)


def layer_graph(name: str, layers: list[tuple[int, list[int]]]) -> Graph:
    """Nodes 0..n-1 of cost 1 with (mem, inputs) each."""
    return Graph.model_validate({"name": name, "nodes": [
        {"id": i, "name": f"n{i}", "kind": "forward", "inputs": inputs, "mem": mem, "cost": 1.0}
        for i, (mem, inputs) in enumerate(layers)]})


def test_the_published_slow_tier_copy_is_paged_in_twice_after_one_page_out() -> None:
    """A (10 B) is read by D (stage 3) and F (stage 5) but cannot stay through C's or E's stage at 21 B.
    Published: one page-out, two page-ins; coop moves the value, so it pays the page-out twice."""
    graph = layer_graph("reuse", [(10, []), (10, [0]), (10, [1]), (1, [2, 0]), (15, [3]), (1, [3, 0])])
    published = solve_published(graph, 21, UNIT, remat=False, time_limit=10)
    assert published.status == "optimal", published.message
    assert published.objective == pytest.approx(6 + 3 * PAGE_10B)  # hand-counted: 6 computes, 1 out, 2 in
    assert validate(graph, published.schedule, 21).ok
    assert published.energy_j == pytest.approx(6 + 4 * PAGE_10B)  # the converted schedule pays the out again
    moved = solve_published(graph, 21, UNIT, remat=False, semantics="coop", time_limit=10)
    coop = poet(graph, 21, device_profile=UNIT, remat=False, time_limit=10, threads=1)
    assert moved.objective == pytest.approx(6 + 4 * PAGE_10B)
    assert coop.extra["milp_objective"] == pytest.approx(6 + 4 * PAGE_10B)


def test_a_published_page_out_needs_the_value_resident_at_the_stage_start() -> None:
    """A (10 B) is read only by C (stage 3); P's stage (15 B) cannot hold it at 20 B. coop pages A out
    right after stage 0; the published model can page it out only during a stage that starts with it
    on the device, so without recomputation it has no schedule."""
    graph = layer_graph("timing", [(10, []), (15, []), (5, [1]), (0, [0, 2])])
    assert solve_published(graph, 20, UNIT, remat=False, time_limit=10).status == "infeasible"
    moved = solve_published(graph, 20, UNIT, remat=False, semantics="coop", time_limit=10)
    coop = poet(graph, 20, device_profile=UNIT, remat=False, time_limit=10, threads=1)
    assert moved.status == "optimal" and moved.page_outs == moved.page_ins == 1
    assert moved.objective == pytest.approx(4 + 2 * PAGE_10B)
    assert coop.extra["milp_objective"] == pytest.approx(4 + 2 * PAGE_10B)
    assert validate(graph, moved.schedule, 20).ok
