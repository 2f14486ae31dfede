"""Cost model of captured nodes: FLOPs from torch's FLOP registry, analytic seconds, profiling.

The analytic cost of an fx node is ``flops / FLOP_RATE + bytes_moved / BANDWIDTH`` seconds,
where ``flops`` comes from ``torch.utils.flop_counter``'s registry (the formulas FlopCounterMode
uses, so the graph's total FLOPs equal FlopCounterMode's count on the eager step) and
``bytes_moved`` is the bytes of the tensors the op reads and writes; the bandwidth term keeps
pointwise ops from looking free. The rates are nominal (a CPU core-ish machine), recorded in the
graph's metadata with the unit.

Nothing here runs a kernel on made-up data (measured on an H100: an
attention backward on zero-filled inputs killed the process). Real storage sizes come from the
reviewed table of :mod:`coop.graph_capture.storage_table` and, when capture profiles, from the real
step itself: :class:`TimingInterpreter` runs the captured program on the caller's parameters and
batch and records each node's real storage bytes next to its time.
"""

from __future__ import annotations

import bisect
import contextlib
import operator
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import flop_registry

from coop.errors import CaptureError
from coop.graph_capture.host_cost import MachineRates, element_key, host_costs_enabled, kernel_calls

FLOP_RATE = 1e11  # FLOP/s, nominal
BANDWIDTH = 2e10  # bytes/s, nominal

#: The CUDA caching allocator hands out blocks in multiples of 512 bytes (``kMinBlockSize`` in
#: c10/cuda/CUDACachingAllocator.cpp), and ``torch.cuda.memory_allocated`` counts whole blocks.
CUDA_BLOCK_BYTES = 512


def node_flops(node: fx.Node) -> int:
    """FLOPs of one fx call node, by the formula FlopCounterMode applies to its op (0 if none).

    Parameters
    ----------
    node : fx.Node
        A node of a traced step, with fake values in ``meta["val"]``.

    Returns
    -------
    int
        The op's FLOPs; 0 for a node that is not a ``call_function`` or whose op has no formula.
    """
    if node.op != "call_function":
        return 0
    packet = getattr(node.target, "_overloadpacket", None)
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    args, kwargs = pytree.tree_map(_fake_value, (node.args, node.kwargs))
    return int(formula(*args, **kwargs, out_val=node.meta.get("val")))


def _fake_value(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, fx.Node) else arg


def _tensor_bytes(value: Any) -> int:
    leaves = pytree.tree_leaves(value)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def bytes_moved(node: fx.Node) -> int:
    """Bytes read (tensor arguments) plus bytes written (outputs) by one fx node.

    None for a view (an op whose output aliases its input: ``view``, ``slice``, ``t``, ``expand``, ...) or a
    ``getitem`` of a multi-output op's tuple, which move no data (counting the viewed tensor made a
    channel-blocked program pay for the whole tensor once per block, and a ``getitem`` for every tensor of the
    tuple).

    Parameters
    ----------
    node : fx.Node
        A node of a traced step, with fake values in ``meta["val"]``.

    Returns
    -------
    int
        Bytes moved; 0 for a view or a ``getitem``.
    """
    if node.target is operator.getitem or getattr(node.target, "is_view", False):
        return 0
    reads = sum(_tensor_bytes(arg.meta.get("val")) for arg in node.all_input_nodes)
    return reads + _tensor_bytes(node.meta.get("val"))


def analytic_seconds(node: fx.Node, flops: int) -> float:
    """The analytic cost of one fx node: ``flops / FLOP_RATE + bytes_moved(node) / BANDWIDTH``.

    Parameters
    ----------
    node : fx.Node
        A node of a traced step.
    flops : int
        Its FLOPs (:func:`node_flops`).

    Returns
    -------
    float
        Seconds, on the nominal rates :data:`FLOP_RATE` (FLOP/s) and :data:`BANDWIDTH` (bytes/s).
    """
    return flops / FLOP_RATE + bytes_moved(node) / BANDWIDTH


