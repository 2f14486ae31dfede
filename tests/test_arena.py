"""Invariants of the address-ordered arena under random allocation and free sequences."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coop.errors import CoopError
from coop.online.arena import Arena, ArenaError

# An operation: ("alloc", size, at_top) or ("free", index into the live tags); at_top: placement "top".
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 40), st.booleans()),
        st.tuples(st.just("free"), st.integers(0, 1000), st.just(False)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 200), operations=_operations)
def test_random_alloc_free_keeps_the_arena_tiled_and_merged(size: int, operations: list) -> None:
    arena = Arena(size)
    live: dict[int, tuple[int, int]] = {}  # tag -> (start, size)
    next_tag = 0
    for kind, amount, at_top in operations:
        if kind == "alloc":
            could_fit = arena.largest_free >= amount
            start = arena.allocate(amount, next_tag, "top" if at_top else "best")
            assert (start is not None) == could_fit
            if start is not None:
                assert 0 <= start and start + amount <= size
                if at_top:  # carved from the top of the block it came from
                    block_after = next((b for b in arena.blocks() if b.start == start + amount), None)
                    assert block_after is None or not block_after.free
                live[next_tag] = (start, amount)
            next_tag += 1
        elif live:
            tag = sorted(live)[amount % len(live)]
            assert arena.free(tag) == live.pop(tag)[1]
        arena.check_invariants()
        spans = sorted(live.values())
        for (a_start, a_size), (b_start, _) in itertools.pairwise(spans):
            assert a_start + a_size <= b_start, "two live blocks overlap"
        assert arena.used == sum(s for _, s in live.values())
        assert arena.used + sum(b.size for b in arena.blocks() if b.free) == size
        assert arena.peak_used >= arena.used


def test_best_fit_takes_the_smallest_hole() -> None:
    arena = Arena(100)
    for tag, amount in enumerate((10, 30, 10, 20, 30)):
        arena.allocate(amount, tag)
    arena.free(1)  # hole of 30 at 10
    arena.free(3)  # hole of 20 at 50
    assert arena.allocate(15, "x") == 50
    assert arena.allocate(25, "y") == 10


def test_top_placement_allocates_at_the_top() -> None:
    arena = Arena(100)
    assert arena.allocate(10, "low") == 0
    assert arena.allocate(10, "high", placement="top") == 90
    assert arena.high_water == 100


def test_allocate_at_reuses_a_free_range_only() -> None:
    arena = Arena(50)
    arena.allocate(10, "a")
    arena.allocate(10, "b")
    arena.free("a")
    assert arena.allocate_at(0, 10, "a2")
    assert not arena.allocate_at(5, 10, "c")  # overlaps b
    arena.check_invariants()


def test_failures_record_free_fraction_and_largest_block() -> None:
    arena = Arena(100)
    for tag in range(4):
        arena.allocate(25, tag)
    arena.free(0)
    arena.free(2)
    assert arena.allocate(30, "big") is None
    failure = arena.failures[-1]
    assert failure.free_bytes == 50 and failure.largest_free == 25
    assert arena.mean_failure_free_fraction == pytest.approx(0.5)
    assert arena.allocate(30, "big", record=False) is None and len(arena.failures) == 1


@pytest.mark.parametrize(
    "action",
    [
        lambda a: a.allocate(0, "zero"),
        lambda a: a.free("missing"),
        lambda a: (a.allocate(1, "t"), a.allocate(1, "t")),
        lambda a: a.allocate(1, None),
    ],
)
def test_misuse_raises_a_coop_error(action) -> None:
    with pytest.raises(ArenaError):
        action(Arena(10))
    assert issubclass(ArenaError, CoopError)
    with pytest.raises(ArenaError):
        Arena(0)


def test_free_blocks_and_neighbours_walk_the_address_order() -> None:
    arena = Arena(100)
    for tag, size in (("a", 10), ("b", 20), ("c", 30)):
        arena.allocate(size, tag)
    arena.free("b")
    holes = list(arena.free_blocks())
    assert [(h.start, h.size) for h in holes] == [(10, 20), (60, 40)]
    assert arena.block_below(holes[0]).tag == "a" and arena.block_above(holes[0]).tag == "c"
    assert arena.block_below(arena.block_of("a")) is None and arena.block_above(holes[1]) is None


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 200), operations=_operations, placement=st.sampled_from(["best", "top", "best-top"]))
def test_every_placement_keeps_the_arena_tiled_and_takes_the_right_hole(size: int, operations: list,
                                                                        placement: str) -> None:
    arena = Arena(size)
    live: dict[int, int] = {}  # tag -> size
    for tag, (kind, amount, _) in enumerate(operations):
        if kind == "alloc":
            holes = list(arena.free_blocks())
            fitting = [h for h in holes if h.size >= amount]
            start = arena.allocate(amount, tag, placement=placement)
            assert (start is not None) == bool(fitting)
            if start is None:
                continue
            hole = next(h for h in holes if h.start <= start < h.end)
            best = min(fitting, key=lambda h: (h.size, h.start))
            if placement == "top":
                assert hole == fitting[-1] and start + amount == hole.end  # highest hole, carved from its top
            else:
                assert hole == best  # best fit: the smallest hole that fits, lowest on ties
                assert start == (hole.start if placement == "best" else hole.end - amount)
            live[tag] = amount
        elif live:
            victim = sorted(live)[amount % len(live)]
            assert arena.free(victim) == live.pop(victim)
        arena.check_invariants()


def test_best_top_carves_the_best_fit_hole_from_its_top() -> None:
    arena = Arena(100)
    for tag, amount in enumerate((10, 30, 10, 20, 30)):
        arena.allocate(amount, tag)
    arena.free(1)  # hole of 30 at [10, 40)
    arena.free(3)  # hole of 20 at [50, 70)
    assert arena.allocate(15, "x", placement="best-top") == 55  # the 20-byte hole, at its top
    assert arena.allocate(6, "y", placement="top") == 34  # "top": the highest hole that fits, [10, 40)
    with pytest.raises(ArenaError, match="unknown placement"):
        arena.allocate(5, "z", placement="middle")
