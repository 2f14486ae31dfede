"""Brute-force optimal schedules with paging on tiny graphs: POET's space, independent of coop's solvers.

Reads only the Graph's plain fields (through :func:`tests.bruteforce._tiny`, written from
contract 2 alone) and the prices it is given per node: it neither calls nor copies
``coop.schedule.simulate``, ``coop.formulations.poet.milp`` or the device profiles.

The space (what ``coop.formulations.poet.milp`` claims to optimise over): Checkmate's frontier-advancing
stages (``space="staged"`` of :mod:`tests.bruteforce`: stage t first-computes the t-th node of the
order, before it may recompute earlier nodes once each in order) plus paging between stages. At a
stage boundary (before a stage's first compute, and after the last stage) a resident value may be
paged out (it leaves the device; only device residency counts in memory) and a paged-out value may
be paged in (memory after the page-in must fit the budget). A value is on one tier at a time:
recomputing a paged-out value drops the host copy; an output must be on the device at the end.
Cost = sum of the compute prices of every compute + the page-in / page-out prices of every page.
Uniform-cost search over (device mask, computed mask, host mask, stage, last recomputed position).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping

from coop.graph import Graph
from tests.bruteforce import Found, _Tiny, _tiny

_State = tuple[int, int, int, int, int]  # device, computed, host, stage, last


def _moves(tiny: _Tiny, state: _State, compute: list[float], page_in: list[float],
           page_out: list[float]) -> Iterator[tuple[tuple[tuple[str, int], ...], float, int | None, _State]]:
    device, computed, host, stage, last = state
    for p in range(tiny.size):
        if device >> p & 1:
            yield (("free", tiny.ids[p]),), 0.0, None, (device & ~(1 << p), computed, host, stage, last)
    if last == -1:  # a stage boundary: page out, page in
        for p in range(tiny.size):
            if device >> p & 1:
                yield ((("page_out", tiny.ids[p]),), page_out[p], None,
                       (device & ~(1 << p), computed, host | 1 << p, stage, last))
            if host >> p & 1:
                after = device | 1 << p
                memory = tiny.owned_bytes + tiny.bytes_of(after)
                yield (("page_in", tiny.ids[p]),), page_in[p], memory, (after, computed, host & ~(1 << p), stage, last)
    resident_bytes = tiny.bytes_of(device)
    for p in range(tiny.size):
        if tiny.extra[p] or device >> p & 1 or tiny.needs[p] & ~device:
            continue
        first = not computed >> p & 1
        if first and p != stage:
            continue
        if not first and (not tiny.recomputable[p] or not (last < p < stage < tiny.size)):
            continue
        memory = tiny.owned_bytes + resident_bytes + tiny.mem[p] + tiny.workspace[p]
        made = 1 << p | (tiny.extras_of[p] if first else 0)
        extras = [q for q in range(tiny.size) if (made >> q & 1) and q != p]
        steps = (("compute", tiny.ids[p]),) + tuple(("compute", tiny.ids[q]) for q in extras)
        cost = compute[p] + sum(compute[q] for q in extras)
        next_stage, next_last = (p + 1 + len(extras), -1) if first else (stage, p)
        yield steps, cost, memory, (device | made, computed | made, host & ~made, next_stage, next_last)


def optimal_paging_schedule(graph: Graph, budget: int, compute: Mapping[int, float], page_in: Mapping[int, float],
                            page_out: Mapping[int, float]) -> Found | None:
    """The cheapest schedule of the staged space with paging between stages whose peak fits ``budget``.

    ``compute`` / ``page_in`` / ``page_out``: the price of one compute / page-in / page-out of each
    computed node (by node id). None when no schedule of the space fits.
    """
    tiny = _tiny(graph)
    prices = [[float(table[i]) for i in tiny.ids] for table in (compute, page_in, page_out)]
    if tiny.owned_bytes > budget:
        return None
    start: _State = (0, 0, 0, 0, -1)
    best: dict[_State, tuple[float, int]] = {start: (0.0, tiny.owned_bytes)}
    parents: dict[_State, tuple[_State, tuple[tuple[str, int], ...]] | None] = {start: None}
    counter = itertools.count()
    queue = [(0.0, tiny.owned_bytes, next(counter), start)]
    while queue:
        cost, peak, _, state = heapq.heappop(queue)
        if best[state] != (cost, peak):
            continue
        device, computed = state[0], state[1]
        if computed == tiny.everything and tiny.outputs & ~device == 0:
            return Found(cost, peak, _rebuild(parents, state))
        for steps, step_cost, memory, after in _moves(tiny, state, *prices):
            if memory is not None and memory > budget:
                continue
            key = (cost + step_cost, max(peak, memory or 0))
            if after not in best or key < best[after]:
                best[after] = key
                parents[after] = (state, steps)
                heapq.heappush(queue, (*key, next(counter), after))
    return None


def _rebuild(parents: dict, state: _State) -> tuple[tuple[str, int], ...]:
    chunks = []
    while parents[state] is not None:
        state, steps = parents[state]
        chunks.append(steps)
    return tuple(itertools.chain.from_iterable(reversed(chunks)))
