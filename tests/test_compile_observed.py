"""The measured re-solve planned on what inductor held (coop.compiled.observed), against the CPU allocator.

Oracles: the CPU allocator's report of the compiled step (:func:`coop.compiled.measure.held_bytes`, not coop's
simulator or the observer's walk), eager PyTorch's gradients, and hand-built Graphs whose inlined readers are
counted by hand.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import fx, nn

import coop
from coop.compiled.measure import held_bytes
from coop.compiled.observed import Observation, inline_unbuffered
from coop.graph import Graph, Node
from coop.graph_capture.lower import Lowered


class Tied(nn.Module):
    """One weight read by the first and the last layer, residual layer-norm blocks in between.

    The tied weight's gradient is ``add(mm, mm)``: inductor's post-grad pass folds the early ``mm`` into the add
    as an ``addmm`` that runs at the end of the backward, so the early mm's inputs live through the whole backward;
    and the layer norms' pointwise values read by several kernels are inlined into each, keeping their inputs
    live. The first plan, which prices neither, holds more than its budget.
    """

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width) / width ** 0.5)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.w)
        for layer in self.layers:
            h = h + torch.tanh(layer(torch.layer_norm(h, (h.shape[-1],))))
        return (h @ self.w.t()).pow(2).mean()


#: bytes the step may hold beyond the walk of inductor's buffers: the loss's gradient seed (4 B), which the autograd
#: engine allocates outside the compiled graphs, and the walk's misses on inductor's reuse of small buffers (a
#: pinned step at 0.5 held 2,262,536 B where its walk said 2,254,084 B, 2026-11-30); a quarter of the 262,144 B
#: value inductor's order kept live across the peak
OUTSIDE_THE_BUFFERS = 65_536


def _caller_owned(compiled: nn.Module) -> int:
    return sum(n.mem for n in compiled.coop_record.plans[0].joint.graph.nodes if n.caller_owned)


def _held_within_what_coop_saw(compiled: nn.Module, batch: torch.Tensor) -> int:
    """The CPU allocator's peak of one step of ``compiled`` (caller-owned values added), asserted within the budget
    and within what coop saw of the step: the walk of the buffers inductor generated for the kept compilation.

    The walk reads the kernels before inductor's ``reorder_for_peak_memory``, so it may be above the step (that pass
    lowered the peak); a step above it holds bytes coop did not see: where inductor's scheduler ran a recomputation
    of coop's schedule early (the tied model at 0.5 in inductor's order, 2026-11-30: 2,516,488 B held, 2,262,532 B
    walked, 2,277,892 B budget), one 1024 x 64 value (262,144 B) was live across the peak.
    """
    record = compiled.coop_record
    requested = record.plans[0].requested
    held = held_bytes(compiled, batch, None) + _caller_owned(compiled)
    seen = record.observed_peak(record.plans[-1])
    assert held <= requested, record.summary()
    assert seen is not None and held <= seen + OUTSIDE_THE_BUFFERS, (held, seen, record.summary())
    return held


@pytest.mark.slow
def test_a_first_round_over_budget_is_re_planned_in_coops_order_and_the_step_meets_the_budget() -> None:
    """The fitted step's CPU-allocator peak (weights and batch added), measured again here, is within the budget and
    within what coop saw of it, and it trains as eager does. Where round 0 (inductor's order) held more than the
    budget (3,266,504 B against 2,733,471 B in the runs of 2026-11-29; the solver's schedule under a time limit
    varies with the machine's load, and one run met the budget in round 0), round 1 ran the kernels in coop's order,
    at the same shave (later rounds are planned on the buffers inductor kept in that order)."""
    torch.manual_seed(0)
    model = Tied()
    eager = copy.deepcopy(model)
    batch = torch.randn(1024, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = coop.compile(model, 0.6, time_limit=5, example_batch=batch, rounds=2)
    record = compiled.coop_record
    requested = record.plans[0].requested
    assert not record.rounds[0].pinned, record.summary()
    if record.rounds[0].measured_peak > requested:  # the first plan missed (a slack round may follow round 1)
        assert len(record.rounds) >= 2, record.summary()
        assert record.rounds[1].pinned and record.rounds[1].shave == 0, record.summary()
    model.zero_grad(set_to_none=True)
    _held_within_what_coop_saw(compiled, batch)
    compiled(batch).backward()
    eager(batch).backward()
    for mine, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_held_bytes_are_monotone_in_the_budget_after_the_observed_re_solve() -> None:
    """Three budgets of the tied model: the allocator's peak of each fitted step is within its budget and within what
    coop saw of the step (:func:`_held_within_what_coop_saw`), and a lower budget never holds more.

    The solver's schedule under its time limit varies with the machine's load, and inductor's scheduler moved a
    recomputation of some schedules (not of others) across the step's peak: at 0.5 the step then held 2,516,488 B
    against 2,277,892 B in every round (2026-11-30), so this test failed or passed with the schedule. The re-solve
    now runs the rounds after such a miss in coop's order (coop.compile's ``pin``)."""
    batch = torch.randn(1024, 64)
    held = []
    for share in (0.8, 0.65, 0.5):
        # up to three rounds per share and two slack rounds: fifteen compilations of Tied.forward over the shares
        # would pass dynamo's recompile_limit (8), after which the step runs eagerly (coop.compile refuses it)
        torch._dynamo.reset()
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = coop.compile(Tied(), share, time_limit=5, example_batch=batch, rounds=3)
        held.append(_held_within_what_coop_saw(compiled, batch))
    assert held == sorted(held, reverse=True), held


def _node(node_id: int, inputs: tuple[int, ...], mem: int, cost: float = 1.0, kind: str = "forward") -> Node:
    return Node(id=node_id, name=f"n{node_id}", inputs=inputs, mem=mem, cost=cost, kind=kind)


def test_an_inlined_value_costs_no_bytes_and_its_readers_read_its_inputs() -> None:
    """a -> x (pointwise, read by r1 and r2) -> out: x inlined leaves a node less; r1 and r2 read a (x's input)
    and pay x's cost each; a value that is an output, and a non-pointwise value with two readers, stay."""
    gm = fx.GraphModule(nn.Module(), fx.Graph())
    graph = gm.graph
    a = graph.placeholder("a")
    x = graph.call_function(torch.ops.aten.tanh.default, (a,))
    r1 = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    mm = graph.call_function(torch.ops.aten.mm.default, (r1, r1))
    r2 = graph.call_function(torch.ops.aten.add.Tensor, (x, mm))
    r3 = graph.call_function(torch.ops.aten.add.Tensor, (mm, r2))
    for node in (a, x, r1, mm, r2, r3):
        node.meta["val"] = torch.empty(4, 4)
    fx_nodes = {n.name: n for n in graph.nodes}
    nodes = [Node(id=0, name="a", mem=64, cost=0, kind="input"), _node(1, (0,), 64, 2.0), _node(2, (1,), 64),
             _node(3, (2,), 64, 5.0), _node(4, (1, 3), 64), _node(5, (3, 4), 64)]
    names = ["a", x.name, r1.name, mm.name, r2.name, r3.name]
    lowered = Lowered(graph=Graph(name="g", nodes=nodes, outputs=(5,)), fx_names={i: [n] for i, n in enumerate(names)},
                      owner_of={n: i for i, n in enumerate(names)}, node_flops={})
    inlined = inline_unbuffered(lowered, fx_nodes, Observation(inline=frozenset({x.name, mm.name, r3.name})), set())
    rebuilt = inlined.lowered.graph
    assert inlined.names == {x.name}  # mm has two readers and is no pointwise op; r3 is the output
    assert len(rebuilt.nodes) == 5
    by_name = {n.name: n for n in rebuilt.nodes}
    assert by_name["n2"].inputs == (inlined.new_id[0],) and by_name["n2"].cost == 1.0 + 2.0
    assert by_name["n4"].inputs == (inlined.new_id[0], inlined.new_id[3]) and by_name["n4"].cost == 1.0 + 2.0
    assert sum(n.mem for n in rebuilt.nodes) == 5 * 64
