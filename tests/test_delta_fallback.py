"""DELTA in the runtime fallback (issue 26): real copies to a host tier, decisions recorded and replayed.

Oracles: eager PyTorch (a deep copy of the model trained side by side with AdamW: loss and every gradient
``torch.equal`` after each step); :class:`tests.independent_meter.TieredHeldBytes` (the CPU allocator's own
allocation and free events through ``torch.profiler``, an allocation under a coop function that enters
``host_pool()`` counted as host tier, every other one as device tier; nothing of coop's accounting); and
the pure simulator (:func:`coop.online.delta_sim.simulate_delta` on the captured graph), whose swaps, page
steps and host bytes the real step must repeat.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch

import coop
from coop.budget import parse_budget
from coop.device_profiles import DeviceProfileError, known_profiles
from coop.graph_capture import capture
from coop.online.delta_sim import simulate_delta
from coop.planner import DynamicPlan
from coop.runtime.fallback import run_dynamic
from coop.runtime.paging import HostPool, page_in, page_out
from coop.schedule import validate
from coop.zoo import build
from tests.eager_oracle import assert_step_equals_eager
from tests.independent_meter import TieredHeldBytes

#: The issue's model and budget: GPT-2 (zoo, 4 layers, batch 2, sequence 128) at 0.4 of its baseline peak.
GPT2 = {"layers": 4, "batch": 2, "seq": 128}
FRACTION = 0.4
PROFILE = "a100-pcie4"


@pytest.fixture(autouse=True)
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ the host pool
def test_a_host_pool_carves_copies_and_takes_them_back_when_they_die() -> None:
    pool = HostPool(1000)
    value = torch.arange(60, dtype=torch.float32).reshape(6, 10).t()[2:]  # strided, with a storage offset
    copy_ = page_out(value, pin=False, non_blocking=False, pool=pool)
    assert copy_.data.untyped_storage().data_ptr() == pool.buffer.untyped_storage().data_ptr()
    assert pool.used_bytes == pool.peak_bytes == 240 and pool.overflows == 0
    back = page_in(copy_)
    assert torch.equal(back, value) and back.stride() == value.stride()
    assert back.storage_offset() == value.storage_offset()
    other = page_out(torch.zeros(200), pin=False, non_blocking=False, pool=pool)  # 800 bytes: no room left
    assert other.data.untyped_storage().data_ptr() != pool.buffer.untyped_storage().data_ptr()
    assert (pool.overflows, pool.overflow_bytes) == (1, 800)
    del copy_
    gc.collect()
    assert pool.used_bytes == 0 and pool.peak_bytes == 240


# ------------------------------------------------------------------ refusals
def test_delta_without_a_device_profile_is_refused_in_one_line_naming_the_profiles() -> None:
    model, batch, loss_fn = build("mlp")
    with pytest.raises(DeviceProfileError) as plan_error:
        coop.plan(model, 1.0, batch, loss_fn=loss_fn, formulation="dynamic", policy="delta")
    captured = capture(model, batch, loss_fn=loss_fn)
    with pytest.raises(DeviceProfileError) as run_error:
        run_dynamic(captured, model, batch, parse_budget(1.0, captured.graph), "delta")
    for error in (plan_error, run_error):
        message = str(error.value)
        assert "\n" not in message and all(name in message for name in known_profiles()), message


# ------------------------------------------------------------------ the bar
#: A 2-layer GPT-2 at sequence 64 swaps and recomputes at 0.4 as the issue's model does, in about half its time (the
#: issue's model, 36 s on 2 loaded cores, runs in the slow tier)
SMALL_GPT2 = {"layers": 2, "batch": 2, "seq": 64}


@pytest.mark.parametrize("size", [SMALL_GPT2, pytest.param(GPT2, marks=pytest.mark.slow)], ids=["small", "issue"])
def test_delta_fallback_trains_gpt2_under_04_like_eager_within_its_arena_with_the_simulated_host_bytes(
        size: dict[str, int]) -> None:
    """Three AdamW steps: the first online (real swaps and recomputations), the next two by the static executor
    replaying its recorded schedule, page steps included. Each step: loss and gradients equal to eager's, the
    independent meter's device tier within the arena (the budget), the host copies where the simulator put them."""
    model, batch, loss_fn = build("gpt2", **size)
    eager = copy.deepcopy(model)
    plan = coop.plan(model, FRACTION, batch, loss_fn=loss_fn, formulation="dynamic", policy="delta",
                     device_profile=PROFILE)
    assert isinstance(plan, DynamicPlan) and plan.host_pool is not None
    graph = plan.captured.graph
    assert plan.budget == parse_budget(FRACTION, graph)
    # the engine the step runs: its arena (the budget less the saved generator states), compacting where it fragments
    simulated = simulate_delta(graph, plan.arena_budget, PROFILE, compact=True)
    assert simulated.status == "ok" and simulated.swaps > 0 and simulated.recompute_decisions > 0
    optimizer, eager_optimizer = torch.optim.AdamW(model.parameters()), torch.optim.AdamW(eager.parameters())
    for step in range(3):
        held = [*model.parameters(), *model.buffers(), *batch, *plan.captured.constants()]
        torch.manual_seed(step)
        with TieredHeldBytes(held) as meter:
            loss = plan.step(*batch)
        assert meter.device_peak_bytes <= plan.budget, (step, meter.device_peak_bytes, plan.budget)
        assert plan.host_pool.overflows == 0 and plan.host_pool.used_bytes == 0, step  # every copy back in the pool
        if step == 0:
            stats = plan.last_stats
            assert stats is not None and plan.recorded is not None and plan.replayed_steps == 0
            # the simulator's decisions, carried out on real tensors: the same steps, page steps included
            assert stats.schedule == simulated.schedule
            assert (stats.extra["swaps"], stats.extra["page_ins"], stats.recomputations) == (
                simulated.swaps, simulated.page_ins, simulated.recomputations)
            # host bytes: the real copies' bytes at their most, in the pool too, as the simulator predicted
            assert stats.extra["host_copy_peak"] == stats.extra["host_pool_peak"] == simulated.host_peak
            assert stats.peak <= plan.budget
            assert validate(graph.with_random_replay(), stats.schedule, plan.budget).ok
        else:
            assert plan.replayed_steps == step
        torch.manual_seed(step)
        eager_loss = loss_fn(eager, *batch)
        eager_loss.backward()
        assert_step_equals_eager(loss, eager_loss, model, eager, step)
        optimizer.step(), eager_optimizer.step()
        optimizer.zero_grad(), eager_optimizer.zero_grad()
    assert plan.host_pool.peak_bytes == simulated.host_peak
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager.parameters(), strict=True))


