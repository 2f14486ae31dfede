"""CUDA-graph replay of a static plan (issue 23, item 1), proven on CPU against a recording fake of the graph API.

No GPU runs here, and this torch cannot make a ``torch.cuda.CUDAGraph``. :class:`RecordingGraphs` is a
:class:`coop.runtime.graph_replay.GraphAPI` on CPU tensors that behaves as a CUDA graph does where coop relies on it:

- ``capture`` runs the warm-ups, then runs the program once while recording, and refuses, with the error text
  torch.cuda gives, what a real capture refuses: a device-to-host sync (``aten._local_scalar_dense``:
  ``.item()``), an op whose output shape depends on the data (``aten.nonzero``, ``masked_select``, ``unique``:
  they read the size back to the host), and a CPU device (the CPU stands for ``cuda:0`` only where a test says
  so, as in tests/test_copy_stream.py). As a real capture, it does not advance the generator (draws inside a
  graph advance only the graph's own offset);
- ``replay`` runs the program again and copies its results into the tensors the capture returned, so the graph's
  outputs are overwritten in place by every replay, as a real graph's are, and it reads the inputs captured (a
  parameter replaced since the capture is not seen, as a real graph reads the old address).

What reading or setting the generator's state inside a capture means differs between torch builds, so the fake
has one mode for each behaviour coop must survive (``generator_in_capture``):

- ``"refused"``: the state calls raise ``assertNotCapturing``'s error, as older builds do;
- ``"graph-local"``: they are accepted but do not reach the graph's draws (the state read is the host's, frozen
  during capture; a state set is dropped), so every draw of a replay takes the next philox offset and the
  replay leaves the generator past all of them: a "recomputed" draw draws new numbers;
- ``"honoured"``: they act as they do eagerly (what one H100 run with torch 2.11 observed for coop's GPT-2 step).

The tests compare with eager PyTorch on twin models (the same seed, the same generator state), bit for bit.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import coop
from coop import capture
from coop.formulations import solve
from coop.planner.plan import Plan
from coop.runtime.executor import Executor, replay_graph
from coop.runtime.graph_replay import GraphReplay, capture_refusal, generator_states_in_graphs
from coop.zoo import build

_CPU = torch.device("cpu")
_aten = torch.ops.aten

#: What torch.cuda raises for a stream operation that is illegal while the stream captures (a sync, a D2H copy):
#: cudaErrorStreamCaptureUnsupported, as torch's C10_CUDA_CHECK words it (first line).
CAPTURE_UNSUPPORTED = "CUDA error: operation not permitted when stream is capturing"
#: at::cuda::assertNotCapturing's text, raised by CUDAGeneratorImpl::get_offset / set_offset inside capture.
GENERATOR_IN_CAPTURE = ("Cannot call CUDAGeneratorImpl::{} during CUDA graph capture. If you need this call to be "
                        "captured, please file an issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive")

#: Ops a capture refuses: a host read of a device value, and ops whose output shape is read back to the host.
REFUSED_IN_CAPTURE = {
    _aten._local_scalar_dense.default,
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique2.default,
    _aten.unique_consecutive.default,
}


class RefuseIllegalInCapture(TorchDispatchMode):
    """Raises what torch.cuda raises for an op that cannot run while a stream captures."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in REFUSED_IN_CAPTURE or (func is _aten.index.Tensor and any(  # x[mask]: its nonzero runs below us
                i is not None and i.dtype == torch.bool for i in args[1])):
            raise RuntimeError(CAPTURE_UNSUPPORTED)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def generator_state_refused() -> Any:
    """``torch.get_rng_state`` / ``set_rng_state`` (what coop.runtime.rng calls for the stand-in device) raise
    as the CUDA generator's state calls do inside capture."""
    get, set_ = torch.get_rng_state, torch.set_rng_state

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*_: Any, **__: Any) -> Any:
            raise RuntimeError(GENERATOR_IN_CAPTURE.format(what))
        return refused

    torch.get_rng_state, torch.set_rng_state = refuse("get_offset"), refuse("set_offset")
    try:
        yield
    finally:
        torch.get_rng_state, torch.set_rng_state = get, set_


