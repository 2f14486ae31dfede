"""The CPU model of the CUDA caching allocator (coop.runtime.cuda_allocator_model, issue 43 item 1).

Oracles independent of the model: every layout below is counted by hand from the allocator's rules (512 B
rounding; 2 MiB small segments; 20 MiB large segments below 10 MiB, else 2 MiB rounding; split where the rest is
>= 512 B small / > 1 MiB large; best fit; coalescing; streams apart; pages of 2 MiB / 20 MiB when expandable), and
the property test recomputes the live rounded bytes itself.
"""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coop.graph import Graph, Node
from coop.planner.measure import modelled_ordinary_step
from coop.runtime.allocator import AllocatorAssumption
from coop.runtime.cuda_allocator_model import (
    Alloc,
    AllocatorOutOfMemory,
    AllocatorSettings,
    BlockView,
    CachingAllocatorModel,
    EmptyCache,
    Free,
    RecordStream,
    ReleasePool,
    Sync,
    predict_reserved,
    schedule_events,
)
from coop.runtime.reserved import modelled_step_reserved
from coop.schedule import Schedule, Step

KIB = 1024
MIB = 1024 * 1024


def _layout(prediction, which: str = "segments") -> list[tuple]:
    """(kind, stream, size, [(offset, size, state, owner), ...]) per segment."""
    return [(s.kind, s.stream, s.size, [(b.offset, b.size, b.state, b.owner) for b in s.blocks])
            for s in getattr(prediction, which)]


# ---------------------------------------------------------------------------------------------- ordinary segments
def test_three_600_kib_requests_split_one_small_segment_three_ways() -> None:
    a = 600 * KIB  # 614400 B, already a multiple of 512
    p = predict_reserved([Alloc(0, a), Alloc(1, a), Alloc(2, a)])
    assert p.reserved == [2 * MIB] * 3
    assert _layout(p) == [("small", 0, 2 * MIB, [(0, a, "allocated", 0), (a, a, "allocated", 1),
                                                (2 * a, a, "allocated", 2), (3 * a, 2 * MIB - 3 * a, "free", None)])]
    assert 2 * MIB - 3 * a == 253952
    p = predict_reserved([Alloc(i, a) for i in range(4)])  # the fourth does not fit the 253952 B left
    assert p.peak_reserved == 4 * MIB
    assert len(p.segments) == 2


def test_request_sizes_round_to_512_bytes() -> None:
    p = predict_reserved([Alloc(0, 1), Alloc(1, 513), Alloc(2, 0)])
    assert p.allocated == [512, 512 + 1024, 1536]
    assert [b.size for b in p.segments[0].blocks] == [512, 1024, 2 * MIB - 1536]


def test_large_requests_get_20_mib_segments_below_10_mib_and_their_size_rounded_to_2_mib_above() -> None:
    p = predict_reserved([Alloc(0, 5 * MIB)])
    assert _layout(p) == [("large", 0, 20 * MIB, [(0, 5 * MIB, "allocated", 0), (5 * MIB, 15 * MIB, "free", None)])]
    p = predict_reserved([Alloc(0, 30 * MIB)])
    assert _layout(p) == [("large", 0, 30 * MIB, [(0, 30 * MIB, "allocated", 0)])]
    p = predict_reserved([Alloc(0, 10 * MIB)])  # 10 MiB is not below 10 MiB: its own 10 MiB segment
    assert p.peak_reserved == 10 * MIB
    # 31 MiB - 1 -> 31 MiB -> a 32 MiB segment; the 1 MiB rest is not more than 1 MiB: no split
    p = predict_reserved([Alloc(0, 31 * MIB - 1)])
    assert _layout(p) == [("large", 0, 32 * MIB, [(0, 32 * MIB, "allocated", 0)])]
    assert (p.allocated[-1], p.active[-1]) == (31 * MIB, 32 * MIB)


