"""Hypothesis strategies shared by the test suite: random graphs, legal schedules, malformed graphs.

Public names (kept stable for other test files):

* :func:`random_graphs` -- valid :class:`coop.Graph` objects shaped like training steps.
* :func:`random_schedules` -- legal schedules over a given graph, with recomputations, explicit
  frees and page_out/page_in pairs.
* :data:`MALFORMATIONS`, :func:`malformed_graph_dict`, :func:`malformed_graphs` -- graph dicts
  broken in one known way, with the node id the error message must name.
"""

from __future__ import annotations

import copy
from typing import Any

import networkx as nx
from hypothesis import strategies as st

from coop.graph import Graph
from coop.schedule import Schedule, Step

__all__ = [
    "MALFORMATIONS",
    "malformed_graph_dict",
    "malformed_graphs",
    "random_graphs",
    "random_schedules",
]


# -------------------------------------------------------------------- graphs
@st.composite
def random_graphs(
    draw: st.DrawFn,
    max_nodes: int = 12,
    with_backward: bool = True,
    with_caller_owned: bool = True,
    with_outputs: bool = True,
    with_impls: bool = False,
    with_extras: bool = True,
) -> Graph:
    """A random valid Graph of at most ``max_nodes`` computed nodes (plus up to 3 caller-owned).

    The forward part is a random DAG (each node reads a random subset of earlier forward values
    and caller-owned values); with ``with_backward`` a backward chain follows that starts from the
    last forward value and reads forward values, as the gradient of a real training step does.
    Memory and costs are small integers including zeros; some forward nodes are not recomputable
    (random ops); with ``with_extras`` some forward ops get an extra output (``output_of``), as
    batch norm's saved statistics; ids are random distinct integers, not 0..n-1, and the node list
    is shuffled.
    """
    num_forward = draw(st.integers(1, max(1, max_nodes if not with_backward else max_nodes - 1)))
    num_backward = 0
    if with_backward:
        num_backward = draw(st.integers(1, max(1, min(num_forward + 1, max_nodes - num_forward))))
    num_owned = draw(st.integers(0, 3)) if with_caller_owned else 0
    total = num_owned + num_forward + num_backward
    ids = draw(st.lists(st.integers(0, 10 * total + 20), min_size=total, max_size=total, unique=True))
    owned_ids, forward_ids, backward_ids = (
        ids[:num_owned],
        ids[num_owned : num_owned + num_forward],
        ids[num_owned + num_forward :],
    )

    nodes: list[dict[str, Any]] = []
    for position, node_id in enumerate(owned_ids):
        kind = draw(st.sampled_from(["input", "param", "buffer"]))
        nodes.append(_node_dict(draw, node_id, f"{kind}{position}", kind, ()))
    for position, node_id in enumerate(forward_ids):
        earlier = forward_ids[:position]
        sources = draw(st.lists(st.sampled_from(earlier), unique=True, max_size=3)) if earlier else []
        if owned_ids:
            sources += draw(st.lists(st.sampled_from(owned_ids), unique=True, max_size=2))
        node = _node_dict(draw, node_id, f"fwd{position}", "forward", tuple(sources), with_impls)
        node["recomputable"] = draw(st.sampled_from([True, True, True, True, False]))
        nodes.append(node)
    saved_ids = list(forward_ids)
    if with_extras:
        # Multi-output ops: an extra output reads only its op, is produced by the op's first
        # compute (counted in the op's workspace while it runs) and is never recomputed.
        next_id = max(ids) + 1
        for op in [n for n in nodes if n["kind"] == "forward"]:
            if draw(st.integers(0, 5)) != 0:
                continue
            extra = _node_dict(draw, next_id, f"{op['name']}.extra", "forward", (op["id"],))
            extra.update(output_of=op["id"], recomputable=False, workspace=0, cost=0.0)
            op["workspace"] = op.get("workspace", 0) + extra["mem"]
            nodes.append(extra)
            saved_ids.append(next_id)
            next_id += 1
    for position, node_id in enumerate(backward_ids):
        # The backward chain: each gradient reads the previous one and some forward values.
        previous = [backward_ids[position - 1]] if position else [forward_ids[-1]]
        saved = draw(st.lists(st.sampled_from(saved_ids), unique=True, max_size=3))
        sources = previous + [s for s in saved if s not in previous]
        if owned_ids and draw(st.booleans()):
            sources.append(draw(st.sampled_from(owned_ids)))
        nodes.append(_node_dict(draw, node_id, f"bwd{position}", "backward", tuple(sources), with_impls))

    nodes = draw(st.permutations(nodes))
    outputs: list[int] = []
    if with_outputs:
        outputs = draw(st.lists(st.sampled_from(ids), unique=True, max_size=3))
    return Graph.model_validate({"name": "random", "nodes": nodes, "outputs": outputs})