# ------------------------------------------------------------------ the copy stream (CUDA's protocol, recorded)
def test_delta_fallback_on_a_copy_stream_keeps_its_protocol_and_eagers_results() -> None:
    """The copies on a side stream, in the online step and in the replay of its record: every cross-stream use
    waited for and recorded (the happens-before checker of tests/test_copy_stream.py over the recording fake, the
    CPU standing in for ``cuda:0``), the compute stream waiting only at first reads, results equal to eager's."""
    from tests.test_copy_stream import AccessLog, RecordingStreams, violations

    model, batch, loss_fn = build("gpt2", **GPT2)
    eager = copy.deepcopy(model)
    streams = RecordingStreams()
    plan = DynamicPlan(capture(model, batch, loss_fn=loss_fn), model, FRACTION, policy="delta", loss_fn=loss_fn,
                       device_profile=PROFILE, copy_stream=streams)
    for step in range(2):
        torch.manual_seed(step)
        with AccessLog(streams):
            loss = plan.step(*batch)
        assert not violations(streams.log, streams.compute), step
        torch.manual_seed(step)
        eager_loss = loss_fn(eager, *batch)
        eager_loss.backward()
        assert_step_equals_eager(loss, eager_loss, model, eager, step)
        model.zero_grad(), eager.zero_grad()
    stats = plan.last_stats
    assert stats is not None and plan.replayed_steps == 1
    page_ins, swaps = stats.extra["page_ins"], stats.extra["swaps"]
    # a wait per page-in (at its first reader) and per page-out that copies (before the block is freed), in the
    # online step and in the replay, none elsewhere on the compute stream
    compute_waits = [entry for entry in streams.log if entry[0] == "wait" and entry[1] is streams.compute]
    assert swaps > 0 and 0 < len(compute_waits) <= 2 * (page_ins + swaps)


@pytest.mark.parametrize("drop_wait", [None, 3])
def test_a_page_in_the_engine_drops_unread_is_waited_for_before_its_block_returns(drop_wait: int | None) -> None:
    """The online step forgets a value whose page-in is still queued on the copy stream (a prefetch that an
    eviction overtook): the compute stream must wait for the copy before the value's block goes back to its pool
    (the happens-before checker of tests/test_copy_stream.py sees the free). White-box: the engine's own
    page-out, page-in and forget on one value; ``drop_wait=3`` drops that wait (the checker must object)."""
    from coop.runtime.copy_stream import CopyStream
    from coop.runtime.fallback import DeltaStep
    from tests.test_copy_stream import AccessLog, RecordingStreams, violations

    streams = RecordingStreams(drop_wait=drop_wait)
    engine = DeltaStep.__new__(DeltaStep)  # only the copy-stream state that forget reads
    engine.copy_stream, engine._pending, engine.fx_names, engine.env = CopyStream(streams), {}, {7: ["v"]}, {}
    with AccessLog(streams):
        value = torch.arange(8.0) * 2  # made on the compute stream
        paged = engine.copy_stream.page_out(value, pin=False)
        del value
        engine._pending[7] = engine.copy_stream.page_in(paged)
        engine.forget(7)  # never read
        gc.collect()
    found = violations(streams.log, streams.compute)
    assert streams.waits == 4  # page-out: 2; page-in: the side's, the compute's at forget
    if drop_wait is None:
        assert found == [] and 7 not in engine._pending
    else:
        assert any("freed" in v and "waited for that use" in v for v in found), found