@contextlib.contextmanager
def generator_state_dropped() -> Any:
    """Inside capture and replay in ``"graph-local"`` mode: a state read gives the state frozen at the start, a set
    is dropped, so draws go on taking the next offsets of the generator (the graph's own counter)."""
    get, set_ = torch.get_rng_state, torch.set_rng_state
    frozen = get()
    torch.get_rng_state, torch.set_rng_state = (lambda: frozen.clone()), (lambda _state: None)
    try:
        yield
    finally:
        torch.get_rng_state, torch.set_rng_state = get, set_


#: The fake's behaviours for generator-state calls inside a capture (module docstring).
GENERATOR_MODES = ("refused", "graph-local", "honoured")


@dataclass(eq=False)
class FakeGraph:
    program: Callable[[], list[Any]] | None = None
    outputs: list[Any] = field(default_factory=list)
    pool: Any = None


@dataclass
class RecordingGraphs:
    """A :class:`GraphAPI` on CPU tensors (see the module docstring); ``log`` records each call."""

    stand_in: torch.device | None = _CPU
    generator_in_capture: str = "refused"
    log: list[str] = field(default_factory=list)

    def _state_calls(self) -> Any:
        if self.generator_in_capture == "refused":
            return generator_state_refused()
        if self.generator_in_capture == "graph-local":
            return generator_state_dropped()
        assert self.generator_in_capture == "honoured", self.generator_in_capture
        return contextlib.nullcontext()

    def new_graph(self) -> FakeGraph:
        self.log.append("graph")
        return FakeGraph()

    def new_pool(self) -> object:
        return object()

    def capture(self, graph: FakeGraph, program: Callable[[], list[Any]], pool: Any, device: torch.device,
                warmup: int) -> list[Any]:
        if torch.device(device) != self.stand_in:
            torch.cuda._utils._get_device_index(torch.device(device), optional=True)  # torch.cuda's own refusal
        for _ in range(warmup):
            self.log.append("warmup")
            program()
        self.log.append("capture")
        state = torch.default_generator.get_state()  # a capture draws inside the graph only
        try:
            with self._state_calls(), RefuseIllegalInCapture():
                outputs = program()
        finally:
            torch.default_generator.set_state(state)
        graph.program, graph.outputs, graph.pool = program, outputs, pool
        return outputs

    def replay(self, graph: FakeGraph) -> None:
        self.log.append("replay")
        assert graph.program is not None, "replay of a graph never captured"
        replay_calls = generator_state_dropped() if self.generator_in_capture == "graph-local" else contextlib.nullcontext()
        with replay_calls:
            fresh_outputs = graph.program()
        for static, fresh in zip(graph.outputs, fresh_outputs, strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(fresh)


# ---------------------------------------------------------------- helpers: twin models, plans, eager steps


def _item_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mlp's loss on inputs scaled by a host value read inside the step (``.item()``)."""
    return model(x / x.abs().max().item(), y)


def _twins(name: str, loss_fn: Any = "zoo") -> tuple:
    model, batch, zoo_loss = build(name)
    eager, _, _ = build(name)
    return model, eager, batch, zoo_loss if loss_fn == "zoo" else loss_fn


def _loss(model: torch.nn.Module, batch: tuple, loss_fn: Any) -> torch.Tensor:
    return loss_fn(model, *batch) if loss_fn is not None else model(*batch)


def _plan(model: torch.nn.Module, batch: tuple, loss_fn: Any, api: RecordingGraphs,
          baseline: str = "store-all") -> Plan:
    captured = capture(model, batch, loss_fn)
    schedule = solve(replay_graph(captured), 10**12, baseline).schedule
    plan = Plan(model, captured, schedule, 10**12, baseline, loss_fn=loss_fn)
    plan.use_cuda_graph(api)
    return plan


def _batches(batch: tuple, count: int) -> list[tuple]:
    """``count`` batches of the example's shapes with different values (floats perturbed, integers permuted)."""
    generator = torch.Generator().manual_seed(3)
    out = []
    for _ in range(count):
        new = []
        for t in batch:
            if t.is_floating_point():
                new.append(t + torch.randn(t.shape, generator=generator))
            else:
                new.append(t.flatten()[torch.randperm(t.numel(), generator=generator)].reshape(t.shape))
        out.append(tuple(new))
    return out


def _train(step: Callable[[tuple], torch.Tensor], model: torch.nn.Module, batches: list[tuple], seed: int = 11,
           accumulation: int = 2) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """AdamW steps of ``accumulation`` micro-batches each; the losses and each step's gradients (copies)."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for start in range(0, len(batches), accumulation):
        for batch in batches[start:start + accumulation]:
            losses.append(step(batch))
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, grads


def _eager_step(model: torch.nn.Module, loss_fn: Any) -> Callable[[tuple], torch.Tensor]:
    def step(batch: tuple) -> torch.Tensor:
        loss = _loss(model, batch, loss_fn)
        loss.backward()
        return loss.detach()
    return step


def _assert_same_training(plan: Plan, model: torch.nn.Module, eager: torch.nn.Module, batches: list[tuple],
                          loss_fn: Any) -> None:
    losses, grads = _train(lambda b: plan.step(*b), model, batches)
    eager_losses, eager_grads = _train(_eager_step(eager, loss_fn), eager, batches)
    assert all(torch.equal(a, b) for a, b in zip(losses, eager_losses, strict=True)), (losses, eager_losses)
    for ours, theirs in zip(grads, eager_grads, strict=True):
        assert len(ours) == len(theirs)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(model.buffers(), eager.buffers(), strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- the graph replay equals eager


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_three_adamw_steps_with_accumulation_equal_eager(name: str, recwarn: pytest.WarningsRecorder) -> None:
    """Store-all replays no draw, so the program is captured (once) and replayed on every micro-batch; loss,
    gradients, parameters and buffers (cnn's BatchNorm statistics) equal eager's bit for bit, dropout included
    (the generator is set back after the warm-ups, and a capture draws inside the graph only)."""
    model, eager, batch, loss_fn = _twins(name)
    api = RecordingGraphs()
    plan = _plan(model, batch, loss_fn, api)
    batches = _batches(batch, 6)
    _assert_same_training(plan, model, eager, batches, loss_fn)
    assert api.log.count("capture") == 1 and api.log.count("replay") == 6
    assert plan.summary()["cuda_graph"] == "captured"
    assert not [w for w in recwarn if "cuda_graph" in str(w.message)]


def test_batches_are_copied_into_static_buffers() -> None:
    """A second batch with other values gives eager's loss and gradients: the replay reads the static buffers,
    into which each step copies its batch (the graph captured once, on the first batch's buffers)."""
    model, eager, batch, loss_fn = _twins("mlp")
    model.eval(), eager.eval()  # no dropout: the two steps differ by their batch only
    api = RecordingGraphs()
    plan = _plan(model, batch, loss_fn, api)
    first, second = _batches(batch, 2)
    for current in (first, second):
        loss = plan.step(*current)
        reference = _loss(eager, current, loss_fn)
        reference.backward()
        assert torch.equal(loss, reference.detach())
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
            p.grad, q.grad = None, None
    assert api.log.count("capture") == 1
    replay = plan.graph_replay
    assert replay is not None and all(replay._static[i] is not t and torch.equal(replay._static[i], t)
                                      for i, t in zip(replay._batch, second, strict=True))


def test_a_held_grad_and_loss_are_never_overwritten_by_a_later_replay() -> None:
    """The caller keeps the first step's gradients and loss, then ``zero_grad(set_to_none=True)``: the next
    replays overwrite the graph's outputs, never what the caller holds; accumulation adds into ``.grad``."""
    model, eager, batch, loss_fn = _twins("mlp")
    plan = _plan(model, batch, loss_fn, RecordingGraphs())
    first, second, third = _batches(batch, 3)
    torch.manual_seed(5)
    loss = plan.step(*first)
    held = [p.grad for p in model.parameters()]
    kept = [g.clone() for g in held]
    kept_loss = loss.clone()
    model.zero_grad(set_to_none=True)
    plan.step(*second)
    plan.step(*third)  # accumulates into the .grad the second step assigned
    assert all(torch.equal(g, k) for g, k in zip(held, kept, strict=True))
    assert torch.equal(loss, kept_loss)
    assert all(p.grad is not g for p, g in zip(model.parameters(), held, strict=True))
    torch.manual_seed(5)
    _eager_step(eager, loss_fn)(first)
    assert all(torch.equal(q.grad, k) for q, k in zip(eager.parameters(), kept, strict=True))
    eager.zero_grad(set_to_none=True)
    _eager_step(eager, loss_fn)(second)
    _eager_step(eager, loss_fn)(third)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters(), strict=True))


def test_replaced_parameters_are_captured_again_with_a_warning() -> None:
    """A parameter whose storage moved (here ``p.data = ...``, as ``model.to()`` does) is not what the graph reads:
    the step is captured again, with a warning naming it, and stays equal to eager."""
    model, eager, batch, loss_fn = _twins("mlp")
    model.eval(), eager.eval()
    api = RecordingGraphs()
    plan = _plan(model, batch, loss_fn, api)
    first, second = _batches(batch, 2)
    plan.step(*first)
    with torch.no_grad():
        for m in (model, eager):
            for p in m.parameters():
                p.data = p.data * 0.5 + 0.25
    model.zero_grad(set_to_none=True)
    with pytest.warns(UserWarning, match=r"cuda_graph: layers\.0\.weight is no longer the tensor .* capturing the step "
                                         "again"):
        loss = plan.step(*second)
    reference = _loss(eager, second, loss_fn)
    reference.backward()
    assert torch.equal(loss, reference.detach())
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters(), strict=True))
    assert api.log.count("capture") == 2 and plan.graph_replay.captures == 2


