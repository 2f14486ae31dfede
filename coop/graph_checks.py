"""The structure checks of a :class:`~coop.graph.Graph` and their one-line errors.

How a graph's nodes fit together (unique ids, known inputs, no cycle, extra outputs, implementations,
optional values, the baseline order) and pydantic's field errors, each turned into one
:class:`~coop.errors.GraphError` line that names the node and the fix. :mod:`coop.graph` runs them when a
graph is built.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from coop.errors import GraphError
from coop.graph_nodes import GRAPH_FORMAT, GRAPH_VERSION, MAX_COST, MAX_MEM, Impl, Node, NodeKind
from coop.text import first_line, json_type_name, short_repr


def check_structure(name: str, version: int, nodes: tuple[Node, ...], outputs: tuple[int, ...],
                    order: tuple[int, ...]) -> tuple[int, ...]:
    """Check how a graph's nodes, outputs and order fit together (GraphError: one line naming the node and
    the fix). A caller-owned node marked recomputable is made not recomputable.

    Parameters
    ----------
    name, version : str, int
        The graph's name and format version.
    nodes : tuple of Node
        The graph's nodes.
    outputs, order : tuple of int
        The graph's outputs and its baseline order (empty: the default).

    Returns
    -------
    tuple of int
        The order to keep: ``order`` itself, or the default topological order when it is empty
        (implementations' inputs count as edges).
    """
    if version != GRAPH_VERSION:
        raise GraphError(f"graph version {version} is not supported (this coop reads 1 to {GRAPH_VERSION})")
    if not nodes:
        raise GraphError(f"graph {name!r} is empty: it needs at least one node")
    seen: set[int] = set()
    for node in nodes:
        if node.id in seen:
            raise GraphError(f"node {node.id} ({node.name}): duplicate node id; give every node its own id")
        seen.add(node.id)
    for node in nodes:
        for source in node.inputs:
            if source not in seen:
                raise GraphError(f"node {node.id} ({node.name}): unknown input id {source}; add node {source} or remove it "
                                 "from the inputs")
            if source == node.id:
                raise GraphError(f"node {node.id} ({node.name}): reads its own output (a cycle); remove {source} from its "
                                 "inputs")
        if len(set(node.inputs)) != len(node.inputs):
            raise GraphError(f"node {node.id} ({node.name}): an input id is listed twice; list each input once")
        if node.caller_owned and node.inputs:
            raise GraphError(f"node {node.id} ({node.name}): a {node.kind} node cannot have inputs; remove them or "
                             "make it a computed node")
        if node.caller_owned and node.recomputable:
            object.__setattr__(node, "recomputable", False)
    _check_extra_outputs(nodes)
    for output in outputs:
        if output not in seen:
            raise GraphError(f"graph output {output} is not a node id; remove it from outputs or add node {output}")
    _check_impls(nodes)
    _check_optional(nodes, outputs)
    # Implementation inputs are edges too: a cycle through them is refused, and the default
    # order puts every node after whatever any of its implementations reads.
    topo = _topological_order(_with_impl_edges(nodes))
    computed = [n.id for n in nodes if not n.caller_owned and not n.optional]
    if not order:
        return tuple(i for i in topo if i in set(computed))
    _check_order(nodes, order, computed)
    return order


def _check_extra_outputs(nodes: tuple[Node, ...]) -> None:
    """An extra output reads only its op, is computed once, and fits in its op's workspace."""
    by_id = {n.id: n for n in nodes}
    taken: dict[int, int] = {}
    for node in nodes:
        if node.output_of is None:
            continue
        where = f"node {node.id} ({node.name}), an extra output of node {node.output_of}"
        if node.inputs != (node.output_of,):
            raise GraphError(f"{where}: its inputs must be exactly [{node.output_of}], the op that produces it")
        if node.recomputable or node.caller_owned:
            raise GraphError(f"{where}: must be a computed node with recomputable false (recomputing its op "
                             "makes a fresh copy that is dropped)")
        op = by_id[node.output_of]
        if op.caller_owned or op.output_of is not None:
            raise GraphError(f"{where}: node {op.id} is not an op that runs (caller-owned or itself an extra output)")
        taken[op.id] = taken.get(op.id, 0) + node.mem
    for op_id, extra_bytes in taken.items():
        if by_id[op_id].workspace < extra_bytes:
            op = by_id[op_id]
            raise GraphError(f"node {op.id} ({op.name}): workspace {op.workspace} is less than its extra outputs' "
                             f"{extra_bytes} bytes; they all exist while it runs, so count them in its workspace")


def _check_impls(nodes: tuple[Node, ...]) -> None:
    """Implementation names are unique; their inputs name other nodes, once each; an in-place
    implementation overwrites a computed value it reads, of its own size."""
    by_id = {n.id: n for n in nodes}
    for node in nodes:
        names = [impl.name for impl in node.impls]
        if len(set(names)) != len(names):
            raise GraphError(f"node {node.id} ({node.name}): two implementations share a name; name each once")
        if node.impls and (node.caller_owned or node.output_of is not None):
            raise GraphError(f"node {node.id} ({node.name}): a {node.kind if node.caller_owned else 'extra output'} "
                             "has no implementations; remove its impls")
        for impl in node.impls:
            _check_impl(node, impl, by_id)


def _check_optional(nodes: tuple[Node, ...], outputs: tuple[int, ...]) -> None:
    """An optional value is computed, no graph output, and read only by implementations (or
    other optional values): a schedule that never computes it must stay legal."""
    optional = {n.id for n in nodes if n.optional}
    for node in nodes:
        where = f"node {node.id} ({node.name})"
        if node.optional and (node.caller_owned or node.output_of is not None):
            raise GraphError(f"{where}: a {node.kind if node.caller_owned else 'extra output'} cannot be optional; "
                             "remove optional")
        if node.optional and node.id in outputs:
            raise GraphError(f"{where}: an optional node cannot be a graph output; remove optional or the output")
        needed = [i for i in node.inputs if i in optional]
        if needed and not node.optional:
            raise GraphError(f"{where}: its inputs name optional node {needed[0]}; only an implementation "
                             "(impls[].inputs) may read an optional value")


def _check_order(nodes: tuple[Node, ...], order: tuple[int, ...], computed: list[int]) -> None:
    position: dict[int, int] = {}
    by_id = {n.id: n for n in nodes}
    for index, node_id in enumerate(order):
        if node_id not in by_id:
            raise GraphError(f"order lists {node_id}, which is not a node id; remove it from order")
        if by_id[node_id].caller_owned:
            raise GraphError(f"order lists node {node_id}, a caller-owned {by_id[node_id].kind}; leave it out")
        if by_id[node_id].optional:
            raise GraphError(f"order lists node {node_id}, an optional value; leave it out (it is computed only "
                             "where an implementation reads it)")
        if node_id in position:
            raise GraphError(f"order lists node {node_id} twice; list every computed node once")
        position[node_id] = index
    missing = [i for i in computed if i not in position]
    if missing:
        raise GraphError(f"order misses node {missing[0]} ({by_id[missing[0]].name}); it must list every computed node")
    for node_id in order:
        node = by_id[node_id]
        for source in node.inputs + tuple(i for impl in node.impls for i in impl.inputs or ()):
            if source in position and position[source] > position[node_id]:
                raise GraphError(
                    f"order puts node {node_id} ({node.name}) before its input {source}; list every "
                    "node after its inputs and its implementations' inputs (or leave order out for a "
                    "topological order)"
                )


def _check_impl(node: Node, impl: Impl, by_id: dict[int, Node]) -> None:
    """One implementation's links: its inputs and the input it overwrites in place."""
    where = f"node {node.id} ({node.name}), implementation {impl.name!r}"
    reads = node.reads(impl)
    for source in impl.inputs or ():
        if source not in by_id:
            raise GraphError(f"{where}: unknown input id {source}; add node {source} or remove it from the "
                             "implementation's inputs")
        if source == node.id:
            raise GraphError(f"{where}: reads its own output (a cycle); remove {source} from its inputs")
        if by_id[source].output_of == node.id:
            raise GraphError(f"{where}: reads node {source}, an extra output of this very op (a cycle); remove it")
    if len(set(reads)) != len(reads):
        raise GraphError(f"{where}: an input id is listed twice; list each input once")
    if impl.inplace_of is None:
        return
    if impl.inplace_of not in reads:
        raise GraphError(f"{where}: runs in place of node {impl.inplace_of}, which it does not read; name one of "
                         f"its inputs {list(reads)}")
    target = by_id[impl.inplace_of]
    if target.caller_owned or target.output_of is not None:
        raise GraphError(f"{where}: cannot overwrite node {target.id}, a "
                         f"{target.kind if target.caller_owned else 'extra output'}; only a computed value's "
                         "storage can be taken over")
    if impl.mem != target.mem:
        raise GraphError(f"{where}: runs in place of node {target.id} ({target.mem} bytes) but declares mem "
                         f"{impl.mem}; an in-place output has the size of the storage it takes over")



def _with_impl_edges(nodes: Iterable[Node]) -> list[Node]:
    """The nodes with every implementation's inputs added to their inputs (for ordering and cycles)."""
    result = []
    for node in nodes:
        extra = tuple(dict.fromkeys(i for impl in node.impls for i in impl.inputs or () if i not in node.inputs))
        result.append(node.model_copy(update={"inputs": node.inputs + extra}) if extra else node)
    return result



def _topological_order(nodes: Iterable[Node]) -> list[int]:
    """Kahn's algorithm, ties broken by position; a cycle raises GraphError naming a node on it."""
    nodes = list(nodes)
    position = {n.id: i for i, n in enumerate(nodes)}
    indegree = {n.id: len(n.inputs) for n in nodes}
    consumers: dict[int, list[int]] = {n.id: [] for n in nodes}
    for node in nodes:
        for source in node.inputs:
            consumers[source].append(node.id)
    ready = [(position[i], i) for i, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, node_id = heapq.heappop(ready)
        order.append(node_id)
        for consumer in consumers[node_id]:
            indegree[consumer] -= 1
            if indegree[consumer] == 0:
                heapq.heappush(ready, (position[consumer], consumer))
    if len(order) != len(nodes):
        # Walk back through unfinished inputs from any unfinished node until one repeats: that one
        # lies on a cycle (a node left over may only depend on a cycle).
        by_id = {n.id: n for n in nodes}
        walker = min((n for n in nodes if indegree[n.id] > 0), key=lambda n: position[n.id])
        visited: set[int] = set()
        while walker.id not in visited:
            visited.add(walker.id)
            walker = by_id[next(i for i in walker.inputs if indegree[i] > 0)]
        raise GraphError(f"node {walker.id} ({walker.name}): lies on a cycle; a graph must be a DAG")
    return order


#: What each field must hold: the fix named in a one-line validation error.
FIELD_RULES: dict[str, str] = {
    "id": "a non-negative integer, unique in the graph",
    "name": "a string",
    "op": "a string",
    "inputs": "a list of the ids of the nodes it reads",
    "mem": f"an integer number of bytes (graph units) from 0 to 2**{MAX_MEM.bit_length() - 1}",
    "workspace": f"an integer number of bytes (graph units) from 0 to 2**{MAX_MEM.bit_length() - 1}",
    "cost": f"a finite number from 0 to {MAX_COST:g}",
    "kind": "one of " + ", ".join(NodeKind.__args__),
    "recomputable": "true or false",
    "random": "true or false",
    "impls": "a list of {name, cost, mem, workspace, inputs, inplace_of, exact, tolerance} objects",
    "optional": "true or false",
    "output_of": "the id of the node whose op produces this extra output",
    "outputs": "a list of node ids",
    "order": "a list of node ids",
    "nodes": "a non-empty list of node objects",
    "meta": "a JSON object",
    "version": f"an integer from 1 to {GRAPH_VERSION}",
    "device": "a torch device name such as \"cuda:0\" or \"cpu\", or null",
    "format": repr(GRAPH_FORMAT),
}


def describe_validation_error(exc: ValidationError, data: Any) -> str:
    """One line for pydantic's first error: the node (id and name) or graph field, the value, the fix.

    Parameters
    ----------
    exc : pydantic.ValidationError
        The error pydantic raised while building a graph.
    data : object
        The raw document the graph was built from (to name the node by id and name).

    Returns
    -------
    str
        The one-line message.
    """
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    where = "graph"
    if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
        where = _describe_node_at(data, loc[1])
        loc = loc[2:]
        if not loc:
            return f"{where}: must be a JSON object with id, name, mem and cost, not {json_type_name(error['input'])}"
    if not loc:
        return f"graph: {first_line(error['msg'])}; a graph file holds a JSON object with a 'nodes' list"
    field = _field_path(loc)
    rule = FIELD_RULES.get(next((p for p in reversed(loc) if isinstance(p, str)), ""), "")
    fix = f"; it must be {rule}" if rule else ""
    if error["type"] == "missing":
        return f"{where}: field {field} is missing; add it{fix.replace('; it must be', ' as')}"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown field {field}; remove it or check its spelling"
    if fix:
        return f"{where}: field {field} is {short_repr(error['input'])}{fix}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: field {field} is {short_repr(error['input'])}: {first_line(message)}"


def _describe_node_at(data: Any, position: int) -> str:
    """'node 7 (relu)' when the raw node at ``position`` has a usable id, else 'node at position 3'."""
    raw = None
    if isinstance(data, dict) and isinstance(data.get("nodes"), (list, tuple)) and position < len(data["nodes"]):
        raw = data["nodes"][position]
    raw_id = raw.get("id") if isinstance(raw, dict) else getattr(raw, "id", None)
    if isinstance(raw_id, bool) or not isinstance(raw_id, int):
        return f"node at position {position}"
    name = raw.get("name") if isinstance(raw, dict) else getattr(raw, "name", None)
    return f"node {raw_id} ({name})" if isinstance(name, str) else f"node {raw_id}"


def _field_path(loc: tuple[Any, ...]) -> str:
    """('impls', 0, 'cost') -> "'impls[0].cost'"."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return repr(text)

