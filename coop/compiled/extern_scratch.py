"""Extern kernels' internal scratch, measured on a real step of the compiled module and matched to joint nodes.

An extern kernel (an ATen call in inductor's generated code: a convolution, its backward, a matmul, CPU
attention) may allocate memory inside itself and give it back before it returns: oneDNN's copy of a convolution's
gradient in its own layout is one. Neither the Graph (lowered from the joint values) nor inductor's buffers
(:mod:`coop.compiled.inductor_buffers`) see it, so a plan at its budget can hold more than the budget by it.

:func:`profiled_calls` reads it from a step that ran on the user's example batch, never from made-up inputs: the
allocator's own reports to ``torch.profiler`` (``profile_memory=True``, the meter of
:func:`coop.runtime.meter.cpu_allocation_peak`), with the ATen calls' input shapes (``record_shapes=True``). Every
op call made directly by a compiled graph's generated code (an ATen or a custom op, not nested in another call,
inside inductor's ``## Call CompiledFxGraph`` range) is a range; within it the running sum of the allocation events reaches a peak,
and what is still allocated at its end is the call's outputs: its scratch is the peak less that, as
:func:`coop.graph_capture.cost.measure_workspace` reads an eager step's nodes.

:func:`match_calls` gives each call to a node of the module inductor compiled for that graph, as
:func:`call_sites` read it at emission (the forward's for a step's first compiled call, the backward's for its
second): the same ATen op, the call's leading non-empty input shapes equal to the node's tensor inputs' (an ``out=``
buffer follows them), the k-th such call to the k-th such node in the module's order. The node's joint value (the emitter's mark, kept through inductor's passes) names the
joint node whose Graph node is charged the scratch as workspace in the next round
(:attr:`coop.compiled.observed.Observation.scratch`), less what the lowering already charges that op by construction
(:func:`coop.graph_capture.random_ops.own_scratch_bytes`: ``coop::dropout_mask``). A call with scratch that matches no
node is not charged; the round's note says how many bytes went unmatched and of which ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._ops import HigherOrderOperator
from torch.utils import _pytree as pytree

from coop.compiled.first_dropout import REJOINED
from coop.compiled.inductor_buffers import JOINT_VALUE
from coop.graph_capture.cost import quiet_profile, transient_bytes
from coop.graph_capture.random_ops import MASK_DRAWS, dropout_mask_scratch, native_dropout_scratch

__all__ = ["CALL_RANGE", "CallSite", "KernelCall", "ScratchMatch", "call_sites", "joint_value", "match_calls",
           "profiled_calls", "scratch_note"]

#: the profiler range inductor's compiled graphs run in (``CompiledFxGraph.__call__``)
CALL_RANGE = "## Call CompiledFxGraph"


@dataclass(frozen=True)
class KernelCall:
    """One ATen call a compiled graph's generated code made, with the scratch it took and gave back."""

    #: the ATen op as the profiler names it (``aten::convolution_backward``)
    op: str
    #: the non-empty input shapes, in order (scalars and lists of ints have none)
    shapes: tuple[tuple[int, ...], ...]
    #: the most bytes allocated inside the call beyond what it left allocated at its end
    scratch: int


def profiled_calls(run: Callable[[], Any], device: str = "cpu") -> list[list[KernelCall]] | None:
    """Per compiled graph call of ``run``, in order, the ATen calls its generated code made and their scratch.

    Parameters
    ----------
    run : callable
        One step on the real batch (a forward and its backward), called once, under a forked CPU generator.
    device : str
        The device type whose allocator's events count (``"cpu"``, ``"cuda"``).

    Returns
    -------
    list of list of KernelCall or None
        One list per ``## Call CompiledFxGraph`` range, in the order they ran; None (``run`` not called) while
        another profiler runs.
    """
    from torch.profiler import ProfilerActivity

    if torch._C._autograd._profiler_enabled():
        return None
    with torch.random.fork_rng(devices=[]), quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                                          record_shapes=True) as prof:
        run()
    events = list(prof.profiler.kineto_results.events())
    wanted = torch.device(device).type
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and str(e.device_type()).rsplit(".", 1)[-1].lower() == wanted)
    graphs = sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.start_thread_id()) for e in events
                    if e.name().startswith(CALL_RANGE))
    calls = sorted((e for e in events if _is_op(e.name())), key=lambda e: (e.start_ns(), -e.duration_ns()))
    found: list[list[KernelCall]] = []
    for start, end, thread in graphs:
        inside = [e for e in calls if start <= e.start_ns() and e.start_ns() + e.duration_ns() <= end
                  and e.start_thread_id() == thread]
        top, reach = [], -1
        for event in inside:
            if event.start_ns() >= reach:  # not nested in the call before it
                top.append(event)
                reach = event.start_ns() + event.duration_ns()
        found.append([KernelCall(op=e.name(), shapes=tuple(tuple(s) for s in e.shapes() if s),
                                 scratch=transient_bytes(memory, e.start_ns(), e.start_ns() + e.duration_ns()))
                      for e in top])
    return found