# ---------------------------------------------------------------- the fallback


def test_a_host_value_read_falls_back_once_naming_the_op() -> None:
    """A step that calls ``.item()`` cannot be captured: one warning naming the op, then the ordinary replay
    for good (no second capture), bit-identical to eager over 3 AdamW steps of 2 micro-batches."""
    model, eager, batch, loss_fn = _twins("mlp", _item_loss)
    api = RecordingGraphs()
    plan = _plan(model, batch, loss_fn, api)
    batches = _batches(batch, 6)
    with pytest.warns(UserWarning) as caught:
        _assert_same_training(plan, model, eager, batches, loss_fn)
    messages = [str(w.message) for w in caught if "cuda_graph" in str(w.message)]
    assert len(messages) == 1, messages
    assert "failed at node _local_scalar_dense (aten._local_scalar_dense.default)" in messages[0]
    assert CAPTURE_UNSUPPORTED in messages[0] and "running the ordinary replay instead" in messages[0]
    assert "\n" not in messages[0]
    assert api.log.count("capture") == 1 and "replay" not in api.log
    assert plan.summary()["cuda_graph"].startswith("fell back to the ordinary replay: capturing the step failed at node "
                                                   "_local_scalar_dense")


#: What the probe logs on the fake before the step's own capture, per mode: its graph, one warm-up, its capture
#: (which raises where state calls are refused), and its replays (the first already differs where they are dropped).
PROBE_LOG = {"refused": ["graph", "warmup", "capture"],
             "graph-local": ["graph", "warmup", "capture", "replay"],
             "honoured": ["graph", "warmup", "capture", "replay", "replay"]}


