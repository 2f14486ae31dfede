"""Run the compiled kernels in coop's order: a recomputation runs where the schedule put it, not where inductor would.

Inductor's scheduler does not keep the order of the graph it is given. What moved coop's recomputations, measured
on the tied MLP of ``tests/test_compile_observed.py`` at 0.5 (one schedule compiled with inductor's settings
toggled; 2,770,184 B held for a 2,258,436 B plan) is its **fusion**: ``Scheduler.fuse_nodes`` places a fused kernel
where its earliest member was, so fusing a consumer coop ranked late (a recomputed layer norm's ``mul`` read by a
matmul at rank 30) into a producer coop ranked early (the recomputed ``tanh`` at rank 16) writes the consumer's
value 14 ranks early, and it lives until its reader. Turning ``reorder_for_peak_memory`` off, or sorting the fused
kernels by coop's rank, changed nothing there; refusing those fusions (:class:`KeepFusionInOrder`) brought the step
to 2,262,536 B. ``reorder_for_peak_memory`` (three topological orders and the given one, the one its own estimate
peaks lowest kept) stays on: on one GPT-2 schedule turning it off held more (ARCHITECTURE.md, order.py's entry), and
on BERT at 0.5 round 0 held 18,027,696 B with it off against 17,503,408 B unpinned. The kernels are sorted by coop's
rank after fusion, so the order it is given (and keeps where its estimate is not beaten) is coop's.

:class:`PinScheduleOrder` is a ``CustomSchedulerPass`` for ``torch._inductor.config._post_fusion_custom_pass``
(inductor calls it with the fused kernels): it returns them in coop's order. A kernel's rank is the largest
:data:`coop.compiled.order.ORDER` rank among the fx nodes it was lowered from (the emitter ranks every computation
it writes, in schedule order; a fused kernel cannot run before its last member's inputs, which is where coop's
schedule had that member); a kernel lowered from nothing ranked (a copy inductor added) takes the rank of its first
reader, so it runs right before it. The kernels are then sorted topologically on their dependencies (inductor's
``unmet_dependencies``, which include its ordering-only ``WeakDep`` s), the ready kernel of lowest rank first, so
no dependency is broken and no value changes: the same kernels run on the same inputs, only in another order.
A kernel whose rank had to give way to a dependency (a kernel ranked lower
that reads a later-ranked one: inductor fused across coop's order) is counted in :attr:`PinScheduleOrder.displaced`,
so no pin is lost silently. ``inner`` (coop's :class:`~coop.compiled.inductor_buffers.BufferObserver`) is called
with the pinned order, so what it observes is the order the generated code runs.
"""

from __future__ import annotations

import heapq
import math
from contextlib import AbstractContextManager
from typing import Any

from torch._inductor.custom_graph_pass import CustomSchedulerPass
from torch._inductor.virtualized import V

from coop.compiled.inductor_buffers import buffer_nbytes
from coop.compiled.order import ORDER

__all__ = ["MOVABLE_BYTES", "KeepFusionInOrder", "PinScheduleOrder", "kernel_ranks", "pinned_order"]

#: a fusion across a gap in coop's order may move at most this many output bytes of its later kernel early (a
#: layer norm's or a bias gradient's reduction into a vector); more, and it is refused
MOVABLE_BYTES = 4096


