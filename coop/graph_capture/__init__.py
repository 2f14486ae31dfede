"""torch -> Graph: capture one training step (forward + backward) as a coop Graph.

:func:`capture` traces the joint step (the forward and ``torch.autograd.grad``, functionalized)
with ``make_fx`` (see :mod:`coop.graph_capture.trace`), folds views and aliases into the node
that owns their storage and prices every node (:mod:`coop.graph_capture.lower`,
:mod:`coop.graph_capture.cost`). Tracing computes nothing (fake tensors), and no kernel runs on
made-up data anywhere in a capture: storage sizes come from a reviewed table
(:mod:`coop.graph_capture.storage_table`) or, with ``profile``, from the real step on the caller's
parameters and batch; MONeT's programs are priced on fake tensors
(:mod:`coop.graph_capture.alternatives.price`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from coop.errors import CaptureError
from coop.graph_capture.alternatives import add_alternatives
from coop.graph_capture.batch import Batch, read_batch
from coop.graph_capture.captured import Captured, flat_values
from coop.graph_capture.cost import NodeProfile, profile_nodes
from coop.graph_capture.fsdp import find_sharding
from coop.graph_capture.lower import lower
from coop.graph_capture.meta import check_weightless_capture, on_device
from coop.graph_capture.trace import flat_names, split_state, trace_step


def capture(model: nn.Module, example_batch: torch.Tensor | tuple | list | dict | Batch, loss_fn: Callable[..., torch.Tensor] | None = None,
            profile: bool = False, compact_masks: bool = True, alternatives: bool = False,
            device: str | None = None) -> Captured:
    """Capture one training step of ``model`` on ``example_batch`` as a coop Graph.

    With ``profile`` node costs are measured seconds on the batch's device, node bytes the storages the real
    step returned and each node's workspace its measured scratch
    (:func:`coop.graph_capture.cost.measure_workspace`, on every device), else the analytic model of
    :mod:`coop.graph_capture.cost` and the storage table of :mod:`coop.graph_capture.storage_table`.

    Parameters
    ----------
    example_batch : torch.Tensor or tuple or list or dict or Batch
        One batch: a dict of keyword arguments (``model(**batch)``), a tuple or list of positional ones
        (``model(*batch)``) or one tensor (``model(batch)``); arguments may nest tensors in dicts, tuples and
        lists beside None and bool, int, float or str values, which become constants of the captured program
        (:func:`coop.graph_capture.batch.read_batch`).
    loss_fn : callable or None
        ``loss_fn(model, *args, **kwargs)`` (the batch's arguments) returns a scalar; without it the model's call
        must return a scalar tensor or an object with ``.loss`` (transformers' ``ModelOutput``).
    profile : bool
        Measure costs (seconds), storage bytes and workspaces on the real step instead of estimating them.
    compact_masks : bool
        With it (the default) each dropout draw is a bool mask, the only non-recomputable
        node of a dropout (:mod:`coop.graph_capture.random_ops`); ``False`` keeps the traced float draw.
    alternatives : bool
        Also record the implementations PyTorch offers (MONeT: ReLU / hardtanh backward from a compact mask,
        in-place activations; :mod:`coop.graph_capture.alternatives`), priced like the nodes (with ``profile``,
        the analytic model calibrated on the profiled step:
        :class:`~coop.graph_capture.alternatives.price.Calibration`); formulations other than ``monet`` ignore them.
    device : str or None
        For a model on the meta device (no weights, :mod:`coop.graph_capture.meta`): the device the plan will
        run on, where every value is recorded; refused for a model with weights.

    Returns
    -------
    Captured
        The Graph (bytes; seconds), the traced fx module, the placeholders and the maps between them.

    Raises
    ------
    CaptureError
        When ``model`` is not an ``nn.Module``, the batch holds a value that is neither a tensor nor a flag, or
        the step cannot be traced (see
        :func:`coop.graph_capture.trace.trace_step`).
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"capture needs an nn.Module, got {type(model).__name__}")
    read = read_batch(example_batch)
    batch = read.tensors
    weightless_step = check_weightless_capture(model, batch, device, profile=profile, alternatives=alternatives)
    start = time.perf_counter()
    sharding = find_sharding(model)
    if sharding is not None and (profile or alternatives):
        raise CaptureError(f"coop cannot {'profile' if profile else 'offer alternatives for'} the step of an "
                           "FSDP-sharded model yet (its collectives would run); capture it with the analytic costs")
    traced = trace_step(model, batch, loss_fn, compact_masks=compact_masks, layout=read.layout,
                        device=device if weightless_step else None, sharding=sharding)
    params, buffers, frozen = split_state(model)
    placeholders = flat_names(params, buffers, frozen, len(batch))
    profiled: NodeProfile | None = None
    if profile:
        state = {**params, **buffers, **frozen}
        flat = flat_values(placeholders, state, batch)
        with torch.random.fork_rng(devices=[]):  # profiling must not advance the caller's RNG
            profiled = profile_nodes(traced.module, flat)
    allocated_on = torch.device(device) if weightless_step and device is not None else None
    lowered = lower(traced, placeholders, name=type(model).__name__, profiled=profiled, allocated_on=allocated_on)
    found = None
    if alternatives:  # the real parameters let batch norm's backward from its output be offered (nonzero weights)
        names = [n.name for n in traced.module.graph.nodes if n.op == "placeholder"]
        values = dict(zip(names, flat_values(placeholders, {**params, **buffers, **frozen}, batch), strict=True))
        found = add_alternatives(traced.module, lowered.graph, lowered.fx_names, lowered.owner_of, profiled, values)
    graph = found.graph if found is not None else lowered.graph
    return Captured(
        graph=on_device(graph, device) if weightless_step and device is not None else graph,
        module=traced.module,
        placeholders=placeholders,
        grad_names=traced.output_grads,
        buffer_names=traced.output_buffers,
        fx_names=lowered.fx_names,
        owner_of=lowered.owner_of,
        node_flops=lowered.node_flops,
        batch_shapes=[(tuple(t.shape), t.dtype) for t in batch],
        batch_layout=read.layout,
        capture_s=time.perf_counter() - start,
        impl_fx=found.impl_fx if found is not None else {},
        optional_fx=found.optional_fx if found is not None else {},
        sharding=sharding,
    )


__all__ = ["Batch", "Captured", "capture"]