def test_one_mib_is_the_largest_small_request() -> None:
    assert _layout(predict_reserved([Alloc(0, MIB)]))[0][:3] == ("small", 0, 2 * MIB)
    p = predict_reserved([Alloc(0, MIB + 1)])  # rounds to 1 MiB + 512: large pool, 20 MiB segment
    assert _layout(p) == [("large", 0, 20 * MIB, [(0, MIB + 512, "allocated", 0),
                                                 (MIB + 512, 19 * MIB - 512, "free", None)])]


def test_large_rest_of_exactly_1_mib_is_not_split_off_but_one_byte_block_more_is() -> None:
    p = predict_reserved([Alloc(0, 19 * MIB)])  # 20 MiB segment, rest 1 MiB: not more than 1 MiB
    assert [b.size for b in p.segments[0].blocks] == [20 * MIB]
    p = predict_reserved([Alloc(0, 19 * MIB - 512)])  # rest 1 MiB + 512: split
    assert [b.size for b in p.segments[0].blocks] == [19 * MIB - 512, MIB + 512]


def test_small_rest_of_512_bytes_is_split_off() -> None:
    p = predict_reserved([Alloc(0, MIB), Alloc(1, MIB - 512)])
    # second request: the 1 MiB rest of the segment fits; it leaves exactly 512 B, which splits
    assert [b.size for b in p.segments[0].blocks] == [MIB, MIB - 512, 512]


def test_free_and_smaller_request_reuse_the_coalesced_block() -> None:
    p = predict_reserved([Alloc(0, 5 * MIB), Free(0), Alloc(1, 3 * MIB)])
    assert p.reserved == [20 * MIB] * 3
    assert _layout(p) == [("large", 0, 20 * MIB, [(0, 3 * MIB, "allocated", 1), (3 * MIB, 17 * MIB, "free", None)])]


def test_best_fit_takes_the_smallest_free_block_that_fits() -> None:
    a = 600 * KIB
    trace = [Alloc(0, a), Alloc(1, a), Alloc(2, a), Free(1)]  # free blocks: 614400 (middle), 253952 (tail)
    p = predict_reserved([*trace, Alloc(3, 200 * KIB)])  # 204800 fits the tail, the smaller one
    assert [(b.size, b.state) for b in p.segments[0].blocks] == [
        (a, "allocated"), (a, "free"), (a, "allocated"), (204800, "allocated"), (253952 - 204800, "free")]
    p = predict_reserved([*trace, Alloc(3, 300 * KIB)])  # 307200 does not fit the tail: the middle, split
    assert [(b.size, b.state) for b in p.segments[0].blocks] == [
        (a, "allocated"), (307200, "allocated"), (307200, "free"), (a, "allocated"), (253952, "free")]


def test_freed_neighbours_coalesce() -> None:
    a = 600 * KIB
    p = predict_reserved([Alloc(0, a), Alloc(1, a), Alloc(2, a), Free(0), Free(2), Free(1)])
    assert _layout(p) == [("small", 0, 2 * MIB, [(0, 2 * MIB, "free", None)])]


def test_two_streams_never_share_a_block() -> None:
    p = predict_reserved([Alloc(0, 600 * KIB, stream=0), Free(0), Alloc(1, 600 * KIB, stream=1)])
    assert p.reserved == [2 * MIB, 2 * MIB, 4 * MIB]
    assert [(s.stream, [b.state for b in s.blocks]) for s in p.segments] == [
        (0, ["free"]), (1, ["allocated", "free"])]


def test_empty_cache_releases_only_segments_with_no_allocated_block() -> None:
    p = predict_reserved([Alloc(0, 5 * MIB), Alloc(1, 600 * KIB), Alloc(2, 16 * MIB), Free(0), Free(2), EmptyCache()])
    # 16 MiB does not fit the 15 MiB left in the 20 MiB segment: a 16 MiB segment of its own
    assert p.reserved == [20 * MIB, 22 * MIB, 38 * MIB, 38 * MIB, 38 * MIB, 2 * MIB]
    assert _layout(p)[0][:3] == ("small", 0, 2 * MIB)
    p = predict_reserved([Alloc(0, 5 * MIB), Alloc(1, 5 * MIB), Free(0), EmptyCache()])  # one live block keeps it
    assert p.reserved[-1] == 20 * MIB


