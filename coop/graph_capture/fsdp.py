"""A model sharded by FSDP2 (``fully_shard``): its step captured with the collectives as nodes of the Graph.

FSDP shards every parameter on dim 0 across the ranks of its mesh. Before a unit (an FSDP module's
parameter group) computes, FSDP all-gathers the unit's full parameters; after its backward it
reduce-scatters their gradients, and each rank keeps its shard of the averaged gradient. A rank's
step therefore holds the shards for the whole step, and a unit's full parameters only between its
all-gather and its last use; whether to keep them from forward to backward or gather them again
is exactly FSDP's ``reshard_after_forward`` choice, which coop makes per unit in the schedule.

The capture (:func:`find_sharding`, :func:`sharded_step_state`, :func:`place_collectives`) makes
these lifetimes part of the Graph:

* the step's parameter placeholders are the rank's padded local shards (FSDP's own
  ``_sharded_param_data``): caller-owned, counted at their real bytes;
* each unit's all-gather is one op, ``coop::fsdp_all_gather`` (the unit's shards in, one byte
  buffer out holding every full parameter of the unit, each at a 512-byte aligned offset), and the
  unit's parameters are views of that buffer. The buffer is an ordinary value: the schedule frees
  it after its last use and may compute it again (a re-gather) before the backward;
* each unit's reduce-scatter is one op, ``coop::fsdp_reduce_scatter`` (the unit's full gradients
  in; out, the rank's shard of the reduced gradients, which FSDP keeps in each parameter's
  ``.grad``). It is not recomputable (it hands gradients to FSDP) and its workspace is the padded
  gradients FSDP copies in before the collective, twice (:func:`collective_fields`);
* each op sits in the program where FSDP would run it: an all-gather right before the unit's first
  use, a reduce-scatter right after the unit's last gradient.

The ops' kernels are FSDP's own machinery (:mod:`coop.runtime.fsdp`): the all-gather copies each
shard into place with the FSDP process group's ``all_gather_into_tensor`` (a copy: the gathered
parameters are FSDP's, bit for bit), and the reduce-scatter hands the gradients to the unit's
``FSDPParamGroup.post_backward``, so the reduction, its division by the world size and the sharded
``.grad`` are FSDP eager's. Only FSDP2 on a one-dimensional mesh with dim-0 sharding, no mixed
precision and no CPU offload is planned; anything else is refused in one line (:func:`refusal`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from coop.errors import CaptureError

#: Bytes between the starts of two parameters in a unit's gathered buffer: the CUDA allocator's block size, so
#: every gathered parameter is as aligned as the separate allocation FSDP eager gives it.
ALIGNMENT = 512

#: Nominal bytes per second of the link a collective crosses (NVLink / InfiniBand class), for the analytic cost.
LINK_BANDWIDTH = 50e9

ALL_GATHER = "fsdp_all_gather"
REDUCE_SCATTER = "fsdp_reduce_scatter"

_LIBRARY = torch.library.Library("coop", "FRAGMENT")  # noqa: TOR901 - the kernels live in coop.runtime.fsdp
_LIBRARY.define(f"{ALL_GATHER}(Tensor[] shards, int unit, int world_size) -> Tensor")
_LIBRARY.define(f"{REDUCE_SCATTER}(Tensor[] grads, int[] params, int unit, int world_size) -> Tensor")

#: The units of live captures by key: the kernels look their FSDP parameter group up here.
UNITS: weakref.WeakValueDictionary[int, ShardedUnit] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def segment_bytes(shard: torch.Tensor, world_size: int) -> int:
    """Bytes a parameter takes in its unit's gathered buffer: its padded full size, aligned to :data:`ALIGNMENT`.

    Parameters
    ----------
    shard : torch.Tensor
        The rank's padded local shard (one-dimensional, as FSDP keeps it).
    world_size : int
        Ranks of the shard group.

    Returns
    -------
    int
        ``world_size`` times the shard's bytes, rounded up to a multiple of :data:`ALIGNMENT`.
    """
    return math.ceil(shard.numel() * shard.element_size() * world_size / ALIGNMENT) * ALIGNMENT


def segments(shards: list[torch.Tensor], world_size: int) -> list[slice]:
    """Where each parameter's gathered bytes lie in its unit's buffer: one after the other, each starting at a
    multiple of :data:`ALIGNMENT` (the one layout the fake op, the traced views and the kernel share).

    Parameters
    ----------
    shards : list of torch.Tensor
        The unit's padded local shards, in the group's order.
    world_size : int
        Ranks of the shard group.

    Returns
    -------
    list of slice
        Per shard, the byte range of its padded full parameter; the buffer's size is :func:`segment_bytes` summed.
    """
    placed = []
    offset = 0
    for shard in shards:
        placed.append(slice(offset, offset + shard.numel() * shard.element_size() * world_size))
        offset += segment_bytes(shard, world_size)
    return placed


def _reduced_numel(grads: list[torch.Tensor], world_size: int) -> int:
    """Elements of a rank's shard of a unit's reduced gradients: each gradient padded on dim 0 to the world size."""
    total = 0
    for grad in grads:
        rows = grad.shape[0] if grad.dim() else 1
        total += math.ceil(rows / world_size) * (grad.numel() // max(rows, 1))
    return total


@torch.library.register_fake(f"coop::{ALL_GATHER}")
def _all_gather_fake(shards: list[torch.Tensor], unit: int, world_size: int) -> torch.Tensor:
    total = sum(segment_bytes(shard, world_size) for shard in shards)
    return shards[0].new_empty((total,), dtype=torch.uint8)


@torch.library.register_fake(f"coop::{REDUCE_SCATTER}")
def _reduce_scatter_fake(grads: list[torch.Tensor], params: list[int], unit: int, world_size: int) -> torch.Tensor:
    return grads[0].new_empty((_reduced_numel(grads, world_size),))


@dataclass(eq=False)
class ShardedUnit:
    """One FSDP parameter group: the parameters all-gathered and reduce-scattered together.

    ``names`` are the parameters' names in the model (``named_parameters``), in the group's order;
    ``group`` is FSDP's ``FSDPParamGroup``, whose ``fsdp_params`` hold the shards.
    """

    key: int
    label: str
    names: list[str]
    shapes: list[torch.Size]
    group: Any
    world_size: int

    def shards(self) -> list[torch.Tensor]:
        """The rank's padded local shards, now (FSDP may replace them, e.g. on ``load_state_dict``)."""
        return [fsdp_param._sharded_param_data for fsdp_param in self.group.fsdp_params]


