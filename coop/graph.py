"""The Graph IR (contract 1).

A :class:`Graph` is a DAG of :class:`Node` s. A node is one operation whose output value occupies
``mem`` bytes (or graph units for imported graphs) and costs ``cost`` to compute. Views and
aliases are folded by the capture, so every node owns its storage and memory is counted once.

Graphs are pydantic models: they serialise to JSON with a ``format`` tag and a version, hash to a
stable content digest and convert to and from networkx; reading files (coop JSON and both
node-link layouts of the published benchmark graphs) is :mod:`coop.graph_files`.
A malformed graph is rejected with a one-line :class:`~coop.errors.GraphError` that names the
node and the problem (the checks: :mod:`coop.graph_checks`). The nodes, their implementations and
field types are :mod:`coop.graph_nodes`, importable from here too.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import networkx as nx
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from coop.errors import GraphError
from coop.graph_checks import check_structure, describe_validation_error
from coop.graph_nodes import (
    CALLER_OWNED_KINDS,
    GRAPH_FORMAT,
    GRAPH_VERSION,
    MAX_COST,
    MAX_MEM,
    Bytes,
    Cost,
    Flag,
    Impl,
    Node,
    NodeId,
    NodeKind,
    device_order,
    reject_bool_and_text,
)
from coop.graph_upgrades import upgrade_v1, upgrade_v2
from coop.text import format_bytes

#: The value a function derives from a graph (see :func:`derived_from_graph`).
Derived = TypeVar("Derived")


class Graph(BaseModel):
    """A DAG of nodes with the values that must be live at the end and a baseline order.

    ``order`` is the baseline execution order over the nodes that a schedule computes (every
    node that is not caller-owned); when it is empty on construction a stable topological order
    is filled in. ``outputs`` are the values that must be resident when the step ends.

    Examples
    --------
    A chain: a caller-owned input ``x``, then ``a`` and ``b`` computed from it (sizes in graph units):

    >>> from coop import Graph, Node
    >>> graph = Graph(name="chain", outputs=(2,), nodes=[
    ...     Node(id=0, name="x", mem=4, cost=0, kind="input"),
    ...     Node(id=1, name="a", inputs=(0,), mem=8, cost=1),
    ...     Node(id=2, name="b", inputs=(1,), mem=2, cost=1)])
    >>> graph.order
    (1, 2)
    >>> [node.name for node in graph.nodes if node.kind == "input"]
    ['x']
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["coop.graph"] = GRAPH_FORMAT
    version: Annotated[int, BeforeValidator(reject_bool_and_text)] = GRAPH_VERSION
    name: str = "graph"
    nodes: tuple[Node, ...]
    outputs: tuple[NodeId, ...] = ()
    order: tuple[NodeId, ...] = ()
    meta: dict[str, Any] = Field(default_factory=dict)

    # ---------------------------------------------------------------- validation
    @model_validator(mode="wrap")
    @classmethod
    def _one_line_errors(cls, data: Any, handler: Any) -> Graph:
        """Turn pydantic's multi-line field errors into one line that names the node."""
        if isinstance(data, dict) and type(data.get("version")) is int and data["version"] == 1:
            data = upgrade_v1(data, GRAPH_VERSION)
        elif isinstance(data, dict) and type(data.get("version")) is int and data["version"] in (2, 3):
            data = upgrade_v2(data, GRAPH_VERSION)
        try:
            return handler(data)
        except ValidationError as exc:
            raise GraphError(describe_validation_error(exc, data)) from None

    @model_validator(mode="after")
    def _check_structure(self) -> Graph:
        """How the nodes, outputs and order fit together (:func:`coop.graph_checks.check_structure`)."""
        order = check_structure(self.name, self.version, self.nodes, self.outputs, self.order)
        if not self.order:
            object.__setattr__(self, "order", order)
        return self

    # ---------------------------------------------------------------- lookups
    @cached_property
    def _index(self) -> dict[int, Node]:
        return {n.id: n for n in self.nodes}

    def node(self, node_id: int) -> Node:
        """The node with this id (GraphError if there is none)."""
        try:
            return self._index[node_id]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no node {node_id}") from None

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._index

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:  # type: ignore[override]
        return iter(self.nodes)

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """For each node id, the ids of the nodes that read it, in node order."""
        result: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for node in self.nodes:
            for source in node.inputs:
                result[source].append(node.id)
        return {k: tuple(v) for k, v in result.items()}

    @cached_property
    def caller_owned_ids(self) -> tuple[int, ...]:
        """Inputs, parameters and buffers, resident for the whole step."""
        return tuple(n.id for n in self.nodes if n.caller_owned)

    @cached_property
    def devices(self) -> tuple[str | None, ...]:
        """The devices the graph's values live on, sorted (None: an imported graph's one device)."""
        return tuple(sorted({n.device for n in self.nodes}, key=device_order))

    @cached_property
    def has_accelerator(self) -> bool:
        """Whether any value lives on an accelerator: a device other than the CPU, or an imported graph's
        one device (all None; in a captured graph None marks a value with no tensor, which lives nowhere)."""
        return any(device not in (None, "cpu") for device in self.devices) or self.devices == (None,)

    def pageable(self, node_id: int) -> bool:
        """Whether a schedule may page this value to the host tier (POET's page_out / page_in).

        Only device memory counts against the budget, so only values on an accelerator can be paged: a
        host value inside a step that runs on an accelerator (a 0-d CPU scalar, the CPU seed an attention
        kernel returns) is already on the host, and paging it would copy it nowhere. A step captured on
        the CPU alone has no accelerator; there the CPU stands in for the device and the executor's host
        pool for the host tier (metered apart, :mod:`coop.runtime.meter`), so that paging plans replay
        and are tested on machines without one. An imported graph's values live on its one device.
        """
        device = self.node(node_id).device
        return device != "cpu" or not self.has_accelerator

    @cached_property
    def caller_owned_bytes(self) -> int:
        """Memory of the caller-owned values, resident at every step."""
        return sum(n.mem for n in self.nodes if n.caller_owned)

    @cached_property
    def extra_outputs(self) -> dict[int, tuple[int, ...]]:
        """For each multi-output op, the ids of its extra outputs (nodes whose ``output_of`` is it)."""
        result: dict[int, list[int]] = {}
        for node in self.nodes:
            if node.output_of is not None:
                result.setdefault(node.output_of, []).append(node.id)
        return {k: tuple(v) for k, v in result.items()}

    def release_positions(self, order: tuple[int, ...] | list[int], kept: set[int]) -> dict[int, int]:
        """For each ``kept`` value (never recomputed, e.g. a random op's output), the position in
        ``order`` after which no recomputation can read it.

        A recomputation reads a kept value K only through recomputable descendants that some later
        step (or the final restore of an output) may still need. Walking down from K through
        recomputable, non-output values, the last read among them in ``order`` bounds every such
        need. Outputs and kept values end the walk: they are never recomputed once computed, so K is
        needed for them only up to their own (single) compute. Kept
        values that are outputs are never released (no entry).
        """
        outputs = set(self.outputs)
        position = {v: k for k, v in enumerate(order)}
        last_read = {v: position[v] for v in order}
        for v in order:
            for source in self.node(v).inputs:
                if source in last_read:
                    last_read[source] = max(last_read[source], position[v])
        release: dict[int, int] = {}
        for value in kept:
            if value in outputs or value not in position:
                continue
            latest = last_read[value]
            stack = list(self.consumers[value])
            seen: set[int] = set()
            while stack:
                v = stack.pop()
                if v in seen or v not in position:
                    continue
                seen.add(v)
                # an output or a kept value is computed once, at its position: K's need through it ends there
                latest = max(latest, position[v] if v in outputs or v in kept else last_read[v])
                if v not in kept and v not in outputs:
                    stack.extend(self.consumers[v])
            release[value] = latest
        return release

    @cached_property
    def random_draws(self) -> frozenset[int]:
        """Computed nodes marked ``random``: their op draws from a torch generator.

        Their first computes must keep the order of ``order`` (one generator, drawn in eager
        PyTorch's order); a replay that restores the generator state saved before a draw repeats
        it exactly (:meth:`with_random_replay`). Imported graphs (free-text ops) have none.
        """
        return frozenset(n.id for n in self.nodes if not n.caller_owned and n.random)

    def with_random_replay(self) -> Graph:
        """This graph with its random draws marked recomputable: the graph a replaying engine plans on.

        Recomputing a random op from the generator state saved right before its first draw yields
        the very same numbers and leaves the generator where it was, so in the Graph's semantics it
        is an ordinary recomputation (contract 1 forbids only replays that draw new numbers). The
        executor and the online engines replay so; the first draws still keep their order.
        """
        return self._with_random_replay

    @cached_property
    def _with_random_replay(self) -> Graph:
        replayable = {v for v in self.random_draws if not self.node(v).recomputable}
        if not replayable:
            return self
        data = self.model_dump()
        for node in data["nodes"]:
            if node["id"] in replayable:
                node["recomputable"] = True
        return Graph.model_validate(data)

    @property
    def num_edges(self) -> int:
        return sum(len(n.inputs) for n in self.nodes)

    @cached_property
    def baseline_cost(self) -> float:
        """Sum of the costs of all computed nodes (each computed once, default implementation; optional
        values are not part of the baseline)."""
        return float(sum(n.cost for n in self.nodes if not n.caller_owned and not n.optional))

    @cached_property
    def has_impls(self) -> bool:
        """Whether any node has implementations to choose from (MONeT)."""
        return any(n.impls for n in self.nodes)

    def remat_only(self) -> Graph:
        """This graph as recomputation alone sees it: default implementations, no optional values."""
        return self._remat_only

    @cached_property
    def _remat_only(self) -> Graph:
        if not self.has_impls and not self.optional_ids:
            return self
        data = self.model_dump()
        data["nodes"] = [node | {"impls": ()} for node in data["nodes"] if not node["optional"]]
        return Graph.model_validate(data)

    @cached_property
    def optional_ids(self) -> tuple[int, ...]:
        """The optional values: computed only where a chosen implementation reads them."""
        return tuple(n.id for n in self.nodes if n.optional)

    @cached_property
    def has_backward(self) -> bool:
        return any(n.kind == "backward" for n in self.nodes)

    # ---------------------------------------------------------------- hashing and JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; defaults of nodes are left out to keep files small."""
        data = self.model_dump(mode="json", exclude={"nodes"})
        data["nodes"] = [
            {"id": n.id, "name": n.name, "mem": n.mem, "cost": n.cost} | n.model_dump(mode="json", exclude_defaults=True)
            for n in self.nodes
        ]
        return data

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write the graph as coop JSON (``format: coop.graph``)."""
        Path(path).write_text(self.to_json(indent=1) + "\n")

    @cached_property
    def sha256(self) -> str:
        """Digest of everything a schedule depends on: nodes (costs included), outputs, order.

        ``random`` is left out: the simulator does not read it, and a captured node's flag follows
        from its op, so graphs (and the schedules and plans that name them) keep the digest they
        had in version 1.
        """
        return _digest({"nodes": self._digest_nodes(()), "outputs": list(self.outputs), "order": list(self.order)})

    @cached_property
    def structure_sha256(self) -> str:
        """Digest without measured quantities (costs, workspace) and without device indices: the same model and
        batch shapes give the same digest on ``cuda:0``, on ``cuda:1`` (a DDP rank) and in a weightless capture
        for ``cuda`` (:mod:`coop.graph_capture.meta`)."""
        nodes = self._digest_nodes(("cost", "impls", "workspace"))
        for node in nodes:
            if isinstance(node.get("device"), str):
                node["device"] = node["device"].split(":", 1)[0]
        return _digest({"nodes": nodes, "outputs": list(self.outputs), "order": list(self.order)})

    def _digest_nodes(self, left_out: tuple[str, ...]) -> list[dict[str, Any]]:
        return [{k: v for k, v in n.items() if k not in ("random", *left_out)} for n in self.to_dict()["nodes"]]

    # ---------------------------------------------------------------- networkx
    def to_networkx(self) -> nx.DiGraph:
        """A networkx DiGraph whose node attributes are the node fields (ids unchanged)."""
        graph = nx.DiGraph(name=self.name, outputs=list(self.outputs), order=list(self.order), **self.meta)
        for node in self.nodes:
            attrs = node.model_dump(mode="json", exclude={"id", "inputs"})
            graph.add_node(node.id, **attrs)
        for node in self.nodes:
            for source in node.inputs:
                graph.add_edge(source, node.id)
        return graph

    @classmethod
    def from_networkx(cls, graph: nx.DiGraph, name: str | None = None) -> Graph:
        """Build a Graph from a DiGraph whose nodes carry at least ``mem`` and ``cost``."""
        nodes = []
        for node_id, attrs in graph.nodes(data=True):
            fields = {k: v for k, v in attrs.items() if k in Node.model_fields and k not in ("id", "inputs")}
            fields.setdefault("name", str(node_id))
            inputs = [_networkx_id(p) for p in graph.predecessors(node_id)]
            nodes.append({"id": _networkx_id(node_id), "inputs": inputs, **fields})
        meta = {k: v for k, v in graph.graph.items() if k not in ("name", "outputs", "order")}
        return cls.model_validate(
            {
                "name": name or graph.graph.get("name", "graph"),
                "nodes": nodes,
                "outputs": graph.graph.get("outputs", []),
                "order": graph.graph.get("order", []),
                "meta": _jsonable(meta),
            }
        )

    # ---------------------------------------------------------------- printing
    def __str__(self) -> str:
        lines = [f"graph {self.name}: {len(self.nodes)} nodes, {self.num_edges} edges"]
        for node in self.nodes:
            args = ", ".join(f"%{i}" for i in node.inputs)
            flags = node.kind + ("" if node.recomputable or node.caller_owned else ", not recomputable")
            flags += ", optional" if node.optional else ""
            lines.append(
                f"  %{node.id} = {node.op or node.name}({args})  mem={format_bytes(node.mem)} cost={node.cost:.4g}  [{flags}]"
            )
            lines.extend(f"      | {_describe_impl(node, impl)}" for impl in node.impls)
        if self.outputs:
            lines.append("  outputs: " + ", ".join(f"%{i}" for i in self.outputs))
        return "\n".join(lines)


def _networkx_id(label: Any) -> Any:
    """A networkx node label as a node id: integers as they are, decimal strings ("12", as GraphML
    writes them) as their integer; anything else is left for validation to name."""
    if isinstance(label, str) and label.isascii() and label.isdigit():
        return int(label)
    return label



def _describe_impl(node: Node, impl: Impl) -> str:
    """One implementation as a line of the printed graph."""
    reads = ", ".join(f"%{i}" for i in node.reads(impl))
    text = f"{impl.name}({reads})  mem={format_bytes(impl.mem)} cost={impl.cost:.4g}"
    text += f" workspace={format_bytes(impl.workspace)}" if impl.workspace else ""
    text += f"  in place of %{impl.inplace_of}" if impl.inplace_of is not None else ""
    return text + ("" if impl.exact else f"  inexact (tolerance {impl.tolerance:g})")





def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def derived_from_graph(function: Callable[..., Derived]) -> Callable[..., Derived]:
    """Decorator: ``function(graph, *args, **kwargs)`` runs once per (immutable) graph and arguments.

    The cache lives on the graph (so it goes with it) and is keyed by the decorated function's full
    name (module and qualified name: two layers can never read each other's entries, and a graph
    holding derived values still pickles) and its arguments, which must be hashable.

    Parameters
    ----------
    function : callable
        A function whose first argument is the graph.

    Returns
    -------
    callable
        The cached wrapper, with ``function``'s name and docstring; positional, keyword and defaulted
        spellings of the same arguments share one entry.
    """

    signature = inspect.signature(function)
    takes_arguments = len(signature.parameters) > 1
    name = f"{function.__module__}.{function.__qualname__}"  # a string: a graph with values stays picklable

    @functools.wraps(function)
    def cached(graph: Graph, *args: Any, **kwargs: Any) -> Derived:
        cache = graph.__dict__.setdefault("_derived", {})
        if takes_arguments:  # one key however the arguments are spelled (positional, keyword, defaulted)
            bound = signature.bind(graph, *args, **kwargs)
            bound.apply_defaults()
            key: tuple[Any, ...] = (name, *list(bound.arguments.items())[1:])
        else:
            key = (name,)
        if key not in cache:
            cache[key] = function(graph, *args, **kwargs)
        return cache[key]

    return cached


__all__ = [
    "CALLER_OWNED_KINDS",
    "GRAPH_FORMAT",
    "GRAPH_VERSION",
    "MAX_COST",
    "MAX_MEM",
    "Bytes",
    "Cost",
    "Derived",
    "Flag",
    "Graph",
    "Impl",
    "Node",
    "NodeId",
    "NodeKind",
    "derived_from_graph",
    "device_order",
]