def test_a_block_recorded_on_another_stream_waits_for_that_stream() -> None:
    trace = [Alloc(0, 12 * MIB), RecordStream(0, 1), Free(0), Alloc(1, 12 * MIB)]
    p = predict_reserved(trace)
    assert p.reserved[-1] == 24 * MIB  # the 12 MiB segment awaits stream 1: a second one
    assert [b.state for b in p.segments[0].blocks] == ["awaiting_free"]
    p = predict_reserved([*trace, Sync(1), Free(1), Alloc(2, 12 * MIB)])
    assert p.reserved[-1] == 24 * MIB
    assert [b.owner for s in p.segments for b in s.blocks] == [2, None]  # best fit tie: the older segment
    assert predict_reserved([Alloc(0, 12 * MIB), Free(0), Alloc(1, 12 * MIB)]).peak_reserved == 12 * MIB
    # a record onto its own stream changes nothing; a sync before the free does not complete it
    assert predict_reserved([Alloc(0, 12 * MIB), RecordStream(0, 0), Free(0), Alloc(1, 12 * MIB)]).peak_reserved == 12 * MIB
    assert predict_reserved([Alloc(0, 12 * MIB), RecordStream(0, 1), Sync(1), Free(0),
                             Alloc(1, 12 * MIB)]).peak_reserved == 24 * MIB
    # empty_cache completes the pending free first
    assert predict_reserved([Alloc(0, 12 * MIB), RecordStream(0, 1), Free(0), EmptyCache()]).reserved[-1] == 0


def test_a_private_pool_is_kept_apart_and_released_only_after_its_graph() -> None:
    trace = [Alloc(0, 5 * MIB, pool=1), Free(0), Alloc(1, 5 * MIB), Free(1), EmptyCache()]
    p = predict_reserved(trace)
    assert p.reserved == [20 * MIB, 20 * MIB, 40 * MIB, 40 * MIB, 20 * MIB]  # the default pool's went, the graph's stays
    assert [s.pool for s in p.segments] == [1]
    p = predict_reserved([*trace, ReleasePool(1), EmptyCache()])
    assert p.reserved[-1] == 0
    with pytest.raises(ValueError, match="released"):
        predict_reserved([ReleasePool(1), Alloc(0, 1, pool=1)])


def test_max_split_size_keeps_big_blocks_for_big_requests() -> None:
    settings = AllocatorSettings(max_split_size=40 * MIB)
    trace = [Alloc(0, 50 * MIB), Free(0), Alloc(1, 30 * MIB)]
    assert predict_reserved(trace).reserved[-1] == 50 * MIB  # unlimited: the 50 MiB block is split
    p = predict_reserved(trace, settings=settings)
    assert p.reserved[-1] == 80 * MIB  # a 50 MiB block serves no request below 40 MiB
    p = predict_reserved([*trace, Alloc(2, 45 * MIB)], settings=settings)  # 50 < 45 + 20: taken whole
    assert p.reserved[-1] == 80 * MIB
    assert (p.allocated[-1], p.active[-1]) == (75 * MIB, 80 * MIB)
    p = predict_reserved([Alloc(0, 70 * MIB), Free(0), Alloc(1, 45 * MIB)], settings=settings)  # 70 >= 45 + 20
    assert p.reserved[-1] == 116 * MIB
    with pytest.raises(ValueError, match="20 MiB"):
        AllocatorSettings(max_split_size=20 * MIB)


def test_capacity_empties_the_cache_and_retries_once() -> None:
    settings = AllocatorSettings(capacity=24 * MIB)
    p = predict_reserved([Alloc(0, 5 * MIB), Free(0), Alloc(1, 22 * MIB)], settings=settings)
    assert p.reserved == [20 * MIB, 20 * MIB, 22 * MIB]
    with pytest.raises(AllocatorOutOfMemory):
        predict_reserved([Alloc(0, 22 * MIB), Alloc(1, 5 * MIB)], settings=settings)


