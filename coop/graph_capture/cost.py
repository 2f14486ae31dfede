"""Cost model of captured nodes: FLOPs from torch's FLOP registry, analytic seconds, profiling.

The analytic cost of an fx node is ``flops / FLOP_RATE + bytes_moved / BANDWIDTH`` seconds,
where ``flops`` comes from ``torch.utils.flop_counter``'s registry (the formulas FlopCounterMode
uses, so the graph's total FLOPs equal FlopCounterMode's count on the eager step) and
``bytes_moved`` is the bytes of the tensors the op reads and writes; the bandwidth term keeps
pointwise ops from looking free. The rates are nominal (a CPU core-ish machine), recorded in the
graph's metadata with the unit.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import flop_registry

from coop.errors import CaptureError

FLOP_RATE = 1e11  # FLOP/s, nominal
BANDWIDTH = 2e10  # bytes/s, nominal

#: The CUDA caching allocator hands out blocks in multiples of 512 bytes (``kMinBlockSize`` in
#: c10/cuda/CUDACachingAllocator.cpp), and ``torch.cuda.memory_allocated`` counts whole blocks.
CUDA_BLOCK_BYTES = 512


def node_flops(node: fx.Node) -> int:
    """FLOPs of one fx call node, by the formula FlopCounterMode applies to its op (0 if none)."""
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
    """Bytes read (tensor arguments) plus bytes written (outputs) by one fx node; none for a view (an op whose
    output aliases its input: ``view``, ``slice``, ``t``, ``expand``, ...) or a ``getitem`` of a multi-output op's
    tuple, which move no data (counting the viewed tensor made a channel-blocked program pay for the whole
    tensor once per block, and a ``getitem`` for every tensor of the tuple)."""
    if node.target is operator.getitem or getattr(node.target, "is_view", False):
        return 0
    reads = sum(_tensor_bytes(arg.meta.get("val")) for arg in node.all_input_nodes)
    return reads + _tensor_bytes(node.meta.get("val"))


def analytic_seconds(node: fx.Node, flops: int) -> float:
    return flops / FLOP_RATE + bytes_moved(node) / BANDWIDTH


def allocator_bytes(nbytes: int, device: torch.device) -> int:
    """Bytes the device's allocator holds for a storage of ``nbytes``: whole 512-byte blocks on CUDA.

    What ``max_memory_allocated`` measures; on CPU the allocator's bookkeeping is the storage itself.
    """
    if device.type == "cuda" and nbytes > 0:
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


@dataclass
class StorageProbe:
    """Real storage bytes of each output of the probed fx nodes, and the nodes that could not run."""

    output_bytes: dict[str, list[int]] = field(default_factory=dict)  # fx node name -> bytes per output tensor
    failed: list[str] = field(default_factory=list)


def probe_storage_bytes(module: fx.GraphModule) -> StorageProbe:
    """Run every allocating, non-pointwise aten op once on zero-filled tensors shaped like its fake inputs.

    Why: a fake tensor's storage size comes from the op's meta function, which some kernels do
    not honour. On CPU, ``mse_loss``, ``smooth_l1_loss`` and ``binary_cross_entropy`` with a
    mean or sum reduction return a 0-d loss whose storage is the whole unreduced elementwise
    buffer (the kernel reduces into it in place), so the loss holds ``numel(input)`` elements,
    not one, for as long as it lives. The executor runs the real kernels, so the Graph must count
    their real storages. Pointwise ops (``Tag.pointwise``) are not run: their TensorIterator
    output is allocated at exactly the broadcast shape, as the fake one is. Each distinct call (op,
    argument shapes, strides, dtypes and values) runs once, so repeated layers cost one probe.
    Ops run one at a time (inputs, then outputs, then both dropped), so the probe needs no more
    memory than the largest single op; random ops run under a forked RNG. An op that cannot run
    on zeros keeps its fake size and is listed in ``failed``.
    """
    probe = StorageProbe()
    seen: dict[tuple[Any, ...], list[int] | None] = {}
    for node in module.graph.nodes:
        if not _allocates(node):
            continue
        signature = _call_signature(node)
        if signature not in seen:
            seen[signature] = _run_once(node)
        if seen[signature] is None:
            probe.failed.append(node.name)
        else:
            probe.output_bytes[node.name] = list(seen[signature])
    return probe


def _run_once(node: fx.Node) -> list[int] | None:
    """Storage bytes of each output tensor of one real run of the node's op (None: it cannot run on zeros)."""
    devices = [t.device for t in _fake_tensors(node.meta.get("val"))]
    try:
        args, kwargs = pytree.tree_map(_materialize, (node.args, node.kwargs))
        with torch.random.fork_rng(devices=[d for d in devices if d.type == "cuda"]), torch.no_grad():
            out = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 (any kernel error: keep the meta function's size for this op)
        return None
    return [t.untyped_storage().nbytes() for t in _fake_tensors(out)]


def _call_signature(node: fx.Node) -> tuple[Any, ...]:
    """What decides an op's output storages: the op and its arguments (tensors by layout, others by value)."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    return (node.target, str(spec), tuple(_leaf_signature(leaf) for leaf in leaves))


def _leaf_signature(leaf: Any) -> Any:
    value = leaf.meta.get("val") if isinstance(leaf, fx.Node) else leaf
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, str(value.device),
                value.untyped_storage().nbytes())
    return repr(value)


def _allocates(node: fx.Node) -> bool:
    """A non-pointwise aten call (not a view) whose fake value holds tensors on a real device."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.is_view:
        return False
    if torch.Tag.pointwise in target.tags:
        return False
    tensors = _fake_tensors(node.meta.get("val"))
    return bool(tensors) and all(t.device.type != "meta" for t in tensors)


def _fake_tensors(value: Any) -> list[torch.Tensor]:
    """The tensor leaves of a (fake or real) value, in pytree order."""
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _materialize(arg: Any) -> Any:
    """A zero-filled real tensor with the fake value's shape, strides, offset, dtype and device."""
    if not isinstance(arg, fx.Node):
        return arg
    value = arg.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return value
    size = value.untyped_storage().nbytes() // max(value.element_size(), 1)
    base = torch.zeros(size, dtype=value.dtype, device=value.device)
    return base.as_strided(value.shape, value.stride(), value.storage_offset())


class TimingInterpreter(fx.Interpreter):
    """Runs the graph on real tensors and records the wall time of each call node.

    On CUDA it also records each node's transient bytes: the allocator's peak while the node runs
    minus what is allocated right after it (its inputs and outputs are still alive then), i.e. the
    scratch a kernel takes and gives back (cuDNN's convolution workspace, a reduction's buffer).
    """

    def __init__(self, module: fx.GraphModule, measure_workspace: bool = False) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.measure_workspace = measure_workspace
        self.seconds: dict[str, float] = {}
        self.workspace: dict[str, int] = {}

    def run_node(self, node: fx.Node) -> Any:
        if node.op != "call_function":
            return super().run_node(node)
        if self.measure_workspace:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        result = super().run_node(node)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds[node.name] = min(self.seconds.get(node.name, float("inf")), time.perf_counter() - start)
        if self.measure_workspace:
            transient = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
            self.workspace[node.name] = min(self.workspace.get(node.name, transient), transient)
        return result


#: Timed runs per profile. Each node keeps its fastest run: a neighbour's load only ever adds time,
#: and on a shared machine it slows small pointwise ops (most of what a plan recomputes) far more
#: than matmuls, so a noisy profile over-predicts a plan's overhead (BENCHMARKS.md, bench_replay).
PROFILE_REPEATS = 4


@dataclass
class NodeProfile:
    """Measured seconds per fx node name and, on CUDA, transient workspace bytes per fx node name."""

    seconds: dict[str, float]
    workspace: dict[str, int] = field(default_factory=dict)


def profile_nodes(module: fx.GraphModule, flat_inputs: list[torch.Tensor],
                  repeats: int = PROFILE_REPEATS) -> NodeProfile:
    """Each node's fastest of ``repeats`` runs after one warm-up (and, on CUDA, its least workspace).

    The warm-up run also lets the allocator reach the step's high-water mark, so the timed runs
    measure compute rather than first-touch page faults, and one-off allocations that persist
    (cuBLAS's workspace per handle) are not taken for a node's scratch.
    """
    if repeats < 1:
        raise CaptureError(f"profile_nodes needs at least one timed run, got repeats={repeats}; pass repeats >= 1")
    on_cuda = any(t.is_cuda for t in flat_inputs if isinstance(t, torch.Tensor))
    interpreter = TimingInterpreter(module, measure_workspace=on_cuda)
    with torch.no_grad():
        for run in range(repeats + 1):
            if run == 1:  # the warm-up's numbers include lazy initialisation: start over
                interpreter.seconds.clear()
                interpreter.workspace.clear()
            interpreter.run(*flat_inputs)
    return NodeProfile(seconds=interpreter.seconds, workspace=interpreter.workspace)


def profile_seconds(module: fx.GraphModule, flat_inputs: list[torch.Tensor],
                    repeats: int = PROFILE_REPEATS) -> dict[str, float]:
    """Measured seconds per fx node name (:func:`profile_nodes` without the workspace)."""
    return profile_nodes(module, flat_inputs, repeats).seconds
