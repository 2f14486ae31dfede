"""The per-op host cost of coop.graph_capture.host_cost (issue 42), against oracles that do not read the cost code:
dispatches counted by a TorchDispatchMode on the real step, FlopCounterMode's FLOPs, hand arithmetic."""

from __future__ import annotations

import importlib
import itertools
import operator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from coop import capture
from coop.graph_capture import host_cost
from coop.graph_capture.cost import without_interpreter_overhead
from coop.graph_capture.host_cost import (
    GRAIN_SIZE,
    MachineRates,
    calibrate,
    element_key,
    element_recipes,
    host_costs,
    host_costs_enabled,
)
from coop.zoo import build


class _CountDispatches(TorchDispatchMode):
    """Counts the aten ops dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _fixed(monkeypatch: pytest.MonkeyPatch, rates: MachineRates) -> None:
    """Captures price at ``rates`` with host costs on (the module, not the package's ``lower`` function of the same name)."""
    lowering = importlib.import_module("coop.graph_capture.lower")
    monkeypatch.setattr(lowering, "machine_rates", lambda threads=None: rates)
    monkeypatch.setattr(lowering, "host_costs_enabled", lambda: True)  # off by default: these tests price with it


def test_the_baseline_is_one_host_cost_per_dispatched_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """With free kernels, the nodes cost the per-op cost times the ops the captured program dispatches when it runs
    (counted by a dispatch mode on the real tensors, not by the cost code): every op priced once. (Views of a
    parameter fold into the parameter's node, which the baseline leaves out as caller-owned.)"""
    _fixed(monkeypatch, MachineRates(per_op_s=1e-6, flop_rate=1e30, bandwidth=1e30, parallel_s=0.0, threads=1))
    model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
    captured = capture(model, batch)
    counter = _CountDispatches()
    with torch.no_grad(), counter:
        captured.module(*captured.flat_inputs(model, batch))
    assert counter.count > 20
    assert sum(n.cost for n in captured.graph.nodes) == pytest.approx(counter.count * 1e-6, rel=1e-6)
    assert all(n.cost > 0 for n in captured.graph.nodes if not n.caller_owned and not n.output_of)


def test_with_free_dispatch_the_baseline_is_the_flops_at_the_measured_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlopCounterMode's count of the eager step over the FLOP rate, when dispatch and bytes cost nothing."""
    _fixed(monkeypatch, MachineRates(per_op_s=0.0, flop_rate=1e9, bandwidth=1e30, parallel_s=0.0, threads=1))
    model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
    captured = capture(model, batch)
    with FlopCounterMode(display=False) as counter:
        model(*batch).backward()
    model.zero_grad(set_to_none=True)
    assert sum(n.cost for n in captured.graph.nodes) == pytest.approx(counter.get_total_flops() / 1e9, rel=1e-9)


class Matmul(torch.nn.Module):
    """``then(x @ w).sum()`` with w (8, 16): the hand-counted steps of the cost tests."""

    def __init__(self, then) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 16))
        self.then = then

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.then(x @ self.w).sum()


def test_a_one_matmul_step_costs_what_the_hand_count_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """``x @ w`` summed, w (8, 16), x (4, 8): the mm node costs one dispatch + 2*4*8*16 FLOPs + (32+128+64)*4 bytes."""
    rates = MachineRates(per_op_s=3e-6, flop_rate=1e10, bandwidth=1e9, parallel_s=0.0, threads=1)
    _fixed(monkeypatch, rates)

    captured = capture(Matmul(lambda y: y), (torch.randn(4, 8),))
    forward_mm = [n for n in captured.graph.nodes if n.op == "aten.mm.default" and n.kind == "forward"]
    assert len(forward_mm) == 1
    expected = 3e-6 + 2 * 4 * 8 * 16 / 1e10 + (4 * 8 + 8 * 16 + 4 * 16) * 4 / 1e9
    assert forward_mm[0].cost == pytest.approx(expected, rel=1e-9)
    assert captured.graph.meta["host_cost"]["per_op_us"] == 3.0


