"""The kernels of an FSDP step's collectives, and the end of its backward: FSDP's own machinery.

A step captured from an FSDP2-sharded model (:mod:`coop.graph_capture.fsdp`) calls two ops that
this module implements on real tensors:

* ``coop::fsdp_all_gather``: each parameter's padded shard gathered with the unit's process group
  (``all_gather_into_tensor``) straight into its aligned place in the unit's buffer. A gather is a
  copy, so the full parameters are FSDP's bit for bit; the schedule may run it again (a re-gather
  before the backward, as FSDP's ``reshard_after_forward`` does).
* ``coop::fsdp_reduce_scatter``: the unit's full gradients set as its unsharded parameters'
  ``.grad`` (the parameters the loss reaches, by their index in the group) and handed to the unit's
  ``FSDPParamGroup.post_backward``, which reduce-scatters them
  exactly as FSDP eager's backward hook does (its division by the world size, its accumulation
  into the sharded ``.grad``). FSDP keeps the reduce-scatter's padded input alive until the next
  unit's reduce on a side stream; here the compute stream waits for the collective and the input
  is released at once, so the step holds what the Graph says (the reduce's workspace).

:class:`FsdpSync` is to FSDP what :class:`coop.runtime.executor.GradientSync` is to DDP: after the
replay it runs FSDP's root post-backward callback (every unit back to idle, pending
reduce-scatters waited for), so the next forward, an optimizer step or ``clip_grad_norm_`` see
FSDP as eager leaves it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from coop.errors import ContextError, CoopError
from coop.graph_capture.captured import Captured
from coop.graph_capture.fsdp import ALL_GATHER, REDUCE_SCATTER, UNITS, ShardedUnit, segment_bytes, segments

#: torch 2.13 names it all_gather_single (all_gather_into_tensor is deprecated there); older torch has only the latter
_ALL_GATHER_INTO = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_KERNELS = torch.library.Library("coop", "IMPL")  # noqa: TOR901 - the ops are defined in coop.graph_capture.fsdp


def _unit(key: int) -> ShardedUnit:
    unit = UNITS.get(key)
    if unit is None:
        raise CoopError(f"FSDP unit {key} of this program is gone (its capture was released); plan the model again")
    return unit


def _all_gather(shards: list[torch.Tensor], unit: int, world_size: int) -> torch.Tensor:
    found = _unit(unit)
    group = found.group._all_gather_process_group
    gathered = torch.empty((sum(segment_bytes(s, world_size) for s in shards),), dtype=torch.uint8,
                           device=shards[0].device)
    for shard, where in zip(shards, segments(shards, world_size), strict=True):
        _ALL_GATHER_INTO(gathered[where].view(shard.dtype), shard, group=group)
    return gathered


def _reduce_scatter(grads: list[torch.Tensor], params: list[int], unit: int, world_size: int) -> torch.Tensor:
    group = _unit(unit).group
    for index, grad in zip(params, grads, strict=True):
        fsdp_param = group.fsdp_params[index]
        if not fsdp_param.sharded_param.requires_grad:
            raise ContextError(f"FSDP parameter {fsdp_param._param_fqn} no longer requires grad, the plan was captured "
                               "with it trainable; make a new plan")
        fsdp_param.unsharded_param.grad = grad
    group.post_backward()
    for state in _reduces_in_flight(group.comm_ctx):  # the compute stream waits; the reduce's input can then go
        if state.event is not None:
            group.device_handle.current_stream().wait_event(state.event)
    return grads[0].new_empty((0,))


def _reduces_in_flight(context: Any) -> list[Any]:
    """The reduce-scatters FSDP keeps in flight (each holding its padded input), taken from its communication
    context: a list in torch >= 2.11, one slot in older torch."""
    if hasattr(context, "reduce_scatter_states"):
        states = list(context.reduce_scatter_states)
        context.reduce_scatter_states.clear()
        return states
    state, context.reduce_scatter_state = context.reduce_scatter_state, None
    return [state] if state is not None else []


_KERNELS.impl(ALL_GATHER, _all_gather, "CompositeExplicitAutograd")
_KERNELS.impl(REDUCE_SCATTER, _reduce_scatter, "CompositeExplicitAutograd")


class FsdpSync:
    """What a replayed step of an FSDP-sharded model runs around its program (FSDP's root hooks).

    ``before_step`` refuses, in one line, FSDP settings the plan cannot honour at this step
    (``set_requires_gradient_sync(False)``: FSDP would keep unsharded gradients across steps, outside the
    plan's budget); ``release`` ends FSDP's backward as its root's final callback does.
    """

    def __init__(self, captured: Captured) -> None:
        if captured.sharding is None:
            raise CoopError("FsdpSync needs a capture of an FSDP-sharded model")
        self.sharding = captured.sharding

    def before_step(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Check FSDP's settings for this step; returns the batch unchanged."""
        for unit in self.sharding.units:
            if not unit.group.reduce_grads:
                raise ContextError(f"FSDP unit {unit.label} has set_requires_gradient_sync(False): FSDP would keep "
                                   "unsharded gradients between steps, outside the plan's budget; accumulate with "
                                   "gradient sync on (each step reduce-scatters into the sharded .grad)")
        return batch

    def release(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """The gradients are with FSDP already (the step's reduce-scatters): run its root post-backward callback."""
        self.sharding.root_state._root_post_backward_final_callback()


__all__ = ["FsdpSync"]
