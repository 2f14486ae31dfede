"""Issue 15: a plan replayed inside one arena at its planned offsets (coop.runtime.arena_replay).

Oracles: eager PyTorch (a deep copy of the model runs ``loss.backward()`` and its own AdamW under the
same seeds; loss, gradients, parameters and buffers ``torch.equal`` after every step), the memory
meter (an independent count of the storages a step allocates), and the placement's own numbers
(each output's address inside the arena is read from the tensor's data pointer).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch

import coop
from coop import capture
from coop.errors import CoopError
from coop.runtime.executor import Executor
from coop.runtime.meter import MemoryMeter
from coop.runtime.placement import Placement, best_fit_placement, execution_placement
from coop.schedule import Schedule
from coop.zoo import build

STEPS = 3
MODELS = {
    "mlp": {},
    "cnn": {},
    "transformer": {},
    "gpt2": {"layers": 1, "hidden": 32, "seq": 16, "vocab": 64},
    "resnet": {"hidden": 4, "image": 16},
    "vit": {"layers": 1, "hidden": 32, "image": 16},
    "bert": {"layers": 1, "hidden": 32, "seq": 16, "vocab": 64},
    "mobilenet": {"image": 16},
}
#: Every model at store-all, and recomputation (checkpoint-all) on convolution nets and a transformer.
CASES = [(name, "store-all") for name in sorted(MODELS)] + [(name, "checkpoint-all") for name in ("cnn", "gpt2", "resnet")]
#: Ops whose CPU kernel allocates its outputs itself (their ``.out`` overloads are wrappers that copy): the arena
#: replay hands their output allocations the planned views; an output a kernel puts elsewhere (only while the
#: replay learns which allocation is which, at a call site's first call) is copied in and reported.
KERNEL_OUTPUT_OPS = {"aten.convolution.default", "aten.convolution_backward.default", "aten.native_layer_norm.default",
                     "aten.native_layer_norm_backward.default", "aten.native_batch_norm_backward.default"}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine thread-pool waits, not kernels, dominate these tiny steps
    (eager and the plan run under the same setting, so the comparison is unchanged)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _micro_batches(batch: tuple) -> list[tuple]:
    """Two micro-batches of the same shapes: the batch and the batch reversed along its first dimension."""
    return [batch, tuple(t.flip(0) for t in batch)]


def _train(model: torch.nn.Module, batch: tuple, step: Callable) -> list[list[torch.Tensor]]:
    """Losses, accumulated gradients, parameters and buffers after each of STEPS AdamW steps of 2 micro-batches.

    The loop holds each step's loss until the next one is made (``loss = step(...)``), as training loops do.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    states = []
    loss = None
    for index in range(STEPS):
        losses = []
        for micro, part in enumerate(_micro_batches(batch)):
            torch.manual_seed(100 + 10 * index + micro)
            loss = step(model, part)
            losses.append(loss.clone())
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
        states.append([*losses, *grads, *(p.detach().clone() for p in model.parameters()),
                       *(b.clone() for b in model.buffers())])
    return states