# ---------------------------------------------------------------------------------------------- expandable segments
def test_expandable_segments_map_whole_pages() -> None:
    assert predict_reserved([Alloc(0, 600 * KIB)], expandable=True).peak_reserved == 2 * MIB
    assert predict_reserved([Alloc(0, 5 * MIB)], expandable=True).peak_reserved == 20 * MIB
    assert predict_reserved([Alloc(0, 30 * MIB)], expandable=True).peak_reserved == 40 * MIB
    assert predict_reserved([Alloc(0, 41 * MIB)], expandable=True).peak_reserved == 60 * MIB
    # 5 MiB leaves 15 MiB free at the end of the first page; 30 MiB grows into one more page: 40 MiB, not 20 + 30
    p = predict_reserved([Alloc(0, 5 * MIB), Alloc(1, 30 * MIB)], expandable=True)
    assert p.reserved == [20 * MIB, 40 * MIB]
    assert _layout(p) == [("large", 0, 40 * MIB, [(0, 5 * MIB, "allocated", 0), (5 * MIB, 30 * MIB, "allocated", 1),
                                                 (35 * MIB, 5 * MIB, "free", None)])]
    assert predict_reserved([Alloc(0, 5 * MIB), Alloc(1, 30 * MIB)]).peak_reserved == 50 * MIB


def test_expandable_segments_keep_one_virtual_segment_per_stream_and_pool_kind() -> None:
    p = predict_reserved([Alloc(0, 600 * KIB), Alloc(1, 600 * KIB, stream=1), Alloc(2, 3 * MIB),
                          Alloc(3, 3 * MIB)], expandable=True)
    assert [(s.kind, s.stream, s.size) for s in p.segments] == [("small", 0, 2 * MIB), ("small", 1, 2 * MIB),
                                                                 ("large", 0, 20 * MIB)]


def test_expandable_empty_cache_unmaps_the_whole_free_pages_and_holes_are_mapped_again() -> None:
    trace = [Alloc(0, 30 * MIB), Alloc(1, 15 * MIB), Free(0), EmptyCache()]
    p = predict_reserved(trace, expandable=True)
    # 30 MiB: pages [0, 40); 15 MiB: the 10 MiB free tail plus one page -> [30, 45), free [45, 60)
    # free [0, 30) holds the whole page [0, 20): unmapped; [45, 60) holds no whole page
    assert p.reserved == [40 * MIB, 60 * MIB, 60 * MIB, 40 * MIB]
    assert _layout(p) == [("large", 0, 40 * MIB, [(0, 20 * MIB, "unmapped", None), (20 * MIB, 10 * MIB, "free", None),
                                                 (30 * MIB, 15 * MIB, "allocated", 1),
                                                 (45 * MIB, 15 * MIB, "free", None)])]
    # 25 MiB fits no free block; the hole [0, 20) and the free [20, 30) make 30 MiB: one page mapped again
    p = predict_reserved([*trace, Alloc(2, 25 * MIB)], expandable=True)
    assert p.reserved[-1] == 60 * MIB
    assert [(b.offset, b.size, b.state) for b in p.segments[0].blocks] == [
        (0, 25 * MIB, "allocated"), (25 * MIB, 5 * MIB, "free"), (30 * MIB, 15 * MIB, "allocated"),
        (45 * MIB, 15 * MIB, "free")]


def test_expandable_large_pool_splits_rests_of_512_bytes() -> None:
    p = predict_reserved([Alloc(0, 20 * MIB - 512)], expandable=True)
    assert [b.size for b in p.segments[0].blocks] == [20 * MIB - 512, 512]