def replayed_seconds(node: fx.Node, flops: int, rates: MachineRates | None) -> float:
    """The cost of one fx call node as a replay runs it: the analytic model at the machine's measured rates plus its
    host cost (:mod:`coop.graph_capture.host_cost`), or the nominal :func:`analytic_seconds` without rates.

    Parameters
    ----------
    node : fx.Node
        A ``call_function`` node of a traced step.
    flops : int
        Its FLOPs (:func:`node_flops`).
    rates : MachineRates or None
        The calibration of the thread count the step runs at; None for the nominal model.

    Returns
    -------
    float
        Seconds: ``per_op + flops / flop_rate + bytes / bandwidth`` (and the thread pool's wake-up for an op that
        writes at least a grain of elements with more than one thread; an op the calibration priced per element pays
        the larger of its elements' time and its bytes', a convolution its kernel calls and FLOPs at its fitted rates:
        :meth:`MachineRates.op_seconds`); 0 for a ``getitem`` of a tuple, which dispatches nothing.
    """
    if rates is None:
        return analytic_seconds(node, flops)
    moved = bytes_moved(node)
    elements = max((t.numel() for t in tensor_leaves(node.meta.get("val"))), default=0) if moved else 0
    first = node.args[0] if node.args else None
    op = element_key(node.target, first.meta.get("val") if isinstance(first, fx.Node) else None) if moved else ""
    return rates.op_seconds(flops, moved, elements, dispatched=node.target is not operator.getitem, op=op,
                            calls=kernel_calls(op, node.args))


def allocator_bytes(nbytes: int, device: torch.device) -> int:
    """Bytes the device's allocator holds for a storage of ``nbytes``: whole 512-byte blocks on CUDA.

    What ``max_memory_allocated`` measures; on CPU the allocator's bookkeeping is the storage itself.

    Parameters
    ----------
    nbytes : int
        The storage's size in bytes.
    device : torch.device
        The storage's device.

    Returns
    -------
    int
        ``nbytes`` rounded up to a multiple of :data:`CUDA_BLOCK_BYTES` on CUDA, else ``nbytes``.
    """
    if device.type == "cuda" and nbytes > 0:
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


class TimingInterpreter(fx.Interpreter):
    """Runs the graph on real tensors and records the wall time of each call node.

    It also records the real storage bytes of each call node's output tensors (pytree order): the
    sizes the kernels really return, which a fake tensor's meta function may not know
    (:mod:`coop.graph_capture.storage_table`). A node's scratch is measured apart, untimed
    (:func:`measure_workspace`).
    """

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.seconds: dict[str, float] = {}
        self.storage_bytes: dict[str, list[int]] = {}
        self.devices: dict[str, list[str]] = {}
        self._cuda = torch.cuda.is_available()  # asked once: asked per node, it was timed with every node

    def run_node(self, node: fx.Node) -> Any:
        if node.op != "call_function":
            return super().run_node(node)
        start = time.perf_counter()
        result = super().run_node(node)
        if self._cuda:
            torch.cuda.synchronize()
        self.seconds[node.name] = min(self.seconds.get(node.name, float("inf")), time.perf_counter() - start)
        self.storage_bytes[node.name] = [t.untyped_storage().nbytes() for t in tensor_leaves(result)]
        self.devices[node.name] = [str(t.device) for t in tensor_leaves(result)]
        return result


class _AnnotatedInterpreter(fx.Interpreter):
    """Runs each call node inside a profiler range named ``coop::<node name>``."""

    def run_node(self, node: fx.Node) -> Any:
        if node.op != "call_function":
            return super().run_node(node)
        with torch.profiler.record_function(WORKSPACE_RANGE + node.name):
            return super().run_node(node)


#: The prefix of the profiler ranges :func:`measure_workspace` puts around each node.
WORKSPACE_RANGE = "coop::"


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 on the null device while inside: kineto (``torch.profiler``'s native backend) writes its
    ``USDT: ... profiler_start`` / ``profiler_stop`` and ``STAGE: ...`` lines there from C++, past Python's
    ``sys.stderr`` and past ``KINETO_LOG_LEVEL``; they are no output of coop's."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 (a daemon), or a closed stream: nothing to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@contextlib.contextmanager
def quiet_profile(**options: Any) -> Iterator[Any]:
    """``torch.profiler.profile(**options)`` whose start and stop print nothing (:func:`_native_stderr_silenced`
    around them only: what the profiled code writes to stderr stays).

    Parameters
    ----------
    **options : Any
        ``torch.profiler.profile``'s arguments (``activities``, ``profile_memory``, ...).

    Yields
    ------
    torch.profiler.profile
        The running profiler; its results are read after the block.
    """
    from torch.profiler import profile

    prof = profile(**options)
    with _native_stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)