def _eager_step(loss_fn: Callable | None) -> Callable:
    def step(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        loss = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
        loss.backward()
        return loss.detach()
    return step


def _assert_equal(expected: list[list[torch.Tensor]], got: list[list[torch.Tensor]]) -> None:
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        for index, (a, b) in enumerate(zip(want, have, strict=True)):
            assert torch.equal(a, b), f"step {step}: tensor {index} differs from eager"


def _metered(plan: coop.Plan, records: list) -> Callable:
    """plan.step under the memory meter, which counts the caller-owned values and the plan's buffer as tracked."""
    def step(model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        program = plan.executor.arena_program
        with MemoryMeter(use_cuda=False) as meter:
            meter.track(*plan.captured.flat_inputs(model, batch), *plan.captured.constants(),
                        *program.buffers.values())
            loss = plan.step(*batch)
        records.append((meter.allocations, meter.peak_bytes))
        return loss
    return step


@pytest.mark.parametrize(("name", "formulation"), CASES)
def test_arena_training_is_bit_identical_and_allocates_only_the_buffer_once(name: str, formulation: str) -> None:
    """Each step of 2 micro-batches: the first allocates nothing but (once) the buffer; the second accumulates into
    the ``.grad`` values the first handed out in the arena, which it first moves out of the arena (what eager holds
    while it accumulates: one storage per gradient) and nothing else."""
    model, batch, loss_fn = build(name, **MODELS[name])
    eager = copy.deepcopy(model)
    plan = coop.plan(model, "1GiB", batch, loss_fn=loss_fn, formulation=formulation, arena=True)
    program = plan.executor.arena_program
    assert program is not None
    expected = _train(eager, batch, _eager_step(loss_fn))
    records: list = []
    _assert_equal(expected, _train(model, batch, _metered(plan, records)))
    assert not program.transients  # no op computed outside the arena and copied in
    buffer = [("aten.empty.memory_format", program.buffer_bytes("cpu"))]
    grads = sorted(p.numel() * p.element_size() for p in model.parameters())
    for call, (allocations, peak) in enumerate(records):
        if call % 2:  # accumulating: the held .grad values moved out of the arena, one clone each
            assert {op for op, _ in allocations} == {"aten.clone.default"}, f"call {call}: {allocations}"
            assert sorted(nbytes for _, nbytes in allocations) == grads
            assert peak <= plan.executor.predicted_peak + sum(grads)
        else:
            assert allocations == (buffer if call == 0 else []), f"call {call}: {allocations}"
            assert peak <= plan.executor.predicted_peak
    assert program.moved_out == STEPS * sum(grads) and program.new_buffers == 0
    copies = list(program.kernel_copies)
    assert {op for op, _ in copies} <= KERNEL_OUTPUT_OPS
    buffer_storage = program.buffers["cpu"].untyped_storage().data_ptr()
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none) left nothing pinned
    model_loss = plan.step(*batch)
    assert all(p.grad.untyped_storage().data_ptr() == buffer_storage for p in model.parameters())
    assert model_loss.untyped_storage().data_ptr() == buffer_storage
    assert program.kernel_copies == copies  # learned at each call site's first call: no copies after it


def test_held_gradients_and_losses_are_never_overwritten() -> None:
    """.grad semantics of eager PyTorch: zero_grad(set_to_none=False) zeroes in place, a .grad (or a view of it)
    the caller holds after zero_grad() keeps its values, a held loss stays the loss it was."""
    model, batch, _ = build("mlp")
    eager = copy.deepcopy(model)
    plan = coop.plan(model, "1GiB", batch, arena=True)

    def session(net: torch.nn.Module, step: Callable) -> list[torch.Tensor]:
        kept: list[torch.Tensor] = []
        for index, how in enumerate(["in place", "keep .grad", "keep a view", "keep losses"]):
            torch.manual_seed(index)
            losses = [step(net, part) for part in _micro_batches(batch)]
            if how == "keep .grad":
                kept += [p.grad for p in net.parameters()]
            if how == "keep a view":
                kept += [p.grad.view(-1)[:3] for p in net.parameters()]
            if how == "keep losses":
                kept += losses
            net.zero_grad(set_to_none=how != "in place")
        return [*kept, *(p.grad for p in net.parameters() if p.grad is not None)]

    expected = session(eager, _eager_step(None))
    got = session(model, lambda net, part: plan.step(*part))
    assert len(expected) == len(got) > 0
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("name", ["gpt2", "cnn"])
def test_every_op_but_the_workspace_ops_writes_its_view_in_place(name: str) -> None:
    """The program's placed values are written in place except the named workspace ops, whose measured
    allocation the meter sees once each, with the bytes the program reports."""
    model, batch, captured, ordinary, _, executor = _arena_executor(name)
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(0)
    expected = [t.clone() for t in ordinary.run_flat(flat)]
    torch.manual_seed(0)
    with MemoryMeter(use_cuda=False) as meter:
        meter.track(*flat, *captured.constants())
        outputs = executor.run_flat(flat)
    assert all(torch.equal(a, b) for a, b in zip(expected, outputs, strict=True))
    program = executor.arena_program
    assert not program.transients
    assert meter.allocations == [("aten.empty.memory_format", program.buffer_bytes("cpu"))]
    assert meter.peak_bytes <= executor.predicted_peak


def test_llama_arena_replay_equals_the_ordinary_replay_and_allocates_only_its_buffer() -> None:
    """Llama (SwiGLU) replays ~1e-9 from eager even without an arena (ARCHITECTURE.md, facts), so its oracle is
    the ordinary replay: two steps equal, the first allocating the buffer alone and the second nothing."""
    model, batch, captured, ordinary, _, executor = _arena_executor("llama", layers=1, hidden=32, seq=16, vocab=64)
    flat = captured.flat_inputs(model, batch)
    for call in range(2):
        torch.manual_seed(call)
        expected = [t.clone() for t in ordinary.run_flat(flat)]
        torch.manual_seed(call)
        with MemoryMeter(use_cuda=False) as meter:
            meter.track(*flat, *captured.constants(), *executor.arena_program.buffers.values())
            outputs = executor.run_flat(flat)
        assert all(torch.equal(a, b) for a, b in zip(expected, outputs, strict=True))
        assert meter.allocations == ([("aten.empty.memory_format", executor.arena_program.buffer_bytes("cpu"))]
                                     if call == 0 else [])
        assert meter.peak_bytes <= executor.predicted_peak
        del outputs  # held outputs would (rightly) send the next step's loss and gradients to fresh copies


def _arena_executor(name: str, schedule_of: Callable = lambda graph: Schedule.from_order(graph.order), **size: int):
    model, batch, loss_fn = build(name, **(size or MODELS[name]))
    captured = capture(model, batch, loss_fn=loss_fn)
    ordinary = Executor(captured, schedule_of(captured.graph))
    placement = execution_placement(ordinary.graph, ordinary.schedule)
    return model, batch, captured, ordinary, placement, Executor(captured, ordinary.schedule, placement=placement)


def test_arena_holds_no_more_than_the_placement_and_values_sit_at_their_offsets() -> None:
    model, batch, captured, _, placement, executor = _arena_executor("mlp")
    placed = [(b, o) for b, o in zip(placement.lifetimes, placement.offsets, strict=True)
              if b.instance >= 0 or b.label.startswith("workspace")]
    base = min(o for _, o in placed)
    program = executor.arena_program
    assert program.arena_bytes == max(o + b.size for b, o in placed) - base <= placement.arena_peak
    # the caller-owned values (parameters, the batch) take no room in the arena: they stay in the caller's storages
    assert base == 0 and len(placed) == len(placement.lifetimes) and program.arenas == placement.arena_peaks
    flat = captured.flat_inputs(model, batch)
    executor.run_flat(flat)  # allocates the buffer; the raw program then shows where it writes each output
    buffer = program.buffers["cpu"]
    with torch.no_grad():
        raw = executor._forward(executor.module, *flat, buffer)
    final = {inst.node: k for k, inst in enumerate(executor.simulation.instances)}
    checked = 0
    for fx_node, value in zip(captured.output_nodes(), raw, strict=True):
        node_id = captured.owner_of[fx_node.name]
        if executor.graph.node(node_id).caller_owned:
            continue
        block = next((b, o) for b, o in placed if b.instance == final[node_id] and b.end == len(executor.schedule) - 1)
        assert value.data_ptr() - buffer.data_ptr() == block[1] - base
        checked += 1
    assert checked == len(captured.grad_names) + 1  # the gradients and the loss
    assert buffer.data_ptr() % 64 == 0 or program.buffer_bytes("cpu") == buffer.numel()


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
            Executor(captured, executor.schedule, placement=bad)
        assert words in str(error.value) and "\n" not in str(error.value)
    checkpointed = coop.formulations.solve(executor.graph, 10**12, "checkpoint-all").schedule
    with pytest.raises(CoopError, match="another schedule"):
        Executor(captured, checkpointed, placement=good)


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


# ------------------------------------------------------------------ issue 22: gradients in the arena, devices, CUDA
def test_held_gradients_move_out_of_the_arena_and_keep_identity_and_values() -> None:
    """A .grad the caller keeps across zero_grad() is the same tensor object with the same values after the next
    step (moved out of the arena onto a storage of its own); the new .grad values are in the arena again."""
    model, batch, _ = build("mlp")
    eager = copy.deepcopy(model)
    plan = coop.plan(model, "1GiB", batch, arena=True)
    program = plan.executor.arena_program
    torch.manual_seed(0)
    plan.step(*batch)
    kept = [p.grad for p in model.parameters()]
    saved = [g.clone() for g in kept]
    model.zero_grad()
    torch.manual_seed(1)
    plan.step(*batch)
    buffer = program.buffers["cpu"].untyped_storage().data_ptr()
    assert all(torch.equal(g, s) and g.untyped_storage().data_ptr() != buffer for g, s in zip(kept, saved, strict=True))
    assert all(p.grad.untyped_storage().data_ptr() == buffer for p in model.parameters())
    assert program.moved_out == sum(g.numel() * g.element_size() for g in kept) and program.new_buffers == 0
    for seed in (0, 1):
        eager.zero_grad()
        torch.manual_seed(seed)
        eager(*batch).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters(), strict=True))


