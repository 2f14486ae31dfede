"""The scratch an extern kernel of a compiled CPU step takes while it runs, measured and charged as workspace.

Inductor generates loops for pointwise ops and reductions (their buffers are what
:class:`~coop.compiled.inductor_buffers.BufferObserver` sees), but calls ATen for the rest: its fallback ops
(``convolution_backward``, CPU attention) and the ops it lowers to an extern kernel (``convolution``, the matmuls).
Such a kernel allocates inside itself, out of the observer's sight and out of the Graph, which lowers it by its
outputs alone: ResNet at 0.7 of bench_compile (2026-11-29) held 2,254,040 B against a budget of 2,246,305 B and a
plan of 2,246,304 B, the CPU allocator's peak at the first convolution's ``convolution_backward``, where oneDNN
allocated a 524,288 B copy of the gradient it was given (the size of that gradient) besides the grad weight; the
plan's own peak, at another step, held a value of that size instead.

:func:`extern_scratch` runs each such op of the joint graph once on tensors of its fake values' sizes, strides and
dtypes (after one warm-up run, so that oneDNN's primitive cache is not taken for scratch), inside a profiler range:
the CPU allocator's peak within the range less what is still allocated at its end (the outputs) is the op's
scratch, the quantity :func:`coop.graph_capture.cost.measure_workspace` takes for an eager capture.
:func:`charge_scratch` adds it to the workspace of the Graph node that computes the op, which the simulator counts
at the step that runs it. Only a CPU step is measured (a CUDA step's extern kernels are planned as before).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes

from coop.compiled.fusion import is_loop_op
from coop.graph import Graph
from coop.graph_capture.cost import quiet_profile
from coop.graph_capture.lower import Lowered

__all__ = ["EXTERN_LOWERED", "charge_scratch", "extern_scratch", "is_extern"]

_aten = torch.ops.aten
#: ops inductor lowers to a call of the ATen kernel (``extern_kernels.*``) rather than a loop
EXTERN_LOWERED = frozenset({_aten.convolution.default, _aten.mm.default, _aten.addmm.default, _aten.bmm.default,
                            _aten.baddbmm.default})
#: the profiler range prefix around each measured op
_RANGE = "coop_scratch::"


def is_extern(node: fx.Node) -> bool:
    """Whether inductor runs this joint node as an ATen kernel: one of its fallbacks or :data:`EXTERN_LOWERED`.

    Loop ops (pointwise, the reductions inductor generates) are not, whatever their eager kernel allocates.
    """
    if node.op != "call_function" or is_loop_op(node):
        return False
    from torch._inductor.lowering import fallbacks

    return node.target in EXTERN_LOWERED or node.target in fallbacks


def extern_scratch(nodes: Iterable[fx.Node]) -> dict[str, int]:
    """Each extern CPU node's scratch in bytes, by fx name (module docstring); nodes with none are left out.

    An op whose inputs are not all CPU tensors of known sizes, or that fails on the made-up inputs (integers are
    zeros, floats standard normal), is left out: planned without scratch, as before.

    Parameters
    ----------
    nodes : iterable of fx.Node
        Nodes of a joint graph with ``meta["val"]`` (fake tensors); those that are not :func:`is_extern` are
        skipped.

    Returns
    -------
    dict of str to int
        fx node name -> bytes allocated and freed inside the op beyond its outputs.
    """
    if torch._C._autograd._profiler_enabled():
        return {}  # another profiler runs (a measured step): nothing measured now
    with _disable_current_modes():  # inductor partitions under its fake mode: these tensors must be real
        return _measure(nodes)


def _measure(nodes: Iterable[fx.Node]) -> dict[str, int]:
    """:func:`extern_scratch` with no dispatch mode active."""
    runnable = [node for node in nodes if is_extern(node) and _on_cpu(node)]
    measured: dict[tuple[Any, ...], int] = {}
    by_key: dict[str, tuple[Any, ...]] = {}
    pending: list[tuple[tuple[Any, ...], fx.Node]] = []
    for node in runnable:
        key = _signature(node)
        by_key[node.name] = key
        if key not in measured and all(key != k for k, _ in pending):
            pending.append((key, node))
    for key, node in pending:  # the warm-up: oneDNN's primitive cache and other one-off allocations
        if not _run(node):
            measured[key] = 0
    todo = [(key, node) for key, node in pending if key not in measured]
    if todo:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), quiet_profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            for index, (_, node) in enumerate(todo):
                args, kwargs = _inputs(node)
                with torch.profiler.record_function(f"{_RANGE}{index}"):
                    out = node.target(*args, **kwargs)
                del out, args, kwargs
        measured.update(zip((key for key, _ in todo), _transients(prof, len(todo)), strict=True))
    return {name: measured[key] for name, key in by_key.items() if measured.get(key, 0) > 0}


def charge_scratch(lowered: Lowered, scratch: dict[str, int]) -> Lowered:
    """``lowered`` with each measured scratch added to the workspace of the node that owns its fx name.

    Parameters
    ----------
    lowered : Lowered
        A lowering of the joint graph (left unchanged).
    scratch : dict of str to int
        fx name -> bytes (:func:`extern_scratch`).

    Returns
    -------
    Lowered
        The same lowering with a new Graph whose charged nodes have the larger workspace.
    """
    extra: dict[int, int] = {}
    for name, nbytes in scratch.items():
        node_id = lowered.owner_of.get(name)
        if node_id is not None:
            extra[node_id] = extra.get(node_id, 0) + nbytes
    if not extra:
        return lowered
    graph = lowered.graph
    nodes = tuple(node.model_copy(update={"workspace": node.workspace + extra[node.id]})
                  if node.id in extra and not node.caller_owned else node for node in graph.nodes)
    rebuilt = Graph(name=graph.name, nodes=nodes, outputs=graph.outputs, order=graph.order, meta=graph.meta)
    return replace(lowered, graph=rebuilt)


def _on_cpu(node: fx.Node) -> bool:
    """Whether every tensor the node reads or returns is a CPU tensor with concrete sizes."""
    values = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    tensors = [v for value in values for v in (value if isinstance(value, (tuple, list)) else (value,))
               if isinstance(v, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" and not _symbolic(t) for t in tensors)


def _symbolic(tensor: torch.Tensor) -> bool:
    return any(not isinstance(s, int) for s in (*tensor.shape, *tensor.stride()))


def _signature(node: fx.Node) -> tuple[Any, ...]:
    """What the scratch depends on: the op, its inputs' sizes, strides and dtypes, and its other arguments."""

    def describe(value: Any) -> Any:
        if isinstance(value, fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor):
                return (tuple(val.shape), tuple(val.stride()), str(val.dtype))
            return repr(val)
        if isinstance(value, (list, tuple)):
            return tuple(describe(v) for v in value)
        return repr(value)

    return (str(node.target), describe(node.args), tuple(sorted((k, describe(v)) for k, v in node.kwargs.items())))


