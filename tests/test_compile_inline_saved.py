"""Saved pointwise values recomputed in the backward (coop.compiled.inline_saved).

Oracles: hand-built Graphs whose per-step bytes are counted by hand (in the comments), the CPU allocator's report of
the compiled step (:func:`coop.compiled.measure.held_bytes`), and the same step compiled without the pass (loss and
gradients bit-identical).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from coop.compiled.inline_saved import recompute_in_backward
from coop.compiled.measure import held_bytes
from coop.compiled.partitioner import CoopPartitioner
from coop.errors import CoopError
from coop.graph import Graph, Node
from coop.schedule import Schedule, Step


def _graph(g_reads_a: bool = True, v_workspace: int = 0) -> Graph:
    """x (input, 100) -> a (40) -> v (40, pointwise) -> y (10, the loss); the tangent t (10) -> w (200) -> u (10)
    -> g (20), g reading u, v and (``g_reads_a``) a, as a pointwise gradient reads its forward input."""
    g_inputs = (6, 2, 1) if g_reads_a else (6, 2)
    return Graph(outputs=(3, 7), nodes=[
        Node(id=0, name="x", mem=100, cost=0, kind="input"),
        Node(id=1, name="a", inputs=(0,), mem=40, cost=1),
        Node(id=2, name="v", inputs=(1,), mem=40, cost=1, workspace=v_workspace),
        Node(id=3, name="y", inputs=(2,), mem=10, cost=1),
        Node(id=4, name="t", inputs=(3,), mem=10, cost=0, kind="backward", recomputable=False),
        Node(id=5, name="w", inputs=(4,), mem=200, cost=1, kind="backward"),
        Node(id=6, name="u", inputs=(5,), mem=10, cost=1, kind="backward"),
        Node(id=7, name="g", inputs=g_inputs, mem=20, cost=1, kind="backward"),
    ])


STORE_ALL = Schedule.from_order([1, 2, 3, 4, 5, 6, 7])


def test_a_saved_value_whose_input_is_held_moves_and_the_peak_falls() -> None:
    # store-all: a lives 0..6 and v 1..6 (g reads both); at w's step: x100 + a40 + v40 + y10 + t10 + w200 = 400
    # moved: v's forward instance lives 1..2 (y reads it); at w's step 100 + 40 + 10 + 10 + 200 = 360; v recomputed
    # before g: 100 + a40 + y10 + u10 + v40 = 200, then g: 220
    schedule, verdict, moved = recompute_in_backward(_graph(), STORE_ALL, 400, [2], {4})
    assert moved == (2,)
    assert [(s.op, s.node) for s in schedule.steps] == [("compute", n) for n in (1, 2, 3, 4, 5, 6, 2, 7)]
    assert verdict.ok and verdict.peak == 360
    assert verdict.simulation.memory == [140, 180, 190, 160, 360, 360, 200, 220]


def test_a_value_whose_input_the_backward_does_not_hold_stays_saved() -> None:
    # g no longer reads a, so a dies at v's step (1): recomputing v would keep a alive through the backward
    graph = _graph(g_reads_a=False)
    schedule, verdict, moved = recompute_in_backward(graph, STORE_ALL, 400, [2], {4})
    # at w's step: x100 + v40 + y10 + t10 + w200 (a is gone); moving v would add a's 40 through to g
    assert moved == () and schedule == STORE_ALL and verdict.peak == 360


def test_a_move_over_the_budget_is_refused_and_one_within_it_is_taken() -> None:
    # v's workspace 250: its first compute peaks at 180 + 250 = 430; recomputed before g, at 200 + 250 = 450
    graph = _graph(v_workspace=250)
    schedule, verdict, moved = recompute_in_backward(graph, STORE_ALL, 430, [2], {4})
    assert moved == () and schedule == STORE_ALL and verdict.peak == 430
    schedule, verdict, moved = recompute_in_backward(graph, STORE_ALL, 450, [2], {4})
    assert moved == (2,) and verdict.peak == 450


def test_a_value_recomputed_in_the_backward_already_is_left_alone() -> None:
    # the schedule frees v in the forward and recomputes it before g: nothing of its forward instance is saved
    steps = [Step(op="compute", node=n) for n in (1, 2, 3)] + [Step(op="free", node=2)] + \
        [Step(op="compute", node=n) for n in (4, 5, 6, 2, 7)]
    schedule = Schedule(steps=tuple(steps))
    rewritten, _, moved = recompute_in_backward(_graph(), schedule, 400, [2], {4})
    assert moved == () and rewritten == schedule


def test_an_illegal_or_over_budget_schedule_is_refused() -> None:
    with pytest.raises(CoopError, match="exceeds the budget"):
        recompute_in_backward(_graph(), STORE_ALL, 399, [2], {4})


class NewGelu(nn.Module):
    """GPT-2's tanh GELU written out (Hugging Face's ``NewGELUActivation``): its backward reads ``tanh`` and the
    products around it, pointwise values of the saved matmul output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


class GeluMlp(nn.Module):
    def __init__(self, width: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), NewGelu(), nn.Linear(width, width))
                                    for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(torch.layer_norm(x, (x.shape[-1],)))
        return x.logsumexp(-1).mean()


def _compiled_step(model: nn.Module, batch: torch.Tensor, inline_saved: bool):
    torch._dynamo.reset()
    part = CoopPartitioner(1.0, inline_saved=inline_saved, time_limit=10)
    compiled = torch.compile(model, options={"custom_partitioner_fn": part})
    loss = compiled(batch)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return part.plans[-1], loss.detach(), grads, held_bytes(compiled, batch, None)


def test_the_compiled_step_saves_fewer_values_holds_less_and_trains_bit_identically() -> None:
    torch.manual_seed(0)
    model = GeluMlp()
    batch = torch.randn(256, 64)
    before, loss_before, grads_before, held_before = _compiled_step(copy.deepcopy(model), batch, False)
    after, loss_after, grads_after, held_after = _compiled_step(copy.deepcopy(model), batch, True)
    assert after.moved and not before.moved, after.summary()
    assert len(after.partition.saved) == len(before.partition.saved) - len(after.moved)
    assert after.peak < before.peak <= after.budget
    assert held_after < held_before  # the CPU allocator's peak of the compiled step
    assert torch.equal(loss_after, loss_before)
    for mine, theirs in zip(grads_after, grads_before, strict=True):
        assert torch.equal(mine, theirs)
