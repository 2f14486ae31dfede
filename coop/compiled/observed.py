"""The next round's Graph from what inductor really held in the last one (the measured re-solve of issue 41).

A compiled round's :class:`~coop.compiled.inductor_buffers.BufferObserver` says which joint values got a buffer
of their own. :func:`observe_round` turns that into an :class:`Observation`, keyed by the joint graph's fx names
(the lowering is deterministic, so the next round's lowering has the same nodes under the same names):

* ``inline``: values the step computed without ever writing them to a buffer. Inductor inlined them into the
  kernels that read them, so they cost no bytes, and their readers read *their* inputs instead, which stay live
  until the last of those readers runs. The same holds for an ``mm`` inductor's post-grad pass folded into the
  ``add`` reading it (``addmm``, which runs where the add was). Names accumulate over rounds: a value inlined
  once is emitted as one copy per reader, which inductor inlines again.
* ``workspace``: per kernel, what it holds beyond the Graph's step of its last joint value, charged as that
  value's workspace: inductor's temporaries (materialized buffers that hold no joint value, e.g. a layer norm's
  partial statistics), and inputs that die in a fused kernel read there only by its earlier values (the kernel
  allocates all its outputs before it frees any input; the Graph's separate steps free them in between).
* ``scratch``: per joint value, what the extern kernel computing it allocated inside itself and gave back on the
  real step (:mod:`coop.compiled.extern_scratch`), charged on top of the Graph node's workspace.

:func:`inline_unbuffered` rebuilds a lowering with those values taken out: each reader of an inlined value reads
the inlined value's inputs (transitively) and pays its cost once per reader, which is what the fused kernels do;
the emitter (:mod:`coop.compiled.emit`) writes an inlined value out again right before each node that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import fx

from coop.compiled.fusion import is_pointwise, with_node_flops
from coop.compiled.inductor_buffers import ObservedGraph
from coop.graph import Graph, Node
from coop.graph_capture.lower import Lowered

__all__ = ["Inlined", "Observation", "inline_unbuffered", "observe_round"]


@dataclass(frozen=True)
class Observation:
    """What the compiled rounds so far showed about the joint values (module docstring)."""

    #: owner fx names of the values that got no buffer (union over the rounds observed)
    inline: frozenset[str] = frozenset()
    #: owner fx name -> bytes of inductor's temporaries in the kernel that computes it (the largest seen)
    workspace: tuple[tuple[str, int], ...] = ()
    #: owner fx name -> bytes an extern kernel computing it allocated inside itself (the largest measured)
    scratch: tuple[tuple[str, int], ...] = ()

    def key(self) -> str:
        """A stable text of the observation, for inductor's cache key."""
        return repr((sorted(self.inline), sorted(self.workspace), sorted(self.scratch)))

    def with_scratch(self, measured: dict[str, int]) -> Observation:
        """This observation with ``measured`` (owner fx name -> bytes) joined into its scratch, the larger kept."""
        scratch = dict(self.scratch)
        for owner, nbytes in measured.items():
            scratch[owner] = max(scratch.get(owner, 0), nbytes)
        return replace(self, scratch=tuple(sorted(scratch.items())))


def observe_round(graph: Graph, fx_names: dict[int, list[str]], computed: set[str], forward: ObservedGraph,
                  backward: ObservedGraph, previous: Observation | None = None) -> Observation:
    """The observation of one compiled round, joined with the rounds before it.

    Parameters
    ----------
    graph : Graph
        The round's Graph.
    fx_names : dict
        The round's lowering: Graph node id -> its fx names (owner first).
    computed : set of str
        Owner fx names of the values the round's modules compute (forward or backward).
    forward, backward
        The round's observed graphs.
    previous : Observation or None
        The observation the round was planned with; its inlined names, workspace and scratch are kept.

    Returns
    -------
    Observation
        The values to inline and the workspace to charge in the next round.
    """
    buffered = {b.joint_name for g in (forward, backward) for b in g.materialized() if b.joint_name is not None}
    node_of = {name: node_id for node_id, names in fx_names.items() for name in names}
    copied = set().union(*(_copied_extern_inputs(graph, fx_names, node_of, g, buffered) for g in (forward, backward)))
    inline = set(previous.inline) if previous is not None else set()
    for names in fx_names.values():
        if names and names[0] in computed and not buffered.intersection(names) and names[0] not in copied:
            inline.add(names[0])
    workspace = dict(previous.workspace) if previous is not None else {}
    for observed in (forward, backward):
        for owner, nbytes in _kernel_workspace(graph, fx_names, node_of, observed).items():
            workspace[owner] = max(workspace.get(owner, 0), nbytes)
    return Observation(inline=frozenset(inline), workspace=tuple(sorted(workspace.items())),
                       scratch=previous.scratch if previous is not None else ())


