"""Lower the fx joint graph to a coop Graph (contract 1: :mod:`coop.graph`).

Alias folding is decided by storage identity on the fake values, not by a list of view ops: the
first fx node whose output holds a storage owns it, and a node that creates no new storage (a
view, ``t``, ``expand``, ``_unsafe_view``, a ``getitem`` of a multi-output op, a returned input)
is folded into the owner of the storage it aliases. So every storage is counted once, in the
node that allocates it, and ``mem`` is the sum of the node's new storages' bytes: the bytes of the
storage the real kernel returns, in whole allocator blocks on CUDA
(:func:`coop.graph_capture.cost.allocator_bytes`), so that the measured peak of a replay never
exceeds the simulator's prediction. Some kernels return a storage larger than the fake tensor's
(a mean-reduced ``mse_loss`` keeps its unreduced buffer); no kernel is run on made-up data to learn
it. The size of a storage is, in this order: the real size the profiled step measured
(``capture(..., profile=True)``, :class:`coop.graph_capture.cost.TimingInterpreter`), the reviewed
table of :mod:`coop.graph_capture.storage_table`, the fake value's storage. Where a measured size
differs from the table's (or the fake) prediction, the graph's metadata lists it under
``storage_table_missed``, so a user sees what the table does not know.

A multi-output op (``native_batch_norm``, ``convolution_backward``, ``native_dropout``) owns
only its first output; each further output becomes its own node (not recomputable, cost 0, input
the op) at the ``getitem`` that takes it, so that outputs with different lifetimes are freed at
different times as in eager PyTorch. Such a node names its op in ``output_of``; the extra
outputs count as the op's ``workspace`` (they exist, all together, at the step that runs the op)
and, by contract 2, from right after the op's first compute whatever step a schedule takes them
at, which is where the executor takes them.

Kinds: placeholders are ``param`` (trainable and frozen parameters), ``buffer`` or ``input``
(the batch); constant tensors of the traced module (``get_attr``) are ``buffer`` s too. A computed node is ``forward`` when the loss or a new buffer value depends on it,
else ``backward``: it exists only to compute gradients. Random ops (``Tag.nondeterministic_seeded``:
dropout, bernoulli, rand*) are not recomputable, and the node a random op creates is marked
``random``: the one definition of a random op that everything downstream of the capture reads.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from coop.graph import Graph, Node
from coop.graph_capture.cost import (
    BANDWIDTH,
    FLOP_RATE,
    NodeProfile,
    allocator_bytes,
    node_flops,
    replayed_seconds,
    tensor_leaves,
)
from coop.graph_capture.fsdp import collective_fields
from coop.graph_capture.host_cost import MachineRates, host_costs_enabled, machine_rates
from coop.graph_capture.random_ops import own_scratch_bytes
from coop.graph_capture.storage_table import predicted_storage_bytes
from coop.graph_capture.trace import TracedStep, is_random

PLACEHOLDER_KIND = {"param": "param", "frozen": "param", "buffer": "buffer", "input": "input"}


@dataclass
class Lowered:
    """The Graph and the maps between its node ids and the fx nodes."""

    graph: Graph
    fx_names: dict[int, list[str]]  # graph node id -> fx node names (owner first, then folded)
    owner_of: dict[str, int]  # fx node name -> graph node id
    node_flops: dict[int, int]
    fx_flops: dict[str, int] = field(default_factory=dict)


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of a tensor's storage (fake or real); stable while the storage lives.

    Parameters
    ----------
    tensor : torch.Tensor
        A fake or real tensor.

    Returns
    -------
    int
        Its untyped storage's ``_cdata``.
    """
    return tensor.untyped_storage()._cdata



