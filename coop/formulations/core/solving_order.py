"""The order of first computations a solver works in: the captured order, or one that defers growing nodes.

Moccasin's and MONeT's interval models, and Checkmate's stages, keep first computations in one
order (Checkmate's restriction, Jain et al. 2020; it removes the time axis' symmetry). The captured
program order is not always a good one: a training step computes a large fully connected layer's
weight gradient (VGG-16's first classifier layer: 392 MiB at fp32) at the start of the backward,
from two small tensors, and then holds it through the whole backward of the convolutions, where
memory is tightest. Computing it last needs only those two small inputs kept.

:func:`deferred_order` moves, from the last node to the first, every node that adds more bytes than
it frees (its output against the inputs it reads for the last time) to just before its first
reader (the end for a value nobody reads, such as a gradient): the bytes between the two
positions drop by the difference. This is Sethi's observation for register allocation ("Complete
register allocation problems", SIAM J. Comput. 1975) that evaluation order alone changes the
storage a computation needs, applied greedily; random ops and multi-output ops stay where they are.
:func:`solving_graph` hands a solver the graph in that order only where it lowers the store-all
peak (the order's own peak), and says which order it used; schedules refer to node ids, so a
schedule of the reordered graph is a schedule of the graph (the one simulator does not read
``Graph.order``).
"""

from __future__ import annotations

from coop.errors import CoopError
from coop.graph import Graph, derived_from_graph
from coop.schedule import Schedule, simulate

#: The deferred order is used only where it lowers the store-all peak by at least this fraction.
MIN_PEAK_GAIN = 0.01


def deferred_order(graph: Graph) -> tuple[int, ...]:
    """``graph.order`` with every node that adds more bytes than it frees moved to just before its first reader.

    See the module docstring. A topological order of the same nodes in which random draws and extra
    outputs keep their places relative to their ops.

    Parameters
    ----------
    graph : Graph
        The graph whose order is rearranged.

    Returns
    -------
    tuple of int
        The deferred order.
    """
    order = list(graph.order)
    readers = _readers(graph)
    has_extras = {node.output_of for node in graph.nodes if node.output_of is not None}
    outputs = set(graph.outputs)
    position = {v: k for k, v in enumerate(order)}
    for v in reversed(graph.order):
        node = graph.node(v)
        if node.random or node.output_of is not None or v in has_extras or node.mem == 0:
            continue
        k = position[v]
        target = min((position[r] for r in readers[v] if r in position), default=len(order))
        if target <= k + 1:
            continue
        freed = 0
        for u in set(node.inputs):
            source = graph.node(u)
            if source.caller_owned or u in outputs:
                continue
            if max(position[r] for r in readers[u] if r in position) == k:
                freed += source.mem
        if node.mem <= freed:
            continue
        order.insert(target - 1, order.pop(k))
        for j in range(k, target):
            position[order[j]] = j
    return tuple(order)


def _readers(graph: Graph) -> dict[int, set[int]]:
    """For each node, the nodes of ``graph.order`` that read it through their inputs or any implementation's,
    directly or through optional values (which are not in the order: they are made before their readers)."""
    direct: dict[int, set[int]] = {node.id: set() for node in graph.nodes}
    for node in graph.nodes:
        for source in {*node.inputs, *(i for impl in node.impls for i in node.reads(impl))}:
            direct[source].add(node.id)
    readers: dict[int, set[int]] = {}

    def of(v: int) -> set[int]:
        if v not in readers:
            readers[v] = set()
            for reader in direct[v]:
                readers[v] |= of(reader) if graph.node(reader).optional else {reader}
        return readers[v]

    for node in graph.nodes:
        of(node.id)
    return readers


#: The ``order`` option of the formulations that keep first computations in one order.
ORDER_CHOICES = ("auto", "captured", "deferred")


def check_order(order: object) -> None:
    """Refuse, in one line, an ``order`` option that is not one of :data:`ORDER_CHOICES`.

    Raises
    ------
    CoopError
        When ``order`` is not one of :data:`ORDER_CHOICES`.
    """
    if not isinstance(order, str) or order not in ORDER_CHOICES:
        raise CoopError(f"order {order!r} is unknown: choose {', '.join(ORDER_CHOICES)}")


def solving_graph(graph: Graph, order: str = "auto") -> tuple[Graph, str]:
    """The graph a solver should work on and the order's name.

    Parameters
    ----------
    order : str
        One of :data:`ORDER_CHOICES`. ``"auto"``: the graph in :func:`deferred_order` where that order's
        store-all peak is at least :data:`MIN_PEAK_GAIN` below the captured order's (graphs with a
        backward only), else the graph; ``"captured"``: the graph as it is; ``"deferred"``: the deferred
        order always.

    Returns
    -------
    tuple of (Graph, str)
        The graph (``graph`` itself where the captured order is kept or deferring moves nothing) and
        the name of its order, for messages.

    Raises
    ------
    CoopError
        When ``order`` is not one of :data:`ORDER_CHOICES`.
    """
    check_order(order)
    return _solving_graph(graph, order)


@derived_from_graph
def _solving_graph(graph: Graph, order: str) -> tuple[Graph, str]:
    """:func:`solving_graph` of a checked ``order``, computed once per graph and order."""
    if order == "captured":
        return graph, "captured"
    if order == "deferred":
        deferred = deferred_order(graph)
        if deferred == graph.order:
            return graph, "captured (deferring moves nothing)"
        return _in_order(graph, deferred), "deferred (asked for)"

    if not graph.has_backward:
        return graph, "captured"
    deferred = deferred_order(graph)
    if deferred == graph.order:
        return graph, "captured"
    before = simulate(graph, Schedule.from_order(graph.order)).peak
    after = simulate(graph, Schedule.from_order(deferred)).peak
    if after > (1 - MIN_PEAK_GAIN) * before:
        return graph, "captured"
    return _in_order(graph, deferred), f"deferred (store-all peak {after:,} B, captured order's {before:,} B)"


def _in_order(graph: Graph, order: tuple[int, ...]) -> Graph:
    """The graph with ``order`` as its order (validated: a topological order of the same nodes)."""
    return Graph.model_validate(graph.model_dump() | {"order": order})


__all__ = ["MIN_PEAK_GAIN", "ORDER_CHOICES", "check_order", "deferred_order", "solving_graph"]
