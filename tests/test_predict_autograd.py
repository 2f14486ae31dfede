"""Autograd's cost in the eager step, and the predicted overhead against eager that counts it (issue 42): on node
costs measured on this machine (``host_costs(True)``); the nominal model keeps the recomputations' overhead.

Oracles that do not read the code under test: eager's own autograd graph (walked from the loss's ``grad_fn``) for
the work counted on the captured program, hand arithmetic from fixed calibration numbers for the prediction, and
the simulator's numbers (``simulation.cost``, ``simulation.baseline_cost``) for the plan's side. No assertion reads
a clock: the real calibration is only checked for its structure (signs, cache, thread count restored).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

import coop
from coop.budget import baseline_peak
from coop.errors import OptionError
from coop.graph_capture import autograd_cost
from coop.graph_capture.autograd_cost import (
    LONG_CHAIN,
    SHORT_CHAIN,
    AutogradRates,
    AutogradWork,
    autograd_costs,
    autograd_costs_enabled,
    autograd_work,
    calibrate_autograd,
)
from coop.graph_capture.host_cost import host_costs
from coop.planner.prediction import overhead_against_eager, priced_in_host_seconds
from coop.zoo import build

prediction = importlib.import_module("coop.planner.prediction")


def _eager_autograd_graph(loss: torch.Tensor) -> tuple[int, int]:
    """(nodes other than AccumulateGrad, all nodes) of the autograd graph eager recorded for ``loss``."""
    seen: set[object] = set()
    stack = [loss.grad_fn]
    accumulate = 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        accumulate += type(node).__name__ == "AccumulateGrad"
        stack.extend(child for child, _ in node.next_functions)
    return len(seen) - accumulate, len(seen)


class _Unused(torch.nn.Module):
    """A parameter the loss does not reach: eager runs no AccumulateGrad for it."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.used(x)).sum()


def _fixed(monkeypatch: pytest.MonkeyPatch, by_threads: dict[int, AutogradRates]) -> None:
    """Predictions price autograd at ``by_threads[threads]`` (torch's current count for None), never measuring."""
    monkeypatch.setattr(prediction, "autograd_rates",
                        lambda threads=None: by_threads[torch.get_num_threads() if threads is None else threads])


# ------------------------------------------------------------------ the work counted on the captured program
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "unused"])
def test_the_counted_work_is_eager_autograd_graph(name: str) -> None:
    """The recorded forward ops and the engine's nodes equal eager's graph for the same step (BatchNorm in the CNN,
    attention in the transformer, a parameter the loss does not reach)."""
    if name == "unused":
        torch.manual_seed(0)
        model, batch, loss_fn = _Unused(), (torch.randn(4, 8),), None
    else:
        model, batch, loss_fn = build(name)
    captured = coop.capture(model, batch, loss_fn=loss_fn)
    loss = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
    recorded, nodes = _eager_autograd_graph(loss)
    assert autograd_work(captured) == AutogradWork(recorded=recorded, nodes=nodes)