def lower(traced: TracedStep, placeholder_names: list[tuple[str, str]], name: str,
          profiled: NodeProfile | None = None, allocated_on: torch.device | None = None) -> Lowered:
    """Build the Graph of a traced step: one node per storage-producing fx node.

    With ``profiled`` a node's cost is the measured seconds of its fx nodes, its workspace
    includes their measured transient bytes (scratch, on every device) and its bytes are the storages the
    profiled run measured; else its cost is the analytic estimate and its bytes the storage table's or the fake
    value's (see the module docstring). Views are folded into the node that owns their storage; each extra
    output of a multi-output op becomes its own node where a ``getitem`` first takes it.

    Parameters
    ----------
    traced : TracedStep
        The traced step (:func:`coop.graph_capture.trace.trace_step`).
    placeholder_names : list of (str, str)
        ``(kind, name)`` of each flat placeholder (:func:`coop.graph_capture.trace.flat_names`).
    name : str
        The Graph's name.
    profiled : NodeProfile or None
        Measured seconds, workspaces and storage bytes (:func:`coop.graph_capture.cost.profile_nodes`); None
        for the analytic model.
    allocated_on : torch.device or None
        The device whose allocator will hold every storage, in place of each fake value's own device: a
        weightless capture for CUDA is traced on fake CPU tensors, and its bytes are CUDA's 512-byte blocks
        (:func:`coop.graph_capture.cost.allocator_bytes`) as a capture of the real model's would be.

    Returns
    -------
    Lowered
        The Graph (bytes; seconds) and the maps between it and the fx graph: fx names per node, the owning node
        of each fx name, FLOPs per node and per fx node.
    """
    seconds = profiled.seconds if profiled is not None else None
    rates = _replay_rates(traced, allocated_on) if profiled is None else None
    measured_workspace = profiled.workspace if profiled is not None else {}
    fx_graph = traced.module.graph
    storage_owner: dict[int, int] = {}  # storage key -> graph node id
    owner_of: dict[str, int] = {}
    fx_names: dict[int, list[str]] = {}
    fields: dict[int, dict[str, Any]] = {}
    fx_flops: dict[str, int] = {}
    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    labels = dict(zip((n.name for n in placeholders), placeholder_names, strict=True))

    measured_storage = profiled.storage_bytes if profiled is not None else {}
    measured_devices = profiled.devices if profiled is not None else {}
    moved: list[dict[str, Any]] = []  # outputs the kernel returned on another device than the fake value said
    host_nodes: list[int] = []  # unprofiled: nodes HOST_OUTPUTS puts on the host
    missed: list[dict[str, Any]] = []  # measured storages the table (or the fake value) did not predict
    pending: dict[int, int] = {}  # storage key of a not-yet-extracted extra output -> bytes
    producer: dict[int, int] = {}  # storage key of an extra output -> the node id of its op
    for fx_node in fx_graph.nodes:
        if fx_node.op == "output":
            continue
        tensors = tensor_leaves(fx_node.meta.get("val"))
        new_storages = _new_storages(fx_node, tensors, storage_owner, measured_storage.get(fx_node.name), allocated_on,
                                     missed)
        claimed = {k: pending.pop(k) for k in [storage_key(t) for t in tensors] if k in pending}
        extras: dict[int, int] = {}
        if len(new_storages) > 1 and fx_node.op == "call_function":
            # A multi-output op: its outputs die at different times, so each extra output becomes
            # its own node when a getitem takes it; until then it counts as the op's workspace.
            first = next(iter(new_storages))
            extras = {k: v for k, v in new_storages.items() if k != first}
            new_storages = {first: new_storages[first]}
            pending.update(extras)
            producer.update(dict.fromkeys(extras, len(fields)))
        if claimed:  # the getitem that first takes an extra output owns it
            new_storages = {**new_storages, **claimed}
        if new_storages or fx_node.op in ("placeholder", "get_attr") or not tensors:
            node_id = len(fields)
            for key in new_storages:
                storage_owner[key] = node_id
            fields[node_id] = _new_node_fields(fx_node, node_id, sum(new_storages.values()), labels)
            devices = _real_devices(fx_node, tensors, measured_devices.get(fx_node.name), moved)
            fields[node_id]["device"] = _device_of(tensors, new_storages, devices)
            owned = _owned_index(tensors, new_storages)
            if profiled is None and owned is not None and owned in host_output_indices(fx_node):
                host_nodes.append(node_id)  # where the table put it (for a weightless capture: kept on the host)
            fields[node_id]["workspace"] = sum(extras.values())
            if claimed:  # extracted from a tuple that a recomputation would not keep
                fields[node_id]["recomputable"] = False
                fields[node_id]["output_of"] = producer[next(iter(claimed))]
            fx_names[node_id] = [fx_node.name]
        else:  # an alias: fold it into the owner of its first storage
            node_id = storage_owner[storage_key(tensors[0])]
            fx_names[node_id].append(fx_node.name)
        owner_of[fx_node.name] = node_id
        flops = node_flops(fx_node)
        fx_flops[fx_node.name] = flops
        if fx_node.op == "call_function":
            fields[node_id]["cost"] += seconds.get(fx_node.name, 0.0) if seconds is not None else \
                replayed_seconds(fx_node, flops, rates)
            # scratch of the op (or of a view folded into it) exists only while it runs
            own = own_scratch_bytes(fx_node)  # coop's own ops: known by construction, not measured
            fields[node_id]["workspace"] = max(fields[node_id]["workspace"], sum(extras.values())
                                               + measured_workspace.get(fx_node.name, 0)
                                               + (allocator_bytes(own, allocated_on or tensors[0].device)
                                                  if own else 0))
            fields[node_id].update(collective_fields(fx_node) or {})  # an FSDP collective (coop.graph_capture.fsdp)
        for source in fx_node.all_input_nodes:
            source_id = owner_of[source.name]
            if source_id != node_id and source_id not in fields[node_id]["inputs"]:
                fields[node_id]["inputs"].append(source_id)
        if is_random(fx_node):
            fields[node_id]["recomputable"] = False

    outputs = _output_ids(fx_graph, owner_of, num_grads=len(traced.param_names))
    _mark_forward(fields, outputs["forward"])
    nodes = [Node(**f) for f in fields.values()]
    flops_per_node = {i: 0 for i in fields}
    for fx_name, flops in fx_flops.items():
        flops_per_node[owner_of[fx_name]] += flops
    meta = _capture_meta(profiled, fx_flops, flops_per_node, host_nodes, missed, moved, rates)
    order = [i for i, f in fields.items() if f["kind"] not in PLACEHOLDER_KIND.values()]
    graph = Graph(name=name, nodes=tuple(nodes), outputs=tuple(dict.fromkeys(outputs["all"])), order=tuple(order), meta=meta)
    return Lowered(graph=graph, fx_names=fx_names, owner_of=owner_of, node_flops=flops_per_node, fx_flops=fx_flops)


