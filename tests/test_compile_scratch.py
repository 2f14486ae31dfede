"""An extern kernel's scratch (coop.compiled.scratch) and the warmed-up measured step (coop.compiled.measure).

Oracles: hand-counted bytes (the contiguous copy ``at::mm`` makes of an operand with no unit stride; a cache a
module allocates at its first call), the simulator's memory at a step computed by hand.
"""

from __future__ import annotations

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from coop.compiled.measure import held_bytes, warm_up
from coop.compiled.scratch import charge_scratch, extern_scratch, is_extern
from coop.graph import Graph, Node
from coop.graph_capture.lower import Lowered
from coop.schedule import Schedule, simulate


def _strided_mm_graph() -> fx.Graph:
    """``add(mm(a[:, ::2], b), mm(...))`` on fake values: a (64, 64) operand with strides (128, 2)."""
    graph = fx.Graph()
    a = graph.placeholder("a")
    b = graph.placeholder("b")
    mm = graph.call_function(torch.ops.aten.mm.default, (a, b))
    add = graph.call_function(torch.ops.aten.add.Tensor, (mm, mm))
    with FakeTensorMode():
        a.meta["val"] = torch.empty(64, 128)[:, ::2]
        b.meta["val"] = torch.empty(64, 32)
        mm.meta["val"] = torch.empty(64, 32)
        add.meta["val"] = torch.empty(64, 32)
    return graph


def test_an_extern_matmul_of_a_strided_operand_is_charged_its_contiguous_copy() -> None:
    """BLAS reads an operand with a unit stride; ``at::mm`` copies one without it: 64 x 64 floats, 16,384 B, made
    and freed inside the op. The pointwise add (a loop inductor generates) is not measured at all."""
    graph = _strided_mm_graph()
    mm, add = (n for n in graph.nodes if n.op == "call_function")
    assert is_extern(mm) and not is_extern(add)
    assert extern_scratch(graph.nodes) == {mm.name: 64 * 64 * 4}


def test_a_charged_scratch_counts_at_the_step_that_runs_the_op_only() -> None:
    """Graph x -> m -> y: with 16,384 B charged to m, the simulator's memory at m's step is x + m + 16,384 (hand
    count) and at y's step unchanged."""
    nodes = (Node(id=0, name="x", mem=1000, cost=0, kind="input"), Node(id=1, name="m", inputs=(0,), mem=200, cost=1.0),
             Node(id=2, name="y", inputs=(1,), mem=300, cost=1.0))
    lowered = Lowered(graph=Graph(name="g", nodes=nodes, outputs=(2,)), fx_names={0: ["x"], 1: ["mm"], 2: ["y"]},
                      owner_of={"x": 0, "mm": 1, "y": 2}, node_flops={})
    charged = charge_scratch(lowered, {"mm": 16_384})
    schedule = Schedule.from_order([1, 2])
    before = simulate(lowered.graph, Schedule.from_order([1, 2]))
    after = simulate(charged.graph, schedule)
    assert after.memory[0] == 1000 + 200 + 16_384 and before.memory[0] == 1000 + 200
    assert after.memory[-1] == before.memory[-1]
    assert lowered.graph.nodes[1].workspace == 0  # left unchanged


class FirstCallCache(nn.Module):
    """A linear layer that allocates a 1 MiB cache at its first call and keeps it, and counts its "compilations":
    one at the first call, one more at the second (a guard the first call changed), none after."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.cache: torch.Tensor | None = None
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.cache is None:
            self.cache = torch.zeros(256 * 1024)
        return self.linear(x).sum()


def test_the_warm_up_runs_until_nothing_compiles_and_the_step_after_it_holds_no_first_call_allocation() -> None:
    """The first step holds the 1,048,576 B cache more than a later one (hand count); the warm-up stops at the
    first step that compiled nothing (the third) and reports the two that did; the gradients are put back."""
    model = FirstCallCache()
    batch = torch.randn(8, 16)
    model(batch).backward()
    kept = [p.grad.clone() for p in model.parameters()]
    model.cache, model.calls = None, 0
    first = held_bytes(model, batch, None)
    model.cache, model.calls = None, 0
    assert warm_up(model, batch, None, lambda: min(model.calls, 2)) == [1, 1]
    assert model.calls == 3
    warmed = held_bytes(model, batch, None)
    assert first - warmed == 256 * 1024 * 4
    for p, grad in zip(model.parameters(), kept, strict=True):
        torch.testing.assert_close(p.grad, grad, rtol=0, atol=0)