# ------------------------------------------------------------------ the calibration
def test_the_calibration_divides_the_chain_times_as_hand_arithmetic_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chains of 10 and 110 ops: the per-op record cost is the growth of (grad - no grad) per added op, the per-node
    cost the growth of the backward per added op less one Python-dispatched kernel."""
    times = {SHORT_CHAIN: autograd_cost._ChainTimes(grad_s=40e-6, no_grad_s=30e-6, backward_s=100e-6),
             LONG_CHAIN: autograd_cost._ChainTimes(grad_s=200e-6, no_grad_s=150e-6, backward_s=460e-6)}
    monkeypatch.setattr(autograd_cost, "_chain_times", lambda length, timer: times[length])
    monkeypatch.setattr(autograd_cost, "best_seconds", lambda fn, calls, blocks, timer: 3e-6)
    rates = calibrate_autograd(1)
    # by hand: ((200 - 150) - (40 - 30)) / 100 = 0.4 us; (460 - 100) / 100 - 3 = 0.6 us
    assert rates.record_s == pytest.approx(0.4e-6) and rates.node_s == pytest.approx(0.6e-6) and rates.threads == 1


def test_a_difference_the_noise_made_negative_counts_as_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    times = {SHORT_CHAIN: autograd_cost._ChainTimes(grad_s=40e-6, no_grad_s=30e-6, backward_s=140e-6),
             LONG_CHAIN: autograd_cost._ChainTimes(grad_s=40e-6, no_grad_s=35e-6, backward_s=200e-6)}
    monkeypatch.setattr(autograd_cost, "_chain_times", lambda length, timer: times[length])
    monkeypatch.setattr(autograd_cost, "best_seconds", lambda fn, calls, blocks, timer: 3e-6)
    assert calibrate_autograd(2) == AutogradRates(record_s=0.0, node_s=0.0, threads=2)


def test_the_real_calibration_is_positive_cached_per_thread_count_and_puts_the_threads_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    autograd_cost.forget_autograd_rates()
    before = torch.get_num_threads()
    calls: list[int] = []
    real = autograd_cost.calibrate_autograd

    def counted(threads: int, timer=None) -> AutogradRates:
        calls.append(threads)
        return real(threads)

    monkeypatch.setattr(autograd_cost, "calibrate_autograd", counted)
    with torch.no_grad():  # a caller's no_grad does not reach the calibration's chains
        one = autograd_cost.autograd_rates(1)
    # each part is 0 or more (a noisy difference counts as 0), and autograd costs something
    assert one.node_s >= 0 and one.record_s >= 0 and one.record_s + one.node_s > 0 and one.threads == 1
    assert math.isfinite(one.record_s) and math.isfinite(one.node_s)
    assert autograd_cost.autograd_rates(1) is one
    two = autograd_cost.autograd_rates(2)
    assert two.threads == 2 and autograd_cost.autograd_rates(2) is two
    assert calls == [1, 2]  # once per thread count
    assert torch.get_num_threads() == before
    autograd_cost.forget_autograd_rates()
    autograd_cost.autograd_rates(1)
    assert calls == [1, 2, 1]


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_a_thread_count_that_is_not_a_whole_number_of_at_least_one_is_refused(threads: object) -> None:
    with pytest.raises(OptionError, match="thread"):
        autograd_cost.autograd_rates(threads)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="thread"):
        calibrate_autograd(threads)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", [{"record_s": -1e-6}, {"node_s": float("nan")}, {"node_s": float("inf")},
                                    {"record_s": True}, {"threads": 0}])
def test_rates_that_make_no_sense_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(OptionError):
        AutogradRates(**{"record_s": 1e-6, "node_s": 1e-6, "threads": 1, **fields})  # type: ignore[arg-type]


# ------------------------------------------------------------------ the prediction
def test_the_overhead_against_eager_by_hand() -> None:
    """Schedule 1.2 s, baseline 1.0 s, 100 recorded ops at 1 ms and 120 nodes at 2.5 ms: eager 1.0 + 0.1 + 0.3 =
    1.4 s, so 1.2 / 1.4 - 1; without rates the recomputations' 20 %."""
    work = AutogradWork(recorded=100, nodes=120)
    rates = AutogradRates(record_s=1e-3, node_s=2.5e-3, threads=1)
    assert overhead_against_eager(1.2, 1.0, work, rates) == pytest.approx(1.2 / 1.4 - 1)
    assert overhead_against_eager(1.2, 1.0, work, None) == pytest.approx(0.2)
    assert overhead_against_eager(0.0, 0.0, AutogradWork(0, 0), rates) == 0.0


@pytest.fixture(scope="module")
def transformer():
    """Plans of a step priced at this machine's measured rates (the term applies to measured costs only)."""
    model, batch, _ = build("transformer")
    loss = model(*batch)
    recorded, nodes = _eager_autograd_graph(loss)
    with host_costs(True):
        captured = coop.capture(model, batch)
    store_all = coop.plan(model, 2 * baseline_peak(captured.graph), batch, captured=captured, formulation="store-all",
                          progress=False)
    checkpoint = coop.plan(model, 1.0, batch, captured=captured, formulation="checkpoint-all", progress=False)
    return model, batch, recorded, nodes, store_all, checkpoint


def test_a_plan_predicts_its_step_against_the_eager_step_with_autograd(transformer, monkeypatch) -> None:
    """A recomputing plan: its schedule's cost over (baseline + eager's counted autograd work at the fixed rates)."""
    _, _, recorded, nodes, _, plan = transformer
    rates = AutogradRates(record_s=1e-6, node_s=5e-6, threads=1)
    _fixed(monkeypatch, {1: rates, torch.get_num_threads(): rates})
    simulation = plan.simulation
    assert simulation.cost > simulation.baseline_cost  # it recomputes
    eager = simulation.baseline_cost + recorded * 1e-6 + nodes * 5e-6
    assert plan.predicted_overhead_at(1) == pytest.approx(simulation.cost / eager - 1)
    assert plan.predicted_overhead == pytest.approx(simulation.cost / eager - 1)
    assert plan.predicted_recompute_overhead == pytest.approx(simulation.cost / simulation.baseline_cost - 1)
    summary = plan.summary()
    assert summary["predicted_overhead"] == plan.predicted_overhead
    assert summary["predicted_recompute_overhead"] == plan.predicted_recompute_overhead
    assert summary["autograd_cost"] == {"record_us": 1.0, "node_us": 5.0, "threads": rates.threads,
                                        "recorded": recorded, "nodes": nodes}


