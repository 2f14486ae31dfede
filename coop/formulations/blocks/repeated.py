"""Repeated blocks in a training step's forward: the layers of a transformer, the bottlenecks of a ResNet stage.

A block group is a stretch of the forward, in the baseline order, made of ``count`` consecutive runs of
``period`` nodes that are the same up to renaming: at each offset the same op, output bytes, cost and
recomputability; the same number of inputs; and each input wired alike. An input inside the block is the
node at the same offset of the previous block; one from outside the block may be the same value for
every block (a rotary table, an attention mask) or the previous block's output (the residual stream), and
is only required to have the same bytes and to be computed or caller-owned alike (a caller-owned one of the
same kind: each layer's own weight). A plan built from a group (:mod:`coop.formulations.blocks.formulation`) is
judged by the one simulator, so the grouping needs to be right to be useful, not to be safe.

The search: each forward node gets a coarse signature (op, bytes, cost, input count, recomputability); for
every period the longest run of positions whose signature equals the one a period later is found (numpy),
the period covering most nodes wins (the shortest among equals, so that a multiple of the true period never
does), the wiring is verified block by block (a block that differs ends the group), and the search repeats
on what is left before and after the group, so that ResNet's stages, whose blocks differ in shape, come out
as groups of their own.

References
----------
Zhao et al., "Rockmate: an Efficient, Fast, Automatic and Generic Tool for Re-materialization in PyTorch",
ICML 2023, and its successor HiRemate (ICML 2025): plan a sequence of blocks from per-block options.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coop.graph import Graph

#: Fewer nodes than this per block are not worth a group (a period of 1 or 2 is a chain of like ops).
MIN_PERIOD = 3


@dataclass(frozen=True)
class BlockGroup:
    """``count`` blocks of ``period`` forward nodes each, the same up to renaming.

    ``blocks[b][offset]`` is the node id at ``offset`` of block ``b`` (blocks in forward order).
    """

    period: int
    blocks: tuple[tuple[int, ...], ...]

    @property
    def count(self) -> int:
        """How many blocks the group has."""
        return len(self.blocks)

    @property
    def nodes(self) -> frozenset[int]:
        """Every node of every block of the group."""
        return frozenset(v for block in self.blocks for v in block)


def find_block_groups(graph: Graph, forward: tuple[int, ...]) -> list[BlockGroup]:
    """The groups of repeated blocks in ``forward``, in forward order (see the module docstring).

    Parameters
    ----------
    graph : Graph
        The graph whose forward is searched.
    forward : tuple of int
        Its forward nodes in the baseline order (:func:`coop.formulations.heuristics.baselines.split_forward_backward`).

    Returns
    -------
    list of BlockGroup
        Disjoint groups of at least two blocks of at least :data:`MIN_PERIOD` nodes; empty when none.
    """
    signature_ids: dict[tuple, int] = {}
    signatures = np.array([signature_ids.setdefault(_signature(graph, v), len(signature_ids)) for v in forward],
                          dtype=np.int64)
    position = {v: i for i, v in enumerate(forward)}
    groups: list[BlockGroup] = []
    _search(graph, forward, position, signatures, 0, len(forward), groups)
    return sorted(groups, key=lambda g: position[g.blocks[0][0]])


def _signature(graph: Graph, node_id: int) -> tuple:
    node = graph.node(node_id)
    return (node.op, node.mem, round(node.cost, 15), len(node.inputs), node.recomputable, node.random)


def _search(graph: Graph, forward: tuple[int, ...], position: dict[int, int], signatures: np.ndarray, lo: int,
            hi: int, groups: list[BlockGroup]) -> None:
    """Find the best group in ``forward[lo:hi]``, then search what is left on either side of it."""
    found = _best_period(signatures[lo:hi])
    if found is None:
        return
    run_start, period, span = found
    run_start += lo
    start, count = run_start, 0
    for rotation in range(period):  # the stretch may begin mid-block (a prefix op alike a block's last op)
        fits = (span - rotation) // period
        if fits <= count:
            break
        verified = _verified_count(graph, forward, position, run_start + rotation, period, fits)
        if verified > count:
            start, count = run_start + rotation, verified
    if count < 2:  # the wiring differs at every alignment: search either side of the stretch's first block
        _search(graph, forward, position, signatures, lo, run_start, groups)
        _search(graph, forward, position, signatures, run_start + period, hi, groups)
        return
    end = start + period * count
    groups.append(BlockGroup(period, tuple(tuple(forward[start + b * period:start + (b + 1) * period])
                                           for b in range(count))))
    _search(graph, forward, position, signatures, lo, start, groups)
    _search(graph, forward, position, signatures, end, hi, groups)


def _best_period(signatures: np.ndarray) -> tuple[int, int, int] | None:
    """(start, period, span) of the repeated stretch covering most positions in whole blocks, or None: the
    ``span`` positions from ``start`` on repeat with ``period``."""
    n = len(signatures)
    best: tuple[int, int, int, int] | None = None  # (covered, start, period, count)
    for period in range(MIN_PERIOD, n // 2 + 1):
        same = signatures[:-period] == signatures[period:]
        if not same.any():
            continue
        padded = np.concatenate(([0], same.astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(padded))
        starts, ends = edges[::2], edges[1::2]
        longest = int(np.argmax(ends - starts))
        run = int(ends[longest] - starts[longest])
        count = (run + period) // period
        if count < 2:
            continue
        covered = count * period
        if best is None or covered > best[0]:
            best = (covered, int(starts[longest]), period, run + period)
    return None if best is None else best[1:]


def _verified_count(graph: Graph, forward: tuple[int, ...], position: dict[int, int], start: int, period: int,
                    count: int) -> int:
    """How many blocks from ``start`` on are wired alike (the first block always counts)."""
    for b in range(1, count):
        here_start, before_start = start + b * period, start + (b - 1) * period
        for offset in range(period):
            here = graph.node(forward[here_start + offset])
            before = graph.node(forward[before_start + offset])
            if not all(_wired_alike(graph, position, here_start, before_start, period, mine, theirs)
                       for mine, theirs in zip(here.inputs, before.inputs, strict=True)):
                return b
    return count


def _wired_alike(graph: Graph, position: dict[int, int], here_start: int, before_start: int, period: int,
                 mine: int, theirs: int) -> bool:
    """Whether input ``mine`` of a block plays the part ``theirs`` plays in the previous block: the node at the same
    offset of its own block, or, from outside the block, a value of the same bytes and kind (the carried residual
    stream, a shared table, a layer's own weight)."""
    mine_offset = position[mine] - here_start if mine in position else -1
    theirs_offset = position[theirs] - before_start if theirs in position else -1
    mine_inside, theirs_inside = 0 <= mine_offset < period, 0 <= theirs_offset < period
    if mine_inside or theirs_inside:
        return mine_inside and theirs_inside and mine_offset == theirs_offset
    a, b = graph.node(mine), graph.node(theirs)
    return a.caller_owned == b.caller_owned and a.mem == b.mem and (not a.caller_owned or a.kind == b.kind)


__all__ = ["MIN_PERIOD", "BlockGroup", "find_block_groups"]
