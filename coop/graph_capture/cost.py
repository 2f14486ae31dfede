"""Cost model of captured nodes: FLOPs from torch's FLOP registry, analytic seconds, profiling.

The analytic cost of an fx node is ``flops / FLOP_RATE + bytes_moved / BANDWIDTH`` seconds,
where ``flops`` comes from ``torch.utils.flop_counter``'s registry (the formulas FlopCounterMode
uses, so the graph's total FLOPs equal FlopCounterMode's count on the eager step) and
``bytes_moved`` is the bytes of the tensors the op reads and writes; the bandwidth term keeps
pointwise ops from looking free. The rates are nominal (a CPU core-ish machine), recorded in the
graph's metadata with the unit.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import flop_registry

from coop.errors import CaptureError

FLOP_RATE = 1e11  # FLOP/s, nominal
BANDWIDTH = 2e10  # bytes/s, nominal


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
    """Bytes read (tensor arguments) plus bytes written (outputs) by one fx node."""
    reads = sum(_tensor_bytes(arg.meta.get("val")) for arg in node.all_input_nodes)
    return reads + _tensor_bytes(node.meta.get("val"))


def analytic_seconds(node: fx.Node, flops: int) -> float:
    return flops / FLOP_RATE + bytes_moved(node) / BANDWIDTH


class TimingInterpreter(fx.Interpreter):
    """Runs the graph on real tensors and records the wall time of each call node."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.seconds: dict[str, float] = {}

    def run_node(self, node: fx.Node) -> Any:
        if node.op != "call_function":
            return super().run_node(node)
        start = time.perf_counter()
        result = super().run_node(node)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds[node.name] = min(self.seconds.get(node.name, float("inf")), time.perf_counter() - start)
        return result


#: Timed runs per profile. Each node keeps its fastest run: a neighbour's load only ever adds time,
#: and with 2 OpenMP threads on a shared 2-core machine it slows small pointwise ops (most of what a
#: plan recomputes) far more than matmuls, so a noisy profile over-predicts a plan's overhead (GPT-2
#: small at 50 %: 22 % predicted and 21.5 % measured under steady load, 10 % and 8.5 % when quiet).
PROFILE_REPEATS = 4


def profile_seconds(module: fx.GraphModule, flat_inputs: list[torch.Tensor],
                    repeats: int = PROFILE_REPEATS) -> dict[str, float]:
    """Measured seconds per fx node name: each node's fastest of ``repeats`` runs after one warm-up.

    The warm-up run also lets the allocator reach the step's high-water mark, so the timed runs
    measure compute rather than first-touch page faults.
    """
    if repeats < 1:
        raise CaptureError(f"profile_seconds needs at least one timed run, got repeats={repeats}; pass repeats >= 1")
    interpreter = TimingInterpreter(module)
    with torch.no_grad():
        for _ in range(repeats + 1):
            interpreter.run(*flat_inputs)
    return interpreter.seconds