@pytest.mark.parametrize(("mode", "found"), [
    ("refused", "capturing a saved-state draw raised RuntimeError: "
                + GENERATOR_IN_CAPTURE.format("get_offset")),
    ("graph-local", "a probe graph's first replay drew other numbers than the same program run eagerly")])
def test_replayed_draws_are_refused_where_the_probe_finds_graphs_do_not_replay_saved_states(
        mode: str, found: str) -> None:
    """checkpoint-all recomputes the dropout masks from saved generator states. Where this torch's graphs refuse the
    state calls, or accept them without reaching the graph's draws, the probe says so: the step is refused before
    its own capture, with one warning naming the random op and the probe's finding, and stays bit-identical to
    eager on the ordinary replay."""
    model, eager, batch, loss_fn = _twins("transformer")
    api = RecordingGraphs(generator_in_capture=mode)
    plan = _plan(model, batch, loss_fn, api, baseline="checkpoint-all")
    why = capture_refusal(plan.executor, draws_in_graphs=found)
    assert why.startswith("the schedule recomputes random op ") and "bernoulli_mask" in why and found in why
    assert "no probe" in capture_refusal(plan.executor)  # unprobed: refused, never assumed
    with pytest.warns(UserWarning) as caught:
        _assert_same_training(plan, model, eager, _batches(batch, 6), loss_fn)
    messages = [str(w.message) for w in caught if "cuda_graph" in str(w.message)]
    assert messages == [f"cuda_graph: {why}; running the ordinary replay instead"]
    assert api.log == PROBE_LOG[mode]  # the probe only: the step itself was never captured