def test_expandable_capacity_undoes_a_mapping_that_does_not_fit() -> None:
    model = CachingAllocatorModel(AllocatorSettings(expandable=True, capacity=30 * MIB))
    model.alloc(0, 5 * MIB)  # page [0, 20)
    with pytest.raises(AllocatorOutOfMemory):
        model.alloc(1, 20 * MIB)  # would map [20, 40): 40 MiB
    assert model.reserved == 20 * MIB
    assert [(b.size, b.state) for b in model.segments[0].blocks[:-1]] == [(5 * MIB, "allocated"), (15 * MIB, "free")]
    # a stream 1 page freed by the retry's empty_cache makes room
    settings = AllocatorSettings(expandable=True, capacity=60 * MIB)
    p = predict_reserved([Alloc(0, 5 * MIB, stream=1), Free(0), Alloc(1, 30 * MIB), Alloc(2, 15 * MIB)],
                         settings=settings)
    assert p.reserved == [20 * MIB, 20 * MIB, 60 * MIB, 60 * MIB]
    assert _layout(p) == [("large", 0, 60 * MIB, [(0, 30 * MIB, "allocated", 1), (30 * MIB, 15 * MIB, "allocated", 2),
                                                 (45 * MIB, 15 * MIB, "free", None)])]


# ---------------------------------------------------------------------------------------------- invariants
def _rounded(size: int) -> int:
    """The allocator's rounding, written apart from the model: whole 512 B units, none for 0 B."""
    units, rest = divmod(size, 512)
    return 512 * (units + (1 if rest else 0))


SIZES = st.one_of(st.integers(0, 4096), st.integers(1, 2 * MIB), st.integers(MIB, 64 * MIB))
OPS = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "free", "empty", "record", "sync"]), SIZES,
                         st.integers(0, 1), st.integers(0, 10 ** 6)), max_size=60)


@given(OPS, st.booleans())
def test_random_traces_keep_the_allocator_invariants(ops: list[tuple[str, int, int, int]], expandable: bool) -> None:
    model = CachingAllocatorModel(AllocatorSettings(expandable=expandable))
    live: dict[int, int] = {}
    for n, (op, size, stream, pick) in enumerate(ops):
        if op == "alloc":
            model.alloc(n, size, stream)
            live[n] = _rounded(size)
        elif op in ("free", "record") and live:
            ident = sorted(live)[pick % len(live)]
            if op == "record":
                model.apply(RecordStream(ident, 1 - stream))
            model.free(ident)
            del live[ident]
        elif op == "empty":
            model.empty_cache()
        elif op == "sync":
            model.apply(Sync(stream))
        assert model.allocated == sum(live.values())
        assert model.reserved >= model.active >= model.allocated
        for segment in model.segments:
            blocks = segment.blocks
            assert [b.offset for b in blocks] == [0] + [b.offset + b.size for b in blocks[:-1]]  # they tile
            assert all(not (x.state == y.state == "free") for x, y in pairwise(blocks))  # coalesced
            assert all(not (x.state == y.state == "unmapped") for x, y in pairwise(blocks))
            assert segment.reserved == sum(b.size for b in blocks if b.state != "unmapped")
            assert segment.expandable or all(b.state != "unmapped" for b in blocks)
            assert segment.reserved % (segment.page if segment.expandable else 512) == 0
    for ident in sorted(live):
        model.free(ident)
    model.empty_cache()
    assert model.reserved == 0 and model.active == 0 and model.allocated == 0


def test_predict_reserved_reports_per_event_values_and_the_peak_layout() -> None:
    p = predict_reserved([Alloc(0, 5 * MIB), Alloc(1, 16 * MIB), Free(1), EmptyCache()])
    assert p.reserved == [20 * MIB, 36 * MIB, 36 * MIB, 20 * MIB]
    assert p.peak_reserved == 36 * MIB and p.peak_allocated == 21 * MIB
    assert [s.size for s in p.peak_segments] == [20 * MIB, 16 * MIB]
    assert p.segments[0].blocks[0] == BlockView(0, 5 * MIB, "allocated", 0)
    with pytest.raises(ValueError, match="not live"):
        predict_reserved([Free(3)])
    with pytest.raises(ValueError, match="not live"):
        predict_reserved([Alloc(0, 1), Free(0), RecordStream(0, 1)])
    with pytest.raises(ValueError, match="already live"):
        predict_reserved([Alloc(0, 1), Alloc(0, 1)])
    with pytest.raises(TypeError, match="not an allocator event"):
        predict_reserved(["alloc"])


