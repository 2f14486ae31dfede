"""Saved pointwise values recomputed inside their backward readers, as inductor's own partitioner does.

A forward value the backward reads is saved: the forward kernel writes it to memory and it stays there until its
last backward reader. Inductor's min-cut partitioner (``min_cut_rematerialization_partition``) saves fewer: a cheap
pointwise value whose inputs the backward holds anyway is recomputed in the backward, where inductor inlines it
into the loop kernel that reads it, so it is never written, neither by the forward (where it may now fuse into its
reader) nor by the backward. A coop schedule that stores every value (store-all, or any plan that keeps such a value
across the boundary) pays that write traffic and those bytes.

:func:`recompute_saved_pointwise` moves such values into the backward, one at a time, on a legal schedule. A value
``v`` moves when:

* its Graph node is an ordinary computed forward value (recomputable, not random, not a Graph output, no
  implementations, not a multi-output op or part of one), and its own fx op is pointwise
  (:func:`coop.compiled.fusion.is_pointwise`);
* the instance resident when the forward ends is read in the backward, and every fx node of the backward that reads
  ``v`` (or a view folded into its node) is a loop op (:func:`coop.compiled.fusion.is_loop_op`) of a node without
  implementations: inductor can inline ``v`` there;
* each of ``v``'s inputs is caller-owned or resident anyway at ``v``'s first backward read (an instance alive there
  in the schedule as it stands: nothing is kept longer for the recomputation);
* the rewritten schedule (``compute v`` inserted right before that first backward read; the forward instance then
  lives through its last forward read) is legal and its simulated peak is within the budget
  (:func:`coop.schedule.validate`, the one simulator).

The Graph still charges ``v``'s bytes from its recomputation to its last backward reader, an upper bound of what the
inlined kernel holds; its cost is charged again, so the plan's predicted overhead counts each move.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import fx

from coop.compiled.fusion import is_loop_op, is_pointwise
from coop.compiled.joint import JointGraph
from coop.errors import CoopError
from coop.graph import Graph, Node
from coop.schedule import Schedule, Step, Validation, validate

__all__ = ["pointwise_candidates", "recompute_in_backward", "recompute_saved_pointwise"]


def recompute_saved_pointwise(joint: JointGraph, gm: fx.GraphModule, schedule: Schedule,
                              budget: int) -> tuple[Schedule, Validation, tuple[int, ...]]:
    """The schedule with each saved pointwise value that qualifies recomputed in the backward (module docstring).

    Parameters
    ----------
    joint : JointGraph
        The lowered joint graph the schedule runs.
    gm : fx.GraphModule
        The joint graph ``joint`` was lowered from (its fx users say who reads a value).
    schedule : Schedule
        A legal schedule of ``joint.graph`` within ``budget``.
    budget : int
        The budget every rewritten schedule must stay within, in graph units.

    Returns
    -------
    tuple
        As :func:`recompute_in_backward` returns them.
    """
    return recompute_in_backward(joint.graph, schedule, budget, pointwise_candidates(joint, gm),
                                 set(joint.tangent_ids))


def pointwise_candidates(joint: JointGraph, gm: fx.GraphModule) -> list[int]:
    """The node ids, in the Graph's node order, whose values inductor would inline into every backward reader.

    Parameters
    ----------
    gm : fx.GraphModule
        The joint graph ``joint`` was lowered from.

    Returns
    -------
    list of int
        Computed forward values whose own op is pointwise, every backward fx reader a loop op (module docstring);
        whether the schedule saves them is :func:`recompute_in_backward`'s to check.
    """
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    graph = joint.graph
    # multi-output ops, and values read by a node with implementations (whose reads the impl names): never moved
    excluded = {n.output_of for n in graph.nodes if n.output_of is not None}
    excluded |= {source for n in graph.nodes if n.impls for source in n.inputs}
    return [node.id for node in graph.nodes
            if node.id not in excluded and _qualifies(node, graph, joint, fx_nodes)]


def recompute_in_backward(graph: Graph, schedule: Schedule, budget: int, candidates: Iterable[int],
                          tangents: set[int]) -> tuple[Schedule, Validation, tuple[int, ...]]:
    """Move each candidate the schedule saves into the backward, one at a time, while the schedule stays legal and
    within ``budget``.

    Parameters
    ----------
    graph : Graph
        The Graph the schedule runs.
    schedule : Schedule
        A legal schedule within ``budget``.
    budget : int
        The budget in graph units.
    candidates : iterable of int
        Node ids that may move, tried in this order (:func:`pointwise_candidates`).
    tangents : set of int
        The tangents' node ids: the first compute of one is where the schedule's backward starts.

    Returns
    -------
    tuple
        The rewritten schedule, the validator's verdict on it (the input's, when nothing moved) and the node ids
        moved, in the order they were tried.

    Raises
    ------
    CoopError
        When ``schedule`` is not legal within ``budget`` (one line: the validator's reason).
    """
    verdict = validate(graph, schedule, budget)
    if not verdict.ok:
        raise CoopError(f"coop.compile: recompute_in_backward takes a legal schedule within the budget: {verdict.reason}")
    steps = list(schedule.steps)
    moved: list[int] = []
    for node_id in candidates:
        trial = _moved(graph, steps, graph.nodes[node_id], tangents, verdict)
        if trial is None:
            continue
        checked = validate(graph, Schedule(steps=tuple(trial)), budget)
        if checked.ok:
            steps, verdict = trial, checked
            moved.append(node_id)
    return Schedule(steps=tuple(steps)), verdict, tuple(moved)


def _qualifies(node: Node, graph: Graph, joint: JointGraph, fx_nodes: dict[str, fx.Node]) -> bool:
    """A computed forward value, its op pointwise, every backward fx reader a loop op (module docstring)."""
    if (node.kind != "forward" or node.caller_owned or not node.recomputable or node.random or node.impls
            or node.output_of is not None or node.id in graph.outputs):
        return False
    names = joint.lowered.fx_names[node.id]
    own = fx_nodes.get(names[0])
    if own is None or not is_pointwise(own):
        return False
    mine = set(names)
    for user in _users(fx_nodes, names):
        if user.name in mine:
            continue
        owner = joint.lowered.owner_of.get(user.name)
        phase = graph.nodes[owner].kind if owner is not None else None
        if (phase != "forward" or user.name in joint.inlined) and not is_loop_op(user):
            return False  # a backward (or unplaced) reader that needs a buffer: an extern kernel, a view, the output
    return True


def _users(fx_nodes: dict[str, fx.Node], names: Iterable[str]) -> list[fx.Node]:
    return [user for name in names if name in fx_nodes for user in fx_nodes[name].users]


def _moved(graph: Graph, steps: list[Step], node: Node, tangents: set[int], verdict: Validation) -> list[Step] | None:
    """``steps`` with ``compute node`` inserted right before the backward's first read of its forward instance, or
    None where that instance is not read in the backward or an input is not resident there anyway."""
    boundary = next((j for j, s in enumerate(steps) if s.op == "compute" and s.node in tangents), None)
    if boundary is None:
        return None
    first_read = None
    for j in range(boundary, len(steps)):
        step = steps[j]
        if step.node == node.id:
            return None  # computed again or freed before any backward read: its forward instance is not saved
        if step.op == "compute" and node.id in graph.nodes[step.node].inputs:
            first_read = j
            break
    if first_read is None:
        return None
    if any(s.node == node.id for s in steps[:boundary] if s.op != "compute") or \
            not any(s.op == "compute" and s.node == node.id for s in steps[:boundary]):
        return None  # freed or paged in the forward, or never computed there: not a plain saved value
    assert verdict.simulation is not None
    alive = verdict.simulation.instances
    for source in node.inputs:
        if graph.nodes[source].caller_owned:
            continue
        if not any(i.node == source and i.start < first_read <= i.end for i in alive):
            return None  # the recomputation would keep this input alive longer
    return [*steps[:first_read], Step(op="compute", node=node.id), *steps[first_read:]]
