"""coop.compiled.inductor_buffers: the buffers inductor's scheduler keeps, against two oracles of its own making.

The observed allocations are checked against the generated code's own ``empty_strided_cpu`` lines (count and
bytes, per graph), and the observed step peak against the CPU allocator's report of the compiled step
(:func:`coop.compiled.measure.held_bytes`), at store-all and with coop's checkpoint-all (every forward value
rebuilt in the backward).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

import coop
from coop.compiled.inductor_buffers import ObservedBuffer, ObservedGraph
from coop.compiled.measure import held_bytes

ALLOCATION = re.compile(r"= empty_strided_cpu\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)")


class Block(nn.Module):
    """Layer norm, a linear, gelu, a linear, a residual add: fused loops, extern matmuls, multi-reader values."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def _allocations(code: str) -> list[int]:
    """Bytes of each fresh allocation in inductor's generated Python wrapper."""
    sizes = []
    for size, stride, dtype in ALLOCATION.findall(code):
        shape = [int(v) for v in size.split(",") if v.strip()]
        strides = [int(v) for v in stride.split(",") if v.strip()]
        elements = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if all(shape) else 0
        sizes.append(elements * getattr(torch, dtype).itemsize)
    return sizes


@pytest.mark.parametrize("formulation", ["store-all", "checkpoint-all"])
def test_observed_buffers_are_what_the_code_allocates_and_the_allocator_holds(formulation: str) -> None:
    """Per graph, the buffers the observer says get memory of their own are the generated code's allocations
    (count and bytes; with recomputation within two allocations and 5 % of the bytes); the step peak it derives is
    the CPU allocator's, within 0.5 %."""
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(64) for _ in range(3)], nn.Linear(64, 1))
    batch = torch.randn(256, 64)
    compiled = coop.compile(model, 1.0, formulation=formulation, time_limit=10)

    def step() -> None:
        compiled(batch).sum().backward()

    _, codes = run_and_get_code(step)
    record = compiled.coop_record
    (plan,) = record.plans
    forward, backward = record.buffers.of(plan.joint.graph.name)
    assert forward is not None and backward is not None and not forward.backward and backward.backward
    assert len(codes) == 2
    for code, graph in zip(codes, (forward, backward), strict=True):
        expected = _allocations(code)
        fresh = [b.nbytes for b in graph.allocated()]
        if formulation == "store-all":
            assert len(fresh) == len(expected) and sum(fresh) == sum(expected), (graph.backward, fresh, expected)
        else:  # the walk decides pooled reuses on its own order of the kernels, which inductor may reorder after
            assert abs(len(fresh) - len(expected)) <= 2, (graph.backward, fresh, expected)
            assert abs(sum(fresh) - sum(expected)) <= 0.05 * sum(expected), (graph.backward, fresh, expected)
    # gelu's and layer norm's intermediates are computed in the forward and never get a buffer
    assert set(plan.partition.forward_counts) - set(forward.joint_bytes())
    if formulation == "checkpoint-all":
        assert sum(plan.partition.recomputed().values()) > 0
        assert backward.joint_bytes().keys() & forward.joint_bytes().keys()  # values built in both graphs
    model.zero_grad(set_to_none=True)
    measured = held_bytes(compiled, batch, None)
    caller_owned = sum(n.mem for n in plan.joint.graph.nodes if n.caller_owned)
    observed = record.observed_peak(plan)
    assert observed is not None
    assert abs(observed - (measured + caller_owned)) <= 0.005 * (measured + caller_owned), (observed, measured)


def _buffer(name: str, nbytes: int, kernel: int, readers: tuple[int, ...], *, output: bool = False,
            writer: str = "", reader_ops: tuple[str, ...] = ()) -> ObservedBuffer:
    return ObservedBuffer(name=name, nbytes=nbytes, joint_name=name, kernel=kernel, readers=readers, output=output,
                          materialized=True, dtype="torch.float32", writer=writer, reader_ops=reader_ops)


def test_the_walk_frees_after_the_last_reader_reuses_in_place_and_pools_as_inductors_wrapper_decides() -> None:
    """Hand-built kernels, the peaks counted by hand: a dead buffer is reused by a later allocation of its size only
    where holding it in between keeps inductor's own peak estimate (every buffer from its kernel to its last
    reader); a loop kernel writes in place of its input read for the last time."""
    graph = ObservedGraph(coop_graph="g", backward=False, kernels=["k0", "k1", "k2", "k3"],
                          extern=[True, False, True, False])
    graph.buffers = [
        _buffer("a", 100, 0, (1,), reader_ops=("k1",)),
        _buffer("b", 100, 1, (2,), writer="k1", reader_ops=("k2",)),  # in place of a (same size, last read)
        _buffer("c", 40, 2, (3,), reader_ops=("k3",)),  # b dies at k2 (extern): pooled, never reused: freed
        _buffer("d", 40, 3, (), output=True, writer="k3"),  # in place of c, read for the last time by k3
    ]
    assert [b.name for b in graph.allocated()] == ["a", "c"]
    assert graph.peak() == 140  # k2: b (100) and c (40)
    declined = ObservedGraph(coop_graph="g", backward=False, kernels=["k0", "k1", "k2", "k3"],
                             extern=[True, True, True, True])
    declined.buffers = [
        _buffer("a", 100, 0, (0,)),  # dies at k0 into the pool
        _buffer("b", 30, 1, (2,)),
        _buffer("c", 100, 3, (), output=True),  # a held through k1-k2 would make 130 > the estimate's peak 100
    ]
    assert [b.name for b in declined.allocated()] == ["a", "b", "c"]
    assert declined.peak() == 100
    assert declined.peak({("saved",): 50}) == 100 + 50  # an input nobody reads here stays resident
    declined.input_readers = {"saved": (0,), "view": (1,)}
    assert declined.peak({("saved", "view"): 50}) == 100 + 50  # two views of one buffer: freed after k1
    taken = ObservedGraph(coop_graph="g", backward=False, kernels=["k0", "k1", "k2", "k3"],
                          extern=[True, True, True, True])
    taken.buffers = [
        _buffer("a", 100, 0, (0,)),
        _buffer("b", 30, 1, (1,)),
        _buffer("c", 100, 2, (3,)),  # a held through k1: 100 + 30 <= the estimate's peak 200 (k3: c and d)
        _buffer("d", 100, 3, (), output=True),  # c dies at k3, after d is allocated: a block of its own
    ]
    assert [b.name for b in taken.allocated()] == ["a", "b", "d"]
    assert taken.peak() == 200