def _new_storages(fx_node: fx.Node, tensors: list[torch.Tensor], storage_owner: dict[int, int],
                  measured: list[int] | None, allocated_on: torch.device | None,
                  missed: list[dict[str, Any]]) -> dict[int, int]:
    """The storages ``fx_node`` allocates (storage key -> allocator bytes): those of its tensors no earlier node
    owns, measured where the profiled run measured every output, else predicted; a measured size the prediction
    missed is appended to ``missed``."""
    new_storages: dict[int, int] = {}
    predicted = _predicted_bytes(fx_node, tensors)
    if measured is None or len(measured) != len(tensors):
        measured = None
    for index, tensor in enumerate(tensors):
        key = storage_key(tensor)
        if key not in storage_owner and key not in new_storages:
            nbytes = predicted[index] if measured is None else measured[index]
            if nbytes != predicted[index]:
                missed.append({"fx_node": fx_node.name, "op": str(fx_node.target), "output": index,
                               "device": str(tensor.device), "predicted": predicted[index], "measured": nbytes})
            new_storages[key] = allocator_bytes(nbytes, allocated_on or tensor.device)
    return new_storages


def _replay_rates(traced: TracedStep, allocated_on: torch.device | None) -> MachineRates | None:
    """The measured rates an unprofiled CPU step is priced at (:func:`coop.graph_capture.host_cost.machine_rates`, at
    torch's current thread count); None (the nominal model) with host costs off or for a step with CUDA values."""
    if not host_costs_enabled() or (allocated_on is not None and allocated_on.type != "cpu"):
        return None
    for fx_node in traced.module.graph.nodes:
        if fx_node.op == "placeholder" and any(t.device.type != "cpu" for t in tensor_leaves(fx_node.meta.get("val"))):
            return None
    return machine_rates()


