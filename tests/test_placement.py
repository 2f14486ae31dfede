"""Addresses for static plans: best fit and the exact CP-SAT packing over schedule lifetimes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coop.errors import CoopError
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.runtime.placement import (
    Placement,
    best_fit_placement,
    exact_placement,
    execution_placement,
    packed_placement,
    schedule_lifetimes,
)
from coop.schedule import Schedule, simulate
from tests.strategies import random_graphs, random_schedules
from tests.tiers import check, examples


def _assert_disjoint(placement: Placement) -> None:
    """Brute force, independent of Placement.check: blocks alive at a common step never share an address."""
    blocks = placement.lifetimes
    for a in range(len(blocks)):
        for b in range(a + 1, len(blocks)):
            if blocks[a].start <= blocks[b].end and blocks[b].start <= blocks[a].end:
                low_a, low_b = placement.offsets[a], placement.offsets[b]
                assert low_a + blocks[a].size <= low_b or low_b + blocks[b].size <= low_a, (blocks[a], blocks[b])
    assert all(o >= 0 for o in placement.offsets)
    assert placement.arena_peak == max((o + b.size for o, b in zip(placement.offsets, blocks)), default=0)


@st.composite
def graphs_with_schedules(draw: st.DrawFn, max_nodes: int = 10, with_impls: bool = False) -> tuple[Graph, Schedule]:
    # Implementations are left out by default: coop.schedule.simulate subtracts node.mem, not the
    # chosen implementation's mem, for a paged instance (reported to the lead), so sim.memory
    # differs from the true residency there.
    graph = draw(random_graphs(max_nodes=max_nodes, with_impls=with_impls))
    return graph, draw(random_schedules(graph))


@settings(max_examples=60, deadline=None)
@given(case=graphs_with_schedules())
def test_best_fit_blocks_never_overlap_and_cover_the_live_peak(case: tuple[Graph, Schedule]) -> None:
    graph, schedule = case
    placement = best_fit_placement(graph, schedule)
    _assert_disjoint(placement)
    sim = simulate(graph, schedule)
    assert placement.live_peak == sim.peak
    assert placement.arena_peak >= placement.live_peak
    # The blocks are exactly the simulator's device memory at every step (paging gaps included).
    for step, memory in enumerate(sim.memory):
        live = sum(b.size for b in placement.lifetimes if b.start <= step <= b.end)
        assert live == memory


@settings(max_examples=25, deadline=None)
@given(case=graphs_with_schedules(max_nodes=7))
def test_exact_is_never_worse_than_best_fit(case: tuple[Graph, Schedule]) -> None:
    graph, schedule = case
    greedy = best_fit_placement(graph, schedule)
    exact = exact_placement(graph, schedule, time_limit=2.0, max_blocks=200)
    _assert_disjoint(exact)
    assert exact.live_peak <= exact.arena_peak <= greedy.arena_peak
    if exact.status == "optimal":
        assert exact.bound is not None and exact.bound <= exact.arena_peak


def _fragmenting_graph() -> Graph:
    """Best fit in order leaves a hole: a (4) and b (4) live, a dies, c (6) cannot use a's hole."""
    nodes = [
        {"id": 0, "name": "a", "mem": 4, "cost": 1},
        {"id": 1, "name": "b", "mem": 4, "cost": 1, "inputs": [0]},
        {"id": 2, "name": "c", "mem": 6, "cost": 1, "inputs": [1]},
        {"id": 3, "name": "d", "mem": 1, "cost": 1, "inputs": [2, 1]},
    ]
    return Graph.model_validate({"name": "fragmenting", "nodes": nodes, "outputs": [3]})


def test_best_fit_fragmentation_is_measured_and_exact_removes_it() -> None:
    graph = _fragmenting_graph()
    schedule = Schedule.from_order(graph.order)
    greedy = best_fit_placement(graph, schedule)
    # Live peak is b + c (+ d at the last step: b, c, d) = 11; best fit puts a at 0, b at 4,
    # c above b at 8 (a's 4-byte hole is too small), d into a's hole: arena 14.
    assert greedy.live_peak == 11
    assert greedy.arena_peak == 14 and greedy.fragmentation == pytest.approx(3 / 14)
    exact = exact_placement(graph, schedule, time_limit=5.0)
    assert exact.status == "optimal" and exact.arena_peak == 11