def test_the_thread_pool_wake_up_is_paid_above_the_grain_size_only_with_threads() -> None:
    one = MachineRates(per_op_s=1e-6, flop_rate=1e10, bandwidth=1e10, parallel_s=5e-6, threads=1)
    two = MachineRates(per_op_s=1e-6, flop_rate=1e10, bandwidth=1e10, parallel_s=5e-6, threads=2)
    assert one.op_seconds(0, 0, GRAIN_SIZE, True) == pytest.approx(1e-6)
    assert two.op_seconds(0, 0, GRAIN_SIZE, True) == pytest.approx(6e-6)
    assert two.op_seconds(0, 0, GRAIN_SIZE - 1, True) == pytest.approx(1e-6)
    assert two.op_seconds(100, 100, GRAIN_SIZE, False) == 0.0


def test_host_costs_are_off_by_default_and_keep_the_nominal_model() -> None:
    model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
    assert not host_costs_enabled()
    nominal = capture(model, batch)
    assert "host_cost" not in nominal.graph.meta
    assert "nominal" not in nominal.graph.meta["cost_unit"] and "1e+11" in nominal.graph.meta["cost_unit"]
    with host_costs(True):
        assert host_costs_enabled()
        priced = capture(model, batch)
    assert not host_costs_enabled()
    assert priced.graph.meta["host_cost"]["threads"] == torch.get_num_threads()
    assert "measured rates" in priced.graph.meta["cost_unit"]


def test_calibration_divides_the_measured_times_as_hand_arithmetic_says() -> None:
    """A fake clock that advances 1 ms per reading: each block of n calls takes 1 ms, so a call takes 1/n ms."""
    ticks = itertools.count()
    rates = calibrate(2, timer=lambda: 1e-3 * next(ticks))
    per_op = 1e-3 / 50 / 4
    assert rates.per_op_s == pytest.approx(per_op)
    assert rates.flop_rate == pytest.approx(2 * 256 ** 3 / (1e-3 / 4 - per_op))
    bandwidth = 12 * 2 ** 20 / (1e-3 / 4 - per_op)
    assert rates.bandwidth == pytest.approx(bandwidth)
    assert rates.parallel_s == pytest.approx(1e-3 / 10 - per_op - 12 * 2 * GRAIN_SIZE / bandwidth)
    assert rates.settle_tries == 1  # the probe's 0.25 ms a call is no stall
    # both convolutions of 2 calls per 1 ms block: equal times, so the floor per FLOP, and the small one's 0.5 ms less
    # the dispatch is its call (two calls for the backward); 55,296 FLOPs: 2 x 2 x 64 x 8 x 27, by hand
    for op, calls in (("aten.convolution", 1), ("aten.convolution_backward", 2)):
        call, per_flop = rates.fitted[op]
        assert per_flop == pytest.approx(1e-15)
        assert call == pytest.approx((0.5e-3 - per_op - calls * 55_296 * 1e-15) / calls)
    assert calibrate(1, timer=lambda: 1e-3 * next(ticks)).parallel_s == 0.0


def test_the_real_calibration_is_positive_and_cached_per_thread_count() -> None:
    host_cost.forget_rates()
    rates = host_cost.machine_rates(1)
    assert rates.per_op_s > 0 and rates.flop_rate > 0 and rates.bandwidth > 0 and rates.parallel_s == 0.0
    assert host_cost.machine_rates(1) is rates


def test_the_interpreter_overhead_is_taken_out_as_one_amount_per_node() -> None:
    corrected, overhead = without_interpreter_overhead({"a": 10.0, "b": 4.0, "c": 1.0}, step_s=9.0)
    assert overhead == pytest.approx(2.0)  # (15 - 9) / 3
    assert corrected == pytest.approx({"a": 8.0, "b": 2.0, "c": 0.1})  # c keeps a tenth of its time
    unchanged, none = without_interpreter_overhead({"a": 1.0}, step_s=5.0)
    assert unchanged == {"a": 1.0} and none == 0.0


def test_a_profiled_capture_records_the_correction() -> None:
    model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
    with host_costs(True):
        captured = capture(model, batch, profile=True)
    meta = captured.graph.meta["host_cost"]
    assert meta["interpreter_us"] >= 0 and meta["step_ms"] > 0
    assert all(n.cost >= 0 for n in captured.graph.nodes)
    with host_costs(False):
        raw = capture(model, batch, profile=True)
    assert "host_cost" not in raw.graph.meta