def measure_workspace(module: fx.GraphModule, flat_inputs: list[torch.Tensor]) -> dict[str, int] | None:
    """Each call node's transient bytes on the real step, by fx node name.

    The scratch its kernel takes and gives back (oneDNN's convolution reorders on CPU, cuDNN's workspace on
    CUDA, a reduction's buffer). One code path for every device: the allocators' own reports to
    ``torch.profiler`` (``profile_memory=True``; the CPU allocator and the CUDA caching allocator report each
    allocation and free with its size). Each node runs inside a profiler range; within it, the running sum of the
    allocation events reaches a peak, and what is still allocated at the range's end is the node's outputs (and
    anything it keeps): the transient is the peak less that, i.e. what ``max_memory_allocated() -
    memory_allocated()`` gives on CUDA, on the CPU too. The run is untimed (the profiler slows it) and comes after
    a warm-up, so one-off allocations that persist (a library's handle workspace, a primitive cache) are not
    taken for a node's scratch.

    Parameters
    ----------
    module : fx.GraphModule
        The traced step.
    flat_inputs : list of torch.Tensor
        Its real flat inputs; it runs once, without grad, under a forked CPU generator.

    Returns
    -------
    dict of str to int or None
        Transient bytes by fx node name; None (not measured) while another profiler is running.
    """
    from torch.profiler import ProfilerActivity

    if torch._C._autograd._profiler_enabled():
        return None
    interpreter = _AnnotatedInterpreter(module, garbage_collect_values=True)
    # CPU activity only, on every device: the allocators' memory events (the CUDA caching allocator's too) are
    # recorded host-side, in the host's timeline of the node ranges
    with torch.no_grad(), torch.random.fork_rng(devices=[]), quiet_profile(activities=[ProfilerActivity.CPU],
                                                                          profile_memory=True) as prof:
        interpreter.run(*flat_inputs)
    events = prof.profiler.kineto_results.events()
    ranges = sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()[len(WORKSPACE_RANGE):])
                    for e in events if e.name().startswith(WORKSPACE_RANGE))
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    return {name: transient_bytes(memory, start, end) for start, end, name in ranges}