def _copied_extern_inputs(graph: Graph, fx_names: dict[int, list[str]], node_of: dict[str, int],
                          observed: ObservedGraph, buffered: set[str]) -> set[str]:
    """Owner fx names of the values held by buffers that name no joint value and that an extern kernel reads.

    An extern kernel reads buffers only: a pointwise input it is handed unrealized is written to a buffer of its
    own first, which inductor names after no fx node (it keeps ``origin_node`` for the values it lowers, not for
    the copies an extern kernel's input takes), so the value looks unbuffered though it was written. Each such
    buffer is matched by its bytes to an input of the kernel's joint values that no named buffer holds (a
    custom op reading ``a * a``: the square's buffer). An input folded into the kernel itself (an ``mm`` inside
    the ``addmm`` that reads it) has no such buffer and stays inlined.
    """
    values: dict[int, set[int]] = {}  # extern kernel -> the Graph nodes its named buffers hold
    for buffer in observed.buffers:
        if observed.extern[buffer.kernel] and buffer.joint_name in node_of:
            values.setdefault(buffer.kernel, set()).add(node_of[buffer.joint_name])
    copied: set[str] = set()
    for kernel, nodes in values.items():
        nameless = [b.nbytes for b in observed.materialized() if b.joint_name is None and kernel in b.readers]
        inputs = sorted({i for v in nodes for i in graph.nodes[v].inputs if not graph.nodes[i].caller_owned})
        for source in inputs:
            owner = fx_names[source][0]
            if nameless and not buffered.intersection(fx_names[source]) and graph.nodes[source].mem in nameless:
                nameless.remove(graph.nodes[source].mem)
                copied.add(owner)
    return copied


def _kernel_workspace(graph: Graph, fx_names: dict[int, list[str]], node_of: dict[str, int],
                      observed: ObservedGraph) -> dict[str, int]:
    """Per kernel, the bytes it holds beyond what its last joint value's compute step holds in the Graph.

    Charged to the owner fx name of the kernel's last joint value (in the Graph's order): inductor's temporaries
    (materialized buffers that hold no joint value), and the buffers that die in the kernel but are read there
    only by its earlier values (a fused kernel allocates all its outputs before any of its inputs is freed, where
    the Graph's separate steps free such an input before the later value is computed).
    """
    position = {node_id: index for index, node_id in enumerate(graph.order)}
    value_of_op = {b.writer: node_of[b.joint_name] for b in observed.buffers if b.joint_name in node_of}
    kernel_of_op = {b.writer: b.kernel for b in observed.buffers}
    members: dict[int, set[int]] = {}
    for buffer in observed.buffers:
        if buffer.joint_name in node_of:
            members.setdefault(buffer.kernel, set()).add(node_of[buffer.joint_name])
    charged: dict[str, int] = {}
    for kernel, values in members.items():
        last = max(values, key=lambda v: position.get(v, -1))
        inputs = set(graph.nodes[last].inputs)
        extra = 0
        written = [b for b in observed.materialized() if b.kernel == kernel]
        in_place = set()  # dying buffers a loop kernel writes an output of the same size and dtype into
        if not observed.extern[kernel]:
            for out in written:
                for dying in observed.materialized():
                    if (dying.name not in in_place and not dying.output and dying.kernel < kernel
                            and max(dying.readers, default=-1) == kernel and dying.key == out.key
                            and out.writer in dying.reader_ops):
                        in_place.add(dying.name)
                        break
        for buffer in observed.materialized():
            if buffer.joint_name is None and buffer.kernel == kernel and not buffer.output:
                extra += buffer.nbytes  # a temporary
                continue
            if (buffer.output or buffer.kernel >= kernel or max(buffer.readers, default=-1) != kernel
                    or buffer.name in in_place):
                continue
            readers = {value_of_op.get(op) for op in buffer.reader_ops if kernel_of_op.get(op) == kernel}
            value = node_of.get(buffer.joint_name) if buffer.joint_name is not None else None
            if last not in readers and value not in inputs and value != last:
                extra += buffer.nbytes  # dies in the kernel, read there only by an earlier value
        if extra:
            charged[fx_names[last][0]] = extra
    return charged


@dataclass
class Inlined:
    """A lowering with the observed values inlined, and what the emitter needs to write them out again."""

    lowered: Lowered
    #: old node id -> new node id, for the nodes that stay
    new_id: dict[int, int]
    #: fx names (owners, folded views and fused members) of the inlined nodes
    names: frozenset[str] = field(default_factory=frozenset)