def test_lifetimes_include_caller_owned_and_workspace() -> None:
    nodes = [
        {"id": 0, "name": "x", "mem": 3, "cost": 0, "kind": "input"},
        {"id": 1, "name": "h", "mem": 5, "cost": 1, "inputs": [0], "workspace": 2},
        {"id": 2, "name": "y", "mem": 1, "cost": 1, "inputs": [1]},
    ]
    graph = Graph.model_validate({"name": "ws", "nodes": nodes, "outputs": [2]})
    lifetimes, live_peak = schedule_lifetimes(graph, Schedule.from_order(graph.order))
    labels = {b.label: (b.start, b.end, b.size) for b in lifetimes}
    assert labels["owned %0"] == (0, 1, 3)
    assert labels["workspace %1@0"] == (0, 0, 2)
    assert live_peak == 3 + 5 + 2


def test_exact_refuses_large_schedules(moccasin_dir) -> None:
    graph = load_graph(moccasin_dir / "ResNet50_256_224_224_3_train_nx.json")
    schedule = Schedule.from_order(graph.order)
    with pytest.raises(CoopError, match="max_blocks"):
        exact_placement(graph, schedule, time_limit=1.0)
    greedy = best_fit_placement(graph, schedule)
    _assert_disjoint(greedy)
    assert greedy.arena_peak >= greedy.live_peak


@settings(max_examples=40, deadline=None)
@given(case=graphs_with_schedules(max_nodes=7))
def test_packed_placement_is_disjoint_and_between_the_optimum_and_best_fit(case: tuple[Graph, Schedule]) -> None:
    """Oracles: the live peak (no placement is lower), CP-SAT's proven optimum, and best fit (packed takes the lower)."""
    graph, schedule = case
    packed = packed_placement(graph, schedule)
    _assert_disjoint(packed)
    packed.check()
    greedy = best_fit_placement(graph, schedule)
    assert packed.live_peak <= packed.arena_peak <= greedy.arena_peak
    exact = exact_placement(graph, schedule, time_limit=2.0, max_blocks=200)
    if exact.status == "optimal":
        assert exact.arena_peak <= packed.arena_peak


def test_greedy_by_size_closes_the_hole_best_fit_leaves() -> None:
    """Hand-placed: best fit in schedule order puts a (4) at 0 and b (4) at 4; a dies, and c (6), alive with b, cannot
    use a's 4-byte hole, so it goes to 8, d (1) to 0 (arena 14). Largest first places c at 0, b at 6 (it overlaps
    c), a at 0 (a and c never share a step), d on top at 10: arena 11 = the live peak b + c + d."""
    graph = _fragmenting_graph()
    schedule = Schedule.from_order(graph.order)
    assert best_fit_placement(graph, schedule).arena_peak > simulate(graph, schedule).peak
    packed = packed_placement(graph, schedule)
    assert packed.method == "greedy-by-size" and packed.arena_peak == packed.live_peak == simulate(graph, schedule).peak


# ------------------------------------------------------------------ one address space per device (issue 22)
def _mixed_device_graph() -> Graph:
    """x (input, cuda:0) -> a (cuda:0) -> s (a CPU scalar) and b (cuda:1); c (cuda:0) reads b and s; d (cuda:1).

    Store-all lifetimes (steps a=0, s=1, b=2, c=3, d=4): a 0..2, s 1..3, b 2..4, c 3..4, d 4 (the output).
    """
    nodes = [
        {"id": 0, "name": "x", "mem": 128, "cost": 0, "kind": "input", "device": "cuda:0"},
        {"id": 1, "name": "a", "mem": 256, "cost": 1, "inputs": [0], "device": "cuda:0"},
        {"id": 2, "name": "s", "mem": 64, "cost": 1, "inputs": [1], "device": "cpu"},
        {"id": 3, "name": "b", "mem": 512, "cost": 1, "inputs": [1], "device": "cuda:1"},
        {"id": 4, "name": "c", "mem": 128, "cost": 1, "inputs": [3, 2], "device": "cuda:0"},
        {"id": 5, "name": "d", "mem": 64, "cost": 1, "inputs": [4, 3], "device": "cuda:1"},
    ]
    return Graph.model_validate({"name": "mixed", "nodes": nodes, "outputs": [5]})


def _assert_disjoint_per_device(placement: Placement) -> None:
    """Brute force: two blocks on one device alive at a common step never share an address; each device's arena
    is the highest address its blocks reach."""
    blocks, offsets = placement.lifetimes, placement.offsets
    for a in range(len(blocks)):
        for b in range(a + 1, len(blocks)):
            if blocks[a].device == blocks[b].device and blocks[a].start <= blocks[b].end and \
                    blocks[b].start <= blocks[a].end:
                assert offsets[a] + blocks[a].size <= offsets[b] or offsets[b] + blocks[b].size <= offsets[a]
    for device in {b.device for b in blocks}:
        top = max(o + b.size for o, b in zip(offsets, blocks, strict=True) if b.device == device)
        assert placement.arena_peaks[device] == top
    assert placement.arena_peak == sum(placement.arena_peaks.values())