class PinScheduleOrder(CustomSchedulerPass):
    """Orders the fused kernels by coop's schedule (module docstring), then hands them to ``inner``."""

    def __init__(self, inner: CustomSchedulerPass | None = None, guard: KeepFusionInOrder | None = None) -> None:
        self.inner = inner
        #: the pre-fusion pass whose fusion veto this pass lifts once fusion is done
        self.guard = guard
        #: per compiled graph: how many kernels were ranked, and how many ran after a later-ranked kernel
        self.ranked: list[int] = []
        self.displaced: list[int] = []

    def __call__(self, nodes: list[Any]) -> list[Any]:
        if self.guard is not None:
            self.guard.lift()
        ranks = kernel_ranks(nodes)
        order, displaced = pinned_order(nodes, ranks)
        self.ranked.append(sum(1 for node in nodes if math.isfinite(ranks[node])))
        self.displaced.append(displaced)
        return self.inner(order) if self.inner is not None else order

    def describe(self) -> str:
        """One line for ``CompiledRecord.summary``: per compiled graph, the kernels ranked, those a dependency put
        after a later-ranked kernel (not where coop's schedule put them) and the fusions refused."""
        refused = [len(r) for r in self.guard.refused] if self.guard is not None else None
        return (f"pinned to coop's order: ranked kernels {self.ranked}, displaced by a dependency "
                f"{self.displaced}, fusions refused {refused if refused is not None else 'not guarded'}")

    def uuid(self) -> str:
        """Inductor's cache key: this pass's behaviour and the inner pass's key."""
        inner = self.inner.uuid() if self.inner is not None else None
        return f"coop-pin-schedule-order-1-{inner}"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled into inductor's cache keys: the inner pass, not what was counted."""
        return {"inner": self.inner, "guard": self.guard, "ranked": [], "displaced": []}


def _rank_set(node: Any) -> set[int]:
    """The coop ranks of the fx nodes a scheduler node (fused or not) was lowered from."""
    found: set[int] = set()
    for member in node.get_nodes():
        for origin in getattr(getattr(member, "node", None), "origins", None) or ():
            rank = (origin.meta.get("custom") or {}).get(ORDER)
            if rank is not None:
                found.add(int(rank))
    return found


class KeepFusionInOrder(CustomSchedulerPass):
    """A ``_pre_fusion_custom_pass``: while inductor fuses this graph, refuses a fusion across a gap in coop's order.

    Inductor places a fused kernel where its earliest member was. Fusing a consumer coop ranked late (``mul_1`` of
    a recomputed layer norm, read by a matmul much later) into a producer coop ranked early (the recomputed
    ``tanh`` it reads) computes the consumer's value early, and it lives until its reader: measured on the tied MLP
    at 0.5, the generated backward wrote a recomputed layer norm's output 14 ranks before the matmul that reads it.
    The pass records which scheduler node holds each rank and installs a choices handler (inductor's
    ``V.choices``, the hook for its fusion heuristics) that answers ``can_fuse`` False when some kernel outside the
    two nodes has a rank between their lowest and highest and the later node (the one whose lowest rank is higher)
    writes more than :data:`MOVABLE_BYTES`; everything else is asked of the handler that was in place.
    :class:`PinScheduleOrder` (the post-fusion pass) puts that handler back (if inductor's fusion raises before it,
    the next graph's pre-fusion pass does). Refused fusions are counted in :attr:`refused`. A refused fusion
    changes no value: the two kernels run apart, the later one reading the earlier one's buffer.
    """

    def __init__(self) -> None:
        #: per compiled graph: the pairs of scheduler nodes whose fusion was refused (inductor asks again for a pair
        #: in each of its fusion rounds; counted once)
        self.refused: list[set[tuple[str, str]]] = []
        self._owners: dict[int, set[str]] = {}
        self._restore: AbstractContextManager[None] | None = None

    def __call__(self, nodes: list[Any]) -> list[Any]:
        self.lift()
        self._owners = {}
        for node in nodes:
            for rank in _rank_set(node):
                self._owners.setdefault(rank, set()).add(node.get_name())
        self.refused.append(set())
        self._restore = V.set_choices_handler(_InOrderChoices(V.choices, self))
        return nodes

    def lift(self) -> None:
        """Put back the choices handler that was in place before this graph's fusion."""
        if self._restore is not None:
            restore, self._restore = self._restore, None
            with restore:
                pass

    def refuses(self, node1: Any, node2: Any) -> bool:
        """Whether fusing ``node1`` and ``node2`` would move a sizable output across another kernel's rank."""
        ranks1, ranks2 = _rank_set(node1), _rank_set(node2)
        if not ranks1 or not ranks2:
            return False
        members = {m.get_name() for n in (node1, node2) for m in n.get_nodes()} | {node1.get_name(),
                                                                                     node2.get_name()}
        low, high = min(ranks1 | ranks2), max(ranks1 | ranks2)
        gap = any(not owners <= members for rank, owners in self._owners.items() if low < rank < high
                  and rank not in ranks1 and rank not in ranks2)
        if not gap:
            return False
        later = node2 if min(ranks2) > min(ranks1) else node1
        moved = sum(buffer_nbytes(buffer.node) for buffer in later.get_outputs())
        if moved <= MOVABLE_BYTES:
            return False
        self.refused[-1].add((node1.get_name(), node2.get_name()))
        return True

    def uuid(self) -> str:
        """Inductor's cache key: the pass's behaviour."""
        return f"coop-keep-fusion-in-order-1-{MOVABLE_BYTES}"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled into inductor's cache keys: nothing of the graph being fused."""
        return {"refused": [], "_owners": {}, "_restore": None}