def _node_dict(
    draw: st.DrawFn, node_id: int, name: str, kind: str, inputs: tuple[int, ...], with_impls: bool = False
) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": node_id,
        "name": name,
        "kind": kind,
        "inputs": list(inputs),
        "mem": draw(st.integers(0, 20)),
        "cost": float(draw(st.integers(0, 10))),
    }
    if kind not in ("input", "param", "buffer"):
        node["workspace"] = draw(st.sampled_from([0, 0, 0, 1, 5]))
        if with_impls and draw(st.booleans()):
            node["impls"] = [
                {"name": "inplace", "cost": float(draw(st.integers(0, 10))), "mem": draw(st.integers(0, 20))},
                {"name": "fast", "cost": float(draw(st.integers(0, 10))), "mem": draw(st.integers(0, 20)),
                 "workspace": draw(st.integers(0, 5))},
            ]
    return node


# -------------------------------------------------------------------- schedules
@st.composite
def random_schedules(draw: st.DrawFn, graph: Graph, page_caller_owned: bool = True, paging: bool = True) -> Schedule:
    """A legal schedule over ``graph``: a random topological order with random extra steps.

    Between the computes of the chosen order it inserts, at random: explicit frees of resident
    recomputable values, page_out of resident values (caller-owned ones too when
    ``page_caller_owned``; none without ``paging``), and recomputations. A value that a compute needs is paged back in or
    recomputed (recursively) first, and the outputs are made resident at the end. Values that are
    not recomputable are never freed, so they are never computed twice.
    """
    builder = _ScheduleBuilder(graph, draw)
    for node_id in _random_topological_order(draw, graph):
        for _ in range(draw(st.integers(0, 2))):
            builder.random_extra_step(page_caller_owned, paging)
        builder.ensure_computed_fresh(node_id)
    for _ in range(draw(st.integers(0, 2))):
        builder.random_extra_step(page_caller_owned, paging)
    builder.finish_outputs()
    return Schedule(steps=tuple(builder.steps))


def _random_topological_order(draw: st.DrawFn, graph: Graph) -> list[int]:
    computed = [n.id for n in graph.nodes if not n.caller_owned]
    remaining_inputs = {
        v: {u for u in graph.node(v).inputs if not graph.node(u).caller_owned} for v in computed
    }
    order: list[int] = []
    while remaining_inputs:
        ready = sorted(v for v, deps in remaining_inputs.items() if not deps)
        chosen = draw(st.sampled_from(ready))
        order.append(chosen)
        del remaining_inputs[chosen]
        for deps in remaining_inputs.values():
            deps.discard(chosen)
    return order


class _ScheduleBuilder:
    """Tracks what is resident and paged out while it appends legal steps."""

    def __init__(self, graph: Graph, draw: st.DrawFn) -> None:
        self.graph = graph
        self.draw = draw
        self.steps: list[Step] = []
        self.resident: set[int] = set()  # computed values with a current instance
        self.paged_out: set[int] = set()  # resident values (or caller-owned) now on the host

    def _impl(self, node_id: int) -> str | None:
        node = self.graph.node(node_id)
        if not node.impls:
            return None
        return self.draw(st.sampled_from([None, *(impl.name for impl in node.impls)]))

    def make_available(self, node_id: int) -> None:
        """Make a value readable on the device: page it in, or compute it (recursively)."""
        if node_id in self.paged_out:
            self.steps.append(Step(op="page_in", node=node_id))
            self.paged_out.discard(node_id)
        elif not self.graph.node(node_id).caller_owned and node_id not in self.resident:
            self.compute(node_id)

    def compute(self, node_id: int) -> None:
        for source in self.graph.node(node_id).inputs:
            self.make_available(source)
        self.steps.append(Step(op="compute", node=node_id, impl=self._impl(node_id)))
        self.resident.add(node_id)
        self.paged_out.discard(node_id)

    def ensure_computed_fresh(self, node_id: int) -> None:
        """The order's own compute of node_id (a recomputation when it already ran)."""
        node = self.graph.node(node_id)
        if node_id in self.resident and not node.recomputable:
            return
        self.compute(node_id)

    def random_extra_step(self, page_caller_owned: bool, paging: bool = True) -> None:
        choice = self.draw(st.sampled_from(["free", "page_out", "recompute", "nothing"]))
        on_device = sorted(self.resident - self.paged_out)
        if choice == "free":
            candidates = [v for v in on_device if self.graph.node(v).recomputable]
            if candidates:
                victim = self.draw(st.sampled_from(candidates))
                self.steps.append(Step(op="free", node=victim))
                self.resident.discard(victim)
        elif choice == "page_out" and paging:
            candidates = list(on_device)
            if page_caller_owned:
                candidates += [v for v in self.graph.caller_owned_ids if v not in self.paged_out]
            if candidates:
                victim = self.draw(st.sampled_from(sorted(candidates)))
                self.steps.append(Step(op="page_out", node=victim))
                self.paged_out.add(victim)
        elif choice == "recompute":
            candidates = [v for v in sorted(self.resident) if self.graph.node(v).recomputable]
            if candidates:
                self.compute(self.draw(st.sampled_from(candidates)))

    def finish_outputs(self) -> None:
        for output in self.graph.outputs:
            self.make_available(output)