def _capture_meta(profiled: NodeProfile | None, fx_flops: dict[str, int], flops_per_node: dict[int, int],
                  host_nodes: list[int], missed: list[dict[str, Any]], moved: list[dict[str, Any]],
                  rates: MachineRates | None = None) -> dict[str, Any]:
    """The captured Graph's ``meta``: units, FLOPs, where the bytes came from, host outputs, the measured rates
    (``host_cost``), and (profiled) what the storage table missed and which outputs moved device."""
    if profiled is not None:
        unit = "seconds (profiled)"
    elif rates is not None:
        unit = "seconds (analytic at this machine's measured rates, with a per-op host cost: coop.graph_capture.host_cost)"
    else:
        unit = f"seconds (analytic: flops / {FLOP_RATE:.0e} FLOP/s + bytes moved / {BANDWIDTH:.0e} B/s)"
    meta: dict[str, Any] = {
        "source": "coop.capture",
        "mem_unit": "bytes",
        "cost_unit": unit,
        "flops": sum(fx_flops.values()),
        "node_flops": {str(i): f for i, f in flops_per_node.items() if f},
        "storage_bytes": "measured on the profiled step" if profiled is not None else
        "storage table (coop.graph_capture.storage_table), else the fake value's storage",
    }
    if rates is not None:
        meta["host_cost"] = rates.as_dict()
    elif profiled is not None and profiled.step_s is not None:
        meta["host_cost"] = {"interpreter_us": round(1e6 * profiled.interpreter_s, 3),
                             "step_ms": round(1e3 * profiled.step_s, 3), "threads": torch.get_num_threads()}
    if host_nodes:
        meta["host_outputs"] = host_nodes
    if profiled is not None:
        meta["storage_table_missed"] = missed
        meta["devices_moved"] = moved
    return meta


def _predicted_bytes(fx_node: fx.Node, tensors: list[torch.Tensor]) -> list[int]:
    """Storage bytes of each output tensor without running anything (:func:`predicted_storage_bytes`)."""
    if fx_node.op != "call_function":
        return [t.untyped_storage().nbytes() for t in tensors]
    args, kwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta.get("val"), (fx_node.args, fx_node.kwargs))
    return predicted_storage_bytes(fx_node.target, args, kwargs, fx_node.meta.get("val"))


def _new_node_fields(fx_node: fx.Node, node_id: int, mem: int, labels: dict[str, tuple[str, str]]) -> dict[str, Any]:
    if fx_node.op == "placeholder":
        kind, label = labels[fx_node.name]
        return {"id": node_id, "name": label, "op": kind, "inputs": [], "mem": mem, "cost": 0.0,
                "kind": PLACEHOLDER_KIND[kind], "recomputable": False}
    if fx_node.op == "get_attr":  # a constant tensor of the traced module: resident like a buffer
        return {"id": node_id, "name": f"constant:{fx_node.target}", "op": "constant", "inputs": [], "mem": mem,
                "cost": 0.0, "kind": "buffer", "recomputable": False}
    return {"id": node_id, "name": fx_node.name, "op": str(fx_node.target), "inputs": [], "mem": mem, "cost": 0.0,
            "kind": "backward", "recomputable": True, "random": is_random(fx_node)}


def output_nodes(fx_graph: fx.Graph) -> list[fx.Node | None]:
    """The flat outputs of the step: loss, one gradient per parameter, one value per buffer.

    Parameters
    ----------
    fx_graph : fx.Graph
        The traced step's graph.

    Returns
    -------
    list of (fx.Node or None)
        The output node's flattened arguments; None for an output that is not a node.
    """
    (flat,) = fx_graph.output_node().args
    return [a if isinstance(a, fx.Node) else None for a in pytree.tree_leaves(flat)]