def test_a_benchmark_says_when_it_ran_at_another_thread_count_than_the_costs_were_measured_at() -> None:
    """The plan is priced at torch's thread count when captured; timed at another, its text says so."""
    from coop.planner.benchmark import StepBenchmark, _priced_threads

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
        with host_costs(True):
            captured = capture(model, batch)
    finally:
        torch.set_num_threads(previous)

    class Planned:
        graph = captured.graph

    assert _priced_threads(Planned()) == 1
    timed = StepBenchmark(plan_ms=2.0, eager_ms=1.0, measured_overhead=1.0, predicted_overhead=0.5, threads=2, steps=9,
                          warmup=2, priced_threads=1)
    assert timed.priced_elsewhere() == " (costs measured at 1 thread)"
    assert timed.as_dict()["priced_threads"] == 1
    same = StepBenchmark(plan_ms=2.0, eager_ms=1.0, measured_overhead=1.0, predicted_overhead=0.5, threads=1, steps=9,
                         warmup=2, priced_threads=1)
    assert same.priced_elsewhere() == ""


def test_an_op_priced_per_element_pays_the_larger_of_its_elements_and_its_bytes() -> None:
    """Hand arithmetic: 1000 elements at 2 ns beat 4000 bytes at 1 GB/s (2 µs against 4 µs only when the bytes are
    more); an op outside the table keeps the roofline, and no wake-up is added to a table op (its measurement holds it)."""
    rates = MachineRates(per_op_s=1e-6, flop_rate=1e10, bandwidth=1e9, parallel_s=5e-6, threads=2,
                         element_s={"aten.tanh": 2e-9})
    assert rates.op_seconds(0, 1000, 1000, True, op="aten.tanh") == pytest.approx(1e-6 + 2e-6)
    assert rates.op_seconds(0, 4000, 1000, True, op="aten.tanh") == pytest.approx(1e-6 + 4e-6)
    assert rates.op_seconds(0, 1000, GRAIN_SIZE, True, op="aten.tanh") == pytest.approx(1e-6 + GRAIN_SIZE * 2e-9)
    assert rates.op_seconds(0, 1000, GRAIN_SIZE, True, op="aten.exp") == pytest.approx(1e-6 + 1e-6 + 5e-6)
    assert rates.op_seconds(0, 1000, 1000, False, op="aten.tanh") == 0.0
    assert rates.as_dict()["element_ns"] == {"aten.tanh": 2.0}


def test_element_keys_name_the_op_and_a_cast_its_source_dtype() -> None:
    aten = torch.ops.aten
    assert element_key(aten.tanh.default) == "aten.tanh"
    assert element_key(aten.div.Scalar) == element_key(aten.div.Tensor) == "aten.div"
    assert element_key(aten._to_copy.default, torch.ones(2, dtype=torch.bool)) == "aten._to_copy.bool"
    assert element_key(aten._to_copy.default, torch.ones(2)) == "aten._to_copy.float32"
    assert element_key(operator.getitem) == ""


def test_every_recipe_names_a_real_op_and_calibrates_by_hand_arithmetic() -> None:
    """Each table key resolves to an op (a typo would price nothing), and with a fake clock (1 ms per block of 2 calls)
    each op's per-element seconds are (0.5 ms - the per-op cost) / the calibration's elements."""
    recipes = element_recipes()
    assert {"aten.tanh", "coop.bernoulli_mask", "aten._native_batch_norm_legit_functional", "aten._to_copy.bool"} \
        <= set(recipes)
    for key in recipes:
        namespace, name = key.split(".")[:2]
        assert hasattr(getattr(torch.ops, namespace), name), key
    ticks = itertools.count()
    rates = calibrate(1, timer=lambda: 1e-3 * next(ticks))
    elements = host_cost.ELEMENT_ROWS * host_cost.ELEMENT_COLUMNS
    assert set(rates.element_s) == set(recipes)
    for seconds in rates.element_s.values():
        assert seconds == pytest.approx((0.5e-3 - rates.per_op_s) / elements)