def inline_unbuffered(lowered: Lowered, fx_nodes: dict[str, fx.Node], observation: Observation,
                      keep: set[int]) -> Inlined:
    """Take the observed values out of ``lowered``'s Graph and charge the workspace and scratch (module docstring).

    A value stays a node when it is caller-owned, random, not recomputable, has implementations, is part of a
    multi-output op, is a Graph output, is in ``keep`` (the tangents), has no reader, or is not pointwise and has
    more than one reader (inlining it would compute a matmul once per reader).

    Parameters
    ----------
    lowered : Lowered
        The joint graph's lowering (after :func:`coop.compiled.fusion.fuse_pointwise`); left unchanged.
    fx_nodes : dict
        fx name -> the fx node of the graph ``lowered`` came from.
    observation : Observation
        The values to inline and the workspace to charge, by owner fx name.
    keep : set of int
        Node ids that stay nodes.

    Returns
    -------
    Inlined
        The new lowering (ids renumbered densely), the id map and the inlined fx names.
    """
    graph = lowered.graph
    readers: dict[int, list[int]] = {node.id: [] for node in graph.nodes}
    for node in graph.nodes:
        for source in node.inputs:
            readers[source].append(node.id)
    pinned = set(graph.outputs) | keep | {n.output_of for n in graph.nodes if n.output_of is not None}
    inlined: set[int] = set()
    for name in observation.inline:
        node_id = lowered.owner_of.get(name)
        if node_id is None or lowered.fx_names[node_id][0] != name:
            continue
        node = graph.nodes[node_id]
        if _stays(node, readers[node_id], pinned, fx_nodes.get(name)):
            continue
        inlined.add(node_id)
    expanded: dict[int, tuple[list[int], list[int]]] = {}  # inlined id -> (its inputs that stay, inlined closure)

    def expand(node_id: int) -> tuple[list[int], list[int]]:
        if node_id not in expanded:
            inputs: list[int] = []
            closure = [node_id]
            for source in graph.nodes[node_id].inputs:
                if source in inlined:
                    more, inner = expand(source)
                    inputs.extend(i for i in more if i not in inputs)
                    closure.extend(i for i in inner if i not in closure)
                elif source not in inputs:
                    inputs.append(source)
            expanded[node_id] = (inputs, closure)
        return expanded[node_id]

    survivors = [node.id for node in graph.nodes if node.id not in inlined]
    new_id = {old: index for index, old in enumerate(survivors)}
    workspace = dict(observation.workspace)
    scratch = dict(observation.scratch)
    nodes: list[Node] = []
    flops: dict[int, int] = {}
    for old in survivors:
        node = graph.nodes[old]
        inputs: list[int] = []
        closure: list[int] = []
        for source in node.inputs:
            more, inner = expand(source) if source in inlined else ([source], [])
            inputs.extend(i for i in more if i not in inputs)
            closure.extend(i for i in inner if i not in closure)
        update = {"id": new_id[old], "inputs": tuple(new_id[i] for i in inputs),
                  "cost": node.cost + sum(graph.nodes[i].cost for i in closure),
                  "output_of": None if node.output_of is None else new_id[node.output_of]}
        owner = lowered.fx_names[old][0]
        charged = max(node.workspace, workspace.get(owner, 0)) + scratch.get(owner, 0)
        if charged != node.workspace and not node.caller_owned:
            update["workspace"] = charged
        nodes.append(node.model_copy(update=update))
        flops[new_id[old]] = lowered.node_flops.get(old, 0) + sum(lowered.node_flops.get(i, 0) for i in closure)
    rebuilt = Graph(name=graph.name, nodes=tuple(nodes), outputs=tuple(new_id[i] for i in graph.outputs),
                    order=tuple(new_id[i] for i in graph.order if i not in inlined),
                    meta=with_node_flops(graph.meta, flops))
    names = frozenset(name for i in inlined for name in lowered.fx_names[i])
    fx_names = {new_id[old]: list(lowered.fx_names[old]) for old in survivors}
    owner_of = {name: new_id[old] for name, old in lowered.owner_of.items() if old not in inlined}
    return Inlined(lowered=replace(lowered, graph=rebuilt, fx_names=fx_names, owner_of=owner_of, node_flops=flops),
                   new_id=new_id, names=names)


def _stays(node: Node, readers: list[int], pinned: set[int], fx_node: fx.Node | None) -> bool:
    """Whether an observed unbuffered value must stay a node of its own (:func:`inline_unbuffered`)."""
    if node.caller_owned or node.id in pinned or node.random or not node.recomputable or node.impls:
        return True
    if not readers or fx_node is None or not isinstance(fx_node.meta.get("val"), torch.Tensor):
        return True
    return len(readers) > 1 and not is_pointwise(fx_node)