class _InOrderChoices:
    """Inductor's choices handler with :meth:`KeepFusionInOrder.refuses` in front of ``can_fuse``."""

    def __init__(self, prior: Any, guard: KeepFusionInOrder) -> None:
        self._prior = prior
        self._guard = guard

    def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        """False for a fusion across coop's order; else the prior handler's answer."""
        if self._guard.refuses(node1, node2):
            return False
        return self._prior.can_fuse(scheduler, node1, node2, shared_data_score)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prior, name)


def _own_rank(node: Any) -> float:
    """The largest coop rank among the fx nodes a scheduler node (fused or not) was lowered from; -1 if none."""
    best = -1.0
    for member in node.get_nodes():
        ir_node = getattr(member, "node", None)
        for origin in getattr(ir_node, "origins", None) or ():
            rank = (origin.meta.get("custom") or {}).get(ORDER)
            if rank is not None:
                best = max(best, float(rank))
    return best


def _producers(nodes: list[Any]) -> dict[Any, list[Any]]:
    """Each scheduler node's producers among ``nodes`` (from its unmet dependencies, weak ones included)."""
    owner = {name: node for node in nodes for name in node.get_buffer_names()}
    producers: dict[Any, list[Any]] = {}
    for node in nodes:
        found = []
        for dep in node.unmet_dependencies:
            producer = owner.get(dep.name)
            if producer is not None and producer is not node and producer not in found:
                found.append(producer)
        producers[node] = found
    return producers


def kernel_ranks(nodes: list[Any]) -> dict[Any, float]:
    """Each kernel's rank in coop's order: its own (largest member rank), else its earliest reader's, else
    infinity (read by nothing ranked: runs last)."""
    producers = _producers(nodes)
    readers: dict[Any, list[Any]] = {node: [] for node in nodes}
    for node, found in producers.items():
        for producer in found:
            readers[producer].append(node)
    ranks: dict[Any, float] = {}
    for node in reversed(nodes):  # inductor's order is topological: readers come later, so are ranked first
        own = _own_rank(node)
        if own >= 0:
            ranks[node] = own
        else:
            ranks[node] = min((ranks.get(r, math.inf) for r in readers[node]), default=math.inf)
    return ranks


def pinned_order(nodes: list[Any], ranks: dict[Any, float]) -> tuple[list[Any], int]:
    """``nodes`` sorted topologically, the ready node of lowest (rank, inductor's position) first, and how many
    ran after a node of higher rank (a dependency overrode coop's order)."""
    producers = _producers(nodes)
    position = {node: index for index, node in enumerate(nodes)}
    waiting = {node: len(found) for node, found in producers.items()}
    readers: dict[Any, list[Any]] = {node: [] for node in nodes}
    for node, found in producers.items():
        for producer in found:
            readers[producer].append(node)
    ready = [(ranks[n], position[n]) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order: list[Any] = []
    displaced = 0
    highest = -math.inf
    while ready:
        rank, index = heapq.heappop(ready)
        node = nodes[index]
        if rank < highest:
            displaced += 1
        highest = max(highest, rank) if math.isfinite(rank) else highest
        order.append(node)
        for reader in readers[node]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (ranks[reader], position[reader]))
    if len(order) != len(nodes):  # a cycle cannot come from inductor; keep its order rather than drop kernels
        raise RuntimeError("coop.compiled.pin: the scheduler's dependencies have a cycle")
    return order, displaced