def _inputs(node: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Real tensors in place of the node's fake inputs (same sizes, strides, dtypes)."""

    def real(value: fx.Node) -> Any:
        val = value.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return val
        tensor = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype)
        return tensor.normal_() if tensor.dtype.is_floating_point else tensor.zero_()

    args = fx.node.map_arg(node.args, real)
    kwargs = fx.node.map_arg(node.kwargs, real)
    return args, kwargs


def _run(node: fx.Node) -> bool:
    """Run the node once on made-up inputs; False when the op fails on them."""
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            args, kwargs = _inputs(node)
            node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 -- an op that cannot run on made-up inputs is planned without scratch
        return False
    return True


def _transients(prof: Any, count: int) -> list[int]:
    """Per measured range ``0 .. count-1``: the CPU allocator's peak inside it less what is still allocated at its
    end."""
    events = prof.profiler.kineto_results.events()
    ranges = {int(e.name()[len(_RANGE):]): (e.start_ns(), e.start_ns() + e.duration_ns())
              for e in events if e.name().startswith(_RANGE)}
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    result = []
    for index in range(count):
        start, end = ranges.get(index, (0, -1))
        running = peak = 0
        for time_ns, nbytes in memory:
            if start <= time_ns <= end:
                running += nbytes
                peak = max(peak, running)
        result.append(max(0, peak - max(running, 0)))
    return result