# ---------------------------------------------------------------------------------------------- schedule events
def _graph() -> Graph:
    return Graph(outputs=(3,), nodes=[
        Node(id=0, name="x", mem=1000, cost=0, kind="input"),
        Node(id=1, name="a", inputs=(0,), mem=3000, cost=1),
        Node(id=2, name="b", inputs=(1,), mem=2000, cost=1, workspace=500),
        Node(id=3, name="c", inputs=(1, 2), mem=700, cost=1),
    ])


def _allocs(events) -> list[tuple[int | None, int, int]]:
    return [(e.node, e.size, e.stream) for e in events if isinstance(e, Alloc)]


def test_schedule_events_allocate_each_value_once_and_free_after_its_last_read() -> None:
    graph = _graph()
    events = schedule_events(graph, Schedule.from_order(graph.order))
    # counted by hand: x before the step; a at step 0; b and its workspace at step 1; c at step 2
    assert _allocs(events) == [(0, 1000, 0), (1, 3000, 0), (2, 2000, 0), (None, 500, 0), (3, 700, 0)]
    assert sum(size for _, size, _ in _allocs(events)) == 7200
    ids = {e.id: e.node for e in events if isinstance(e, Alloc)}
    freed = [ids[e.id] for e in events if isinstance(e, Free)]
    assert freed == [None, 1, 2]  # the workspace in its step; a and b after c reads them; x and c stay
    live, peak = {}, 0  # the most bytes live at once, counted from the events
    for e in events:
        if isinstance(e, Alloc):
            live[e.id] = e.size
        else:
            del live[e.id]
        peak = max(peak, sum(live.values()))
    assert peak == 1000 + 3000 + 2000 + 700
    assert len(schedule_events(graph, Schedule.from_order(graph.order), workspace=False, include_owned=False)) == 5


def test_schedule_events_follow_free_and_page_steps() -> None:
    graph = _graph()
    steps = (Step(op="compute", node=1), Step(op="compute", node=2), Step(op="page_out", node=1),
             Step(op="page_in", node=1), Step(op="compute", node=3), Step(op="free", node=2))
    schedule = Schedule(steps=steps)
    events = schedule_events(graph, schedule, workspace=False, include_owned=False)
    # a: allocated at 0, freed at its page-out (after step 1), allocated again at its page-in (step 3)
    assert _allocs(events) == [(1, 3000, 0), (2, 2000, 0), (1, 3000, 0), (3, 700, 0)]
    kinds = [(type(e).__name__, e.id) for e in events]
    first_a, b, second_a, c = (e.id for e in events if isinstance(e, Alloc))
    assert kinds == [("Alloc", first_a), ("Alloc", b), ("Free", first_a), ("Alloc", second_a), ("Alloc", c),
                     ("Free", second_a), ("Free", b)]
    copy = schedule_events(graph, schedule, page_in_stream=1, workspace=False, include_owned=False)
    assert _allocs(copy) == [(1, 3000, 0), (2, 2000, 0), (1, 3000, 1), (3, 700, 0)]
    # the page-in's block comes from stream 1's pool: a second small segment
    assert predict_reserved(copy).peak_reserved == 4 * MIB
    assert predict_reserved(events).peak_reserved == 2 * MIB


