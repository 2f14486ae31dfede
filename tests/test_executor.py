"""The executor replays every baseline schedule bit-exactly and within its predicted peak."""

from __future__ import annotations

import pytest
import torch

from coop import Schedule, Step, capture, simulate
from coop.errors import ScheduleError
from coop.formulations import BASELINES, solve
from coop.runtime.executor import Executor
from coop.runtime.meter import MemoryMeter
from coop.zoo import build

MODELS = ("mlp", "cnn", "transformer")


@pytest.fixture(scope="module", params=MODELS)
def captured_model(request: pytest.FixtureRequest):
    model, batch, loss_fn = build(request.param)
    return model, batch, capture(model, batch, loss_fn)


def metered_run(executor: Executor, flat: list[torch.Tensor], extra: list[torch.Tensor]) -> tuple[list, MemoryMeter]:
    with MemoryMeter() as meter:
        meter.track(*flat, *extra)
        outputs = executor.run_flat(flat)
    return outputs, meter


@pytest.mark.parametrize("formulation", BASELINES)
def test_baseline_schedules_replay_exactly_within_prediction(captured_model, formulation: str) -> None:
    model, batch, captured = captured_model
    result = solve(captured.graph, 10**12, formulation)
    executor = Executor(captured, result.schedule)
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(11)
    outputs, meter = metered_run(executor, flat, captured.constants())
    torch.manual_seed(11)
    reference = captured.run(model, *batch)
    assert len(outputs) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
    predicted = simulate(captured.graph, result.schedule).peak
    assert meter.peak_bytes <= predicted * 1.02


def _paged_store_all(captured) -> Schedule:
    """Baseline order, paging out the largest forward activation until its first backward reader."""
    graph = captured.graph
    forward = [graph.node(i) for i in graph.order if graph.node(i).kind == "forward" and graph.node(i).recomputable]
    victim = max(forward, key=lambda n: n.mem)
    readers = [i for i in graph.order if victim.id in graph.node(i).inputs]
    first_reader, last_reader = readers[0], readers[-1]
    steps: list[Step] = []
    for node_id in graph.order:
        if node_id == last_reader and len(readers) > 1 or (len(readers) == 1 and node_id == first_reader):
            steps.append(Step(op="page_in", node=victim.id))
        steps.append(Step(op="compute", node=node_id))
        if node_id == victim.id and len(readers) == 1:
            steps.append(Step(op="page_out", node=victim.id))
        if node_id == readers[0] and len(readers) > 1:
            steps.append(Step(op="page_out", node=victim.id))
    return Schedule(steps=tuple(steps))


def test_paging_moves_values_to_the_host_pool(captured_model) -> None:
    model, batch, captured = captured_model
    schedule = _paged_store_all(captured)
    executor = Executor(captured, schedule)
    assert "to_host" in executor.code and "to_device" in executor.code
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(5)
    outputs, meter = metered_run(executor, flat, captured.constants())
    torch.manual_seed(5)
    reference = captured.run(model, *batch)
    assert all(torch.equal(a, b) for a, b in zip(outputs, reference, strict=True))
    assert meter.host_peak_bytes > 0
    assert meter.peak_bytes <= simulate(captured.graph, schedule).peak * 1.02


def test_recomputing_a_random_op_is_refused() -> None:
    model, batch, _ = build("mlp")
    captured = capture(model, batch)
    graph = captured.graph
    random_id = next(n.id for n in graph.nodes if not n.recomputable and not n.caller_owned)
    steps = [Step(op="compute", node=i) for i in graph.order]
    position = graph.order.index(random_id)
    steps.insert(position + 1, Step(op="compute", node=random_id))
    with pytest.raises(ScheduleError, match="not recomputable"):
        Executor(captured, Schedule(steps=tuple(steps)))


def test_illegal_schedule_is_refused_with_the_step() -> None:
    model, batch, _ = build("mlp")
    captured = capture(model, batch)
    with pytest.raises(ScheduleError, match="step 0"):
        Executor(captured, Schedule(steps=(Step(op="compute", node=captured.graph.order[-1]),)))
