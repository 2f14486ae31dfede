"""What an implementation's program costs: seconds, stored bytes, workspace (MONeT, Shah et al. 2021, profiles
each operator implementation the same way).

No program runs on made-up data: a kernel fed synthetic inputs can kill the process (measured on an H100,
ARCHITECTURE.md "Facts the code relies on"; packed max-pool indices decoded from zeros once scattered out of bounds here). So:

* **Bytes** -- :func:`price` runs a program of :mod:`coop.graph_capture.alternatives` under a ``FakeTensorMode``
  on fake tensors of the captured layouts (nothing is computed) and counts each new storage as the device
  allocator holds it: the fake storage, or the real size that :mod:`coop.graph_capture.storage_table` gives for a
  kernel whose storage differs from its meta function's. The output's storage, the peak of live intermediates
  above the inputs minus the output (the workspace) and a tuple output's further tensors, each value freed after
  its last use as fx frees it.
* **Seconds** -- the analytic model of :mod:`coop.graph_capture.cost`, as the nodes were priced. When the capture
  was profiled, the analytic model calibrated on the profiled step (:class:`Calibration`): each call of the
  program costs its analytic seconds times the ratio of measured to analytic seconds of the step's nodes that run
  the same op overload (a split convolution backward runs ``convolution_backward``, batch norm in channel blocks
  ``native_batch_norm_backward``: the very kernels the measured default ran), else of the step's nodes of the
  same class (pointwise or not; bandwidth-bound kernels share a rate), else of the whole step; a call the analytic
  model prices at zero (a view, a ``getitem``) costs the median measured seconds of such nodes in the step (their
  dispatch overhead). This is an estimate in the profile's unit, not a measurement: a kernel on a chunk may run at
  another rate than on the whole tensor. Timing the programs for real would need the step's real values at hand
  (the profiled run frees them as it goes) or made-up inputs, which is what this module must not use.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from coop.graph_capture.alternatives.base import ImplProgram
from coop.graph_capture.cost import NodeProfile, allocator_bytes, analytic_seconds, node_flops, tensor_leaves
from coop.graph_capture.storage_table import predicted_storage_bytes


@dataclass
class Price:
    """What one program costs: seconds, the bytes its output stores, its workspace; ``extra``: the bytes of
    the further tensors of a tuple output (a multi-output op's extra outputs) that the program allocates."""

    seconds: float
    mem: int
    workspace: int
    extra: int = 0


@dataclass
class Calibration:
    """Measured over analytic seconds of a profiled step, per op overload and per class (see the module docstring)."""

    by_op: dict[Any, float] = field(default_factory=dict)  # op overload -> ratio
    by_class: dict[bool, float] = field(default_factory=dict)  # pointwise? -> ratio
    overall: float = 0.0
    free_call: float = 0.0  # median measured seconds of a call the analytic model prices at zero

    @classmethod
    def of_step(cls, module: fx.GraphModule, profile: NodeProfile) -> Calibration:
        """The ratios of a profiled step.

        Parameters
        ----------
        module
            The captured step.
        profile
            The measured seconds of its call nodes.

        Returns
        -------
        Calibration
            Measured over analytic seconds per op overload, per class and overall.
        """
        measured: dict[Any, float] = {}
        analytic: dict[Any, float] = {}
        free: list[float] = []
        for node in module.graph.nodes:
            if node.op != "call_function" or node.name not in profile.seconds:
                continue
            seconds = analytic_seconds(node, node_flops(node))
            if seconds <= 0:
                free.append(profile.seconds[node.name])
                continue
            for key in (node.target, _pointwise(node), None):  # the op, its class, the whole step
                measured[key] = measured.get(key, 0.0) + profile.seconds[node.name]
                analytic[key] = analytic.get(key, 0.0) + seconds
        ratios = {key: measured[key] / analytic[key] for key in analytic}
        return cls(by_op={k: r for k, r in ratios.items() if not isinstance(k, bool) and k is not None},
                   by_class={k: r for k, r in ratios.items() if isinstance(k, bool)},
                   overall=ratios.get(None, 0.0), free_call=statistics.median(free) if free else 0.0)

    def seconds(self, node: fx.Node) -> float:
        """Estimated seconds of one call of a program.

        Parameters
        ----------
        node
            A ``call_function`` node of a program.

        Returns
        -------
        float
            Its analytic seconds at the step's measured rate.
        """
        seconds = analytic_seconds(node, node_flops(node))
        if seconds <= 0:
            return self.free_call
        ratio = self.by_op.get(node.target)
        if ratio is None:
            ratio = self.by_class.get(_pointwise(node), self.overall)
        return seconds * ratio


def _pointwise(node: fx.Node) -> bool:
    return torch.Tag.pointwise in getattr(node.target, "tags", ())


def price(program: ImplProgram, calibration: Calibration | None = None) -> Price:
    """Seconds, stored bytes and workspace of a program, without running any kernel (see the module docstring).

    Parameters
    ----------
    program
        An implementation's or optional value's program.
    calibration
        Of a profiled capture: seconds are then the analytic model at the step's measured rates, else the analytic
        model.

    Returns
    -------
    Price
        Its seconds, output bytes, workspace and the bytes of a tuple output's further tensors.
    """
    mem, workspace, extra = _fake_run_bytes(program)
    if calibration is None:
        return Price(sum(analytic_seconds(n, node_flops(n)) for n in program.calls), mem, workspace, extra)
    return Price(sum(calibration.seconds(n) for n in program.calls), mem, workspace, extra)


def _placeholders(program: ImplProgram) -> list[fx.Node]:
    return [n for n in program.graph.nodes if n.op == "placeholder"]


def _fake_like(value: torch.Tensor) -> torch.Tensor:
    """A fresh fake tensor (call inside the mode) with the captured value's layout and whole storage."""
    size = value.untyped_storage().nbytes() // max(value.element_size(), 1)
    base = torch.empty(size, dtype=value.dtype, device=value.device)
    return base.as_strided(value.shape, value.stride(), value.storage_offset())


def _fake_run_bytes(program: ImplProgram) -> tuple[int, int, int]:
    """(output bytes, workspace bytes, the output's further new bytes) of the program run on fake tensors, each
    value freed after its last use as fx frees it."""
    # real constants a program may hold become fake too (allow_non_fake_inputs): no kernel runs on anything
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        # a placeholder may hold a tuple (an optional value such as a convolution's weight and bias gradients)
        inputs = [pytree.tree_map_only(torch.Tensor, _fake_like, p.meta["val"]) for p in _placeholders(program)]
        env: dict[fx.Node, Any] = dict(zip(_placeholders(program), inputs, strict=True))
        input_storages = _storage_keys(inputs)
        last_use = {v: n for n in program.graph.nodes for v in n.all_input_nodes}
        live: dict[int, int] = {}
        alive: set[fx.Node] = set()  # program values not yet past their last use
        peak = 0
        for node in program.calls:
            args, kwargs = pytree.tree_map_only(fx.Node, env.__getitem__, (node.args, node.kwargs))
            value = node.target(*args, **kwargs)
            env[node] = value
            alive.add(node)
            tensors = tensor_leaves(value)
            sizes = predicted_storage_bytes(node.target, args, kwargs, value)
            for tensor, nbytes in zip(tensors, sizes, strict=True):
                if _key(tensor) not in input_storages:
                    live[_key(tensor)] = allocator_bytes(nbytes, tensor.device)
            peak = max(peak, sum(live.values()))
            dead = {used for used in node.all_input_nodes if last_use.get(used) is node and used.op == "call_function"}
            alive -= dead
            # a storage is freed once no live value holds it (an in-place or view result, a getitem of a tuple)
            held = set().union(*(_storage_keys(env[v]) for v in alive)) if dead else set()
            for used in dead:
                for key in _storage_keys(env[used]) - held:
                    live.pop(key, None)
        outputs = tensor_leaves(env[program.output])  # a tuple (batch norm's gradients): the node's value is the first
        out_bytes = live.get(_key(outputs[0]), 0) if outputs else 0
        all_out = sum(live.get(key, 0) for key in _storage_keys(env[program.output]))
    return out_bytes, max(peak - all_out, 0), all_out - out_bytes


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _storage_keys(value: Any) -> set[int]:
    return {_key(t) for t in tensor_leaves(value)}


__all__ = ["Calibration", "Price", "price"]