def _is_op(name: str) -> bool:
    """Whether a profiler event names a dispatcher op (``aten::mm``, a custom ``lib::op``), not a range."""
    return "::" in name and not name.startswith(("#", "autograd::", "[")) and " " not in name


def joint_value(node: fx.Node) -> str | None:
    """The joint fx name an emitted node computes (the emitter's mark, or its copy in ``meta["custom"]``)."""
    if JOINT_VALUE in node.meta:
        return node.meta[JOINT_VALUE]
    custom = node.meta.get("custom")
    return custom.get(JOINT_VALUE) if isinstance(custom, dict) else None


@dataclass
class ScratchMatch:
    """The measured calls matched to joint values: what to charge and what matched nothing."""

    #: joint fx name -> the largest scratch of a call matched to a node computing it
    charged: dict[str, int] = field(default_factory=dict)
    #: (op, scratch) of the calls with scratch that matched no node
    unmatched: list[tuple[str, int]] = field(default_factory=list)
    #: calls measured with scratch, matched or not
    with_scratch: int = 0
    #: (op, bytes) of the matched calls whose scratch the lowering charges by construction (coop's own ops)
    known: list[tuple[str, int]] = field(default_factory=list)


def _called(node: fx.Node) -> tuple[Any, tuple[Any, ...]] | None:
    """The op a call node runs and its operands, seen through inductor's ``control_deps`` wrapper.

    With eager's random kernels (``fallback_random``) inductor keeps the draws in program order by wrapping each
    random op after the first in ``control_deps(deps, subgraph, *operands)``, the op itself inside ``subgraph``;
    the generated code still calls the op, so the measured call is the wrapped op's.
    """
    if node.op != "call_function":
        return None
    if isinstance(node.target, HigherOrderOperator) and node.target.name() == "control_deps":
        holder = node.args[1]
        owner = node.graph.owning_module
        subgraph = getattr(owner, holder.target, None) if isinstance(holder, fx.Node) and owner is not None else None
        inner = [n for n in subgraph.graph.nodes if n.op == "call_function"] if subgraph is not None else []
        return (inner[0].target, tuple(node.args[2:])) if len(inner) == 1 else None
    return node.target, (node.args, node.kwargs)


def _signature(node: fx.Node) -> tuple[str, tuple[tuple[int, ...], ...]] | None:
    """The ATen op name and the non-empty shapes of a call node's tensor inputs; None for anything else."""
    called = _called(node)
    schema = getattr(called[0], "_schema", None) if called is not None else None
    if schema is None:
        return None
    shapes = []
    for leaf in pytree.tree_leaves(called[1]):
        value = leaf.meta.get("val") if isinstance(leaf, fx.Node) else None
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            shapes.append(tuple(int(d) for d in value.shape))
    return schema.name, tuple(shapes)


def _known_scratch(node: fx.Node) -> int:
    """The scratch coop's lowering already charges the op of ``node`` by construction (0 for any other op)."""
    called = _called(node)
    rejoined = called is not None and called[0] is torch.ops.aten.native_dropout.default and node.meta.get(REJOINED)
    if called is None or (called[0] not in MASK_DRAWS and not rejoined):
        return 0
    operands = pytree.tree_leaves(called[1])
    if not operands:
        return 0
    return native_dropout_scratch(operands[0]) if rejoined else dropout_mask_scratch(operands[0])