def test_a_view_of_a_handed_out_gradient_keeps_the_old_buffer() -> None:
    """``set_`` cannot follow a view: a step after a view of a .grad was kept runs on a new buffer, the view keeps its
    values, and the next step (the view released) reuses the new buffer."""
    model, batch, _ = build("mlp")
    plan = coop.plan(model, "1GiB", batch, arena=True)
    program = plan.executor.arena_program
    plan.step(*batch)
    views = [p.grad.view(-1)[:3] for p in model.parameters()]
    saved = [v.clone() for v in views]
    old = program.buffers["cpu"].untyped_storage().data_ptr()
    model.zero_grad()
    plan.step(*batch)
    new = program.buffers["cpu"].untyped_storage().data_ptr()
    assert program.new_buffers == 1 and new != old
    assert all(torch.equal(v, s) and v.untyped_storage().data_ptr() == old for v, s in zip(views, saved, strict=True))
    del views
    model.zero_grad()
    plan.step(*batch)
    assert program.new_buffers == 1 and program.buffers["cpu"].untyped_storage().data_ptr() == new


def _relocated(captured: coop.Captured, device_of: Callable[[int], str]) -> coop.Captured:
    """``captured`` as if traced on other devices: each Graph node (and each fx value it owns) on ``device_of(id)``.

    Fake tensors may live on CUDA without a GPU; the program is built and read, never run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    data = captured.graph.model_dump()
    for node in data["nodes"]:
        node["device"] = device_of(node["id"]) if node["device"] is not None else None
    captured.graph = coop.Graph.model_validate(data)
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def moved(value: object, device: str) -> object:
        if isinstance(value, torch.Tensor):
            with mode:
                base = torch.empty(value.untyped_storage().nbytes() // value.element_size() or 1, dtype=value.dtype,
                                   device=device)
                return base.as_strided(value.shape, value.stride(), value.storage_offset())
        if isinstance(value, (tuple, list)):
            return type(value)(moved(v, device) for v in value)
        return value

    for fx_node in captured.module.graph.nodes:
        owner = captured.owner_of.get(fx_node.name)
        if owner is not None and "val" in fx_node.meta:
            fx_node.meta["val"] = moved(fx_node.meta["val"], device_of(owner))
    return captured


def test_mixed_device_program_writes_each_value_into_its_devices_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose values live on cuda:0, cuda:1 and the CPU (hand-assigned; built with fake CUDA tensors, never run):
    one buffer per device, each the size of that device's placed peak, and every planned value is a view of its own
    device's buffer."""
    from coop.runtime.arena_replay import ArenaProgramBuilder

    model, batch, loss_fn = build("mlp")
    captured = capture(model, batch, loss_fn=loss_fn)
    computed = [n.id for n in captured.graph.nodes if not n.caller_owned]
    on_cpu, on_second = set(computed[2:4]), set(computed[5:9])

    def device_of(node_id: int) -> str:
        return "cpu" if node_id in on_cpu else "cuda:1" if node_id in on_second else "cuda:0"

    captured = _relocated(captured, device_of)
    assert set(captured.graph.devices) == {"cpu", "cuda:0", "cuda:1"}
    written: list[tuple[int, str]] = []
    original = ArenaProgramBuilder.view_at

    def recording(self: ArenaProgramBuilder, offset: int, size: int, fake: torch.Tensor, device: str | None = None):
        written.append((self.node_id, device or str(fake.device)))
        return original(self, offset, size, fake, device)

    monkeypatch.setattr(ArenaProgramBuilder, "view_at", recording)
    ordinary = Executor(captured, Schedule.from_order(captured.graph.order))
    placement = execution_placement(ordinary.graph, ordinary.schedule)
    executor = Executor(captured, ordinary.schedule, placement=placement)
    program = executor.arena_program
    assert program.devices == ["cpu", "cuda:0", "cuda:1"]
    assert {d: program.arenas[d] for d in program.devices} == placement.arena_peaks
    for device in program.devices:
        assert f"coop_arena_{device.replace(':', '_')}" in executor.code
    placed = [(node, device) for node, device in written if node >= 0]
    assert placed and {device for _, device in placed} == {"cpu", "cuda:0", "cuda:1"}
    assert all(device == device_of(node) for node, device in placed)
    with pytest.raises(CoopError, match="arena=True replays CPU steps only") as error:
        coop.plan(model, 1.0, batch, loss_fn=loss_fn, arena=True, captured=captured)
    assert "\n" not in str(error.value) and "expandable segments" in str(error.value)


def test_cuda_arena_is_refused_in_one_line_before_any_solve() -> None:
    """On CUDA the arena is not what coop uses (measured on an H100: ARCHITECTURE.md, facts): plan(arena=True) says so and what to use."""
    model, batch, loss_fn = build("mlp")
    captured = capture(model, batch, loss_fn=loss_fn)
    captured.graph = coop.Graph.model_validate(
        {**captured.graph.model_dump(), "nodes": [{**n, "device": "cuda:0" if n["device"] else None}
                                                  for n in captured.graph.model_dump()["nodes"]]})
    with pytest.raises(CoopError, match="cuda:0") as error:
        coop.plan(model, 1.0, batch, loss_fn=loss_fn, arena=True, captured=captured, time_limit=0.01)
    message = str(error.value)
    assert "\n" not in message and "ordinary replay" in message and "without arena=True" in message
    ordinary = coop.plan(model, 1.0, batch, loss_fn=loss_fn, captured=capture(model, batch, loss_fn=loss_fn))
    with pytest.raises(CoopError, match="CPU steps only"):
        ordinary.captured.graph = captured.graph
        ordinary.use_arena(None)
