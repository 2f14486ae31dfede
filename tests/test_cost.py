"""The node cost model (coop.graph_capture.cost) and bench_replay's overhead bookkeeping."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

from coop.errors import CaptureError
from coop.graph_capture import capture
from coop.graph_capture.cost import (
    BANDWIDTH,
    FLOP_RATE,
    analytic_seconds,
    bytes_moved,
    node_flops,
    probe_storage_bytes,
    profile_seconds,
)
from coop.zoo import build


def _traced(function, *example: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(function, tracing_mode="fake")(*example)


def _call(module: torch.fx.GraphModule, name_prefix: str) -> torch.fx.Node:
    return next(n for n in module.graph.nodes if n.op == "call_function" and n.name.startswith(name_prefix))


def test_mm_flops_are_two_m_n_k_and_placeholders_are_free() -> None:
    module = _traced(torch.mm, torch.randn(3, 5), torch.randn(5, 7))
    assert node_flops(_call(module, "mm")) == 2 * 3 * 5 * 7
    assert all(node_flops(n) == 0 for n in module.graph.nodes if n.op == "placeholder")


def test_ops_without_a_flop_formula_cost_only_their_bytes() -> None:
    module = _traced(lambda a, b: torch.relu(a + b), torch.randn(4, 8), torch.randn(4, 8))
    add = _call(module, "add")
    assert node_flops(add) == 0
    assert bytes_moved(add) == 3 * 4 * 8 * 4  # two float32 reads and one write
    assert analytic_seconds(add, 0) == pytest.approx(bytes_moved(add) / BANDWIDTH)


def test_views_and_tuple_getitems_move_no_bytes() -> None:
    """A slice of a large tensor reads none of it (it was counted whole, once per slice); neither does a getitem."""
    module = _traced(lambda a: (a[2:3].t(), torch.max(a, 0)[1]), torch.randn(64, 8))
    for prefix in ("getitem", "t", "slice"):
        nodes = [n for n in module.graph.nodes if n.op == "call_function" and n.name.startswith(prefix)]
        assert nodes and all(bytes_moved(n) == 0 for n in nodes), prefix
    maximum = _call(module, "max")
    assert bytes_moved(maximum) == 64 * 8 * 4 + 8 * 4 + 8 * 8  # it reads the tensor, writes values and indices


def test_analytic_seconds_adds_compute_and_traffic() -> None:
    module = _traced(torch.mm, torch.randn(16, 32), torch.randn(32, 8))
    mm = _call(module, "mm")
    flops = node_flops(mm)
    expected = flops / FLOP_RATE + (16 * 32 + 32 * 8 + 16 * 8) * 4 / BANDWIDTH
    assert analytic_seconds(mm, flops) == pytest.approx(expected)


def test_captured_flops_equal_flop_counter_mode_on_the_eager_step() -> None:
    model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
    captured = capture(model, batch)
    with FlopCounterMode(display=False) as counter:
        model(*batch).backward()
    model.zero_grad(set_to_none=True)
    assert captured.flops == counter.get_total_flops() > 0
    assert captured.graph.meta["flops"] == captured.flops


def test_profile_times_every_call_node_and_ranks_a_big_matmul_above_a_tiny_add() -> None:
    def work(big: torch.Tensor, tiny: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return big @ big, tiny + 1

    inputs = [torch.randn(384, 384), torch.randn(4)]
    module = torch.fx.symbolic_trace(work)
    seconds = profile_seconds(module, inputs, repeats=3)
    calls = {n.name for n in module.graph.nodes if n.op in ("call_function", "call_method")}
    assert set(seconds) == {n.name for n in module.graph.nodes if n.op == "call_function"} and seconds
    assert set(seconds) <= calls and all(s >= 0 for s in seconds.values())
    # 2 x 384^3 FLOPs against four additions: the fastest of three runs keeps the order under any noise.
    assert seconds["matmul"] > 10 * seconds["add"]


def test_profile_refuses_zero_timed_runs() -> None:
    module = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(CaptureError, match="repeats >= 1"):
        profile_seconds(module, [torch.ones(2)], repeats=0)


def test_profiled_capture_replaces_analytic_costs_with_measured_seconds() -> None:
    model, batch, _ = build("mlp", layers=2, hidden=16, batch=4)
    state = torch.random.get_rng_state()
    graph = capture(model, batch, profile=True).graph
    assert torch.equal(state, torch.random.get_rng_state())  # profiling leaves the caller's RNG alone
    assert graph.meta["cost_unit"] == "seconds (profiled)"
    computed = [n for n in graph.nodes if not n.caller_owned]
    assert sum(n.cost for n in computed) > 0 and all(n.cost >= 0 for n in computed)


# ------------------------------------------------------------------ bench_replay's bookkeeping
@pytest.fixture(scope="module")
def bench_replay() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_replay.py"
    spec = importlib.util.spec_from_file_location("coop_bench_replay_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _worker_rows(warm_seconds: dict, default_seconds: dict, default_faults: dict, predicted: float) -> tuple:
    warm = {"model": "m", "nodes": 1, "threads": 2, "baseline_peak": 100, "min_budget_fraction": 0.4,
            "half_formulation": "f", "half_status": "optimal", "half_note": "", "half_budget_fraction": 0.5,
            "half_predicted_peak_fraction": 0.5, "half_metered_peak_fraction": 0.5, "predicted_overhead": predicted,
            "seconds": warm_seconds, "faults": dict.fromkeys(warm_seconds, 0), "rounds": 5, "rounds_used": 5,
            "quiet_rounds": 5, "others_cores": [0.0] * 5, "times_s": {}, "planning_s": 1.0}
    default = {"seconds": default_seconds, "faults": default_faults, "fault_s": 1e-6, "times_s": {}}
    return warm, default


def test_within_ten_percent_is_reported_relative_and_in_points(bench_replay: ModuleType) -> None:
    warm, default = _worker_rows({"eager": 1.0, "store_all": 1.0, "half": 1.15}, {"eager": 1.0, "store_all": 1.0,
                                 "half": 1.0}, {"eager": 0, "store_all": 0, "half": 0}, predicted=0.10)
    row = bench_replay.merge(warm, default)
    assert row["measured_overhead"] == pytest.approx(0.15) and row["gap_pp"] == pytest.approx(5.0)
    assert row["within_10pp"] is True  # 5 points of the eager step
    assert row["within_10pct_of_predicted"] is False  # 50 % off the predicted 10 %


def test_fault_time_is_taken_out_of_default_allocator_steps(bench_replay: ModuleType) -> None:
    # store-all faults 500,000 pages at 1 us each: 0.5 s of its 1.5 s; the plan faults none.
    warm, default = _worker_rows({"eager": 1.0, "store_all": 1.0, "half": 1.1}, {"eager": 1.5, "store_all": 1.5,
                                 "half": 1.1}, {"eager": 500_000, "store_all": 500_000, "half": 0}, predicted=0.10)
    row = bench_replay.merge(warm, default)
    assert row["default_vs_store_all"] < 0
    assert row["default_vs_store_all_wo_faults"] == pytest.approx(0.1)


def test_the_storage_probe_finds_kernels_whose_storage_exceeds_the_fake_one() -> None:
    """A fake 0-d mse_loss claims 4 bytes; the CPU kernel's loss holds its 6 x 5 buffer (120 bytes).
    A plain mean (which reduces into a fresh tensor) keeps its 4 bytes."""
    module = _traced(lambda x, y: (torch.nn.functional.mse_loss(x, y), (x - y).mean(), x.t()),
                     torch.randn(6, 5), torch.randn(6, 5))
    mse, mean = _call(module, "mse_loss"), _call(module, "mean")
    assert mse.meta["val"].untyped_storage().nbytes() == 4
    probe = probe_storage_bytes(module)
    assert probe.output_bytes[mse.name] == [6 * 5 * 4]
    assert probe.output_bytes[mean.name] == [4]
    # pointwise ops allocate exactly their broadcast shape and views allocate nothing: neither is run
    assert _call(module, "sub").name not in probe.output_bytes and _call(module, "t").name not in probe.output_bytes
    assert probe.failed == []


def test_an_op_that_cannot_run_on_zeros_keeps_its_fake_size_and_is_named() -> None:
    module = _traced(lambda p: torch.multinomial(p, 2), torch.rand(3, 4))  # all-zero probabilities are refused
    node = _call(module, "multinomial")
    probe = probe_storage_bytes(module)
    assert probe.failed == [node.name] and node.name not in probe.output_bytes