def test_each_device_gets_its_own_arena_of_its_own_peak() -> None:
    """Hand-counted per device: cuda:0 holds a (256) and later c (128): 256; cuda:1 b (512) with d (64) at the last
    step: 576; the CPU the scalar s: 64. The caller-owned x (cuda:0) is in no execution arena; with the caller-owned
    values placed, cuda:0 holds x beside a: 384."""
    graph = _mixed_device_graph()
    schedule = Schedule.from_order(graph.order)
    for placement in (execution_placement(graph, schedule, alignment=64), best_fit_placement(graph, schedule,
                                                                                           caller_owned=False)):
        placement.check()
        _assert_disjoint_per_device(placement)
        assert placement.arena_peaks == {"cpu": 64, "cuda:0": 256, "cuda:1": 576}
        assert placement.live_peak == placement.arena_peak == 896
        assert all(b.device == graph.node(b.node).device for b in placement.lifetimes)
        assert not any(b.label.startswith("owned") for b in placement.lifetimes)
    # separate address spaces: a (cuda:0), b (cuda:1) and s (cpu) are alive together at step 2, all at offset 0
    execution = execution_placement(graph, schedule, alignment=64)
    at = {b.label: o for b, o in zip(execution.lifetimes, execution.offsets, strict=True)}
    assert at["%1#0"] == at["%3#2"] == at["%2#1"] == 0
    with_owned = best_fit_placement(graph, schedule)
    _assert_disjoint_per_device(with_owned)
    assert with_owned.arena_peaks == {"cpu": 64, "cuda:0": 384, "cuda:1": 576}
    exact = exact_placement(graph, schedule, time_limit=2.0)
    _assert_disjoint_per_device(exact)
    assert exact.arena_peaks == with_owned.arena_peaks


def test_a_placement_that_mixes_devices_is_refused_by_check() -> None:
    """Two blocks alive together at one address are an overlap on one device and legal on two."""
    graph = _mixed_device_graph()
    placement = execution_placement(graph, Schedule.from_order(graph.order), alignment=64)
    same = [replace(b, device="cuda:0") for b in placement.lifetimes]
    low = [512 if b.label == "%5#4" else 0 for b in placement.lifetimes]  # d above b on cuda:1, the rest at 0
    Placement("x", "heuristic", placement.lifetimes, low, 1024, 896).check()  # a, s, b at 0 on three devices
    with pytest.raises(CoopError, match="placement overlap on cuda:0"):
        Placement("x", "heuristic", same, low, 1024, 896).check()


@st.composite
def graphs_on_devices(draw: st.DrawFn) -> tuple[Graph, Schedule]:
    """A random graph whose values live on two accelerators, and a random legal schedule of it (paging included)."""
    graph, schedule = draw(graphs_with_schedules(max_nodes=10))
    data = graph.model_dump()
    for node in data["nodes"]:
        node["device"] = draw(st.sampled_from(["cuda:0", "cuda:1"]))
    return Graph.model_validate(data), schedule


def _per_device_placement_never_overlaps_and_counts_each_device_exactly(case: tuple[Graph, Schedule]) -> None:
    """Oracle: the simulator. At every step each device's blocks add up to that device's share of sim.memory, no two
    blocks on one device overlap, and each device's arena is at least its own live peak."""
    graph, schedule = case
    sim = simulate(graph, schedule)
    for placement in (best_fit_placement(graph, schedule), packed_placement(graph, schedule, alignment=8)):
        _assert_disjoint_per_device(placement)
        placement.check()
        for step, memory in enumerate(sim.memory):
            live = sum(b.size for b in placement.lifetimes if b.start <= step <= b.end)
            assert live == memory or placement.extra["alignment"] > 1
        for device, peak in placement.arena_peaks.items():
            live_peak = max(sum(b.size for b in placement.lifetimes if b.device == device and b.start <= j <= b.end)
                            for j in range(len(schedule)))
            assert peak >= live_peak


#: 60 examples in the slow tier, 20 in the fast one (tests/tiers.py)
@examples(20, 60)
def test_per_device_placement_never_overlaps_and_counts_each_device_exactly(examples: int) -> None:
    check(_per_device_placement_never_overlaps_and_counts_each_device_exactly, examples, settings(deadline=None),
          case=graphs_on_devices())