def test_replayed_draws_are_captured_where_graphs_replay_saved_states() -> None:
    """Where the state calls act inside a graph as they do eagerly, the probe passes and checkpoint-all's recomputed
    dropout masks are captured with the step: one capture, a replay per micro-batch, bit-identical to eager."""
    model, eager, batch, loss_fn = _twins("transformer")
    api = RecordingGraphs(generator_in_capture="honoured")
    plan = _plan(model, batch, loss_fn, api, baseline="checkpoint-all")
    assert capture_refusal(plan.executor, draws_in_graphs="") == ""
    _assert_same_training(plan, model, eager, _batches(batch, 6), loss_fn)
    assert api.log[:len(PROBE_LOG["honoured"])] == PROBE_LOG["honoured"]
    assert api.log[len(PROBE_LOG["honoured"]):] == ["graph", *["warmup"] * 3, "capture", *["replay"] * 6]
    assert plan.summary()["cuda_graph"] == "captured"


@pytest.mark.parametrize("mode", GENERATOR_MODES)
def test_the_probe_leaves_the_generator_as_it_found_it(mode: str) -> None:
    """Eager draws after the probe are the draws eager makes without it, whatever the probe found."""
    torch.manual_seed(21)
    expected = torch.rand(5)
    torch.manual_seed(21)
    found = generator_states_in_graphs(RecordingGraphs(generator_in_capture=mode), _CPU)
    assert (found == "") == (mode == "honoured"), found
    assert torch.equal(torch.rand(5), expected)


def test_the_graph_local_fake_draws_a_recomputation_anew() -> None:
    """The ``graph-local`` fake's own semantics, against eager arithmetic on the generator: inside its graph a state
    set is dropped, so the second draw is the generator's next numbers, and a replay advances it past both."""
    api = RecordingGraphs(generator_in_capture="graph-local")

    def program() -> list[Any]:
        state = torch.get_rng_state()
        first = torch.rand(4)
        torch.set_rng_state(state)
        return [first, torch.rand(4)]

    graph = api.new_graph()
    outputs = api.capture(graph, program, api.new_pool(), _CPU, warmup=0)
    torch.manual_seed(8)
    api.replay(graph)
    torch.manual_seed(8)
    sequential = torch.rand(8)
    assert torch.equal(outputs[0], sequential[:4]) and torch.equal(outputs[1], sequential[4:])
    torch.manual_seed(8)
    api.replay(graph)
    after = torch.rand(2)  # the replay left the generator past both draws
    torch.manual_seed(8)
    assert torch.equal(after, torch.rand(10)[8:])