def test_schedule_events_reuse_the_storage_an_inplace_compute_consumes() -> None:
    graph = Graph(outputs=(2,), nodes=[
        Node(id=0, name="x", mem=1000, cost=0, kind="input"),
        Node(id=1, name="a", inputs=(0,), mem=3000, cost=1),
        Node(id=2, name="relu", inputs=(1,), mem=3000, cost=1,
             impls=[{"name": "inplace", "cost": 1, "mem": 3000, "inplace_of": 1}]),
    ])
    schedule = Schedule(steps=(Step(op="compute", node=1), Step(op="compute", node=2, impl="inplace")))
    events = schedule_events(graph, schedule, include_owned=False)
    assert _allocs(events) == [(1, 3000, 0)]  # relu's output is a's storage
    assert not [e for e in events if isinstance(e, Free)]  # the output lives on


def test_modelled_step_reserved_counts_from_what_the_caller_owned_values_hold() -> None:
    graph = Graph(outputs=(2,), nodes=[
        Node(id=0, name="x", mem=600 * KIB, cost=0, kind="input"),
        Node(id=1, name="a", inputs=(0,), mem=5 * MIB, cost=1),
        Node(id=2, name="b", inputs=(1,), mem=30 * MIB, cost=1),
    ])
    schedule = Schedule.from_order(graph.order)
    # x: a 2 MiB small segment (its 600 KiB block was allocated before); a: a 20 MiB segment; b: 30 MiB of its own
    assert modelled_step_reserved(graph, schedule, expandable=False) == 2 * MIB + 20 * MIB + 30 * MIB - 600 * KIB
    # expandable: b grows a's 20 MiB page by one more (15 MiB free + 20 MiB >= 30 MiB): 40 MiB in the large pool
    assert modelled_step_reserved(graph, schedule, expandable=True) == 2 * MIB + 40 * MIB - 600 * KIB


def _chain_on_cuda() -> Graph:
    """x (4 MiB, caller-owned) -> a (12 MiB) -> b (12 MiB) -> c (14 MiB, the output), every value on cuda:0."""
    return Graph(outputs=(3,), nodes=[
        Node(id=0, name="x", mem=4 * MIB, cost=0, kind="input", device="cuda:0"),
        Node(id=1, name="a", inputs=(0,), mem=12 * MIB, cost=1, device="cuda:0"),
        Node(id=2, name="b", inputs=(1,), mem=12 * MIB, cost=1, device="cuda:0"),
        Node(id=3, name="c", inputs=(2,), mem=14 * MIB, cost=1, device="cuda:0"),
    ])


def test_a_plans_modelled_reserve_is_its_caller_owned_bytes_plus_the_step_in_its_pool() -> None:
    """coop.plan's rounds act on modelled_ordinary_step (coop.planner.measure). Hand count, expandable segments
    (20 MiB pages): x takes [0, 4) of page 0; a [4, 16); b finds 4 MiB free and maps page 1 for [16, 28); a is freed
    (12 MiB hole); c (14 MiB) fits neither 12 MiB block and maps page 2 for [28, 42): 60 MiB. In a CUDA graph's
    private pool (ordinary segments, 2 MiB rounding at and above 10 MiB): a, b and c a segment each, 12 + 12 + 14
    MiB (c does not fit a's freed 12), beside x's 20 MiB page in the default pool: 58 MiB."""
    graph = _chain_on_cuda()
    expandable = AllocatorAssumption(True, "coop", 22 * MIB, "")

    def candidate(graph_replay: object = None, copy_stream: object = None) -> SimpleNamespace:
        return SimpleNamespace(graph=graph, schedule=Schedule.from_order(graph.order), graph_replay=graph_replay,
                               executor=SimpleNamespace(copy_stream=copy_stream),
                               captured=SimpleNamespace(sharding=None))

    assert modelled_ordinary_step(candidate(), expandable) == 60 * MIB
    assert modelled_ordinary_step(candidate(graph_replay=object()), expandable) == 58 * MIB
    # the copy stream allocates a page-in's block on the compute stream (coop.runtime.copy_stream): the same events
    assert modelled_ordinary_step(candidate(copy_stream=object()), expandable) == 60 * MIB
    not_applicable = AllocatorAssumption(None, "PYTORCH_ALLOC_CONF", 0, "")
    assert modelled_ordinary_step(candidate(), not_applicable) is None
