"""The Graph IR (contract 1).

A :class:`Graph` is a DAG of :class:`Node` s. A node is one operation whose output value occupies
``mem`` bytes (or graph units for imported graphs) and costs ``cost`` to compute. Views and
aliases are folded by the capture, so every node owns its storage and memory is counted once.

Graphs are pydantic models: they serialise to JSON with a ``format`` tag and a version, hash to a
stable content digest and convert to and from networkx; reading files (coop JSON and both
node-link layouts of the published benchmark graphs) is :mod:`coop.graph_files`.
A malformed graph is rejected with a one-line :class:`~coop.errors.GraphError` that names the
node and the problem.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import inspect
import json
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import networkx as nx
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from coop.errors import GraphError
from coop.graph_upgrades import upgrade_v1, upgrade_v2
from coop.text import first_line, format_bytes, json_type_name, short_repr

GRAPH_FORMAT = "coop.graph"
#: Version 2 added ``Node.random`` (set by the capture); version 3 added MONeT's implementation
#: links (``Impl.inputs``, ``Impl.inplace_of``, ``Impl.exact``/``tolerance``) and ``Node.optional``;
#: version 4 added ``Node.device``. Older files are upgraded on reading (:mod:`coop.graph_upgrades`).
GRAPH_VERSION = 4

NodeKind = Literal["input", "param", "buffer", "forward", "backward", "other"]
#: Values owned by the caller: resident for the whole step, never computed nor freed by a schedule.
CALLER_OWNED_KINDS: frozenset[str] = frozenset({"input", "param", "buffer"})

#: The largest value or workspace a node may declare (1 PiB). Anything larger is a unit mistake, and
#: sums of such values would overflow the 64-bit integers of the CP-SAT and MILP models.
MAX_MEM = 2**50
#: The largest cost a node may declare: sums of many such costs stay finite and exact enough.
MAX_COST = 1e15


#: The value a function derives from a graph (see :func:`derived_from_graph`).
Derived = TypeVar("Derived")


def _reject_bool_and_text(value: Any) -> Any:
    """Refuse JSON booleans and strings where a number belongs: pydantic's lax mode would turn
    ``true`` into 1 and ``"5"`` into 5, a silent repair of a malformed file."""
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"got {type(value).__name__} {value!r}, not a number")  # noqa: TRY004 (pydantic wants ValueError)
    return value


def _reject_non_bool(value: Any) -> Any:
    """Refuse anything but a JSON boolean (lax mode would read ``"no"`` or ``0`` as False)."""
    if not isinstance(value, bool):
        raise ValueError(f"got {type(value).__name__} {value!r}, not true or false")  # noqa: TRY004 (pydantic wants ValueError)
    return value


#: A node id: a non-negative integer (a boolean or a numeric string is refused, not converted).
NodeId = Annotated[int, BeforeValidator(_reject_bool_and_text), Field(ge=0)]
#: Bytes (graph units for imported graphs): a non-negative integer no larger than MAX_MEM.
Bytes = Annotated[int, BeforeValidator(_reject_bool_and_text), Field(ge=0, le=MAX_MEM)]
#: A compute cost: a finite non-negative number no larger than MAX_COST.
Cost = Annotated[float, BeforeValidator(_reject_bool_and_text), Field(ge=0, le=MAX_COST, allow_inf_nan=False)]
Flag = Annotated[bool, BeforeValidator(_reject_non_bool)]


def device_order(device: str | None) -> tuple[bool, str]:
    """Sort key of device names: None (an imported graph's one device) first, then by name.

    Parameters
    ----------
    device : str or None
        A device name, or None for an imported graph's one device.

    Returns
    -------
    tuple of (bool, str)
        The sort key.
    """
    return (device is not None, device or "")


class Impl(BaseModel):
    """One implementation of a node (MONeT, Shah et al. 2021): its own cost, output and workspace,
    the values it reads and whether it runs in place.

    * ``inputs``: the node ids this implementation reads instead of the node's ``inputs`` (None:
      the same). A ReLU backward that reads a compact mask names the mask node here, so its
      schedule need not keep the float activation. The ids may name ``optional`` nodes.
    * ``inplace_of``: one of the values it reads whose storage its output takes over (an in-place
      activation). The compute consumes that input's resident instance: no new bytes, the
      instance's bytes move to the new value, and no later step may read the consumed instance.
      Its ``mem`` must equal the input node's ``mem``.
    * ``exact``: False for different arithmetic (output-activated normalisation, a fused
      attention kernel) whose results differ from the default within ``tolerance`` (relative);
      plans solved with ``exact=True`` never choose it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    cost: Cost
    mem: Bytes
    workspace: Bytes = 0
    inputs: tuple[NodeId, ...] | None = None
    inplace_of: NodeId | None = None
    exact: Flag = True
    tolerance: Cost = 0.0


