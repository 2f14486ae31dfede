"""An address-ordered arena of a fixed size: the memory model of the online eviction engine.

Real device allocators hand out contiguous address ranges, so the bytes freed by evicting
tensors scattered over the address space may be useless to the next allocation. Coop (Zhang et
al., NeurIPS 2023, "Coop: Memory is not a Commodity") measures that waste; this arena models it:

* the blocks tile ``[0, size)`` in address order; a block is free or holds one tagged value;
* ``allocate`` places a block by one of :data:`PLACEMENTS`: "best" is best fit (the smallest free
  block that fits, lowest address on ties, the block at its bottom); "top"
  carves from the top of the highest free block that fits; "best-top" takes the best-fit free
  block but carves from its top (Coop keeps its cheap and expensive tensors at opposite ends);
* ``free`` merges the freed block with free neighbours, so two free blocks are never adjacent;
* every failed allocation records Coop's fragmentation measure (free bytes / arena size) and the
  largest free block.

Operations are O(log n) searches plus list inserts (C memmove) through ``sortedcontainers``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

from sortedcontainers import SortedDict, SortedList

from coop.errors import CoopError

#: Where ``allocate`` puts a block (see the module docstring).
PLACEMENTS = ("best", "top", "best-top")


class ArenaError(CoopError):
    """A misuse of the arena (unknown tag, double allocation, bad size)."""


@dataclass(frozen=True, slots=True)
class Block:
    """A contiguous address range; ``tag`` is None when the block is free."""

    start: int
    size: int
    tag: Hashable | None = None

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def free(self) -> bool:
        return self.tag is None


@dataclass(frozen=True, slots=True)
class AllocationFailure:
    """What the arena looked like when an allocation of ``requested`` bytes did not fit."""

    requested: int
    free_bytes: int
    largest_free: int
    free_fraction: float


class Arena:
    """A fixed-size address space with best-fit allocation and merged free neighbours."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ArenaError(f"arena size {size} must be positive")
        self.size = size
        self._blocks: SortedDict = SortedDict()  # start -> Block, free and used, tiling [0, size)
        self._free_by_size: SortedList = SortedList()  # (size, start) of free blocks, for best fit
        self._free_starts: SortedList = SortedList()  # starts of free blocks, for from_end
        self._where: dict[Hashable, int] = {}  # tag -> start of its block
        self.used = 0
        self.peak_used = 0
        self.high_water = 0  # highest address ever occupied (end of the topmost used block)
        self.failures: list[AllocationFailure] = []
        self._add_free(0, size)

    # ---------------------------------------------------------------- allocation
    def allocate(self, size: int, tag: Hashable, placement: str = "best", *, record: bool = True) -> int | None:
        """The start address of a new block for ``tag``, or None when nothing fits.

        ``placement`` is one of :data:`PLACEMENTS`: the one hook that says where a block goes.
        A failure is recorded in :attr:`failures` unless ``record`` is False (the engine retries
        one request after each eviction and records only its first failure).
        """
        self._check_new(size, tag)
        if placement not in PLACEMENTS:
            raise ArenaError(f"unknown placement {placement!r}: use one of {', '.join(PLACEMENTS)}")
        found = self._highest_fit(size) if placement == "top" else self._best_fit(size)
        if found is None:
            if record:
                self._record_failure(size)
            return None
        free_start, free_size = found
        start = free_start if placement == "best" else free_start + free_size - size
        self._carve(free_start, free_size, start, size, tag)
        return start

    def allocate_at(self, start: int, size: int, tag: Hashable) -> bool:
        """Place ``tag`` at exactly ``start`` if that range is free (Coop's in-place recompute)."""
        self._check_new(size, tag)
        index = self._blocks.bisect_right(start) - 1
        if index < 0:
            return False
        block: Block = self._blocks.peekitem(index)[1]
        if not block.free or start + size > block.end:
            return False
        self._carve(block.start, block.size, start, size, tag)
        return True

    def free(self, tag: Hashable) -> int:
        """Release the block of ``tag``, merging it with free neighbours; returns its size."""
        start = self._where.pop(tag, None)
        if start is None:
            raise ArenaError(f"arena holds no block tagged {tag!r}")
        block: Block = self._blocks.pop(start)
        self.used -= block.size
        new_start, new_end = block.start, block.end
        before = self._block_before(new_start)
        if before is not None and before.free:
            self._remove_free(before)
            new_start = before.start
        after = self._blocks.get(new_end)
        if after is not None and after.free:
            self._remove_free(after)
            new_end = after.end
        self._add_free(new_start, new_end - new_start)
        return block.size

    def compact(self, first: Callable[[Hashable], bool] | None = None) -> int:
        """Pack every used block at the bottom, closing the gaps; the free bytes become one block at the top.
        Blocks whose tag ``first`` accepts go first, each group in address order. Returns the bytes moved (the
        sum of the sizes of the blocks that moved).

        The arena is a model of the device allocator, whose real addresses coop does not choose: compacting
        stands for the allocator's own freedom to serve a request from memory it releases and maps again
        (the dynamic fallback's last resort before it gives up, :class:`coop.online.online_sim.OnlineSimulator`).
        """
        used = [block for block in self._blocks.values() if not block.free]
        if first is not None:
            used.sort(key=lambda block: not first(block.tag))  # stable: address order within each group
        self._blocks.clear()
        self._free_by_size.clear()
        self._free_starts.clear()
        moved, position = 0, 0
        for block in used:
            moved += block.size if block.start != position else 0
            self._blocks[position] = Block(position, block.size, block.tag)
            self._where[block.tag] = position
            position += block.size
        if position < self.size:
            self._add_free(position, self.size - position)
        self.high_water = max(self.high_water, position)
        return moved

    # ---------------------------------------------------------------- queries
    def __contains__(self, tag: object) -> bool:
        return tag in self._where

    def address_of(self, tag: Hashable) -> int:
        try:
            return self._where[tag]
        except KeyError:
            raise ArenaError(f"arena holds no block tagged {tag!r}") from None

    def block_of(self, tag: Hashable) -> Block:
        return self._blocks[self.address_of(tag)]

    def blocks(self) -> Iterator[Block]:
        """All blocks, free and used, in address order (the two-pointer scan walks these)."""
        return iter(self._blocks.values())

    def free_blocks(self) -> Iterator[Block]:
        """The free blocks in address order."""
        return (self._blocks[start] for start in self._free_starts)

    def block_below(self, block: Block) -> Block | None:
        """The block that ends where ``block`` starts (None at address 0)."""
        return self._block_before(block.start)

    def block_above(self, block: Block) -> Block | None:
        """The block that starts where ``block`` ends (None at the top of the arena)."""
        return self._blocks.get(block.end)

    def wall_address(self, size: int, fixed: Callable[[Hashable], bool]) -> int | None:
        """Where a block that never leaves fragments the free space least (None: no hole fits).

        Such a block splits every free run it lands in, for good, so it goes against a wall (an arena
        end or another block whose tag is ``fixed``): the smallest hole walled on both sides, else the
        smallest hole with a wall on one side (placed against that wall), else the top of the highest
        hole that fits. O(free blocks).
        """

        def is_wall(block: Block | None) -> bool:
            return block is None or (not block.free and fixed(block.tag))

        best: tuple[int, int, int] | None = None  # (walls missing, hole size, address)
        highest: int | None = None
        for hole in self.free_blocks():
            if hole.size < size:
                continue
            highest = hole.end - size
            wall_below = is_wall(self.block_below(hole))
            wall_above = is_wall(self.block_above(hole))
            if not (wall_below or wall_above):
                continue
            candidate = (int(not (wall_below and wall_above)), hole.size, hole.end - size if wall_above else hole.start)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return best[2] if best is not None else highest

    def free_neighbour_bytes(self, tag: Hashable) -> int:
        """Free bytes directly below and above the block of ``tag`` (DTE's effective size)."""
        block = self.block_of(tag)
        total = 0
        before = self._block_before(block.start)
        if before is not None and before.free:
            total += before.size
        after = self._blocks.get(block.end)
        if after is not None and after.free:
            total += after.size
        return total

    @property
    def free_bytes(self) -> int:
        return self.size - self.used

    @property
    def largest_free(self) -> int:
        return self._free_by_size[-1][0] if self._free_by_size else 0

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def fits(self, size: int) -> bool:
        """Whether an allocation of ``size`` would succeed now (no failure is recorded)."""
        return size <= self.largest_free

    @property
    def mean_failure_free_fraction(self) -> float:
        """Coop's fragmentation figure: mean of free bytes / arena size over the failures."""
        if not self.failures:
            return 0.0
        return sum(f.free_fraction for f in self.failures) / len(self.failures)

    def check_invariants(self) -> None:
        """Raise AssertionError unless the blocks tile the arena and free neighbours are merged."""
        position = 0
        previous_free = False
        used = 0
        free_count = 0
        for start, block in self._blocks.items():
            assert start == block.start == position, f"gap or overlap at {position}"
            assert block.size > 0, f"empty block at {start}"
            assert not (block.free and previous_free), f"unmerged free neighbours at {start}"
            if block.free:
                free_count += 1
                assert (block.size, start) in self._free_by_size
            else:
                used += block.size
                assert self._where[block.tag] == start
            previous_free = block.free
            position = block.end
        assert position == self.size, "blocks do not cover the arena"
        assert used == self.used and len(self._where) + free_count == len(self._blocks)
        assert free_count == len(self._free_by_size) == len(self._free_starts)

    # ---------------------------------------------------------------- internals
    def _check_new(self, size: int, tag: Hashable) -> None:
        if size <= 0:
            raise ArenaError(f"allocation of {size} bytes for {tag!r}: sizes must be positive")
        if tag is None:
            raise ArenaError("a block tag cannot be None (None marks free blocks)")
        if tag in self._where:
            raise ArenaError(f"tag {tag!r} already holds a block; free it first")

    def _best_fit(self, size: int) -> tuple[int, int] | None:
        index = self._free_by_size.bisect_left((size, -1))
        if index == len(self._free_by_size):
            return None
        free_size, start = self._free_by_size[index]
        return start, free_size

    def _highest_fit(self, size: int) -> tuple[int, int] | None:
        # Walk free blocks from the top of the arena down; O(free blocks) worst case.
        for start in reversed(self._free_starts):
            block: Block = self._blocks[start]
            if block.size >= size:
                return start, block.size
        return None

    def _carve(self, free_start: int, free_size: int, start: int, size: int, tag: Hashable) -> None:
        self._remove_free(Block(free_start, free_size))
        if start > free_start:
            self._add_free(free_start, start - free_start)
        tail = free_start + free_size - (start + size)
        if tail > 0:
            self._add_free(start + size, tail)
        self._blocks[start] = Block(start, size, tag)
        self._where[tag] = start
        self.used += size
        self.peak_used = max(self.peak_used, self.used)
        self.high_water = max(self.high_water, start + size)

    def _block_before(self, start: int) -> Block | None:
        index = self._blocks.bisect_left(start) - 1
        return self._blocks.peekitem(index)[1] if index >= 0 else None

    def _add_free(self, start: int, size: int) -> None:
        self._blocks[start] = Block(start, size)
        self._free_by_size.add((size, start))
        self._free_starts.add(start)

    def _remove_free(self, block: Block) -> None:
        del self._blocks[block.start]
        self._free_by_size.remove((block.size, block.start))
        self._free_starts.remove(block.start)

    def _record_failure(self, size: int) -> None:
        free = self.free_bytes
        self.failures.append(AllocationFailure(size, free, self.largest_free, free / self.size))