@dataclass(eq=False)
class Sharding:
    """How FSDP shards a model: its units (one shard group, whose process group this holds) and FSDP's states."""

    units: list[ShardedUnit]
    root_state: Any
    process_group: Any
    #: sharded on the meta device (a plan made without weights, under a fake process group): nothing runs
    weightless: bool = False
    #: every FSDP state of the model (one per ``fully_shard`` call), whose forward hooks the trace takes off
    states: list[Any] = field(default_factory=list)

    def shard_state(self) -> dict[str, torch.Tensor]:
        """Every sharded parameter's padded local shard, by the parameter's name."""
        return {name: shard for unit in self.units for name, shard in zip(unit.names, unit.shards(), strict=True)}


def fsdp_version(module: nn.Module) -> int | None:
    """Which FSDP wrapped ``module``: coop's one FSDP detection.

    Returns
    -------
    int or None
        2 for FSDP2 (``fully_shard``: an ``FSDPModule``, which coop plans), 1 for FSDP1 (a
        ``FullyShardedDataParallel`` wrapper, refused), None for neither (and where torch.distributed is not built).
    """
    if not torch.distributed.is_available():
        return None
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel  # lazy: needs torch.distributed

    if isinstance(module, FSDPModule):
        return 2
    return 1 if isinstance(module, FullyShardedDataParallel) else None


def refusal(model: nn.Module) -> str:
    """Why coop cannot plan ``model``'s FSDP sharding ('' when it can, or the model is not sharded).

    Parameters
    ----------
    model : nn.Module
        The model as given to ``coop.plan`` (runs FSDP's lazy initialisation where it is sharded from its root).

    Returns
    -------
    str
        One line naming what is refused and the fix, or ''.
    """
    sharded = [name for name, module in model.named_modules() if fsdp_version(module) == 2]
    if not sharded:
        return ""
    if sharded[0] != "":
        return (f"coop plans an FSDP model from its root: apply fully_shard to the whole model too (submodule "
                f"{sharded[0]!r} is sharded, the model is not)")
    names = {id(param): name for name, param in model.named_parameters()}
    for where, group in _param_groups(model):
        if group.mp_policy.param_dtype is not None or group.mp_policy.reduce_dtype is not None:
            return (f"coop cannot plan FSDP mixed precision ({where}: MixedPrecisionPolicy with param_dtype or "
                    "reduce_dtype); shard without it and train under torch.autocast")
        if type(group.offload_policy).__name__ == "CPUOffloadPolicy":
            return f"coop cannot plan FSDP's CPU offload ({where}); shard without offload_policy"
        if type(group.mesh_info).__name__ != "FSDPMeshInfo":
            return (f"coop plans FSDP on a one-dimensional mesh only ({where} is {type(group.mesh_info).__name__}: "
                    "HSDP or replication); shard over a 1-D DeviceMesh")
        for fsdp_param in group.fsdp_params:
            name = names.get(id(fsdp_param.sharded_param), "?")
            if fsdp_param.fsdp_placement.dim != 0 or fsdp_param.is_dtensor:
                return (f"coop plans FSDP parameters sharded on dim 0 only ({name}); drop shard_placement_fn and "
                        "tensor parallelism")
            if len(fsdp_param._orig_size) == 0:
                return f"coop cannot plan the 0-dimensional FSDP parameter {name}"
    return ""


