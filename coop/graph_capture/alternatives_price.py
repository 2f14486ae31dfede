"""What an implementation's program costs: seconds, stored bytes, workspace (MONeT, Shah et al. 2021, profiles
each operator implementation the same way).

:func:`price` runs a program of :mod:`coop.graph_capture.alternatives` once on zero-filled tensors of the
captured layouts and counts the bytes the device allocator holds (the output's storage, the peak of live
intermediates above the inputs); with ``profiled`` it also times the program (the fastest of
:data:`~coop.graph_capture.cost.PROFILE_REPEATS` runs after a warm-up), else the analytic model prices it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from coop.graph_capture.cost import PROFILE_REPEATS, allocator_bytes, analytic_seconds, node_flops

if TYPE_CHECKING:
    from coop.graph_capture.alternatives import ImplProgram


@dataclass
class Price:
    """What one program costs: seconds, the bytes its output stores, its workspace; ``extra``: the bytes of
    the further tensors of a tuple output (a multi-output op's extra outputs) that the program allocates."""

    seconds: float
    mem: int
    workspace: int
    extra: int = 0


def price(program: ImplProgram, profiled: bool) -> Price:
    """Time (timed runs when ``profiled``, else the analytic model), stored bytes and workspace of a program.

    Bytes come from one real run on zero-filled tensors of the captured layouts: the output's
    storage as the device allocator holds it, and the peak of live intermediates minus the output.
    """
    with torch.random.fork_rng(devices=[]):  # pricing must not advance the caller's RNG
        # a placeholder may hold a tuple (an optional value such as a convolution's weight and bias gradients)
        inputs = [pytree.tree_map_only(torch.Tensor, lambda v: _materialize(v, random=profiled), p.meta["val"])
                  for p in _placeholders(program)]
    mem, workspace, extra = _run_bytes(program, _clones(inputs))
    if not profiled:
        return Price(sum(analytic_seconds(n, node_flops(n)) for n in program.calls), mem, workspace, extra)
    module = fx.GraphModule(torch.nn.Module(), program.graph)
    # a program that writes into what it reads (an in-place activation, masked_fill_, copy_) runs on fresh copies
    in_place = any(getattr(n.target, "_schema", None) is not None and n.target._schema.is_mutable for n in program.calls)
    best = float("inf")
    with torch.no_grad():
        for run in range(PROFILE_REPEATS + 1):
            args = _clones(inputs) if in_place or run == 0 else inputs
            start = time.perf_counter()
            module(*args)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if run:  # the first run is the warm-up
                best = min(best, time.perf_counter() - start)
    return Price(best, mem, workspace, extra)


def _clones(inputs: list[Any]) -> list[Any]:
    return [pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, value) for value in inputs]


def _placeholders(program: ImplProgram) -> list[fx.Node]:
    return [n for n in program.graph.nodes if n.op == "placeholder"]


def _materialize(value: torch.Tensor, random: bool) -> torch.Tensor:
    """A real tensor with the fake value's layout: zeros, or random data for timing."""
    size = value.untyped_storage().nbytes() // max(value.element_size(), 1)
    if value.dtype == torch.bool:
        base = torch.rand(size, device=value.device) < 0.5 if random else torch.zeros(size, dtype=torch.bool, device=value.device)
    elif value.is_floating_point() and random:
        base = torch.randn(size, dtype=value.dtype, device=value.device)
    else:
        base = torch.zeros(size, dtype=value.dtype, device=value.device)
    return base.as_strided(value.shape, value.stride(), value.storage_offset())


def _run_bytes(program: ImplProgram, inputs: list[torch.Tensor]) -> tuple[int, int, int]:
    """(output bytes, workspace bytes, the output's further new bytes) of one real run, each value freed after its
    last use as fx frees it."""
    env: dict[fx.Node, Any] = dict(zip(_placeholders(program), inputs, strict=True))
    input_storages = _storage_keys(inputs)
    last_use = {v: n for n in program.graph.nodes for v in n.all_input_nodes}
    live: dict[int, int] = {}
    alive: set[fx.Node] = set()  # program values not yet past their last use
    peak = 0
    with torch.no_grad():
        for node in program.calls:
            args, kwargs = pytree.tree_map_only(fx.Node, env.__getitem__, (node.args, node.kwargs))
            value = node.target(*args, **kwargs)
            env[node] = value
            alive.add(node)
            for tensor in _tensors(value):
                if tensor.untyped_storage()._cdata not in input_storages:
                    live[tensor.untyped_storage()._cdata] = allocator_bytes(tensor.untyped_storage().nbytes(), tensor.device)
            peak = max(peak, sum(live.values()))
            dead = {used for used in node.all_input_nodes if last_use.get(used) is node and used.op == "call_function"}
            alive -= dead
            # a storage is freed once no live value holds it (an in-place or view result, a getitem of a tuple)
            held = set().union(*(_storage_keys(env[v]) for v in alive)) if dead else set()
            for used in dead:
                for key in _storage_keys(env[used]) - held:
                    live.pop(key, None)
    outputs = _tensors(env[program.output])  # a tuple (batch norm's gradients): the node's value is the first
    out_bytes = live.get(outputs[0].untyped_storage()._cdata, 0) if outputs else 0
    all_out = sum(live.get(key, 0) for key in _storage_keys(env[program.output]))
    return out_bytes, max(peak - all_out, 0), all_out - out_bytes


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _storage_keys(value: Any) -> set[int]:
    return {t.untyped_storage()._cdata for t in _tensors(value)}


__all__ = ["Price", "price"]
