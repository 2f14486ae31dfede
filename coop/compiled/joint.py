"""The joint graph inductor hands a partitioner, as a coop Graph (contract 1).

``torch.compile`` traces a training step into one joint forward+backward aten graph (AOTAutograd) and asks a
partitioner to split it into the forward module, which returns the values it saves, and the backward module.
Its placeholders are the primals (parameters, buffers and the batch; ``static_lifetime_input_indices`` names the
parameters and buffers) and one tangent per differentiable forward output; its outputs are the forward outputs,
then one gradient per primal (None where a primal gets none).

The lowering is coop's own (:func:`coop.graph_capture.lower.lower`: one node per storage, views folded into the
node that owns their storage, bytes from the fake tensors, analytic costs from FLOPs and bytes moved), run on a
copy of the joint graph with three changes that give the compiled step's semantics:

* Each tangent becomes a computed node (not recomputable, cost 0) whose inputs are the forward outputs: the
  gradient of the loss exists only once the forward has returned, so no schedule can run a node that reads
  it before the forward is done. Its first compute is where a schedule's forward ends. Each tangent is also a
  Graph output, held to the end of the step: autograd passes the gradients to the compiled backward as the
  arguments of one call, which hold them until the backward returns, whatever the backward frees (the allocator's
  events of a compiled step show the loss's 4 B gradient freed only after the last gradient is written).
* In-place updates of inputs that the forward keeps in the graph (batch norm's running statistics:
  ``copy_(buffer, new_value)``) are taken out of the lowered copy; their new values become Graph outputs, so
  every schedule keeps them until the forward module writes them back at its end
  (:mod:`coop.compiled.emit`).
* Inductor's RNG: ``prims.inductor_seeds`` draws the seeds (a random op, never recomputed); the random values are
  ``prims.inductor_random`` of a seed, a pure function, so a recomputed dropout mask is the same mask.
* A view's fake value shares its input's storage, which is how the lowering folds views: inductor's joint-graph
  passes may leave a view whose fake value has a storage of its own (LLaMA's attention: ``expand(div)`` after the
  softmax, a second 2 MiB storage per layer). Such a view's value is derived again from its input's
  (:func:`views_share_storage`), so that it folds into its input's node as the compiled kernel's view does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import fx

from coop.compiled.fusion import fuse_pointwise
from coop.compiled.observed import Observation, inline_unbuffered
from coop.compiled.pricing import (
    DRAWS,
    inlined_recomputations,
    recomputation_rates,
    recomputations_at_rates,
    reprice,
    step_rates,
    unwritten_seconds,
)
from coop.errors import CoopError
from coop.graph import Graph
from coop.graph_capture.cost import BANDWIDTH
from coop.graph_capture.host_cost import MachineRates
from coop.graph_capture.lower import Lowered, lower
from coop.graph_capture.trace import TracedStep

__all__ = ["JointGraph", "effect_nodes", "joint_outputs", "lower_joint", "views_share_storage"]

TANGENT_OP = "tangent"
#: ``lower_joint``'s pricings (:mod:`coop.compiled.pricing`)
PRICINGS = ("draws", "fused", "measured", "nominal")


@dataclass
class JointGraph:
    """The coop Graph of a joint graph and what the emitter needs to map a schedule back onto it."""

    graph: Graph
    lowered: Lowered
    #: graph node ids of the tangents (computed nodes here; see the module docstring)
    tangent_ids: tuple[int, ...]
    num_fwd_outputs: int
    #: fx names of the in-place updates of inputs, emitted at the end of the forward module
    effects: tuple[str, ...]
    #: joint fx name -> its fake value; an emitted copy of a node holds the same object
    values: dict[str, object]
    #: fx names of the values an observed round showed inductor never writes (:mod:`coop.compiled.observed`):
    #: no node of their own, written out again right before each node that reads them
    inlined: frozenset[str] = frozenset()


def joint_outputs(gm: fx.GraphModule, num_fwd_outputs: int) -> tuple[list[object], list[object]]:
    """The forward outputs and the per-primal gradients (None where a primal gets no gradient).

    Parameters
    ----------
    num_fwd_outputs : int
        How many leading outputs the forward returns.

    Returns
    -------
    tuple of two lists
        The forward outputs, then the gradients, as the output node holds them.
    """
    (flat,) = gm.graph.output_node().args
    flat = list(flat)
    return flat[:num_fwd_outputs], flat[num_fwd_outputs:]


def effect_nodes(graph: fx.Graph) -> list[fx.Node]:
    """Calls of mutating ops (``copy_`` into a buffer): they run once, at the end of the forward.

    Returns
    -------
    list of fx.Node
        Its calls whose op schema mutates an argument.
    """
    return [n for n in graph.nodes if n.op == "call_function" and _is_mutating(n)]


def _is_mutating(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def lower_joint(gm: fx.GraphModule, num_fwd_outputs: int, static_indices: list[int] | None,
                name: str = "compiled", fuse: bool = True, device: torch.device | None = None,
                observation: Observation | None = None, pricing: str = "fused") -> JointGraph:
    """Lower inductor's joint graph to a coop Graph; refuse in one line what the compiled path cannot plan.

    Parameters
    ----------
    gm : fx.GraphModule
        The joint graph (``primals_*`` and ``tangents_*`` placeholders), left unchanged.
    num_fwd_outputs : int
        How many of its outputs the forward returns (the rest are the primals' gradients).
    static_indices : list of int or None
        Indices of the primals that are parameters or buffers (inductor's ``static_lifetime_input_indices``).
    name : str
        The Graph's name.
    fuse : bool
        Contract the values inductor's pointwise fusion never writes (:mod:`coop.compiled.fusion`).
    device : torch.device or None
        The device whose allocator sizes the values (a meta-device joint graph planned for CUDA); None: each
        value's own device.
    observation : Observation or None
        What an earlier compiled round of this joint graph showed: its unbuffered values are inlined into their
        readers and its temporaries charged as workspace (:mod:`coop.compiled.observed`).
    pricing : str
        ``"nominal"``: the capture's nominal model; ``"draws"``: the nominal model, the random draws
        (inductor's, or coop's mask draws of eager's) at this machine's measured price per element; ``"fused"``
        (default): ``"draws"``, and each pointwise value the backward recomputes priced as inductor fuses it into its
        readers (:func:`coop.compiled.pricing.inlined_recomputations`, at the nominal bandwidth); on a CPU step each
        recomputation is priced at this machine's measured rates instead, the step's first computes as before
        (:func:`coop.compiled.pricing.recomputations_at_rates`); ``"measured"``: every op of
        a CPU step at this machine's compiled rates, the fused recomputations so too (:mod:`coop.compiled.pricing`).
        A CUDA step's draws are priced nominally.
    """
    if pricing not in PRICINGS:
        raise CoopError(f"coop.compile: pricing={pricing!r}; give one of {', '.join(PRICINGS)}")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    _refuse_unplannable(gm, placeholders)
    static = set(static_indices or [])
    primals = [n for n in placeholders if n.name.startswith("primals")]
    labels: list[tuple[str, str]] = []
    for node in placeholders:
        if node.name.startswith("tangents"):
            labels.append(("input", node.name))
        else:
            labels.append(("param" if primals.index(node) in static else "input", node.name))

    copied = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    copied.graph_copy(gm.graph, remap)  # every node but the output, under its own name
    effects = effect_nodes(copied)
    effect_sources = [a for e in effects for a in e.all_input_nodes if a.op != "placeholder"]
    for effect in effects:
        copied.erase_node(effect)
    views_share_storage(copied)
    fwd, grads = joint_outputs(gm, num_fwd_outputs)
    fwd = [remap[a] if isinstance(a, fx.Node) else a for a in fwd]
    grads = [remap[a] for a in grads if isinstance(a, fx.Node)]
    if not fwd or not isinstance(fwd[0], fx.Node):
        raise CoopError("coop.compile: the compiled forward returns no tensor first; return the loss (or a "
                        "model output) as a tensor")
    # coop's lowering reads (loss, gradients..., further forward values...): the forward roots are the first
    # value and everything after the gradients.
    roots = [fwd[0], *grads, *[a for a in fwd[1:] if isinstance(a, fx.Node)], *effect_sources]
    copied.output(tuple(roots))
    module = fx.GraphModule(gm, copied)
    traced = TracedStep(module=module, param_names=[f"grad{i}" for i in range(len(grads))], buffer_names=[],
                        frozen_names=[], batch_size=0, output_grads=[], output_buffers=[])
    lowered = lower(traced, labels, name, allocated_on=device)
    rates = step_rates(placeholders, device) if pricing != "nominal" else None
    fx_by_name = {n.name: n for n in copied.nodes}
    at_rates = None
    # the recomputations' prices (pricing.recomputations_at_rates)
    if pricing == "fused" and fuse and rates is not None:
        at_rates, _ = _priced_lowering(replace(lowered), fx_by_name, placeholders, recomputation_rates(rates),
                                       only=None, fuse=True, fused_rates=rates, inline_bandwidth=rates.bandwidth)
    inline_bandwidth = None
    if fuse and (pricing == "fused" or (rates is not None and pricing == "measured")):
        inline_bandwidth = rates.bandwidth if rates is not None and pricing == "measured" else BANDWIDTH
    lowered, tangent_ids = _priced_lowering(lowered, fx_by_name, placeholders, rates,
                                            only=None if pricing == "measured" else DRAWS, fuse=fuse,
                                            fused_rates=rates if pricing == "measured" else None,
                                            inline_bandwidth=inline_bandwidth)
    if at_rates is not None:
        lowered = recomputations_at_rates(lowered, at_rates.graph)
    graph = lowered.graph
    inlined: frozenset[str] = frozenset()
    if observation is not None:
        rebuilt = inline_unbuffered(lowered, {n.name: n for n in copied.nodes}, observation, set(tangent_ids))
        lowered, inlined = rebuilt.lowered, rebuilt.names
        graph, tangent_ids = lowered.graph, tuple(rebuilt.new_id[t] for t in tangent_ids)
    return JointGraph(graph=graph, lowered=lowered, tangent_ids=tangent_ids, num_fwd_outputs=num_fwd_outputs,
                      effects=tuple(e.name for e in effects),
                      values={n.name: n.meta.get("val") for n in gm.graph.nodes}, inlined=inlined)


def _priced_lowering(lowered: Lowered, fx_nodes: dict[str, fx.Node], placeholders: list[fx.Node],
                     rates: MachineRates | None, only: frozenset[str] | None, fuse: bool,
                     fused_rates: MachineRates | None,
                     inline_bandwidth: float | None) -> tuple[Lowered, tuple[int, ...]]:
    """The lowering priced (``rates``: :func:`coop.compiled.pricing.reprice` of the ops ``only`` names; None keeps
    the nominal model), its tangents made nodes, its pointwise values fused (the unwritten traffic at
    ``fused_rates``' bandwidth, None: nominal) and its recomputed pointwise values priced as inlined at
    ``inline_bandwidth`` (None: not so priced); and the tangents' node ids."""
    if rates is not None:
        lowered = reprice(lowered, fx_nodes, rates, only=only)
    lowered.graph, tangent_ids = _tangents_after_forward(lowered, placeholders)
    if fuse:
        lowered, new_id = fuse_pointwise(lowered, fx_nodes, set(tangent_ids), unwritten_seconds(fused_rates))
        tangent_ids = tuple(new_id[t] for t in tangent_ids)
        if inline_bandwidth is not None:
            lowered = inlined_recomputations(lowered, fx_nodes, inline_bandwidth)
    return lowered, tangent_ids


def views_share_storage(graph: fx.Graph) -> list[str]:
    """Give each view whose fake value has a storage of its own a value that aliases its input's (in place).

    A view op (its schema's result aliases an argument and writes nothing) returns its input's storage when it
    runs; its fake value may not (module docstring). In graph order, each such view's value is computed again
    by the op itself, under the fake mode of the graph's values, from its inputs' (already corrected) values.
    The node's meta is replaced, not mutated: a copied graph's nodes share their meta values with the original.

    Parameters
    ----------
    graph : fx.Graph
        A graph whose nodes carry fake values in ``meta["val"]`` (the lowering's copy of a joint graph).

    Returns
    -------
    list of str
        The names of the views given a new value.
    """
    fake_mode = None
    changed: list[str] = []
    for node in graph.nodes:
        source = _viewed_argument(node)
        if source is None:
            continue
        value, viewed = node.meta.get("val"), source.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(viewed, torch.Tensor):
            continue
        if value.untyped_storage()._cdata == viewed.untyped_storage()._cdata:
            continue
        if fake_mode is None:
            fake_mode = torch._guards.detect_fake_mode([viewed])
            if fake_mode is None:
                raise CoopError(f"coop.compile: {node.name} carries no fake value to derive its view from")
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
        with fake_mode:
            derived = node.target(*args, **kwargs)
        if derived.shape != value.shape or derived.stride() != value.stride() or derived.dtype != value.dtype:
            raise CoopError(f"coop.compile: {node.name} ({node.target}) derived again is {tuple(derived.shape)} "
                            f"{derived.stride()}, not the joint graph's {tuple(value.shape)} {value.stride()}")
        node.meta = {**node.meta, "val": derived}
        changed.append(node.name)
    return changed


def _viewed_argument(node: fx.Node) -> fx.Node | None:
    """The argument whose storage a view op's one result aliases; None for any other node."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or len(schema.returns) != 1 or not schema.arguments:
        return None
    alias = schema.returns[0].alias_info
    if alias is None or alias.is_write or schema.is_mutable:
        return None
    first = schema.arguments[0].alias_info
    if first is None or not set(alias.before_set) & set(first.before_set):
        return None
    return node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None


def _refuse_unplannable(gm: fx.GraphModule, placeholders: list[fx.Node]) -> None:
    for node in placeholders:
        if not node.name.startswith(("primals", "tangents")):
            raise CoopError(f"coop.compile: the joint graph has an input {node.name!r} coop cannot plan "
                            "(functionalized RNG offsets or backward state); compile with coop off for this model")
        if not isinstance(node.meta.get("val"), torch.Tensor):
            raise CoopError(f"coop.compile: input {node.name!r} is a symbolic size: coop plans static shapes; "
                            "pass dynamic=False to coop.compile (one plan per input shape)")
    for node in gm.graph.nodes:
        if node.op == "call_function" and _is_mutating(node) and node.meta.get("partitioner_tag") in (
                "is_backward", "must_be_in_backward"):
            raise CoopError(f"coop.compile: {node.name} ({node.target}) mutates an input in the backward; coop "
                            "cannot plan it yet: compile this model without coop")
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload) and \
                node.target.__name__ != "getitem":
            raise CoopError(f"coop.compile: {node.name} calls {node.target} (a higher-order op or a Python "
                            "function), which coop cannot plan yet: compile this model without coop")


def _tangents_after_forward(lowered: Lowered, placeholders: list[fx.Node]) -> tuple[Graph, tuple[int, ...]]:
    """Turn each tangent placeholder into a computed node that reads the forward outputs (module docstring)."""
    graph = lowered.graph
    tangent_ids = tuple(lowered.owner_of[n.name] for n in placeholders if n.name.startswith("tangents"))
    roots = tuple(i for i in graph.outputs if graph.nodes[i].kind == "forward" and not graph.nodes[i].caller_owned)
    nodes = list(graph.nodes)
    for t in tangent_ids:
        nodes[t] = nodes[t].model_copy(update={"kind": "backward", "op": TANGENT_OP, "inputs": roots,
                                               "recomputable": False, "cost": 0.0})
    order = _stable_topological(nodes, [*graph.order, *tangent_ids])
    return Graph(name=graph.name, nodes=tuple(nodes), outputs=(*graph.outputs, *tangent_ids), order=tuple(order),
                 meta=graph.meta), tangent_ids


def _stable_topological(nodes: list, wanted: list[int]) -> list[int]:
    """``wanted`` reordered as little as needed for every node to follow its computed inputs."""
    position = {n: i for i, n in enumerate(wanted)}
    done: set[int] = set()
    order: list[int] = []
    pending = sorted(wanted, key=position.__getitem__)
    while pending:
        for index, node_id in enumerate(pending):
            if all(i in done or i not in position for i in nodes[node_id].inputs):
                order.append(node_id)
                done.add(node_id)
                del pending[index]
                break
        else:  # pragma: no cover - the joint graph is a DAG
            raise CoopError("coop.compile: the joint graph has a cycle")
    return order