def _param_groups(model: nn.Module) -> list[tuple[str, Any]]:
    """Each FSDP parameter group of ``model`` with its module's name ('<root>' for the model's own), in module
    order. FSDP's lazy initialisation runs first where the model has weights; a model on the meta device (sharded
    under a fake process group, to plan without the cluster) keeps its groups as ``fully_shard`` made them."""
    if not on_meta(model):
        model._get_fsdp_state()._lazy_init()
    return [(name, group) for name, state in _fsdp_states(model) for group in state_groups(state)]


def _fsdp_states(model: nn.Module) -> list[tuple[str, Any]]:
    """Each FSDP state of ``model`` (one per ``fully_shard`` call) with its first module's name, in module order."""
    found: dict[int, tuple[str, Any]] = {}
    for name, module in model.named_modules():
        if fsdp_version(module) == 2:
            state = module._get_fsdp_state()
            found.setdefault(id(state), (name or "<root>", state))
    return list(found.values())


def on_meta(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are on the meta device (FSDP shards of a model built without weights).

    Parameters
    ----------
    model : nn.Module
        An FSDP-sharded model.

    Returns
    -------
    bool
        True where any parameter is a meta tensor.
    """
    return any(p.device.type == "meta" for p in model.parameters())


def state_groups(state: Any) -> list[Any]:
    """An FSDP state's parameter groups: torch >= 2.11 keeps a list (one group per mesh), older torch one or none.

    Returns
    -------
    list
        Its ``FSDPParamGroup`` s.
    """
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    return [state._fsdp_param_group] if state._fsdp_param_group is not None else []


def find_sharding(model: nn.Module) -> Sharding | None:
    """The FSDP sharding of ``model`` (None for a model FSDP does not shard); refuses what coop cannot plan.

    Runs FSDP's lazy initialisation, and gathers each unit once through FSDP (``unshard`` then
    ``reshard``, a collective every rank runs) so that FSDP holds the unsharded parameters whose
    ``.grad`` its ``post_backward`` reduces. A model sharded on the meta device (built without weights and
    ``fully_shard``-ed under a fake process group of the cluster's world size) is read as ``fully_shard`` left
    it: its plan is made for any rank of that cluster and saved, to be loaded there (``coop.load_plan``).

    Parameters
    ----------
    model : nn.Module
        The model, FSDP2-sharded from its root or not sharded at all.

    Returns
    -------
    Sharding or None
        The units in module order, the root state, the shard group's process group and FSDP's states.

    Raises
    ------
    CaptureError
        For a sharding coop cannot plan (:func:`refusal`).
    """
    why = refusal(model)
    if why:
        raise CaptureError(why)
    if fsdp_version(model) != 2:
        return None
    groups = _param_groups(model)
    names = {id(param): name for name, param in model.named_parameters()}
    weightless = on_meta(model)
    units = []
    for label, group in groups:
        for module in group.modules if not weightless else ():  # FSDP makes its unsharded parameters here
            module.unshard()
            module.reshard()
        world_size = group.mesh_info.shard_mesh_size
        unit = ShardedUnit(key=next(_KEYS), label=label,
                           names=[names[id(p.sharded_param)] for p in group.fsdp_params],
                           shapes=[p._orig_size for p in group.fsdp_params], group=group, world_size=world_size)
        UNITS[unit.key] = unit
        units.append(unit)
    world = {unit.world_size for unit in units}
    if len(world) != 1:
        raise CaptureError(f"coop plans FSDP with one shard group; this model's units shard over {sorted(world)} ranks")
    return Sharding(units=units, root_state=model._get_fsdp_state(),
                    process_group=groups[0][1].mesh_info.shard_process_group, weightless=weightless,
                    states=[state for _, state in _fsdp_states(model)])


def sharded_step_state(sharding: Sharding, shards: dict[str, torch.Tensor],
                       trainable: set[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Inside the traced step: each unit all-gathered, its full parameters as views of the gathered buffer.

    Parameters
    ----------
    sharding : Sharding
        The model's FSDP units.
    shards : dict of str to torch.Tensor
        The step's shard placeholders by parameter name.
    trainable : set of str
        Names of the parameters that require grad; their full views become leaves requiring grad.

    Returns
    -------
    tuple of (dict, dict)
        The full parameters by name, and per unit key the names of its trainable parameters.
    """
    full: dict[str, torch.Tensor] = {}
    for unit in sharding.units:
        unit_shards = [shards[name] for name in unit.names]
        gathered = torch.ops.coop.fsdp_all_gather(unit_shards, unit.key, unit.world_size)
        placed = segments(unit_shards, unit.world_size)
        for name, shape, shard, where in zip(unit.names, unit.shapes, unit_shards, placed, strict=True):
            rows = shard.numel() * unit.world_size // max(math.prod(shape[1:]), 1)
            view = gathered[where].view(shard.dtype).view((rows, *shape[1:]))[:shape[0]]
            full[name] = view.detach().requires_grad_(name in trainable)
    return full, {unit.key: [n for n in unit.names if n in trainable] for unit in sharding.units}


def reduce_gradients(sharding: Sharding, grads: dict[str, torch.Tensor | None],
                     trainable_by_unit: dict[int, list[str]]) -> dict[str, torch.Tensor]:
    """Inside the traced step: each unit's gradients reduce-scattered (last unit first, as FSDP's backward runs).

    Parameters
    ----------
    sharding : Sharding
        The model's FSDP units.
    grads : dict of str to (torch.Tensor or None)
        The full gradient of each trainable parameter, by name (None where the loss does not reach it: FSDP eager
        hands no gradient of it to ``post_backward`` either).
    trainable_by_unit : dict of int to list of str
        Per unit key, its trainable parameters' names (:func:`sharded_step_state`).

    Returns
    -------
    dict of str to (torch.Tensor or None)
        Per unit label, the rank's shard of its reduced gradients (units without a trainable parameter left out;
        None for a unit whose parameters the loss does not reach).
    """
    reduced: dict[str, torch.Tensor | None] = {}
    for unit in _reducing_units(sharding, set(grads)):
        names = [name for name in trainable_by_unit[unit.key] if grads[name] is not None]
        # None where the loss reaches none of them: FSDP eager reduces nothing
        reduced[_unit_output_name(unit)] = torch.ops.coop.fsdp_reduce_scatter(
            [grads[name] for name in names], [unit.names.index(name) for name in names], unit.key,
            unit.world_size) if names else None
    return reduced


def sharded_gradient_names(sharding: Sharding, trainable: set[str]) -> list[str]:
    """The step's gradient outputs under FSDP, in :func:`reduce_gradients`' order: one per unit with a trainable
    parameter.

    Parameters
    ----------
    sharding : Sharding
        The model's FSDP units.
    trainable : set of str
        Names of the parameters that require grad.

    Returns
    -------
    list of str
        ``fsdp:<unit label>`` per such unit, last unit first.
    """
    return [_unit_output_name(unit) for unit in _reducing_units(sharding, trainable)]


def _reducing_units(sharding: Sharding, trainable: set[str]) -> list[ShardedUnit]:
    """The units with a trainable parameter, in the order the backward reduces them (the last unit first)."""
    return [unit for unit in reversed(sharding.units) if any(n in trainable for n in unit.names)]


def _unit_output_name(unit: ShardedUnit) -> str:
    """The name a unit's reduced gradients go by among the step's gradient outputs."""
    return f"fsdp:{unit.label}"


def _is_collective(node: fx.Node, name: str | None = None) -> bool:
    """Whether ``node`` calls one of coop's FSDP collectives (``name``: that one)."""
    schema = getattr(node.target, "_schema", None)
    names = (name,) if name is not None else (ALL_GATHER, REDUCE_SCATTER)
    return node.op == "call_function" and schema is not None and schema.name in {f"coop::{n}" for n in names}


def place_collectives(graph: fx.Graph) -> None:
    """Move each all-gather (and the views of its buffer) right before the first op that reads a parameter it
    gathers, and each reduce-scatter right after the last gradient it reads: where FSDP runs them.

    The trace gathers every unit before the forward and reduces after the whole backward; moving them keeps
    every dependency (a gather reads only placeholders, a reduce only gradients) and makes the captured program
    order, the Graph's baseline, FSDP's own order.

    Parameters
    ----------
    graph : fx.Graph
        The traced step's graph, changed in place.
    """
    position = {node: index for index, node in enumerate(graph.nodes)}
    for gather in [n for n in graph.nodes if _is_collective(n, ALL_GATHER)]:
        chain = [gather]
        members = {gather}
        for member in chain:  # the views of the buffer: view ops all of whose inputs are in the chain
            for user in member.users:
                if user not in members and user.op == "call_function" and getattr(user.target, "is_view", False) \
                        and set(user.all_input_nodes) <= members:
                    chain.append(user)
                    members.add(user)
        readers = [user for member in chain for user in member.users if user not in members]
        first = min(readers, key=position.__getitem__)
        for node in sorted(chain, key=position.__getitem__):
            first.prepend(node)
        position = {node: index for index, node in enumerate(graph.nodes)}
    for reduce in [n for n in graph.nodes if _is_collective(n, REDUCE_SCATTER)]:
        last = max(reduce.all_input_nodes, key=position.__getitem__)
        last.append(reduce)
        position = {node: index for index, node in enumerate(graph.nodes)}


@contextlib.contextmanager
def hooks_suppressed(sharding: Sharding | None) -> Iterator[None]:
    """FSDP's forward hooks (which all-gather and reshard on real tensors) taken off while the step is traced.

    Only the hooks FSDP's states registered are removed, and put back in their place afterwards; a user's own
    hooks on the same modules stay and are traced.

    Parameters
    ----------
    sharding : Sharding or None
        The model's FSDP units; None: nothing to take off.

    Yields
    ------
    None
        While FSDP's hooks are off.
    """
    if sharding is None:
        yield
        return
    states = sharding.states
    saved: list[tuple[dict, list]] = []
    for state in states:
        for module in state._modules:
            for hooks in (module._forward_pre_hooks, module._forward_hooks):
                saved.append((hooks, list(hooks.items())))
                for key in [key for key, hook in hooks.items() if any(_owner(hook) is s for s in states)]:
                    del hooks[key]
    try:
        yield
    finally:
        for hooks, items in reversed(saved):  # each dict back as it was, FSDP's hooks in their places
            hooks.clear()
            hooks.update(items)


def _owner(hook: Any) -> Any:
    """The object a hook is bound to, looking through ``functools.wraps`` wrappers."""
    while hook is not None and not hasattr(hook, "__self__"):
        hook = getattr(hook, "__wrapped__", None)
    return getattr(hook, "__self__", None)


def collective_fields(fx_node: fx.Node) -> dict[str, Any] | None:
    """What a collective's Graph node says beyond its traced value (None for any other node): its cost at
    :data:`LINK_BANDWIDTH` for the bytes a rank receives; for an all-gather, the largest parameter's gathered
    bytes as its workspace (gloo receives each parameter into a buffer of its own, then copies it into place;
    NCCL needs none, so on CUDA it is an upper bound); for a reduce-scatter, not recomputable (it hands the
    gradients to FSDP), with twice the padded gradients as its workspace (FSDP copies them into one buffer and
    gloo stages that buffer once more; NCCL reduces in place, so on CUDA it is again an upper bound).

    Parameters
    ----------
    fx_node : fx.Node
        A node of the traced step, its fake value in ``meta["val"]``.

    Returns
    -------
    dict or None
        The Graph node's fields to set (``cost``, ``workspace``, ``recomputable``), or None.
    """
    if not _is_collective(fx_node):
        return None
    value = fx_node.meta["val"]
    received = value.numel() * value.element_size()
    world_size = fx_node.args[-1]
    if _is_collective(fx_node, ALL_GATHER):  # gloo stages each parameter's gather through a buffer of its size
        staged = max(segment_bytes(shard.meta["val"], world_size) for shard in fx_node.args[0])
        return {"cost": received / LINK_BANDWIDTH, "workspace": staged}
    padded = received * world_size  # FSDP's copy of the padded gradients, and gloo's staging copy of it
    return {"cost": padded / LINK_BANDWIDTH, "recomputable": False, "workspace": 2 * padded}


__all__ = [
    "ALIGNMENT",
    "ALL_GATHER",
    "LINK_BANDWIDTH",
    "REDUCE_SCATTER",
    "UNITS",
    "ShardedUnit",
    "Sharding",
    "collective_fields",
    "find_sharding",
    "fsdp_version",
    "hooks_suppressed",
    "on_meta",
    "place_collectives",
    "reduce_gradients",
    "refusal",
    "segment_bytes",
    "segments",
    "sharded_gradient_names",
    "sharded_step_state",
    "state_groups",
]