# -------------------------------------------------------------------- malformed graphs
#: The ways :func:`malformed_graph_dict` can break a graph.
MALFORMATIONS = ("cycle", "unknown_input", "duplicate_id", "negative_mem", "negative_cost", "missing_field", "empty")


def malformed_graph_dict(graph: Graph, malformation: str, pick: int = 0) -> tuple[dict[str, Any], frozenset[int]]:
    """Break ``graph`` (as a dict) in one way; return the dict and the node ids the error may name.

    ``pick`` selects which computed node is broken (modulo their number). For a cycle any node
    that lies on a cycle is a right answer; for ``empty`` the set is empty (the message names the
    graph instead). The order is dropped so that only the malformation is wrong.
    """
    data, target = _break(graph, malformation, pick)
    if malformation == "cycle":
        return data, _nodes_on_cycles(data)
    return data, frozenset() if target is None else frozenset({target})


def _nodes_on_cycles(data: dict[str, Any]) -> frozenset[int]:
    digraph = nx.DiGraph()
    for node in data["nodes"]:
        digraph.add_node(node["id"])
        digraph.add_edges_from((source, node["id"]) for source in node.get("inputs", []))
    on_cycle = {v for component in nx.strongly_connected_components(digraph) if len(component) > 1 for v in component}
    return frozenset(on_cycle | {v for v, _ in nx.selfloop_edges(digraph)})


def _break(graph: Graph, malformation: str, pick: int) -> tuple[dict[str, Any], int | None]:
    data = copy.deepcopy(graph.to_dict())
    data["order"] = []
    nodes = data["nodes"]
    computed = [n for n in nodes if n.get("kind", "forward") not in ("input", "param", "buffer")]
    target = computed[pick % len(computed)]
    if malformation == "cycle":
        # A self-loop when there is one computed node, else a two-node cycle target <-> other.
        others = [n for n in computed if n["id"] != target["id"]]
        if not others:
            target["inputs"] = [*target.get("inputs", []), target["id"]]
            return data, target["id"]
        other = others[pick % len(others)]
        for a, b in ((target, other), (other, target)):
            if b["id"] not in a.get("inputs", []):
                a["inputs"] = [*a.get("inputs", []), b["id"]]
        return data, target["id"]
    if malformation == "unknown_input":
        unknown = max(n["id"] for n in nodes) + 1
        target["inputs"] = [*target.get("inputs", []), unknown]
        return data, target["id"]
    if malformation == "duplicate_id":
        others = [n for n in nodes if n["id"] != target["id"]]
        if not others:
            clone = dict(target, name="clone")
            nodes.append(clone)
            return data, target["id"]
        others[0]["id"] = target["id"]
        return data, target["id"]
    if malformation == "negative_mem":
        target["mem"] = -1
        return data, target["id"]
    if malformation == "negative_cost":
        target["cost"] = -0.5
        return data, target["id"]
    if malformation == "missing_field":
        del target["mem"]
        return data, target["id"]
    if malformation == "empty":
        data["nodes"], data["outputs"] = [], []
        return data, None
    raise ValueError(f"unknown malformation {malformation!r}; choose one of {MALFORMATIONS}")


@st.composite
def malformed_graphs(draw: st.DrawFn) -> tuple[dict[str, Any], str, frozenset[int]]:
    """(graph dict, malformation, node ids one of which the one-line GraphError must name)."""
    graph = draw(random_graphs(max_nodes=6))
    malformation = draw(st.sampled_from(MALFORMATIONS))
    data, node_ids = malformed_graph_dict(graph, malformation, pick=draw(st.integers(0, 10)))
    return data, malformation, node_ids