def test_a_captured_tanh_costs_its_elements_at_the_calibrated_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tanh(x @ w).sum()``, x (4, 8), w (8, 16): the forward tanh node costs one dispatch + 64 elements x 1 µs (its
    bytes, 512, at 1 GB/s would be 0.5 µs); the mm keeps the roofline."""
    rates = MachineRates(per_op_s=3e-6, flop_rate=1e10, bandwidth=1e9, parallel_s=0.0, threads=1,
                         element_s={"aten.tanh": 1e-6})
    _fixed(monkeypatch, rates)

    captured = capture(Matmul(torch.tanh), (torch.randn(4, 8),))
    forward = {n.op: n for n in captured.graph.nodes if n.kind == "forward"}
    assert forward["aten.tanh.default"].cost == pytest.approx(3e-6 + 64 * 1e-6, rel=1e-9)
    assert forward["aten.mm.default"].cost == pytest.approx(3e-6 + 2 * 4 * 8 * 16 / 1e10 + (32 + 128 + 64) * 4 / 1e9)


def test_a_per_call_fit_goes_through_both_measurements_as_hand_arithmetic_says() -> None:
    """Made-up times: 5 µs dispatch; 1,000 FLOPs in 135 µs and 1,000,001,000 FLOPs in 20,135 µs, one call each: 20 ms
    per 1e9 FLOPs (2e-11 s per FLOP, 50 GFLOP/s) and 130 µs per call less 1,000 FLOPs' 20 ns; at two calls per
    measurement the call is half that."""
    call, per_flop = host_cost.fit_per_call((135e-6, 1000), (20135e-6, 1_000_001_000), 1, 5e-6)
    assert per_flop == pytest.approx(2e-11)
    assert call == pytest.approx(130e-6 - 1000 * 2e-11)
    halved, _ = host_cost.fit_per_call((135e-6, 1000), (20135e-6, 1_000_001_000), 2, 5e-6)
    assert halved == pytest.approx((130e-6 - 1000 * 2e-11) / 2)
    # a large measurement no slower than the small one (noise) keeps a positive floor, not a negative rate
    assert host_cost.fit_per_call((135e-6, 1000), (100e-6, 10_000), 1, 5e-6)[1] > 0


def test_a_convolution_backward_makes_one_kernel_call_per_gradient_of_input_or_weight() -> None:
    geometry = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    args = (None, None, None, [4], *geometry)
    assert host_cost.kernel_calls("aten.convolution_backward", (*args, [True, True, True])) == 2
    assert host_cost.kernel_calls("aten.convolution_backward", (*args, [False, True, True])) == 1
    assert host_cost.kernel_calls("aten.convolution_backward", (*args, [False, False, True])) == 1
    assert host_cost.kernel_calls("aten.convolution", (None,) * 9) == 1


def test_captured_convolutions_cost_their_calls_and_flops_at_the_fitted_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 3 x 3 convolutions (3 -> 4 -> 4 channels) on a 2 x 3 x 5 x 5 batch, padded: each forward is 2 x 2 x 25 x 4
    x C_in x 9 FLOPs (hand count); the first one's backward computes its weight's gradient only (the batch wants none):
    one call and its forward's FLOPs; the second's, its input's and weight's: two calls and twice the FLOPs. Bytes
    and dispatch are made free, so each node costs calls x 100 µs + FLOPs x 1 ns."""
    rates = MachineRates(per_op_s=0.0, flop_rate=1e30, bandwidth=1e30, parallel_s=0.0, threads=1,
                         fitted={"aten.convolution": (100e-6, 1e-9), "aten.convolution_backward": (100e-6, 1e-9)})
    _fixed(monkeypatch, rates)
    class TwoConvolutions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.convs(x).sum()

    captured = capture(TwoConvolutions(), (torch.randn(2, 3, 5, 5),))
    first, second = (2 * 2 * 25 * 4 * channels * 9 for channels in (3, 4))
    forward = sorted(n.cost for n in captured.graph.nodes if n.op == "aten.convolution.default")
    backward = sorted(n.cost for n in captured.graph.nodes if n.op == "aten.convolution_backward.default")
    assert forward == pytest.approx(sorted([100e-6 + first * 1e-9, 100e-6 + second * 1e-9]), rel=1e-9)
    assert backward == pytest.approx(sorted([100e-6 + first * 1e-9, 2 * 100e-6 + 2 * second * 1e-9]), rel=1e-9)


class _ScriptedClock:
    """A fake clock whose consecutive pairs of readings are ``durations`` apart; it records how many times ``warm`` and
    the timed function had run at its first reading."""

    def __init__(self, durations: list[float], counts: dict[str, int]) -> None:
        self._readings = list(itertools.accumulate([0.0] + [step for d in durations for step in (d, 0.0)]))
        self.counts, self.at_first_reading = counts, None

    def __call__(self) -> float:
        if self.at_first_reading is None:
            self.at_first_reading = dict(self.counts)
        return self._readings.pop(0)


