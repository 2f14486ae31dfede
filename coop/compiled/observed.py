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
* ``together``: per joint value, the values a fused loop kernel computing it pulled ahead of it. Inductor places a
  fused kernel at its earliest member and runs everything the later members read before it: on ResNet at 0.7
  (issue 41) a batch norm's weight-gradient sum the schedule ran early in the backward was fused with the
  statistics of a convolution the schedule recomputed late, so the whole recomputation from the stem on ran early
  and the stem's 524,288 B output lived through most of the backward (the step held 2,954,264 B for a plan of
  2,246,208). Each value written after the member and read by its kernel (or, where the member reads another
  instance of it, that value's inputs: :func:`fused_reads`) becomes an input of the member in the next round's
  Graph (where it precedes the member in the Graph's order), so a schedule that computes the member early pays for
  what the fused kernel pulls there.

:func:`inline_unbuffered` rebuilds a lowering with those values taken out: each reader of an inlined value reads
the inlined value's inputs (transitively) and pays its cost once per reader, which is what the fused kernels do;
the emitter (:mod:`coop.compiled.emit`) writes an inlined value out again right before each node that reads it.
"""

from __future__ import annotations

from collections.abc import Callable
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
    #: owner fx name -> owner fx names a fused kernel computing it read besides its inputs (union over the rounds)
    together: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def key(self) -> str:
        """A stable text of the observation, for inductor's cache key."""
        return repr((sorted(self.inline), sorted(self.workspace), sorted(self.scratch), sorted(self.together)))

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
    together = {owner: set(reads) for owner, reads in previous.together} if previous is not None else {}
    for observed in (forward, backward):
        tied = fused_reads(graph, fx_names, node_of, observed)
        for owner, nbytes in _kernel_workspace(graph, fx_names, node_of, observed, tied).items():
            workspace[owner] = max(workspace.get(owner, 0), nbytes)
        for owner, reads in tied.items():
            together.setdefault(owner, set()).update(reads)
    return Observation(inline=frozenset(inline), workspace=tuple(sorted(workspace.items())),
                       scratch=previous.scratch if previous is not None else (),
                       together=tuple(sorted((owner, tuple(sorted(reads))) for owner, reads in together.items())))


def fused_reads(graph: Graph, fx_names: dict[int, list[str]], node_of: dict[str, int],
                observed: ObservedGraph) -> dict[str, set[str]]:
    """Per joint value a fused loop kernel computes, the joint values the kernel pulled ahead of it.

    Inductor numbers its operations in the order of the emitted module (``op0``, ``op1``...), places a fused
    kernel at its earliest member and runs everything its members read before it. A value the kernel reads that
    was written by a later operation than one of the kernel's members (ResNet: the recomputed convolution read by
    the statistics fused with the early weight-gradient sum) was pulled ahead of that member, and is live at its
    compute: each such read is charged to each member written before it (module docstring: ``together``); where the
    member reads another instance of that value itself, the inputs of the value are charged instead. Reads of
    values written before the kernel's earliest member (the common case: a pointwise chain fused where it was
    emitted) are left to :func:`_kernel_workspace`. Only reads that come before the member in the Graph's order are
    kept (the next Graph stays a DAG in that order), and none that are caller-owned or the member's own inputs.

    Returns
    -------
    dict
        Owner fx name of a member -> owner fx names of the values to read with it.
    """
    position = {node_id: index for index, node_id in enumerate(graph.order)}
    kernel_of = {b.writer: b.kernel for b in observed.buffers}
    first: dict[int, int] = {}  # fused kernel -> its earliest member's operation number
    members: dict[int, list[tuple[int, int]]] = {}  # fused kernel -> (operation number, Graph node) of its values
    for buffer in observed.buffers:
        number = _op_number(buffer.writer)
        if observed.extern[buffer.kernel] or number is None:
            continue
        first[buffer.kernel] = min(first.get(buffer.kernel, number), number)
        if buffer.joint_name in node_of:
            members.setdefault(buffer.kernel, []).append((number, node_of[buffer.joint_name]))
    found: dict[str, set[str]] = {}
    for buffer in observed.buffers:
        written = _op_number(buffer.writer)
        value = node_of.get(buffer.joint_name) if buffer.joint_name is not None else None
        if value is None or written is None or graph.nodes[value].caller_owned:
            continue
        for kernel in {kernel_of.get(op) for op in buffer.reader_ops} - {None, buffer.kernel}:
            if kernel not in first or written < first[kernel]:
                continue
            for number, member in members.get(kernel, ()):
                node = graph.nodes[member]
                if number > written or node.output_of is not None or member not in position:
                    continue
                # the member reads another instance of the value (ResNet: sum_15 read the saved convolution_11,
                # the statistics fused with it a recomputation): what that recomputation reads is pulled ahead
                pulled = graph.nodes[value].inputs if value in node.inputs else (value,)
                for read in pulled:
                    if (read not in node.inputs and not graph.nodes[read].caller_owned
                            and position.get(read, len(position)) < position[member]):
                        found.setdefault(fx_names[member][0], set()).add(fx_names[read][0])
    return found


def _op_number(name: str) -> int | None:
    """The number of an inductor operation (``op27`` -> 27); None for another name."""
    return int(name[2:]) if name.startswith("op") and name[2:].isdigit() else None


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
                      observed: ObservedGraph, tied: dict[str, set[str]]) -> dict[str, int]:
    """Per kernel, the bytes it holds beyond what its last joint value's compute step holds in the Graph.

    Charged to the owner fx name of the kernel's last joint value (in the Graph's order): inductor's temporaries
    (materialized buffers that hold no joint value), and the buffers that die in the kernel but are read there
    only by its earlier values (a fused kernel allocates all its outputs before any of its inputs is freed, where
    the Graph's separate steps free such an input before the later value is computed), unless :func:`fused_reads`
    (``tied``, computed once by the caller) makes that value an input of the last one (then it is live at that
    step without a charge).
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
            if value is not None and fx_names[value][0] in tied.get(fx_names[last][0], ()):
                continue  # an input of the last value in the next Graph (fused_reads), not its workspace too
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
    together = _together_ids(lowered, observation, inlined, expand)
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
        inputs.extend(i for i in together.get(old, ()) if i not in inputs)  # read by a kernel fused with it
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


def _together_ids(lowered: Lowered, observation: Observation, inlined: set[int],
                  expand: Callable[[int], tuple[list[int], list[int]]]) -> dict[int, list[int]]:
    """Old node id -> the old ids it reads with the kernel it was fused into (``Observation.together``), inlined
    reads replaced by their inputs; only reads before it in the Graph's order (the Graph stays a DAG in it), none
    that are caller-owned, and none for an extra output (which reads only its op)."""
    graph = lowered.graph
    position = {node_id: index for index, node_id in enumerate(graph.order)}
    found: dict[int, list[int]] = {}
    for owner, names in observation.together:
        member = lowered.owner_of.get(owner)
        if member is None or member in inlined or member not in position or graph.nodes[member].output_of is not None:
            continue
        reads: list[int] = []
        for name in names:
            source = lowered.owner_of.get(name)
            if source is None:
                continue
            for value in expand(source)[0] if source in inlined else [source]:
                if (value not in reads and value not in graph.nodes[member].inputs and not graph.nodes[value].caller_owned
                        and position.get(value, len(position)) < position[member]):
                    reads.append(value)
        if reads:
            found[member] = reads
    return found


def _stays(node: Node, readers: list[int], pinned: set[int], fx_node: fx.Node | None) -> bool:
    """Whether an observed unbuffered value must stay a node of its own (:func:`inline_unbuffered`)."""
    if node.caller_owned or node.id in pinned or node.random or not node.recomputable or node.impls:
        return True
    if not readers or fx_node is None or not isinstance(fx_node.meta.get("val"), torch.Tensor):
        return True
    return len(readers) > 1 and not is_pointwise(fx_node)
