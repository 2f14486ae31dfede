"""A coop Schedule of a joint graph, written out as the forward and backward graph modules inductor compiles.

The schedule's steps before the first tangent's compute are the forward module, the rest the backward module
(:mod:`coop.compiled.joint`: nothing that reads a tangent can run earlier). Each compute step emits a fresh copy
of its fx node that reads the most recent instances of its inputs, so a value the schedule computes twice is two
nodes, and what a node reads is what the schedule says it reads. Views and ``getitem`` s (folded into the node
that owns their storage) are emitted where a consumer first needs them from that instance. A value computed in
the forward and read in the backward is a saved value: the forward module returns it, the backward module takes
it as an input (the layout of AOTAutograd's partitioners: forward outputs, then saved tensors, then saved sizes;
backward inputs: saved values, then tangents); a view of a forward tensor read by the backward is taken again there
from the saved storage, so that each storage is one backward input. A forward value the backward recomputes is not
saved: the copy in the backward is the recomputation. Frees need no node: inductor frees a buffer after its last
reader, which is where the schedule's simulator frees it (contract 2), and an explicit free is followed by a
recomputation, a new node.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._functorch.partitioners import _extract_fwd_bwd_outputs

from coop.compiled.extern_scratch import CallSite, call_sites
from coop.compiled.first_dropout import rejoin_first_products
from coop.compiled.inductor_buffers import COOP_GRAPH, mark_joint_value
from coop.compiled.joint import JointGraph
from coop.compiled.order import mark_order, matmuls_read_by
from coop.errors import CoopError
from coop.schedule import Schedule

__all__ = ["JOINT_NAME", "Partition", "emit_partition"]

FORWARD, BACKWARD = "forward", "backward"
#: the instance key of an inlined value's copy: one per compute that reads it
INLINED = "inlined"
#: the meta key naming, on each emitted computation, the joint node it computes
JOINT_NAME = "coop_joint_name"


@dataclass
class Partition:
    """The two modules and what they carry of the schedule, for the summary and the tests."""

    forward: fx.GraphModule
    backward: fx.GraphModule
    #: joint fx names the forward returns for the backward (tensors), in output order
    saved: list[str]
    #: joint fx name -> how many times the forward / backward module computes it
    forward_counts: Counter[str] = field(default_factory=Counter)
    backward_counts: Counter[str] = field(default_factory=Counter)
    #: copies of the two graphs as emitted, before inductor's passes run on the modules
    emitted_forward: fx.Graph | None = None
    emitted_backward: fx.Graph | None = None
    #: split dropouts whose draw and first product the forward runs as one native_dropout (coop.compiled.first_dropout)
    rejoined_dropouts: int = 0
    #: the forward's and the backward's op calls as emitted (:func:`coop.compiled.extern_scratch.call_sites`: read
    #: now, before inductor compiles the modules and AOTAutograd's cache may clear their nodes' meta)
    call_sites: tuple[list[CallSite], list[CallSite]] = field(default_factory=lambda: ([], []))

    def recomputed(self) -> dict[str, int]:
        """Joint fx names computed more than once in the step, with the number of extra computations."""
        both = self.forward_counts + self.backward_counts
        return {name: count - 1 for name, count in both.items() if count > 1}


class _Emitter:
    """Walks the schedule once, writing each step into the module of its phase."""

    def __init__(self, gm: fx.GraphModule, joint: JointGraph) -> None:
        self.gm = gm
        self.joint = joint
        self.nodes = {n.name: n for n in gm.graph.nodes}
        self.owner_of = joint.lowered.owner_of
        self.owner_name = {i: names[0] for i, names in joint.lowered.fx_names.items()}
        self.graphs = {FORWARD: fx.Graph(), BACKWARD: fx.Graph()}
        self.instance: dict[int, int] = {}  # graph node id -> serial of its most recent instance
        self.instance_phase: dict[int, str] = {}  # serial -> phase that created it
        self.boundary: dict[int, int] = {}  # the instances resident when the forward returns
        self.values: dict[tuple[str, str, Any], fx.Node] = {}  # (phase, fx name, serial) -> emitted node
        self.saved: dict[str, fx.Node] = {}  # joint fx name -> backward placeholder
        self.counts = {FORWARD: Counter(), BACKWARD: Counter()}
        self.rank = {FORWARD: 0, BACKWARD: 0}  # computations written so far per phase (coop.compiled.order)
        self.serial = 0
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.primals = [n for n in placeholders if n.name.startswith("primals")]
        self.tangents = [n for n in placeholders if n.name.startswith("tangents")]
        for node in self.primals:
            self.values[(FORWARD, node.name, -1)] = self._placeholder(FORWARD, node)

    def _placeholder(self, phase: str, node: fx.Node) -> fx.Node:
        new = self.graphs[phase].placeholder(node.name)
        new.meta = dict(node.meta)
        return new

    # ------------------------------------------------------------------ resolution
    def resolve(self, node: fx.Node, phase: str, instances: dict[int, int]) -> fx.Node:
        """The node of ``phase``'s module that holds ``node``'s value, for the instances in ``instances``."""
        if node.name in self.joint.inlined:  # written out again for the node being computed (coop.compiled.observed)
            return self._folded(node, phase, instances, (INLINED, self.serial))
        if node.op == "placeholder":
            if node.name.startswith("tangents"):
                return self._tangent(phase, node)
            if phase == FORWARD:
                return self.values[(FORWARD, node.name, -1)]
            return self._saved(node)
        owner = self.owner_of[node.name]
        if owner in self.joint.tangent_ids:
            return self._tangent(phase, self.nodes[self.owner_name[owner]]) if node.name == self.owner_name[owner] \
                else self._folded(node, phase, instances, -2)
        if owner not in instances:
            if self.joint.graph.nodes[owner].caller_owned:  # a view of a primal
                return self._folded(node, phase, instances, -1)
            raise CoopError(f"coop.compile: {node.name} is read while node {owner} is not resident; the schedule "
                            "is not legal for this joint graph")
        serial = instances[owner]
        key = (phase, node.name, serial)
        if key in self.values:
            return self.values[key]
        if self.instance_phase[serial] != phase:  # a forward value read by the backward: saved
            if node.name != self.owner_name[owner] and self._saves_its_base(owner):
                # a view: its storage is saved once, the view taken again in the backward
                return self._folded(node, phase, instances, serial)
            self.resolve(node, FORWARD, self.boundary)
            return self._saved(node)
        if node.name == self.owner_name[owner]:
            raise CoopError(f"coop.compile: {node.name} read before its compute in the {phase}")
        return self._folded(node, phase, instances, serial)

    def _folded(self, node: fx.Node, phase: str, instances: dict[int, int], serial: int | tuple[str, int]) -> fx.Node:
        key = (phase, node.name, serial)
        if key not in self.values:
            self.values[key] = self.graphs[phase].node_copy(node, lambda a: self.resolve(a, phase, instances))
            mark_joint_value(self.values[key], node.name)
        return self.values[key]

    def _saves_its_base(self, owner: int) -> bool:
        """Whether a view of ``owner``'s storage read by the backward is taken there from the saved storage.

        Inductor's wrapper holds a dead buffer for reuse while its estimate of the graph's peak allows it, and
        that estimate counts each backward input apart: two saved views of one forward buffer count it twice
        (ViT's attention: ``view_default_1`` and ``permute_default_3`` of one ``mul``), so the wrapper held
        buffers up to a peak the step did not have. Saved once, the storage is counted once. A multi-output op's
        owner is a tuple, whose parts are saved as they are.
        """
        return isinstance(self.nodes[self.owner_name[owner]].meta.get("val"), torch.Tensor)

    def _tangent(self, phase: str, node: fx.Node) -> fx.Node:
        if phase == FORWARD:
            raise CoopError(f"coop.compile: the forward reads {node.name}; the schedule is not legal here")
        return self.values[(BACKWARD, node.name, -2)]

    def _saved(self, node: fx.Node) -> fx.Node:
        if node.name not in self.saved:
            with self.graphs[BACKWARD].inserting_before(None):
                self.saved[node.name] = self._placeholder(BACKWARD, node)
        return self.saved[node.name]

    # ------------------------------------------------------------------ steps
    def compute(self, node_id: int, phase: str) -> None:
        graph_node = self.joint.graph.nodes[node_id]
        fx_node = self.nodes[self.owner_name[node_id]]
        self.serial += 1
        instances = dict(self.instance)
        instances[node_id] = self.serial
        self.instance_phase[self.serial] = phase
        if graph_node.output_of is not None:
            # an extra output of a multi-output op: the getitem of the op's latest instance
            producer = graph_node.output_of
            if producer not in self.instance:
                raise CoopError(f"coop.compile: {fx_node.name} taken before its op ran")
            instances[producer] = self.instance[producer]
            source_phase = self.instance_phase[self.instance[producer]]
            emitted = self.graphs[source_phase].node_copy(
                fx_node, lambda a: self.resolve(a, source_phase, instances))
            self.instance_phase[self.serial] = source_phase
            if source_phase != phase:
                # taken in the backward from the forward's op: the value exists from the op's compute on (the
                # Graph's contract), so the forward returns it like any value resident at its end (bench_compile's
                # ResNet at 0.7 took a max pool's offsets so, 2026-12-01, and the backward found nothing to read)
                self.boundary[node_id] = self.serial
        else:
            # the members fused into this node (coop.compiled.fusion) resolve to this new instance and are
            # written out just before it
            try:
                emitted = self.graphs[phase].node_copy(fx_node, lambda a: self.resolve(a, phase, instances))
            except CoopError as error:  # which computation read it: the next session's clue (issue 41)
                raise CoopError(f"{error} (computing {fx_node.name}, node {node_id}, in the {phase})") from None
            emitted.meta[JOINT_NAME] = fx_node.name
            self.counts[phase][fx_node.name] += 1
        mark_joint_value(emitted, fx_node.name)
        if graph_node.output_of is None:
            mark_order(emitted, self.rank[phase], matmuls_read_by(emitted))
            self.rank[phase] += 1
        self.values[(self.instance_phase[self.serial], fx_node.name, self.serial)] = emitted
        self.instance[node_id] = self.serial

    def start_backward(self, effects: list[fx.Node], fwd_outputs: list[Any]) -> list[Any]:
        """Close the forward's body: write back mutated inputs; return the resolved forward outputs."""
        self.boundary = dict(self.instance)
        try:
            for effect in effects:
                self.graphs[FORWARD].node_copy(effect, lambda a: self.resolve(a, FORWARD, self.boundary))
            resolved = [self.resolve(a, FORWARD, self.boundary) if isinstance(a, fx.Node) else a for a in fwd_outputs]
        except CoopError as error:
            raise CoopError(f"{error} (writing the forward's in-place updates and outputs)") from None
        for tangent in self.tangents:
            with self.graphs[BACKWARD].inserting_before(None):
                self.values[(BACKWARD, tangent.name, -2)] = self._placeholder(BACKWARD, tangent)
        return resolved


def emit_partition(gm: fx.GraphModule, joint: JointGraph, schedule: Schedule) -> Partition:
    """The forward and backward modules that run ``schedule`` (module docstring).

    Parameters
    ----------
    gm : fx.GraphModule
        The joint graph the schedule's Graph was lowered from (:func:`coop.compiled.joint.lower_joint`).
    schedule : Schedule
        A legal schedule of ``joint.graph`` without page steps.

    Returns
    -------
    Partition
        The modules in AOTAutograd's layout, the saved values and the computations per phase.
    """
    if any(step.op in ("page_out", "page_in") for step in schedule.steps):
        raise CoopError("coop.compile: the schedule pages values to the host, which compiled graphs do not run "
                        "yet; use a formulation without paging")
    emitter = _Emitter(gm, joint)
    fwd_outputs, bwd_outputs, fwd_descs, bwd_descs = _extract_fwd_bwd_outputs(gm, num_fwd_outputs=joint.num_fwd_outputs)
    effects = [emitter.nodes[name] for name in joint.effects]
    phase = FORWARD
    tangents = set(joint.tangent_ids)
    resolved_fwd: list[Any] = []
    for step in schedule.steps:
        if step.op == "free":
            continue
        if phase == FORWARD and step.node in tangents:
            resolved_fwd = emitter.start_backward(effects, fwd_outputs)
            phase = BACKWARD
        if step.node in tangents:
            emitter.instance[step.node] = -2
            continue
        emitter.compute(step.node, phase)
    if phase == FORWARD:
        raise CoopError("coop.compile: the schedule never starts the backward (no tangent is computed)")
    resolved_bwd = [emitter.resolve(a, BACKWARD, emitter.instance) if isinstance(a, fx.Node) else a
                    for a in bwd_outputs]
    return _modules(gm, emitter, resolved_fwd, fwd_descs, resolved_bwd, bwd_descs)


def _modules(gm: fx.GraphModule, emitter: _Emitter, fwd_out: list[Any], fwd_descs: list[Any], bwd_out: list[Any],
             bwd_descs: list[Any]) -> Partition:
    from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput

    # the saved tensors in AOTAutograd's order: with version-counter checks first, then without
    no_check = {n for n in emitter.saved if emitter.nodes[n].meta.get("saved_tensor_with_no_vc_check", False)}
    ordered = [n for n in emitter.saved if n not in no_check] + [n for n in emitter.saved if n in no_check]
    forward_graph, backward_graph = emitter.graphs[FORWARD], emitter.graphs[BACKWARD]
    saved_values = [emitter.resolve(emitter.nodes[n], FORWARD, emitter.boundary) for n in ordered]
    out = forward_graph.output(tuple(fwd_out + saved_values))
    out.meta["desc"] = list(fwd_descs) + [SavedForBackwardsAOTOutput(i) for i in range(len(ordered))]
    # backward inputs: the saved values, then the tangents, leading the graph in that order
    backward_inputs = [emitter.saved[n] for n in ordered] + \
        [emitter.values[(BACKWARD, t.name, -2)] for t in emitter.tangents]
    anchor = next((n for n in backward_graph.nodes if n.op != "placeholder"), None)
    if anchor is not None:
        for placeholder in backward_inputs:
            anchor.prepend(placeholder)
    out = backward_graph.output(tuple(bwd_out))
    out.meta["desc"] = list(bwd_descs)
    for node in backward_graph.nodes:
        if node.op in ("call_function", "get_attr"):
            node.meta["autograd_backward"] = True
    for node in [*forward_graph.nodes, *backward_graph.nodes]:
        node.meta[COOP_GRAPH] = emitter.joint.graph.name
    rejoined = rejoin_first_products(forward_graph)  # coop.compiled.first_dropout: one draw, not two products
    forward_graph.eliminate_dead_code()
    backward_graph.eliminate_dead_code()
    forward_graph.lint()
    backward_graph.lint()
    forward = fx._lazy_graph_module._make_graph_module(gm, forward_graph)
    backward = fx._lazy_graph_module._make_graph_module(gm, backward_graph)
    return Partition(forward=forward, backward=backward, saved=ordered, forward_counts=emitter.counts[FORWARD],
                     backward_counts=emitter.counts[BACKWARD], emitted_forward=_copy(forward_graph),
                     emitted_backward=_copy(backward_graph), rejoined_dropouts=rejoined,
                     call_sites=(call_sites(forward), call_sites(backward)))


def _copy(graph: fx.Graph) -> fx.Graph:
    copied = fx.Graph()
    output = copied.graph_copy(graph, {})
    copied.output(output)
    return copied
