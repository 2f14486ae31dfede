"""Issue 15: a plan replayed inside one arena at its planned offsets (coop.runtime.arena_replay).

Oracles: eager PyTorch (a deep copy of the model runs ``loss.backward()`` and its own AdamW under the
same seeds; loss, gradients, parameters and buffers ``torch.equal`` after every step), the memory
meter (an independent count of the storages a step allocates), and the placement's own numbers
(each output's address inside the arena is read from the tensor's data pointer).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

import coop
from coop import capture
from coop.errors import CoopError
from coop.online.static_arena import Placement, best_fit_placement, execution_placement
from coop.runtime.executor import Executor
from coop.runtime.meter import MemoryMeter
from coop.schedule import Schedule
from coop.zoo import build

STEPS = 3
MODELS = {
    "mlp": {},
    "cnn": {},
    "transformer": {},
    "gpt2": {"layers": 1, "hidden": 32, "seq": 16, "vocab": 64},
    "resnet": {"hidden": 4, "image": 16},
}


def _eager_step(loss_fn: Callable | None) -> Callable:
    def step(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        loss = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
        loss.backward()
        return loss.detach()
    return step


def _train(model: torch.nn.Module, batch: tuple, step: Callable) -> list[list[torch.Tensor]]:
    """Loss, gradients, parameters and buffers after each of STEPS AdamW steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    states = []
    for index in range(STEPS):
        torch.manual_seed(100 + index)
        loss = step(model, batch)
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
        states.append([loss, *grads, *(p.detach().clone() for p in model.parameters()),
                       *(b.clone() for b in model.buffers())])
    return states


def _assert_equal(expected: list[list[torch.Tensor]], got: list[list[torch.Tensor]]) -> None:
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        for index, (a, b) in enumerate(zip(want, have, strict=True)):
            assert torch.equal(a, b), f"step {step}: tensor {index} differs from eager"


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("formulation", ["store-all", "checkpoint-all"])
def test_arena_plan_is_bit_identical_to_eager_over_optimizer_steps(name: str, formulation: str) -> None:
    model, batch, loss_fn = build(name, **MODELS[name])
    eager = copy.deepcopy(model)
    plan = coop.plan(model, "1GiB", batch, loss_fn=loss_fn, formulation=formulation, arena=True)
    assert plan.executor.arena_program is not None
    expected = _train(eager, batch, _eager_step(loss_fn))
    got = _train(model, batch, lambda m, b: plan.step(*b).detach())
    _assert_equal(expected, got)


def _arena_executor(name: str, schedule_of: Callable = lambda graph: Schedule.from_order(graph.order)):
    model, batch, loss_fn = build(name, **MODELS[name])
    captured = capture(model, batch, loss_fn=loss_fn)
    ordinary = Executor(captured, schedule_of(captured.graph))
    placement = execution_placement(ordinary.graph, ordinary.schedule)
    return model, batch, captured, ordinary, placement, Executor(captured, ordinary.schedule, arena=placement)


@pytest.mark.parametrize("name", ["mlp", "gpt2", "resnet"])
def test_meter_sees_one_arena_allocation_and_only_the_reported_transients(name: str) -> None:
    model, batch, captured, ordinary, _, executor = _arena_executor(name)
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(0)
    expected = ordinary.run_flat(flat)
    torch.manual_seed(0)
    with MemoryMeter() as meter:
        meter.track(*flat)
        outputs = executor.run_flat(flat)
    assert all(torch.equal(a, b) for a, b in zip(expected, outputs, strict=True))
    program = executor.arena_program
    arena_allocations = [a for a in meter.allocations if a[0] == "aten.empty.memory_format"]
    assert arena_allocations == [("aten.empty.memory_format", -(-program.arena_bytes // 64) * 64)]
    others = sorted(nbytes for op, nbytes in meter.allocations if op != "aten.empty.memory_format")
    assert others == sorted(nbytes for t in program.transients for nbytes in t.storages)
    assert meter.peak_bytes == executor.predicted_peak
    if name == "mlp":  # every MLP op writes its view in place: nothing but the arena is allocated
        assert meter.allocations == arena_allocations and not program.transients


def test_arena_holds_no_more_than_the_placement_and_values_sit_at_their_offsets() -> None:
    model, batch, captured, _, placement, executor = _arena_executor("mlp")
    computed = [(b, o) for b, o in zip(placement.lifetimes, placement.offsets, strict=True) if b.instance >= 0]
    base = min(o for _, o in computed)
    assert executor.arena_program.arena_bytes == max(o + b.size for b, o in computed) - base <= placement.arena_peak
    outputs = executor.run_flat(captured.flat_inputs(model, batch))
    final = {inst.node: k for k, inst in enumerate(executor.simulation.instances)}
    checked = 0
    for fx_node, value in zip(captured.output_nodes(), outputs, strict=True):
        node_id = captured.owner_of[fx_node.name]
        if executor.graph.node(node_id).caller_owned:
            continue
        block = next((b, o) for b, o in computed if b.instance == final[node_id] and b.end == len(executor.schedule) - 1)
        assert value.data_ptr() - value.untyped_storage().data_ptr() == block[1] - base
        assert value.data_ptr() % 64 == value.untyped_storage().data_ptr() % 64
        checked += 1
    assert checked == len(captured.grad_names) + 1  # the gradients and the loss


def test_bad_or_too_small_arena_is_one_line_error() -> None:
    model, batch, loss_fn = build("mlp")
    captured = capture(model, batch, loss_fn=loss_fn)
    executor = Executor(captured, Schedule.from_order(captured.graph.order))
    good = execution_placement(executor.graph, executor.schedule)
    unaligned = best_fit_placement(executor.graph, executor.schedule)
    too_small = Placement(good.method, good.status, good.lifetimes, good.offsets, good.arena_peak - 64, good.live_peak,
                          extra=good.extra)
    overlapping = Placement(good.method, good.status, good.lifetimes, [0] * len(good.offsets), good.arena_peak,
                            good.live_peak, extra=good.extra)
    for bad, words in [(unaligned, "execution_placement"), (too_small, "too small"), (overlapping, "overlap"),
                       ("64MB", "Placement")]:
        with pytest.raises(CoopError) as error:
            Executor(captured, executor.schedule, arena=bad)
        assert words in str(error.value) and "\n" not in str(error.value)
    checkpointed = coop.formulations.solve(executor.graph, 10**12, "checkpoint-all").schedule
    with pytest.raises(CoopError, match="another schedule"):
        Executor(captured, checkpointed, arena=good)


def test_replay_runs_bound_ops_bit_identical_to_fx_code() -> None:
    model, batch, loss_fn = build("transformer")
    captured = capture(model, batch, loss_fn=loss_fn)
    executor = Executor(captured, Schedule.from_order(captured.graph.order))
    assert "torch.ops.aten" not in executor.code and "_op_aten_" in executor.code
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(0)
    fx_outputs = executor.module(*flat)
    torch.manual_seed(0)
    bound_outputs = executor.run_flat(flat)
    assert all(torch.equal(a, b) for a, b in zip(fx_outputs, bound_outputs, strict=True))