class Node(BaseModel):
    """One operation of the graph; its output value occupies ``mem`` and costs ``cost``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: NodeId
    name: str
    op: str = ""
    inputs: tuple[NodeId, ...] = ()
    mem: Bytes
    cost: Cost
    workspace: Bytes = 0
    kind: NodeKind = "forward"
    recomputable: Flag = True
    #: A seeded random op (dropout, bernoulli, rand*): it draws from a torch generator, so its first
    #: computes keep the baseline order and a recomputation must replay the saved generator state.
    #: The capture sets it from the traced op (``Tag.nondeterministic_seeded``).
    random: Flag = False
    impls: tuple[Impl, ...] = ()
    #: For an extra output of a multi-output op (batch norm's saved mean, a pooling's indices,
    #: a convolution backward's weight gradient): the id of the op node whose call produces it.
    #: Such a value exists from the op's first compute (contract 2); the op's ``workspace``
    #: covers it at the op's own step.
    output_of: NodeId | None = None
    #: A value that exists only to serve some implementations (a ReLU's compact mask): no schedule
    #: has to compute it, only a chosen implementation may read it (``Impl.inputs``), and it is
    #: not in ``Graph.order`` nor in the baseline (contract 2: every non-optional node is computed).
    optional: Flag = False
    #: The device the value lives on, as torch names it (``"cuda:0"``, ``"cpu"``), set by the capture from
    #: the traced value; None for imported graphs, whose values all live on the one device the graph
    #: describes. A captured CUDA step also holds host values (0-d CPU scalars, the RNG seeds an attention
    #: kernel returns): :meth:`Graph.pageable` tells which values may be paged.
    device: str | None = None

    @property
    def caller_owned(self) -> bool:
        """Inputs, parameters and buffers: resident for the whole step, owned by the caller."""
        return self.kind in CALLER_OWNED_KINDS

    def implementation(self, name: str | None) -> Impl | None:
        """The implementation called ``name`` (None for the default one, or when there is none)."""
        if name is None:
            return None
        return next((impl for impl in self.impls if impl.name == name), None)

    def reads(self, impl: Impl | None = None) -> tuple[int, ...]:
        """The node ids a compute of this node reads under ``impl`` (None: the default implementation)."""
        return self.inputs if impl is None or impl.inputs is None else impl.inputs


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
    version: Annotated[int, BeforeValidator(_reject_bool_and_text)] = GRAPH_VERSION
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
            raise GraphError(_describe_validation_error(exc, data)) from None

    @model_validator(mode="after")
    def _check_structure(self) -> Graph:
        if self.version != GRAPH_VERSION:
            raise GraphError(f"graph version {self.version} is not supported (this coop reads 1 to {GRAPH_VERSION})")
        if not self.nodes:
            raise GraphError(f"graph {self.name!r} is empty: it needs at least one node")
        seen: set[int] = set()
        for node in self.nodes:
            if node.id in seen:
                raise GraphError(f"node {node.id} ({node.name}): duplicate node id; give every node its own id")
            seen.add(node.id)
        for node in self.nodes:
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
        self._check_extra_outputs()
        for output in self.outputs:
            if output not in seen:
                raise GraphError(f"graph output {output} is not a node id; remove it from outputs or add node {output}")
        self._check_impls()
        self._check_optional()
        # Implementation inputs are edges too: a cycle through them is refused, and the default
        # order puts every node after whatever any of its implementations reads.
        topo = _topological_order(_with_impl_edges(self.nodes))
        computed = [n.id for n in self.nodes if not n.caller_owned and not n.optional]
        if not self.order:
            object.__setattr__(self, "order", tuple(i for i in topo if i in set(computed)))
        else:
            self._check_order(computed)
        return self

    def _check_extra_outputs(self) -> None:
        """An extra output reads only its op, is computed once, and fits in its op's workspace."""
        by_id = {n.id: n for n in self.nodes}
        taken: dict[int, int] = {}
        for node in self.nodes:
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

    def _check_impls(self) -> None:
        """Implementation names are unique; their inputs name other nodes, once each; an in-place
        implementation overwrites a computed value it reads, of its own size."""
        by_id = {n.id: n for n in self.nodes}
        for node in self.nodes:
            names = [impl.name for impl in node.impls]
            if len(set(names)) != len(names):
                raise GraphError(f"node {node.id} ({node.name}): two implementations share a name; name each once")
            if node.impls and (node.caller_owned or node.output_of is not None):
                raise GraphError(f"node {node.id} ({node.name}): a {node.kind if node.caller_owned else 'extra output'} "
                                 "has no implementations; remove its impls")
            for impl in node.impls:
                _check_impl(node, impl, by_id)

    def _check_optional(self) -> None:
        """An optional value is computed, no graph output, and read only by implementations (or
        other optional values): a schedule that never computes it must stay legal."""
        optional = {n.id for n in self.nodes if n.optional}
        for node in self.nodes:
            where = f"node {node.id} ({node.name})"
            if node.optional and (node.caller_owned or node.output_of is not None):
                raise GraphError(f"{where}: a {node.kind if node.caller_owned else 'extra output'} cannot be optional; "
                                 "remove optional")
            if node.optional and node.id in self.outputs:
                raise GraphError(f"{where}: an optional node cannot be a graph output; remove optional or the output")
            needed = [i for i in node.inputs if i in optional]
            if needed and not node.optional:
                raise GraphError(f"{where}: its inputs name optional node {needed[0]}; only an implementation "
                                 "(impls[].inputs) may read an optional value")

    def _check_order(self, computed: list[int]) -> None:
        position: dict[int, int] = {}
        by_id = {n.id: n for n in self.nodes}
        for index, node_id in enumerate(self.order):
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
        for node_id in self.order:
            node = by_id[node_id]
            for source in node.inputs + tuple(i for impl in node.impls for i in impl.inputs or ()):
                if source in position and position[source] > position[node_id]:
                    raise GraphError(
                        f"order puts node {node_id} ({node.name}) before its input {source}; list every "
                        "node after its inputs and its implementations' inputs (or leave order out for a "
                        "topological order)"
                    )

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


# -------------------------------------------------------------------- helpers
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


def _describe_impl(node: Node, impl: Impl) -> str:
    """One implementation as a line of the printed graph."""
    reads = ", ".join(f"%{i}" for i in node.reads(impl))
    text = f"{impl.name}({reads})  mem={format_bytes(impl.mem)} cost={impl.cost:.4g}"
    text += f" workspace={format_bytes(impl.workspace)}" if impl.workspace else ""
    text += f"  in place of %{impl.inplace_of}" if impl.inplace_of is not None else ""
    return text + ("" if impl.exact else f"  inexact (tolerance {impl.tolerance:g})")


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
_FIELD_RULES: dict[str, str] = {
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


def _describe_validation_error(exc: ValidationError, data: Any) -> str:
    """One line for pydantic's first error: the node (id and name) or graph field, the value, the fix."""
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
    rule = _FIELD_RULES.get(next((p for p in reversed(loc) if isinstance(p, str)), ""), "")
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