def test_a_pooled_measurement_warms_the_pool_first_and_takes_the_median_block() -> None:
    """Blocks of 2 calls lasting 4, 6, 2, 8 and 6 ms: the median block's 6 ms / 2 calls, where the least would be 1 ms;
    the pool was warmed and the function called once before the clock was first read."""
    counts = {"warm": 0, "fn": 0}
    clock = _ScriptedClock([4e-3, 6e-3, 2e-3, 8e-3, 6e-3], counts)

    def bump(key: str) -> None:
        counts[key] += 1

    seconds = host_cost.pooled_seconds(lambda: bump("fn"), 2, 3, clock, lambda: bump("warm"))
    assert seconds == pytest.approx(3e-3)
    assert clock.at_first_reading == {"warm": 1, "fn": 1}
    assert counts == {"warm": 1, "fn": 1 + 5 * 2}


def test_settling_pauses_while_the_pool_is_stalled_and_gives_up_after_its_tries() -> None:
    """A probe block (4 calls) of 40 ms is 10 ms a call, a stall (above STALL_S); of 0.1 ms, 25 µs a call. Two stalled
    probes then a quick one: three tries, two pauses. Stalled throughout: SETTLE_TRIES tries, one pause fewer."""
    blocks = host_cost.POOLED_BLOCKS
    stalled, quick = [40e-3] * blocks, [0.1e-3] * blocks
    pauses: list[float] = []
    clock = _ScriptedClock(stalled + stalled + quick, {})
    assert host_cost.settle_pool(lambda: None, clock, pauses.append) == 3
    assert pauses == [host_cost.SETTLE_PAUSE_S] * 2
    pauses.clear()
    clock = _ScriptedClock(stalled * host_cost.SETTLE_TRIES, {})
    assert host_cost.settle_pool(lambda: None, clock, pauses.append) == host_cost.SETTLE_TRIES
    assert len(pauses) == host_cost.SETTLE_TRIES - 1


def test_a_calibration_at_two_threads_is_kept_between_one_threads_and_half_of_it() -> None:
    """Hand-made rates: a two-thread calibration that caught stalls (FLOP rate, the convolution's slope, tanh) keeps one
    thread's term there; one that came out more than twice as fast (bandwidth, gelu, the backward's slope: a stalled
    small measurement) gets half of one thread's; within the two (dispatch, the calls, exp) its own; the wake-up stays."""
    single = MachineRates(per_op_s=3e-6, flop_rate=5e10, bandwidth=2e10, parallel_s=0.0, threads=1,
                          element_s={"aten.tanh": 4e-9, "aten.gelu": 3e-9, "aten.exp": 2e-9},
                          fitted={"aten.convolution": (130e-6, 2e-11), "aten.convolution_backward": (140e-6, 2e-11)})
    stalled = MachineRates(per_op_s=2e-6, flop_rate=1e9, bandwidth=1e11, parallel_s=5e-6, threads=2,
                           element_s={"aten.tanh": 9e-8, "aten.gelu": 1e-9, "aten.exp": 1.5e-9, "aten.erf": 7e-9},
                           fitted={"aten.convolution": (125e-6, 2.5e-10), "aten.convolution_backward": (150e-6, 1e-15)})
    bounded = host_cost.within_one_thread(stalled, single)
    assert (bounded.per_op_s, bounded.parallel_s, bounded.threads) == (2e-6, 5e-6, 2)
    assert bounded.flop_rate == pytest.approx(5e10) and bounded.bandwidth == pytest.approx(4e10)
    assert bounded.element_s == pytest.approx({"aten.tanh": 4e-9, "aten.gelu": 1.5e-9, "aten.exp": 1.5e-9,
                                               "aten.erf": 7e-9})
    assert bounded.fitted["aten.convolution"] == pytest.approx((125e-6, 2e-11))
    assert bounded.fitted["aten.convolution_backward"] == pytest.approx((140e-6, 1e-11))


def test_a_calibration_leaves_torchs_random_stream_where_it_was() -> None:
    """The per-element table draws random numbers (bernoulli, dropout); the user's next draw is the one it would have
    been without the calibration (the oracle: torch's generator state, read before and after)."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    calibrate(1)
    assert torch.equal(before, torch.get_rng_state())
