"""Online eviction (DTR, DTR-eq, DTE, Coop): legal schedules within budget, Coop's window search."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.graph_upgrades import is_seeded_random_op
from coop.online.online_sim import OnlineSimulator, replayable_random_ids, simulate_online
from coop.online.policies import LAYOUTS, POLICIES, WINDOW_COSTS, CoopPolicy, cheapest_window, make_policy
from coop.schedule import simulate, validate

POLICY_NAMES = tuple(POLICIES)
GRAPHS = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"


@st.composite
def small_dags(draw: st.DrawFn) -> Graph:
    """A random DAG: a few caller-owned values, computed nodes reading earlier ones, some random ops."""
    num_owned = draw(st.integers(0, 2))
    num_computed = draw(st.integers(2, 12))
    nodes = []
    for i in range(num_owned):
        nodes.append({"id": i, "name": f"p{i}", "mem": draw(st.integers(1, 6)), "cost": 0, "kind": "param"})
    for i in range(num_owned, num_owned + num_computed):
        earlier = list(range(i))
        inputs = sorted(draw(st.sets(st.sampled_from(earlier), max_size=3))) if earlier else []
        if i > num_owned and not any(j >= num_owned for j in inputs):
            inputs = sorted(set(inputs) | {i - 1})  # keep the graph mostly connected
        nodes.append(
            {
                "id": i,
                "name": f"n{i}",
                "inputs": inputs,
                "mem": draw(st.integers(0, 10)),
                "cost": draw(st.integers(0, 5)),
                "workspace": draw(st.sampled_from([0, 0, 0, 3])),
                "recomputable": draw(st.sampled_from([True, True, True, True, False])),
            }
        )
    computed = [n["id"] for n in nodes[num_owned:]]
    outputs = sorted(draw(st.sets(st.sampled_from(computed), max_size=2)))
    return Graph.model_validate({"name": "random", "nodes": nodes, "outputs": outputs})


@settings(max_examples=60, deadline=None)
@given(graph=small_dags(), fraction=st.floats(0.0, 1.0), policy=st.sampled_from(POLICY_NAMES))
def test_online_schedule_is_legal_and_within_budget(graph: Graph, fraction: float, policy: str) -> None:
    low, high = min_budget(graph), baseline_peak(graph)
    budget = max(1, round(low + fraction * max(high - low, 0)))
    result = simulate_online(graph, budget, policy)
    assert result.peak <= budget
    if result.schedule is None:
        assert result.status in ("oom", "thrashed") and result.message
        return
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    sim = simulate(graph, result.schedule)
    assert sim.overhead == pytest.approx(result.overhead)
    assert sim.peak <= result.peak
    assert result.recomputations == sim.recomputations
    assert result.steps == len(result.schedule)


@settings(max_examples=30, deadline=None)
@given(graph=small_dags(), policy=st.sampled_from(POLICY_NAMES))
def test_a_roomy_budget_evicts_nothing(graph: Graph, policy: str) -> None:
    # Room for every value at once (plus a workspace): no allocation can fail.
    roomy = sum(n.mem for n in graph.nodes) + max(n.workspace for n in graph.nodes) + 1
    result = simulate_online(graph, roomy, policy)
    assert result.status == "ok"
    assert result.evictions == 0 and result.recomputations == 0 and result.overhead == 0
    assert result.failures == 0 and result.fragmentation == 0


def _chain(length: int, mem: int = 4) -> Graph:
    nodes = [{"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"}]
    for i in range(1, length + 1):
        nodes.append({"id": i, "name": f"f{i}", "inputs": [i - 1], "mem": mem, "cost": 1})
    # A backward-like tail that reads every forward value again, last one first.
    tail = length + 1
    for k, forward in enumerate(range(length, 0, -1)):
        nodes.append({"id": tail + k, "name": f"b{forward}", "inputs": [forward] + ([tail + k - 1] if k else []),
                      "mem": mem, "cost": 1})
    return Graph.model_validate({"name": "chain", "nodes": nodes, "outputs": [tail + length - 1]})


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_tight_chain_recomputes_and_still_fits(policy: str) -> None:
    graph = _chain(8)
    budget = min_budget(graph) + 8
    assert budget < baseline_peak(graph)
    result = simulate_online(graph, budget, policy)
    assert result.status in ("ok", "thrashed") and result.schedule is not None
    assert result.evictions > 0 and result.recomputations > 0 and result.failures > 0
    assert validate(graph, result.schedule, budget).ok


def test_caller_owned_values_that_do_not_fit_are_out_of_memory() -> None:
    graph = _chain(3)
    result = simulate_online(graph, graph.caller_owned_bytes + 2, "dtr")
    assert result.status == "oom" and result.schedule is None


def test_thrashing_stops_at_the_overhead_limit() -> None:
    graph = _chain(12)
    result = simulate_online(graph, min_budget(graph), "dtr", max_overhead=0.1)
    assert result.status in ("thrashed", "oom") and result.schedule is None


def test_unknown_policy_is_a_coop_error() -> None:
    with pytest.raises(CoopError, match="unknown eviction policy"):
        make_policy("lru-ish")


# ---------------------------------------------------------------------------- random replay
def _with_random_ops(graph: Graph) -> Graph:
    """The same DAG with its non-recomputable computed nodes named as torch random ops."""
    data = graph.model_dump()
    for node in data["nodes"]:
        if node["kind"] not in ("input", "param", "buffer") and not node["recomputable"]:
            node["op"], node["random"] = "aten.bernoulli.p", True
    return Graph.model_validate(data)


@settings(max_examples=40, deadline=None)
@given(graph=small_dags(), fraction=st.floats(0.0, 1.0), policy=st.sampled_from(POLICY_NAMES))
def test_replayed_random_ops_give_legal_schedules_on_the_replay_graph(graph: Graph, fraction: float, policy: str) -> None:
    graph = _with_random_ops(graph)
    low, high = min_budget(graph), baseline_peak(graph)
    budget = max(1, round(low + fraction * max(high - low, 0)))
    replayable = replayable_random_ids(graph)
    replayed = simulate_online(graph, budget, policy)
    if replayed.schedule is not None:
        assert replayed.peak <= budget
        verdict = validate(graph.with_random_replay(), replayed.schedule, budget)
        assert verdict.ok, verdict.reason
        recomputed = len(replayed.schedule.steps) - len({s.node for s in replayed.schedule.steps})
        assert replayed.random_replays <= recomputed
    kept = simulate_online(graph, budget, policy, replay_random=False)
    assert kept.random_replays == 0
    if kept.schedule is not None:  # without replay the plain graph's rules hold
        assert validate(graph, kept.schedule, budget).ok
        assert all(sum(s.node == r for s in kept.schedule.steps) == 1 for r in replayable)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_replaying_random_ops_lowers_the_overhead_of_a_tight_chain(policy: str) -> None:
    data = _chain(8).model_dump()
    for node in data["nodes"]:
        if node["id"] in (2, 5):  # two dropout-like draws in the forward chain
            node["op"], node["recomputable"], node["random"] = "aten.bernoulli.p", False, True
    graph = Graph.model_validate(data)
    budget = min_budget(graph.with_random_replay()) + 8  # the floor of the replaying engine's graph
    replayed = simulate_online(graph, budget, policy)
    kept = simulate_online(graph, budget, policy, replay_random=False)
    assert replayed.status == kept.status == "ok"
    assert replayed.random_replays > 0 and kept.random_replays == 0
    assert replayed.overhead < kept.overhead
    assert validate(graph.with_random_replay(), replayed.schedule, budget).ok
    assert not validate(graph, replayed.schedule, budget).ok  # a replay is a recomputation of a random op


def test_only_torch_random_ops_are_replayable() -> None:
    assert is_seeded_random_op("aten.bernoulli.p") and is_seeded_random_op("coop.bernoulli_mask.default")
    assert not is_seeded_random_op("aten.mm.default") and not is_seeded_random_op("<built-in function getitem>")
    assert not is_seeded_random_op("dropout") and not is_seeded_random_op("nosuchns.op.default")


def test_never_evictable_values_are_placed_at_the_top_of_the_arena() -> None:
    # x -> a -> out (a graph output) -> b: out can never be evicted, so it goes to the high end.
    nodes = [
        {"id": 0, "name": "x", "mem": 2, "cost": 0, "kind": "input"},
        {"id": 1, "name": "a", "inputs": [0], "mem": 4, "cost": 1},
        {"id": 2, "name": "out", "inputs": [1], "mem": 3, "cost": 1},
        {"id": 3, "name": "b", "inputs": [2], "mem": 4, "cost": 1},
    ]
    graph = Graph.model_validate({"name": "top", "nodes": nodes, "outputs": [2, 3]})
    for policy in POLICY_NAMES:
        engine = OnlineSimulator(graph, 40, make_policy(policy), max_overhead=10.0)
        engine.run()
        assert engine.arena.address_of(2) + 3 == 40, policy
        assert engine.arena.address_of(0) == 0  # caller-owned values come first, at the bottom


def test_a_never_evictable_value_fills_a_hole_walled_by_never_evictable_blocks() -> None:
    # Arena 100: x (caller-owned) [0, 10), a (evictable) [10, 30), hole [30, 40), o1 (output) [40, 50),
    # hole [50, 60), o2 (output) [60, 70), b (evictable) [70, 80), hole [80, 100).
    # A new output belongs in [50, 60), walled by outputs on both sides: anywhere else it would
    # split a run that evictions could otherwise merge.
    nodes = [{"id": 0, "name": "x", "mem": 10, "cost": 0, "kind": "input"}]
    nodes += [{"id": i, "name": f"n{i}", "inputs": [0], "mem": 10, "cost": 1} for i in range(1, 6)]
    graph = Graph.model_validate({"name": "walls", "nodes": nodes, "outputs": [3, 4, 5]})
    engine = OnlineSimulator(graph, 100, make_policy("coop"), max_overhead=10.0)
    arena = engine.arena
    for tag, start, size in ((0, 0, 10), (1, 10, 20), (3, 40, 10), (4, 60, 10), (2, 70, 10)):
        assert arena.allocate_at(start, size, tag)
    assert engine._permanent_address(5) == 55  # against o2, the upper wall, in the walled hole
    assert engine._permanent_address(15) == 85  # only the top hole fits: against the arena's top


def test_coop_packs_cheap_tensors_from_the_high_end() -> None:
    policy = make_policy("coop")
    assert not policy.from_end(10, 10.0)  # no history yet
    assert policy.from_end(10, 1.0)  # below the running median: cheap, packed at the top
    assert not policy.from_end(10, 50.0)  # expensive: best fit from the low end
    assert not make_policy(CoopPolicy(partition=False)).from_end(10, 0.0)


def test_coop_places_cheap_tensors_at_the_top_of_the_best_fit_hole() -> None:
    default, ends = make_policy("coop"), make_policy(CoopPolicy(layout="ends"))
    for policy in (default, ends):
        assert policy.placement(10, 10.0) == "best"  # no history: expensive
    assert default.placement(10, 1.0) == "best-top"  # cheap: best-fit hole, its top
    assert ends.placement(10, 1.0) == "top"  # the earlier layout: the highest hole's top
    assert default.placement(10, 50.0) == "best"
    assert make_policy(CoopPolicy(partition=False)).placement(10, 0.0) == "best"
    assert make_policy("dtr").placement(10, 0.0) == "best" and make_policy("dte").placement(10, 0.0) == "best"
    with pytest.raises(CoopError, match="unknown Coop layout"):
        CoopPolicy(layout="middle")
    with pytest.raises(CoopError, match="unknown Coop window cost"):
        CoopPolicy(window_cost="cheapest")


def test_coop_keeps_a_cheap_tensor_out_of_the_top_hole_when_a_smaller_one_fits() -> None:
    # Arena 100: x (caller-owned) [0, 10), a [10, 30), hole [30, 40), b [40, 60), hole [60, 100).
    # A cheap tensor of 10 under "hole-ends" fills [30, 40) (best fit, at its top) and leaves the
    # 40-byte hole whole; under "ends" it splits the top hole.
    nodes = [{"id": 0, "name": "x", "mem": 10, "cost": 0, "kind": "input"}]
    nodes += [{"id": i, "name": f"n{i}", "inputs": [0], "mem": 20, "cost": 100} for i in (1, 2)]
    nodes += [{"id": 3, "name": "cheap", "inputs": [0], "mem": 10, "cost": 1}]
    graph = Graph.model_validate({"name": "holes", "nodes": nodes, "outputs": [1, 2, 3]})
    for layout, expected in (("hole-ends", 30), ("ends", 90)):
        policy = make_policy(CoopPolicy(layout=layout))
        engine = OnlineSimulator(graph, 100, policy, max_overhead=10.0)
        for tag, start, size in ((0, 0, 10), (1, 10, 20), (2, 40, 20)):
            assert engine.arena.allocate_at(start, size, tag)
        policy.from_end(20, 100.0)  # history: one expensive tensor, so cost 1 on 10 bytes is cheap
        engine._allocate(3, 10, 1.0, None)
        assert engine.arena.address_of(3) == expected, layout
        engine.arena.check_invariants()


@settings(max_examples=40, deadline=None)
@given(graph=small_dags(), fraction=st.floats(0.0, 1.0), window_cost=st.sampled_from(WINDOW_COSTS),
       layout=st.sampled_from(LAYOUTS), partition=st.booleans())
def test_every_coop_variant_exports_legal_schedules_within_budget(graph: Graph, fraction: float, window_cost: str,
                                                                  layout: str, partition: bool) -> None:
    low, high = min_budget(graph), baseline_peak(graph)
    budget = max(1, round(low + fraction * max(high - low, 0)))
    result = simulate_online(graph, budget, CoopPolicy(window_cost=window_cost, layout=layout, partition=partition))
    assert result.peak <= budget
    if result.schedule is not None:
        verdict = validate(graph, result.schedule, budget)
        assert verdict.ok, verdict.reason


# ---------------------------------------------------------------------------- Coop's window search
_slots = st.lists(
    st.tuples(st.integers(1, 20), st.one_of(st.none(), st.floats(0, 10), st.just(0.0))),
    max_size=25,
)


def _brute_force_cheapest(slots: list, request: int) -> float | None:
    best = None
    for first, last in itertools.combinations_with_replacement(range(len(slots)), 2):
        window = slots[first:last + 1]
        if any(cost is None for _, cost in window) or sum(size for size, _ in window) < request:
            continue
        cost = sum(c for _, c in window)
        best = cost if best is None else min(best, cost)
    return best


def _brute_force_cheapest_per_byte(slots: list, request: int) -> float | None:
    """Least cost / bytes over the windows that cover the request and lose cover without their left slot."""
    best = None
    for first, last in itertools.combinations_with_replacement(range(len(slots)), 2):
        window = slots[first:last + 1]
        size = sum(s for s, _ in window)
        if any(cost is None for _, cost in window) or size < request:
            continue
        if first < last and size - window[0][0] >= request:  # not the shortest for this right end
            continue
        ratio = sum(c for _, c in window) / size
        best = ratio if best is None else min(best, ratio)
    return best


@pytest.mark.parametrize("per_byte", [False, True])
@settings(max_examples=300, deadline=None)
@given(slots=_slots, request=st.integers(1, 60))
def test_two_pointer_window_matches_brute_force(per_byte: bool, slots: list, request: int) -> None:
    """The O(n) scan finds the cheapest covering window (by cost, or by cost per byte among the shortest)."""
    found = cheapest_window(slots, request, per_byte=per_byte)
    expected = (_brute_force_cheapest_per_byte if per_byte else _brute_force_cheapest)(slots, request)
    if expected is None:
        assert found is None
        return
    assert found is not None
    first, last, score = found
    window = slots[first:last + 1]
    size, cost = sum(s for s, _ in window), sum(c for _, c in window if c is not None)
    assert all(c is not None for _, c in window) and size >= request
    assert score == pytest.approx(cost / size if per_byte else cost, abs=1e-6)
    assert score == pytest.approx(expected, abs=1e-6)


def test_the_per_byte_window_prefers_the_cheaper_tensor_over_the_bigger_one() -> None:
    # Request 6: a big tensor (cost 3 on 20 bytes) against a small one with a free neighbour
    # (cost 1 on 4 bytes + 4 free). Summing DTR's h (cost / bytes per tensor) picks the big one
    # (0.15 < 0.25); per byte of the window the small one is cheaper (1 / 8 < 3 / 20).
    h_slots = [(20, 3 / 20), (2, None), (4, 1 / 4), (4, 0.0)]
    assert cheapest_window(h_slots, 6)[:2] == (0, 0)
    ratio_slots = [(20, 3.0), (2, None), (4, 1.0), (4, 0.0)]
    assert cheapest_window(ratio_slots, 6, per_byte=True)[:2] == (2, 3)


# ---------------------------------------------------------------------------- published graphs
@pytest.mark.skipif(not GRAPHS.is_dir(), reason="the published graphs (graphs/moccasin) are not present")
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_checkmate_graph_runs_within_budget(policy: str) -> None:
    graph = load_graph(GRAPHS / "fcn_8_vgg_32_416_608_3_train_nx.json")
    budget = round(0.7 * baseline_peak(graph))
    result = simulate_online(graph, budget, policy)
    assert result.status == "ok", result.message
    assert result.evictions > 0
    assert validate(graph, result.schedule, budget).ok


# ---------------------------------------------------------------------------- DTR's e*
class _FakeView:
    """A lineage a - b - c - d (a chain) with b and c evicted; only d and a resident."""

    def __init__(self) -> None:
        from coop.online.arena import Arena

        self.clock = 10.0
        self.arena = Arena(100)
        self.costs = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0}
        self.links = {"a": ["b"], "b": ["a", "c"], "c": ["b", "d"], "d": ["c"]}
        self.evicted = {"b", "c"}

    def neighbours(self, key):
        return self.links[key]

    def is_evicted(self, key):
        return key in self.evicted

    def cost(self, key):
        return self.costs[key]


def test_e_star_counts_the_evicted_neighbourhood_exactly_and_by_classes() -> None:
    from coop.online.policies import DTREquivalencePolicy, DTRPolicy, TensorInfo

    view = _FakeView()
    info_d = TensorInfo("d", 10, 8.0, 5.0, True)
    info_a = TensorInfo("a", 10, 1.0, 5.0, True)
    exact = DTRPolicy()
    assert exact.recompute_cost(info_d, view) == 8.0 + 4.0 + 2.0  # d plus the evicted run c, b
    assert exact.recompute_cost(info_a, view) == 1.0 + 2.0 + 4.0
    classes = DTREquivalencePolicy()
    for key in ("b", "c"):
        classes.on_evicted(key, view)
    assert classes.recompute_cost(info_d, view) == pytest.approx(14.0)
    view.evicted.discard("c")  # c rematerialized: its cost leaves the class, which stays merged
    classes.on_resident("c", view)
    assert classes.recompute_cost(info_a, view) == pytest.approx(1.0 + 2.0)
    assert exact.score(info_d, view) == pytest.approx(8.0 / (10 * 5.0))  # c is resident again