@pytest.mark.parametrize(("record_s", "node_s"), [(0.0, 0.0), (1e-6, 0.0), (0.0, 1e-6), (2e-6, 7e-6)])
def test_store_all_predicts_a_negative_overhead_exactly_when_autograd_costs_something(
        transformer, monkeypatch, record_s: float, node_s: float) -> None:
    _, _, _, _, store_all, _ = transformer
    rates = AutogradRates(record_s=record_s, node_s=node_s, threads=1)
    _fixed(monkeypatch, {1: rates, torch.get_num_threads(): rates})
    assert store_all.predicted_recompute_overhead == 0.0
    if record_s + node_s > 0:
        assert store_all.predicted_overhead_at(1) < 0
    else:
        assert store_all.predicted_overhead_at(1) == 0.0


def test_switched_off_the_prediction_is_the_recomputations_overhead(transformer, monkeypatch) -> None:
    _, _, _, _, store_all, plan = transformer
    _fixed(monkeypatch, {n: AutogradRates(record_s=1e-6, node_s=5e-6, threads=n) for n in (1, 2, 4, 8, 16)})
    assert autograd_costs_enabled()
    with autograd_costs(False):
        assert not autograd_costs_enabled()
        assert plan.predicted_overhead == plan.predicted_recompute_overhead
        assert store_all.predicted_overhead == 0.0
        assert plan.summary()["autograd_cost"] is None
    assert autograd_costs_enabled()


def test_costs_not_measured_on_a_cpu_step_get_no_autograd_term(transformer) -> None:
    plan = transformer[5]
    graph = plan.graph
    assert priced_in_host_seconds(graph)
    assert not priced_in_host_seconds(graph.model_copy(update={"meta": {**graph.meta, "cost_unit": "flops"}}))
    nominal = {key: value for key, value in graph.meta.items() if key != "host_cost"}
    assert not priced_in_host_seconds(graph.model_copy(update={"meta": nominal}))
    on_gpu = [node.model_copy(update={"device": "cuda:0"}) if node.kind == "forward" else node for node in graph.nodes]
    assert not priced_in_host_seconds(graph.model_copy(update={"nodes": on_gpu}))


def test_a_nominal_capture_predicts_its_recomputations_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    """coop's default costs leave each op's host cost out, so autograd's seconds would not be on their scale."""
    _fixed(monkeypatch, {n: AutogradRates(record_s=1e-6, node_s=5e-6, threads=n) for n in (1, 2, 4, 8, 16)})
    model, batch, _ = build("transformer")
    plan = coop.plan(model, 1.0, batch, formulation="checkpoint-all", progress=False)
    assert "host_cost" not in plan.graph.meta
    assert plan.predicted_overhead == plan.predicted_recompute_overhead > 0
    assert plan.summary()["autograd_cost"] is None


def test_a_profiled_capture_is_priced_in_measured_seconds() -> None:
    """``profile=True`` times the real step: its node costs carry each op's host cost, so the term applies."""
    model, batch, _ = build("mlp")
    profiled = coop.capture(model, batch, profile=True)
    assert priced_in_host_seconds(profiled.graph)
    assert not priced_in_host_seconds(coop.capture(model, batch).graph)


def test_a_benchmark_predicts_at_the_thread_count_it_ran_at(transformer, monkeypatch) -> None:
    """Autograd priced at 2 threads where the benchmark ran at 2, whatever torch's count is outside it."""
    _, batch, recorded, nodes, _, plan = transformer
    by_threads = {n: AutogradRates(record_s=1e-6 * n, node_s=5e-6 * n, threads=n) for n in (1, 2, 4, 8, 16)}
    _fixed(monkeypatch, by_threads)
    monkeypatch.setattr(plan, "last_benchmark", None)  # put back after the test: the fixture is shared
    result = plan.benchmark(batch, steps=1, warmup=0, threads=2)
    simulation = plan.simulation
    eager = simulation.baseline_cost + recorded * 2e-6 + nodes * 10e-6
    assert result.threads == 2
    assert result.predicted_overhead == pytest.approx(simulation.cost / eager - 1)
    # what summary() shows beside the measurement is priced like it, at 2 threads
    assert plan.predicted_overhead == result.predicted_overhead == plan.summary()["predicted_overhead"]
    assert plan.summary()["autograd_cost"]["threads"] == 2
