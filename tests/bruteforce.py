"""Brute-force optimal rematerialization schedules for tiny graphs: an oracle independent of coop.

Everything here is written from contract 2 (coop.schedule's docstring) alone; it neither calls nor copies
``coop.schedule.simulate``, the formulations or ``coop.budget``. Only the Graph's plain fields are
read (``nodes``, ``order``, ``outputs`` and each node's ``kind``, ``inputs``, ``mem``, ``cost``,
``workspace``, ``recomputable``, ``output_of``).

Memory semantics (contract 2), as the search models them:

* caller-owned values (kind input, param, buffer) are resident at every step and never freed;
* a schedule is a sequence of ``compute v`` and ``free v``; a compute needs every input resident
  and makes v resident; memory at a compute = caller-owned + resident values + v's output +
  v's workspace; the peak is the largest such memory (a free never raises memory);
* a value with no explicit free dies right after its last use; the search instead offers every
  explicit free at every point, which covers free-at-last-use (freeing earlier than the last use
  is illegal, later never helps), so searching compute/free sequences finds the true optimum;
* every computed node is computed at least once, every ``outputs`` value is resident at the end,
  a node with ``recomputable`` false is computed exactly once;
* an extra output e of a multi-output op p (``output_of``) comes into existence with p's first
  compute (p's workspace covers it while p runs) and is never recomputed: the search takes it as
  part of p's first compute, and a recomputation of p does not bring it back.

Three schedule spaces (``space``), nested, so their optima never decrease in this order:

* ``"all"``: every legal schedule; the true optimum.
* ``"in_order"``: first computations follow the baseline order (``graph.order``, extra outputs
  taken with their op). Moccasin's "optimal" speaks about this space on training-step graphs
  (``keep_order``).
* ``"staged"``: Checkmate's frontier-advancing stages (Jain et al. 2020, section 4): stage t
  first-computes the t-th node of the order and before it may recompute earlier nodes, each at
  most once and in increasing order position; nodes with ``recomputable`` false only in their
  own stage; nothing is computed after the last stage (so an output freed earlier cannot be
  rebuilt at the end, which ``"in_order"`` allows). Checkmate's MILP optimizes over exactly
  this space.

Search: uniform-cost (Dijkstra) over states (resident set, computed set, stage, last position
recomputed in the stage), as bitmasks. :func:`optimal_schedule` minimises the total compute cost
among schedules whose peak fits a budget; :func:`least_peak_schedule` minimises the peak
(a bottleneck shortest path). Tiny graphs only: states grow as 3^n.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from coop.graph import Graph

Space = Literal["all", "in_order", "staged"]
SPACES: tuple[Space, ...] = ("all", "in_order", "staged")

#: The kinds whose values the caller owns (contract 2): resident at every step, never computed.
OWNED_KINDS = frozenset({"input", "param", "buffer"})

#: Refuse graphs with more computed nodes than this: the state space is exponential.
MAX_COMPUTED_NODES = 14

#: One step of a found schedule: ("compute" | "free", node id).
Step = tuple[str, int]


@dataclass(frozen=True)
class Found:
    """A schedule the search found, with its peak and its total compute cost (hand-summed)."""

    cost: float
    peak: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class _Tiny:
    """The computed nodes by position (baseline order, extra outputs right after their op)."""

    ids: tuple[int, ...]
    mem: tuple[int, ...]
    workspace: tuple[int, ...]
    cost: tuple[float, ...]
    needs: tuple[int, ...]        # bitmask of computed inputs of each position
    recomputable: tuple[bool, ...]
    extra: tuple[bool, ...]       # an extra output of a multi-output op
    extras_of: tuple[int, ...]    # bitmask of the extra outputs each op produces
    outputs: int                  # bitmask of computed graph outputs
    owned_bytes: int

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def everything(self) -> int:
        return (1 << self.size) - 1

    def bytes_of(self, mask: int) -> int:
        return sum(self.mem[p] for p in range(self.size) if mask >> p & 1)


def _tiny(graph: Graph) -> _Tiny:
    """Project the graph onto positions; caller-owned inputs drop out (they are always resident)."""
    nodes = {n.id: n for n in graph.nodes}
    if any(n.impls for n in graph.nodes):
        raise ValueError("the brute force does not model implementations (impls); draw graphs without them")
    extras: dict[int, list[int]] = {}
    for node in graph.nodes:
        if node.output_of is not None:
            extras.setdefault(node.output_of, []).append(node.id)
    order: list[int] = []
    for node_id in graph.order:
        if nodes[node_id].output_of is None:
            order.append(node_id)
            order.extend(extras.get(node_id, ()))
    computed = [n.id for n in graph.nodes if n.kind not in OWNED_KINDS]
    if sorted(order) != sorted(computed):
        raise ValueError("graph.order does not list every computed node once")
    if len(order) > MAX_COMPUTED_NODES:
        raise ValueError(f"{len(order)} computed nodes: the brute force is for at most {MAX_COMPUTED_NODES}")
    position = {node_id: p for p, node_id in enumerate(order)}

    def mask(ids: list[int] | tuple[int, ...]) -> int:
        return sum(1 << position[i] for i in set(ids) if i in position)

    return _Tiny(
        ids=tuple(order),
        mem=tuple(nodes[i].mem for i in order),
        workspace=tuple(nodes[i].workspace for i in order),
        cost=tuple(float(nodes[i].cost) for i in order),
        needs=tuple(mask(nodes[i].inputs) for i in order),
        recomputable=tuple(nodes[i].recomputable and nodes[i].output_of is None for i in order),
        extra=tuple(nodes[i].output_of is not None for i in order),
        extras_of=tuple(mask(extras.get(i, [])) for i in order),
        outputs=mask(graph.outputs),
        owned_bytes=sum(n.mem for n in graph.nodes if n.kind in OWNED_KINDS),
    )


# A search state: (resident mask, computed mask, stage = next position to first-compute for the
# ordered spaces, last position recomputed in the current stage, for the staged space).
_State = tuple[int, int, int, int]


@dataclass(frozen=True)
class _Move:
    """One transition: the steps it emits, its cost, the memory at its compute, the next state."""

    steps: tuple[Step, ...]
    cost: float
    memory: int | None  # None for a free
    state: _State


def _moves(tiny: _Tiny, state: _State, space: Space) -> Iterator[_Move]:
    resident, computed, stage, last = state
    for p in range(tiny.size):
        if resident >> p & 1:
            yield _Move((("free", tiny.ids[p]),), 0.0, None, (resident & ~(1 << p), computed, stage, last))
    resident_bytes = tiny.bytes_of(resident)
    for p in range(tiny.size):
        if tiny.extra[p] or resident >> p & 1 or tiny.needs[p] & ~resident:
            continue
        first = not computed >> p & 1
        if not first and not tiny.recomputable[p]:
            continue
        if first and space != "all" and p != stage:
            continue  # first computations follow the baseline order
        if not first and space == "staged" and not (last < p < stage < tiny.size):
            continue  # a stage recomputes earlier nodes once each, in order, before its own node
        memory = tiny.owned_bytes + resident_bytes + tiny.mem[p] + tiny.workspace[p]
        made = 1 << p | (tiny.extras_of[p] if first else 0)
        extras = [q for q in range(tiny.size) if (made >> q & 1) and q != p]
        steps = (("compute", tiny.ids[p]),) + tuple(("compute", tiny.ids[q]) for q in extras)
        cost = tiny.cost[p] + sum(tiny.cost[q] for q in extras)
        next_stage, next_last = stage, last
        if space != "all":  # the unordered space keeps (0, -1): fewer, merged states
            next_stage, next_last = (p + 1 + len(extras), -1) if first else (stage, p)
        yield _Move(steps, cost, memory, (resident | made, computed | made, next_stage, next_last))


def _start_and_goal(tiny: _Tiny) -> tuple[_State, int]:
    return (0, 0, 0, -1), tiny.everything


def _is_goal(tiny: _Tiny, state: _State) -> bool:
    resident, computed, _, _ = state
    return computed == tiny.everything and tiny.outputs & ~resident == 0


def _rebuild(parents: dict[_State, tuple[_State, tuple[Step, ...]] | None], state: _State) -> tuple[Step, ...]:
    chunks: list[tuple[Step, ...]] = []
    while parents[state] is not None:
        state, steps = parents[state]  # type: ignore[misc]
        chunks.append(steps)
    return tuple(itertools.chain.from_iterable(reversed(chunks)))


def optimal_schedule(graph: Graph, budget: int, space: Space = "all") -> Found | None:
    """The cheapest schedule of ``space`` whose peak is at most ``budget``; None if none fits."""
    tiny = _tiny(graph)
    start, _ = _start_and_goal(tiny)
    if tiny.owned_bytes > budget:
        return None
    # Dijkstra on cost; ties broken by the smaller peak so that the result is deterministic.
    best: dict[_State, tuple[float, int]] = {start: (0.0, tiny.owned_bytes)}
    parents: dict[_State, tuple[_State, tuple[Step, ...]] | None] = {start: None}
    counter = itertools.count()
    queue = [(0.0, tiny.owned_bytes, next(counter), start)]
    while queue:
        cost, peak, _, state = heapq.heappop(queue)
        if best[state] != (cost, peak):
            continue
        if _is_goal(tiny, state):
            return Found(cost, peak, _rebuild(parents, state))
        for move in _moves(tiny, state, space):
            if move.memory is not None and move.memory > budget:
                continue
            key = (cost + move.cost, max(peak, move.memory or 0))
            if move.state not in best or key < best[move.state]:
                best[move.state] = key
                parents[move.state] = (state, move.steps)
                heapq.heappush(queue, (*key, next(counter), move.state))
    return None


def least_peak_schedule(graph: Graph, space: Space = "all") -> Found:
    """A schedule of ``space`` with the smallest peak (every tiny graph has one: store-all)."""
    tiny = _tiny(graph)
    start, _ = _start_and_goal(tiny)
    best: dict[_State, tuple[int, float]] = {start: (tiny.owned_bytes, 0.0)}
    parents: dict[_State, tuple[_State, tuple[Step, ...]] | None] = {start: None}
    counter = itertools.count()
    queue = [(tiny.owned_bytes, 0.0, next(counter), start)]
    while queue:
        peak, cost, _, state = heapq.heappop(queue)
        if best[state] != (peak, cost):
            continue
        if _is_goal(tiny, state):
            return Found(cost, peak, _rebuild(parents, state))
        for move in _moves(tiny, state, space):
            key = (max(peak, move.memory or 0), cost + move.cost)
            if move.state not in best or key < best[move.state]:
                best[move.state] = key
                parents[move.state] = (state, move.steps)
                heapq.heappush(queue, (*key, next(counter), move.state))
    raise AssertionError("no legal schedule at all: the graph is not a DAG of the expected shape")


def least_peak(graph: Graph, space: Space = "all") -> int:
    """The least feasible budget of ``space``: no schedule of it peaks lower."""
    return least_peak_schedule(graph, space).peak


def optimal_cost(graph: Graph, budget: int, space: Space = "all") -> float | None:
    """The least total compute cost of a schedule of ``space`` within ``budget`` (None: none fits)."""
    found = optimal_schedule(graph, budget, space)
    return None if found is None else found.cost


def store_all_peak(graph: Graph) -> int:
    """The peak of ``graph.order`` with no recomputation and every value freed after its last use.

    An independent recount of the baseline peak (contract 1) by live intervals: a value lives from
    its compute to its last reader (to the end for an output); an extra output lives from right
    after its op's step (the op's workspace covers it during the op's own step).
    """
    nodes = {n.id: n for n in graph.nodes}
    position = {node_id: k for k, node_id in enumerate(graph.order)}
    steps = len(graph.order)
    last = {node_id: k for node_id, k in position.items()}
    for node_id, k in position.items():
        node = nodes[node_id]
        if node.output_of is not None:
            continue  # taking an extra output does not read its op
        for source in node.inputs:
            if source in last:
                last[source] = max(last[source], k)
    for output in graph.outputs:
        if output in last:
            last[output] = steps - 1
    memory = [0] * steps
    for node_id, k in position.items():
        node = nodes[node_id]
        begin = k if node.output_of is None else position[node.output_of] + 1
        for j in range(begin, max(k, last[node_id]) + 1):
            memory[j] += node.mem
        memory[k] += node.workspace
    owned = sum(n.mem for n in graph.nodes if n.kind in OWNED_KINDS)
    return owned + max(memory, default=0)


# -------------------------------------------------------------------- implementations (MONeT)
# A second search, for graphs with implementations (``Node.impls``), optional values and in-place
# execution. It is written from contract 2 as coop.schedule's docstring states it,
# not from the simulator or the monet formulation:
#
# * a compute names one implementation: the node's own fields or one of ``impls``; it costs that
#   implementation's cost, needs every value that implementation reads (``Impl.inputs`` when given,
#   else the node's inputs) resident, and memory at the step = caller-owned + resident values +
#   its output + its workspace;
# * in place (``Impl.inplace_of = u``): u's resident copy is consumed; memory at the step =
#   caller-owned + resident values (u's bytes, now the new value's) + workspace; afterwards the new
#   value holds u's bytes and u is not resident;
# * optional values need not be computed; every other computed node is, at least once.
#
# Spaces: "all" (every legal schedule) and "staged" (Checkmate's stages over the positions of
# :func:`impl_positions`: stage t first computes position t -- an optional value may be skipped
# instead -- after recomputing earlier recomputable positions, each at most once, in increasing
# position).

#: One step of a found schedule: ("compute" | "free", node id, implementation name or None).
ImplStep = tuple[str, int, str | None]


@dataclass(frozen=True)
class FoundImpl:
    """A schedule with implementations, its peak and its total cost (hand-summed)."""

    cost: float
    peak: int
    steps: tuple[ImplStep, ...]


@dataclass(frozen=True)
class _Option:
    name: str | None
    cost: float
    mem: int
    workspace: int
    needs: int        # bitmask of the positions it reads
    inplace: int      # position it overwrites, -1 for none


@dataclass(frozen=True)
class _ImplTiny:
    ids: tuple[int, ...]
    options: tuple[tuple[_Option, ...], ...]
    recomputable: tuple[bool, ...]
    optional: tuple[bool, ...]
    extra: tuple[bool, ...]
    extras_of: tuple[int, ...]
    mem: tuple[int, ...]          # an extra output's bytes
    outputs: int
    mandatory: int
    owned_bytes: int


def impl_positions(graph: Graph) -> list[int]:
    """``graph.order`` with extra outputs right after their op, and each optional value placed
    before the first node (not an extra output) that comes once all its computed inputs are placed."""
    nodes = {n.id: n for n in graph.nodes}
    extras: dict[int, list[int]] = {}
    for node in graph.nodes:
        if node.output_of is not None:
            extras.setdefault(node.output_of, []).append(node.id)
    owned = {n.id for n in graph.nodes if n.kind in OWNED_KINDS}
    waiting = [n.id for n in graph.nodes if n.optional]
    result: list[int] = []

    def place_ready() -> None:
        again = True
        while again:
            again = False
            for value in list(waiting):
                if all(i in owned or i in result for i in nodes[value].inputs):
                    result.append(value)
                    waiting.remove(value)
                    again = True

    for node_id in graph.order:
        if nodes[node_id].output_of is None:
            place_ready()
            result.append(node_id)
            result.extend(extras.get(node_id, ()))
    place_ready()
    return result + waiting


def _impl_tiny(graph: Graph, exact: bool) -> _ImplTiny:
    nodes = {n.id: n for n in graph.nodes}
    order = impl_positions(graph)
    if len(order) > MAX_COMPUTED_NODES:
        raise ValueError(f"{len(order)} positions: the brute force is for at most {MAX_COMPUTED_NODES}")
    position = {node_id: p for p, node_id in enumerate(order)}

    def mask(ids: tuple[int, ...] | list[int]) -> int:
        return sum(1 << position[i] for i in set(ids) if i in position)

    options = []
    for node_id in order:
        node = nodes[node_id]
        reads = () if node.output_of is not None else node.inputs
        row = [_Option(None, float(node.cost), node.mem, node.workspace, mask(reads), -1)]
        for impl in node.impls:
            if exact and not impl.exact:
                continue
            row.append(_Option(impl.name, float(impl.cost), impl.mem, impl.workspace,
                               mask(node.inputs if impl.inputs is None else impl.inputs),
                               -1 if impl.inplace_of is None else position[impl.inplace_of]))
        options.append(tuple(row))
    extras: dict[int, list[int]] = {}
    for node in graph.nodes:
        if node.output_of is not None:
            extras.setdefault(node.output_of, []).append(node.id)
    return _ImplTiny(
        ids=tuple(order), options=tuple(options),
        recomputable=tuple(nodes[i].recomputable and nodes[i].output_of is None for i in order),
        optional=tuple(nodes[i].optional for i in order),
        extra=tuple(nodes[i].output_of is not None for i in order),
        extras_of=tuple(mask(extras.get(i, [])) for i in order),
        mem=tuple(nodes[i].mem for i in order),
        outputs=mask(graph.outputs), mandatory=mask([i for i in order if not nodes[i].optional]),
        owned_bytes=sum(n.mem for n in graph.nodes if n.kind in OWNED_KINDS),
    )


# (bytes of each position's resident copy, -1 when none; computed mask; stage; last recomputed)
_ImplState = tuple[tuple[int, ...], int, int, int]


def _impl_moves(tiny: _ImplTiny, state: _ImplState, space: Space) -> Iterator[tuple[tuple[ImplStep, ...], float,
                                                                                   int | None, _ImplState]]:
    held, computed, stage, last = state
    resident = sum(1 << p for p, b in enumerate(held) if b >= 0)
    resident_bytes = sum(b for b in held if b >= 0)
    for p, size in enumerate(held):
        if size >= 0:
            yield (("free", tiny.ids[p], None),), 0.0, None, (held[:p] + (-1,) + held[p + 1:], computed, stage, last)
    if space == "staged" and stage < len(held) and tiny.optional[stage]:
        yield (), 0.0, None, (held, computed, stage + 1, -1)  # skip the optional value of this stage
    for p in range(len(held)):
        if tiny.extra[p] or held[p] >= 0:
            continue
        first = not computed >> p & 1
        if not first and not tiny.recomputable[p]:
            continue
        if space == "staged":
            own = p == stage
            if not own and not (tiny.recomputable[p] and last < p < stage < len(held)):
                continue
        for option in tiny.options[p]:
            if option.needs & ~resident:
                continue
            made = 1 << p | (tiny.extras_of[p] if first else 0)
            after = list(held)
            if option.inplace >= 0:
                memory = tiny.owned_bytes + resident_bytes + option.workspace
                after[p], after[option.inplace] = held[option.inplace], -1
            else:
                memory = tiny.owned_bytes + resident_bytes + option.mem + option.workspace
                after[p] = option.mem
            extras = [q for q in range(len(held)) if (made >> q & 1) and q != p]
            for q in extras:
                after[q] = tiny.mem[q]
            steps = (("compute", tiny.ids[p], option.name),) + tuple(("compute", tiny.ids[q], None) for q in extras)
            next_stage, next_last = stage, last
            if space == "staged":
                next_stage, next_last = (p + 1 + len(extras), -1) if p == stage else (stage, p)
            yield steps, option.cost, memory, (tuple(after), computed | made, next_stage, next_last)


def _impl_search(graph: Graph, budget: int | None, space: Space, exact: bool, by_peak: bool) -> FoundImpl | None:
    """Dijkstra on (cost, peak), or on (peak, cost) with ``by_peak``; None when nothing fits ``budget``."""
    if space not in ("all", "staged"):
        raise ValueError("the implementation search knows the spaces 'all' and 'staged'")
    tiny = _impl_tiny(graph, exact)
    start: _ImplState = (tuple([-1] * len(tiny.ids)), 0, 0, -1)
    if budget is not None and tiny.owned_bytes > budget:
        return None
    first_key = (tiny.owned_bytes, 0.0) if by_peak else (0.0, tiny.owned_bytes)
    best: dict[_ImplState, tuple[float, float]] = {start: first_key}
    parents: dict[_ImplState, tuple[_ImplState, tuple[ImplStep, ...]] | None] = {start: None}
    counter = itertools.count()
    queue = [(*first_key, next(counter), start)]
    while queue:
        a, b, _, state = heapq.heappop(queue)
        if best[state] != (a, b):
            continue
        held, computed, _, _ = state
        resident = sum(1 << p for p, size in enumerate(held) if size >= 0)
        if computed & tiny.mandatory == tiny.mandatory and tiny.outputs & ~resident == 0:
            cost, peak = (b, a) if by_peak else (a, b)
            return FoundImpl(cost, int(peak), _rebuild(parents, state))  # type: ignore[arg-type]
        for steps, step_cost, memory, nxt in _impl_moves(tiny, state, space):
            if budget is not None and memory is not None and memory > budget:
                continue
            cost, peak = (b, a) if by_peak else (a, b)
            cost, peak = cost + step_cost, max(peak, memory or 0)
            key = (peak, cost) if by_peak else (cost, peak)
            if nxt not in best or key < best[nxt]:
                best[nxt] = key
                parents[nxt] = (state, steps)  # type: ignore[assignment]
                heapq.heappush(queue, (*key, next(counter), nxt))
    return None


def optimal_impl_schedule(graph: Graph, budget: int, space: Space = "all", exact: bool = False) -> FoundImpl | None:
    """The cheapest schedule (implementations chosen) of ``space`` within ``budget``; None if none fits.
    ``exact`` leaves out implementations marked inexact."""
    return _impl_search(graph, budget, space, exact, by_peak=False)


def least_impl_peak(graph: Graph, space: Space = "all", exact: bool = False) -> int:
    """The least peak any schedule of ``space`` reaches with the graph's implementations."""
    found = _impl_search(graph, None, space, exact, by_peak=True)
    assert found is not None, "every graph has a schedule: store-all with the default implementations"
    return found.peak


def without_impls(graph: Graph) -> Graph:
    """The graph with no implementations and no optional values: what recomputation alone sees."""
    data = graph.model_dump()
    data["nodes"] = [n | {"impls": ()} for n in data["nodes"] if not n["optional"]]
    return Graph.model_validate(data)