def _output_ids(fx_graph: fx.Graph, owner_of: dict[str, int], num_grads: int) -> dict[str, list[int]]:
    flat = output_nodes(fx_graph)
    ids = [owner_of[n.name] for n in flat if n is not None]
    # forward roots: the loss and the new buffer values (flat layout: loss, gradients, buffers)
    forward = [flat[0]] + flat[1 + num_grads:]
    return {"all": ids, "forward": [owner_of[n.name] for n in forward if n is not None]}


def _mark_forward(fields: dict[int, dict[str, Any]], roots: list[int]) -> None:
    """Every computed ancestor of a forward root is forward; the rest is backward."""
    stack = list(roots)
    seen: set[int] = set()
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        if fields[node_id]["kind"] == "backward":
            fields[node_id]["kind"] = "forward"
        stack.extend(fields[node_id]["inputs"])


#: outputs a CUDA kernel returns on the host where its meta function says ``meta`` (so a fake value follows the
#: inputs to CUDA): efficient attention's 0-d int64 philox seed and offset (outside CUDA-graph capture), as
#: measured on an H100 (ARCHITECTURE.md, facts). Used where no profiled step says where each output went.
HOST_OUTPUTS: dict[str, tuple[int, ...]] = {
    "aten._scaled_dot_product_efficient_attention.default": (2, 3),
    "aten._efficient_attention_forward.default": (2, 3),
}


def _real_devices(fx_node: fx.Node, tensors: list[torch.Tensor], measured: list[str] | None,
                  moved: list[dict[str, Any]]) -> list[str]:
    """The device of each of ``fx_node``'s output tensors: as the profiled kernel returned it where measured, else
    the fake value's (:data:`HOST_OUTPUTS` on the host). Each measured output the kernel placed elsewhere than
    its fake is noted in ``moved``."""
    faked = [str(t.device) for t in tensors]
    if measured is None or len(measured) != len(faked):
        host = host_output_indices(fx_node)
        return ["cpu" if index in host and tensors[index].dim() == 0 else device for index, device in enumerate(faked)]
    for index, (fake, real) in enumerate(zip(faked, measured, strict=True)):
        if fake != real:
            moved.append({"fx_node": fx_node.name, "op": str(fx_node.target), "output": index, "fake": fake,
                          "real": real})
    return list(measured)


def host_output_indices(fx_node: Any) -> tuple[int, ...]:
    """Indices of ``fx_node``'s outputs that :data:`HOST_OUTPUTS` puts on the host.

    Parameters
    ----------
    fx_node : fx.Node
        A traced node: an op (its own indices in the table) or a ``getitem`` of one output of such an op.

    Returns
    -------
    tuple of int
        The op's host outputs; for a ``getitem`` taking a host output ``(0,)``; else empty.
    """
    if fx_node.target is operator.getitem and fx_node.args and isinstance(fx_node.args[0], fx.Node):
        source, index = fx_node.args[0], fx_node.args[1]
        return (0,) if index in HOST_OUTPUTS.get(str(source.target), ()) else ()
    return HOST_OUTPUTS.get(str(fx_node.target), ())


def _device_of(tensors: list[torch.Tensor], new_storages: dict[int, int], devices: list[str]) -> str | None:
    """The device of the storage a node owns (its first new one; a placeholder's own): ``"cuda:0"``, ``"cpu"``.

    None for a node that holds no tensor. An extra output of a multi-output op is its own node with its own
    device: efficient attention's philox seed and offset are CPU tensors beside its CUDA output (the fake
    value puts them on CUDA; ``devices``, the profiled step's, says where the kernel put them)."""
    owned = _owned_index(tensors, new_storages)
    return devices[owned] if owned is not None else None


def _owned_index(tensors: list[torch.Tensor], new_storages: dict[int, int]) -> int | None:
    """The index of the output whose storage a node owns (its first new one, else its first output)."""
    owned = [i for i, t in enumerate(tensors) if storage_key(t) in new_storages] or list(range(len(tensors)))
    return owned[0] if owned else None