def test_without_the_pre_check_the_fake_capture_refuses_the_generator_state() -> None:
    """The pre-check is not what makes the fake pass: with it skipped, the capture itself fails at the first
    generator-state call (coop.runtime.rng), named in the warning."""
    model, _, batch, loss_fn = _twins("transformer")
    captured = capture(model, batch, loss_fn)
    executor = Executor(captured, solve(replay_graph(captured), 10**12, "checkpoint-all").schedule)
    replay = GraphReplay(executor, RecordingGraphs())
    replay._replays_draws = False
    with pytest.warns(UserWarning, match=r"failed at node save_generator_state.*Cannot call "
                                         r"CUDAGeneratorImpl::get_offset during CUDA graph capture"):
        replay.run_flat(captured.flat_inputs(model, batch))


# ---------------------------------------------------------------- refusals, and the fake refuses what torch.cuda refuses


def test_cuda_graph_on_a_cpu_step_is_refused_in_one_line() -> None:
    model, batch, loss_fn = build("mlp")
    with pytest.raises(coop.NeedsCudaError, match=r"^cuda_graph=True replays CUDA kernels only, and this step runs on cpu; "
                                        r"drop cuda_graph \(or move the model and batch to CUDA\)$"):
        coop.plan(model, "90%", batch, loss_fn=loss_fn, cuda_graph=True)
    captured = capture(model, batch, loss_fn)
    executor = Executor(captured, solve(replay_graph(captured), 10**12, "store-all").schedule)
    with pytest.raises(coop.NeedsCudaError, match=r"^cuda_graph=True replays CUDA kernels only[^\n]*$"):
        GraphReplay(executor)  # torch.cuda's graphs: refused, not run on the CPU


def test_the_fake_refuses_what_a_capture_refuses() -> None:
    api = RecordingGraphs()
    x = torch.randn(4)
    for body, text in [(lambda: x.sum().item(), CAPTURE_UNSUPPORTED), (lambda: x.nonzero(), CAPTURE_UNSUPPORTED),
                       (lambda: x[x > 0], CAPTURE_UNSUPPORTED),
                       (lambda: torch.get_rng_state(), GENERATOR_IN_CAPTURE.format("get_offset")),
                       (lambda: torch.set_rng_state(torch.get_rng_state()), GENERATOR_IN_CAPTURE.format("get_offset"))]:
        with pytest.raises(RuntimeError, match=f"^{re.escape(text)}$"):
            api.capture(api.new_graph(), lambda body=body: [body()], api.new_pool(), _CPU, warmup=0)
    strict = RecordingGraphs(stand_in=None)  # a CPU device as a CUDA build sees it
    with pytest.raises(ValueError, match="^Expected a cuda device, but got: cpu$"):
        strict.capture(strict.new_graph(), lambda: [x * 2], strict.new_pool(), _CPU, warmup=0)
    graph = api.new_graph()
    torch.manual_seed(2)
    before = torch.get_rng_state()
    (out,) = api.capture(graph, lambda: [torch.rand(3)], api.new_pool(), _CPU, warmup=0)
    assert torch.equal(torch.get_rng_state(), before)  # a capture draws inside the graph only
    api.replay(graph)
    torch.manual_seed(2)
    assert torch.equal(out, torch.rand(3))  # a replay draws what eager draws from the generator's state now
    after_one = torch.get_rng_state()
    kept = out.clone()
    api.replay(graph)
    assert not torch.equal(out, kept)  # ... and overwrites the captured output in place
    torch.set_rng_state(after_one)
    assert torch.equal(out, torch.rand(3))