@dataclass(frozen=True)
class CallSite:
    """One op call of an emitted module, as :func:`match_calls` matches measured calls to it."""

    #: the ATen op as the profiler names it
    op: str
    #: the non-empty shapes of its tensor inputs, in order
    shapes: tuple[tuple[int, ...], ...]
    #: the joint value it computes (None: not one of the emitter's nodes)
    joint: str | None
    #: the scratch coop's lowering already charges it by construction
    known: int


def call_sites(module: fx.GraphModule) -> list[CallSite]:
    """The op calls of an emitted module, in order, read before inductor compiles it.

    Read at emission: once AOTAutograd has compiled a module it may clear every node's ``meta`` (its cache's
    ``serialize_graph_module``: the backward's, after the first backward), and with it the shapes and the joint
    values (ResNet's 41 backward convolutions matched no node so, 2026-11-30).
    """
    sites = []
    for node in module.graph.nodes:
        signature = _signature(node)
        if signature is not None:
            sites.append(CallSite(signature[0], signature[1], joint_value(node), _known_scratch(node)))
    return sites


def match_calls(calls: list[list[KernelCall]], modules: list[list[CallSite]]) -> ScratchMatch:
    """Each measured call with scratch matched to an op call of the module of its compiled graph (module docstring).

    Parameters
    ----------
    calls : list of list of KernelCall
        Per compiled graph call, its ATen calls (:func:`profiled_calls`).
    modules : list of list of CallSite
        The op calls of the modules inductor compiled (:func:`call_sites`), in the order the step calls them (the
        forward, then the backward).

    Returns
    -------
    ScratchMatch
        Joint fx name -> bytes to charge, and the calls left unmatched.
    """
    match = ScratchMatch()
    for graph_calls, sites in zip(calls, modules, strict=False):
        untaken: dict[str, list[CallSite]] = {}  # per op, its sites not yet matched, in the module's order
        for site in sites:
            untaken.setdefault(site.op, []).append(site)
        for call in graph_calls:
            candidates = untaken.get(call.op, [])
            index = next((i for i, site in enumerate(candidates) if call.shapes[:len(site.shapes)] == site.shapes),
                         None)
            site = candidates.pop(index) if index is not None else None
            if call.scratch <= 0:
                continue
            match.with_scratch += 1
            if site is None or site.joint is None:
                match.unmatched.append((call.op, call.scratch))
                continue
            if site.known:
                match.known.append((call.op, min(site.known, call.scratch)))
            if call.scratch > site.known:  # beyond what the Graph already charges the op
                match.charged[site.joint] = max(match.charged.get(site.joint, 0), call.scratch - site.known)
    for graph_calls in calls[len(modules):]:
        match.unmatched.extend((c.op, c.scratch) for c in graph_calls if c.scratch > 0)
    return match


def scratch_note(match: ScratchMatch | None, calls: int | None) -> str:
    """The round's words for what was measured: charged bytes, unmatched calls, or why nothing was measured.

    Parameters
    ----------
    match : ScratchMatch or None
        The matched calls; None when nothing was measured.
    calls : int or None
        How many compiled graph calls the profiled step made; None when it did not run (another profiler).
    """
    if match is None:
        why = ("another profiler was running" if calls is None else
               f"the step made {calls} compiled graph calls, not a forward and a backward")
        return f"extern kernels' scratch not measured ({why})"
    text = (f"extern kernels' scratch measured on the example batch: {len(match.charged)} joint values charged "
            f"{sum(match.charged.values()):,} B")
    if match.known:
        text += (f"; {len(match.known)} calls of coop's own ops with {sum(b for _, b in match.known):,} B charged by "
                 "construction")
    if match.unmatched:
        ops = sorted({op for op, _ in match.unmatched})
        text += (f"; {len(match.unmatched)} calls with {sum(b for _, b in match.unmatched):,} B of scratch matched "
                 f"no node and are not charged ({', '.join(ops)})")
    return text