def transient_bytes(memory: list[tuple[int, int]], start: int, end: int) -> int:
    """What a range of a profiled run allocated and gave back within itself: the peak of the running sum of the
    allocation events ``(time, bytes)`` (sorted) from ``start`` to ``end`` less the sum at ``end``."""
    running = peak = 0
    position = bisect.bisect_left(memory, (start, -sys.maxsize))
    while position < len(memory) and memory[position][0] <= end:
        running += memory[position][1]
        peak = max(peak, running)
        position += 1
    return max(0, peak - max(running, 0))


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensor leaves of a value, in pytree order.

    Parameters
    ----------
    value : Any
        A tensor, or a pytree (tuple, list, dict) holding tensors.

    Returns
    -------
    list of torch.Tensor
        Its tensor leaves; non-tensor leaves left out.
    """
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


#: Timed runs per profile. Each node keeps its fastest run: a neighbour's load only ever adds time,
#: and on a shared machine it slows small pointwise ops (most of what a plan recomputes) far more
#: than matmuls, so a noisy profile over-predicts a plan's overhead (BENCHMARKS.md, bench_replay).
PROFILE_REPEATS = 4


@dataclass
class NodeProfile:
    """Measured seconds per fx node name, the real storage bytes and devices of each call node's output tensors
    (pytree order) and each node's transient workspace bytes (:func:`measure_workspace`; empty where it could
    not be measured)."""

    seconds: dict[str, float]
    workspace: dict[str, int] = field(default_factory=dict)
    storage_bytes: dict[str, list[int]] = field(default_factory=dict)
    #: the device of each output tensor as the kernel returned it (pytree order): a fake tensor's meta function
    #: may place an output elsewhere (efficient attention's philox seed and offset: meta, so the fake puts them on
    #: the query's CUDA device, where the kernel returns CPU tensors)
    devices: dict[str, list[str]] = field(default_factory=dict)
    #: the seconds subtracted from each call node's time: what the timing interpreter spends per node beyond what the
    #: step's own generated code does (:func:`without_interpreter_overhead`); 0.0 where not corrected
    interpreter_s: float = 0.0
    #: the fastest whole run of the step's generated code (seconds); None where not measured
    step_s: float | None = None


#: A corrected node keeps at least this share of its measured time (its kernel is never free).
KEPT_SHARE = 0.1


def without_interpreter_overhead(seconds: dict[str, float], step_s: float) -> tuple[dict[str, float], float]:
    """Per-node seconds less the timing interpreter's own per-node overhead, so that they add up to the step.

    Timing node by node through ``fx.Interpreter`` adds its Python work to every node (the arguments fetched from
    its environment, the op's Python ``__call__``, the clock): on a step of many small ops the nodes summed to
    1.5-2.3x the step's own run, so a plan's recomputations of small ops looked dearer against the baseline than
    they run. The overhead is one amount per node: ``(sum(seconds) - step_s) / len(seconds)``, subtracted from each
    (each keeping at least :data:`KEPT_SHARE` of its time); nothing is subtracted where the nodes already sum to
    less than the step.

    Parameters
    ----------
    seconds : dict of str to float
        Measured seconds per call node.
    step_s : float
        The step's own run (its generated code, the same ops without the interpreter).

    Returns
    -------
    tuple of (dict of str to float, float)
        The corrected seconds and the overhead subtracted per node.
    """
    if not seconds:
        return dict(seconds), 0.0
    overhead = max(0.0, (sum(seconds.values()) - step_s) / len(seconds))
    return {name: max(value - overhead, KEPT_SHARE * value) for name, value in seconds.items()}, overhead


def _fastest_run(module: fx.GraphModule, flat_inputs: list[torch.Tensor], repeats: int) -> float:
    """The fastest of ``repeats`` runs of the step's generated code (after the interpreter's warm-up), in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        module(*flat_inputs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def profile_nodes(module: fx.GraphModule, flat_inputs: list[torch.Tensor],
                  repeats: int = PROFILE_REPEATS) -> NodeProfile:
    """Each node's fastest of ``repeats`` runs after one warm-up, and its workspace measured on one more run.

    With host costs on (:func:`coop.graph_capture.host_cost.host_costs_enabled`, the default) the step's own code
    is timed too (``repeats`` runs) and the interpreter's per-node overhead is taken out of each node
    (:func:`without_interpreter_overhead`).

    The warm-up run also lets the allocator reach the step's high-water mark, so the timed runs
    measure compute rather than first-touch page faults, and one-off allocations that persist
    (cuBLAS's workspace per handle) are not taken for a node's scratch. The workspace comes from
    :func:`measure_workspace`.

    Parameters
    ----------
    module : fx.GraphModule
        The traced step.
    flat_inputs : list of torch.Tensor
        Its real flat inputs; the runs are without grad.
    repeats : int
        The timed runs after the warm-up (:data:`PROFILE_REPEATS` by default).

    Returns
    -------
    NodeProfile
        Seconds, workspace bytes (empty when not measured) and storage bytes, by fx node name.

    Raises
    ------
    CaptureError
        When ``repeats`` is below 1.
    """
    if repeats < 1:
        raise CaptureError(f"profile_nodes needs at least one timed run, got repeats={repeats}; pass repeats >= 1")
    interpreter = TimingInterpreter(module)
    with torch.no_grad():
        for run in range(repeats + 1):
            if run == 1:  # the warm-up's numbers include lazy initialisation: start over
                interpreter.seconds.clear()
            interpreter.run(*flat_inputs)
        seconds, overhead, step_s = interpreter.seconds, 0.0, None
        if host_costs_enabled():
            step_s = _fastest_run(module, flat_inputs, repeats)
            seconds, overhead = without_interpreter_overhead(seconds, step_s)
    return NodeProfile(seconds=seconds, workspace=measure_workspace(module, flat_inputs) or {},
                       storage_bytes=interpreter.storage_bytes, devices=interpreter.devices, interpreter_s=overhead,
                       step_s=step_s)


def profile_seconds(module: fx.GraphModule, flat_inputs: list[torch.Tensor],
                    repeats: int = PROFILE_REPEATS) -> dict[str, float]:
    """Measured seconds per fx node name (:func:`profile_nodes` without the workspace).

    Parameters
    ----------
    module : fx.GraphModule
        The traced step.
    repeats : int
        The timed runs after the warm-up.

    Returns
    -------
    dict of str to float
        Each node's fastest time in seconds, by fx node name.

    Raises
    ------
    CaptureError
        When ``repeats`` is below 1.
    """
    return profile_nodes(module, flat_inputs, repeats).seconds
