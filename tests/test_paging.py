"""Paging keeps a value's layout and device, and only accelerator values are paged (issue 22).

On an H100, a paged-in view came back contiguous and on ``cuda`` whatever its index (the replay then
failed a ``view``), and a schedule paged a CPU scalar of a CUDA step into the copy stream, where
``torch.cuda.current_stream(cpu)`` raised. Here:

- :mod:`coop.runtime.paging` round-trips transposed, sliced (storage offset), expanded (stride 0),
  channels-last and 0-d values with their dtype, shape, strides, offset, device and bits, on CPU and
  (where a GPU is present) on ``cuda:0`` / ``cuda:1``;
- on a hand-built mixed-device Graph (CUDA activations beside a 0-d CPU scalar and a CPU RNG seed)
  the validator refuses a schedule that pages the CPU value, in one line, and POET (both models) and
  the paging heuristic page only CUDA values, where on the same graph with every value on CUDA they
  would page the tempting CPU one;
- the executor refuses such a schedule through its validation (with or without a copy stream);
- a POET plan whose paged values are a transposed activation and a 0-d loss viewing a larger storage
  replays bit-identically to eager PyTorch, each paged value reaching its readers with its strides.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from coop import Schedule, Step, capture
from coop.budget import baseline_peak, min_budget
from coop.errors import ScheduleError
from coop.formulations import solve
from coop.formulations.heuristics.paging import paging_schedule
from coop.graph import Graph
from coop.runtime.executor import Executor
from coop.runtime.meter import MemoryMeter
from coop.runtime.paging import HostCopy, page_in, page_out, pin_host_copy
from coop.schedule import validate
from tests.test_copy_stream import RecordingStreams

# ---------------------------------------------------------------- the paging functions


def _layouts(device: str) -> dict[str, torch.Tensor]:
    """Values whose layout a contiguous copy would lose, on ``device``."""
    torch.manual_seed(0)
    base = torch.randn(6, 10, device=device)
    return {
        "transposed": base.t(),
        "sliced": base[2:, 3:],  # storage offset 23, rows of 7 in a stride of 10
        "expanded": torch.randn(4, 1, device=device).expand(4, 5),  # stride 0
        "channels_last": torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last),
        "0-d view of a larger storage": base[1, 2],
        "int16 narrow": torch.arange(20, dtype=torch.int16, device=device)[5:17:3],
        "bool": (base > 0).t(),
        "empty": torch.empty(0, 3, device=device),
    }


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    if sa.nbytes() != sb.nbytes():
        return False
    as_bytes = [torch.empty(0, dtype=torch.uint8, device=t.device).set_(s) for t, s in ((a, sa), (b, sb))]
    return torch.equal(as_bytes[0].cpu(), as_bytes[1].cpu())


def _assert_round_trip(value: torch.Tensor, back: torch.Tensor) -> None:
    assert back.dtype == value.dtype and back.shape == value.shape
    assert back.stride() == value.stride() and back.storage_offset() == value.storage_offset()
    assert back.device == value.device  # the exact device, index included
    assert _same_bytes(back, value)  # the whole storage, bit for bit (the gaps of a slice included)
    assert torch.equal(back, value)
    if value.untyped_storage().nbytes():
        assert back.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()  # a new storage


@pytest.mark.parametrize("name", list(_layouts("cpu")))
def test_a_paged_value_comes_back_with_its_layout_and_bits_on_cpu(name: str) -> None:
    value = _layouts("cpu")[name]
    host = page_out(value, pin=pin_host_copy(value.device), non_blocking=False)
    assert isinstance(host, HostCopy) and host.data.dtype == torch.uint8 and host.data.device.type == "cpu"
    assert host.nbytes == value.untyped_storage().nbytes()
    _assert_round_trip(value, page_in(host, non_blocking=False))
    assert torch.equal(host.host_view(), value.cpu()) and host.host_view().stride() == value.stride()


@pytest.mark.parametrize("name", list(_layouts("cpu")))
def test_paging_into_a_placed_tensor_writes_the_value_there(name: str) -> None:
    """The arena replay's page-in: the value written into a tensor it placed (same layout or not)."""
    value = _layouts("cpu")[name]
    host = page_out(value, pin=False, non_blocking=False, whole_storage=False)  # an arena value shares its buffer
    assert host.nbytes <= value.untyped_storage().nbytes() and host.storage_offset == 0
    arena = torch.full((64 + value.untyped_storage().nbytes(),), 7, dtype=torch.uint8)
    placed = arena[16:16 + host.nbytes].view(value.dtype).as_strided(value.shape, value.stride()) if host.nbytes \
        else torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
    assert page_in(host, non_blocking=False, into=placed) is placed
    assert torch.equal(placed, value) and placed.stride() == value.stride()
    assert torch.equal(arena[:16], torch.full((16,), 7, dtype=torch.uint8))  # nothing written outside its block
    assert torch.equal(arena[16 + host.nbytes:], torch.full((arena.numel() - 16 - host.nbytes,), 7, dtype=torch.uint8))
    back = page_in(host, non_blocking=False)  # without a place: a storage of the span, offset 0, strides kept
    assert torch.equal(back, value) and back.stride() == value.stride() and back.storage_offset() == 0
    if not name.startswith("expanded"):
        contiguous = torch.empty(value.shape, dtype=value.dtype)
        assert torch.equal(page_in(host, non_blocking=False, into=contiguous), value)


def test_paging_into_a_tensor_of_another_kind_is_refused() -> None:
    host = page_out(torch.zeros(3, 4), pin=False, non_blocking=False)
    for wrong in (torch.zeros(4, 3), torch.zeros(3, 4, dtype=torch.float64)):
        with pytest.raises(ValueError, match="cannot page a torch.float32 \\[3, 4\\] value of cpu into"):
            page_in(host, non_blocking=False, into=wrong)


def test_a_value_of_an_odd_sized_storage_round_trips() -> None:
    """A float32 view of a 10-byte storage: the storage is not a whole number of float32s."""
    raw = torch.arange(10, dtype=torch.uint8)
    value = raw[:8].view(torch.float32)
    _assert_round_trip(value, page_in(page_out(value, pin=False, non_blocking=False), non_blocking=False))


def test_the_host_copy_is_metered_apart_from_the_device() -> None:
    value = torch.randn(64, 32).t()
    with MemoryMeter() as meter:
        meter.track(value)
        back = page_in(page_out(value, pin=False, non_blocking=False), non_blocking=False)
    assert meter.host_peak_bytes == value.untyped_storage().nbytes()
    assert meter.peak_bytes == 2 * value.untyped_storage().nbytes()  # the value and its paged-in copy
    assert torch.equal(back, value)


_CUDA_DEVICES = [pytest.param(f"cuda:{index}", marks=pytest.mark.skipif(
    torch.cuda.device_count() <= index, reason=f"needs {index + 1} CUDA device(s)")) for index in (0, 1)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("device", _CUDA_DEVICES)
@pytest.mark.parametrize("name", list(_layouts("cpu")))
def test_a_paged_value_comes_back_with_its_layout_and_device_on_cuda(device: str, name: str) -> None:
    """Issue 22: ``torch.empty(shape)`` lost the strides and ``.to("cuda")`` the index (cuda:1 came back on cuda:0)."""
    value = _layouts(device)[name]
    pin = pin_host_copy(value.device)
    assert pin
    host = page_out(value, pin=pin, non_blocking=True)
    assert host.data.is_pinned() and host.device == torch.device(device)
    with torch.cuda.device("cuda:0"):  # the current device is not where the value goes back to
        back = page_in(host, non_blocking=True)
    torch.cuda.synchronize()
    _assert_round_trip(value, back)


# ---------------------------------------------------------------- only accelerator values are paged

#: x -> a, s, seed, m1 -> m2 -> loss; g1 reads loss, s, seed; g2 reads g1, a. The peak is at m2, while a (CUDA,
#: 40 B) and s (a CPU value, 80 B: larger, idle longer by bytes x steps, so the tempting one) are idle.
_NODES = [
    {"id": 0, "name": "x", "kind": "input", "mem": 4, "cost": 0, "device": "cuda:0"},
    {"id": 1, "name": "a", "inputs": [0], "mem": 40, "cost": 1.0, "device": "cuda:0"},
    {"id": 2, "name": "s", "inputs": [0], "mem": 80, "cost": 1.0, "device": "cpu"},  # a 0-d scalar's storage
    {"id": 3, "name": "seed", "inputs": [0], "mem": 8, "cost": 1e-6, "device": "cpu", "recomputable": False},
    {"id": 4, "name": "m1", "inputs": [0], "mem": 50, "cost": 1e-6, "device": "cuda:0"},
    {"id": 5, "name": "m2", "inputs": [4], "mem": 10, "cost": 1e-6, "device": "cuda:0"},
    {"id": 6, "name": "loss", "inputs": [5], "mem": 1, "cost": 1e-6, "device": "cuda:0"},
    {"id": 7, "name": "g1", "kind": "backward", "inputs": [6, 2, 3], "mem": 10, "cost": 1e-6, "device": "cuda:0"},
    {"id": 8, "name": "g2", "kind": "backward", "inputs": [7, 1], "mem": 10, "cost": 1e-6, "device": "cuda:0"},
]


def _mixed_graph(every_value_on_cuda: bool = False) -> Graph:
    nodes = [dict(n, device="cuda:0") if every_value_on_cuda else n for n in _NODES]
    return Graph.model_validate({"name": "mixed" if not every_value_on_cuda else "uniform", "nodes": nodes,
                                 "outputs": [8]})


def _paged(graph: Graph, schedule: Schedule | None) -> set[str]:
    assert schedule is not None
    return {graph.node(s.node).name for s in schedule.steps if s.op in ("page_out", "page_in")}


def test_the_graph_says_which_values_are_pageable() -> None:
    graph = _mixed_graph()
    assert graph.has_accelerator
    assert [n.name for n in graph.nodes if not graph.pageable(n.id)] == ["s", "seed"]
    assert all(_mixed_graph(every_value_on_cuda=True).pageable(n.id) for n in graph.nodes)
    assert baseline_peak(graph) == 192  # at m2: x 4 + a 40 + s 80 + seed 8 + m1 50 + m2 10


@pytest.mark.parametrize("victim", ["s", "seed"])
def test_the_validator_refuses_paging_a_cpu_value_in_one_line(victim: str) -> None:
    graph = _mixed_graph()
    node = next(n for n in graph.nodes if n.name == victim)
    steps: list[Step] = []
    for node_id in graph.order:
        steps += [Step(op="page_in", node=node.id)] if node_id == 7 else []
        steps.append(Step(op="compute", node=node_id))
        steps += [Step(op="page_out", node=node.id)] if node_id == node.id else []
    schedule = Schedule(steps=tuple(steps))
    verdict = validate(graph, schedule)
    step = [str(s) for s in steps].index(f"page_out %{node.id}")
    assert not verdict.ok and verdict.step == step
    assert verdict.reason == (f"step {step} (page_out %{node.id}): node {node.id} ({victim}) lives on cpu, not on the "
                              "accelerator (cuda:0) whose memory the budget bounds; only accelerator values can be "
                              "paged: remove its page_out/page_in and keep it resident (it is host memory already)")
    # the same schedule is legal where every value is on the device
    assert validate(_mixed_graph(every_value_on_cuda=True), schedule).ok


def test_the_paging_heuristic_pages_only_cuda_values() -> None:
    budget = 152  # 192 - 40: paging a alone fits; paging s would fit too
    assert _paged(_mixed_graph(True), paging_schedule(_mixed_graph(True), budget)) == {"s"}  # the tempting one
    graph = _mixed_graph()
    schedule = paging_schedule(graph, budget)
    assert _paged(graph, schedule) == {"a"}
    assert validate(graph, schedule, budget).ok
    assert paging_schedule(graph, 130) is None  # only s could bring it there


@pytest.mark.parametrize("model", ["milp", "intervals"])
@pytest.mark.parametrize("budget", [130, 152])
def test_poet_pages_only_cuda_values(model: str, budget: int) -> None:
    """At 130 only paging s (or recomputing it) fits: on the uniform graph POET pages s, on the mixed one it
    recomputes s instead; at 152 it pages a. The interval model (max_nodes=0) and the T x T MILP alike."""
    options = {"device_profile": "h100-sxm-pcie5", "time_limit": 20, "threads": 1}
    if model == "intervals":
        options["max_nodes"] = 0
    assert min_budget(_mixed_graph()) <= budget
    if budget == 130:
        uniform = _mixed_graph(every_value_on_cuda=True)
        assert "s" in _paged(uniform, solve(uniform, budget, "poet", **options).schedule)
    graph = _mixed_graph()
    result = solve(graph, budget, "poet", **options)
    assert result.schedule is not None, result.message
    assert validate(graph, result.schedule, budget).ok
    paged = _paged(graph, result.schedule)
    assert all(graph.pageable(n.id) for n in graph.nodes if n.name in paged) and not paged & {"s", "seed"}
    assert paged == ({"a"} if budget == 152 else paged)
    paging_only = solve(graph, budget, "poet", remat=False, **options)  # no recomputation: s stays, so 130 fails
    if budget == 130:
        assert paging_only.schedule is None
    else:
        assert _paged(graph, paging_only.schedule) == {"a"}


# ---------------------------------------------------------------- the executor


class _Transposed(nn.Module):
    """tanh's output is transposed (strides (1, width)) and owns its storage: a captured value that is not
    contiguous; F.mse_loss's 0-d loss views a (batch, 4) storage on CPU."""

    def __init__(self, width: int = 64, hidden: int = 512) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(8, width), nn.Linear(width, hidden), nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(self.l1(x).t().clone())
        return self.l3(torch.relu(self.l2(z.t())))


@pytest.fixture(scope="module")
def transposed_model():
    torch.manual_seed(0)
    model = _Transposed()
    batch = (torch.randn(16, 8), torch.randn(16, 4))
    return model, batch, capture(model, batch, lambda m, x, y: F.mse_loss(m(x), y))


def _fake_values(captured) -> dict[int, torch.Tensor]:
    """Each Graph node's traced base value (the fx node the replay pages)."""
    values = {n.name: n.meta.get("val") for n in captured.module.graph.nodes}
    found = {}
    for node_id, names in captured.fx_names.items():
        tensors = [values[name] for name in names if isinstance(values.get(name), torch.Tensor)]
        if tensors:
            found[node_id] = tensors[0]
    return found


class _ReadStrides(TorchDispatchMode):
    """The (shape, stride, offset, storage bytes) of every tensor each op reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, list[tuple]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        layouts = [(tuple(a.shape), a.stride(), a.storage_offset(), a.untyped_storage().nbytes())
                   for a in args if isinstance(a, torch.Tensor)]
        self.reads.append((str(func), layouts))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("copy_stream", [False, True])
def test_a_poet_plan_paging_a_transposed_value_replays_exactly(transposed_model, copy_stream: bool) -> None:
    """POET, paging only, at min_budget: it pages the transposed tanh output and the 0-d loss (a view of a 256-byte
    storage). The replay equals eager PyTorch bit for bit; every op reads the paged values with their traced layout
    (on CUDA a contiguous copy broke the captured program's views); the host tier held them."""
    model, batch, captured = transposed_model
    graph = captured.graph.with_random_replay()
    budget = min_budget(graph)
    result = solve(graph, budget, "poet", device_profile="a100-pcie4", remat=False, time_limit=30, threads=1)
    assert result.schedule is not None, result.message
    fakes = _fake_values(captured)
    paged = {s.node for s in result.schedule.steps if s.op == "page_out"}
    odd = {v for v in paged  # transposed, or viewing a larger storage (the Graph counts its real bytes)
           if not fakes[v].is_contiguous() or graph.node(v).mem > fakes[v].numel() * fakes[v].element_size()}
    assert {graph.node(v).name for v in odd} >= {"tanh", "mse_loss"}, [graph.node(v).name for v in paged]
    streams = RecordingStreams()
    executor = Executor(captured, result.schedule, copy_stream=streams if copy_stream else False)
    meter, reads = _replay_equal_to_eager(executor, captured, model, batch)
    assert meter.host_peak_bytes > 0 and meter.peak_bytes <= executor.predicted_peak <= budget
    tanh = fakes[next(v for v in odd if graph.node(v).name == "tanh")]
    layout = (tuple(tanh.shape), tanh.stride(), 0, tanh.untyped_storage().nbytes())
    # tanh_backward(grad, output) reads the paged-in tanh output as traced: strides (1, 64), not (16, 1)
    assert [layouts[1] for op, layouts in reads.reads if op == "aten.tanh_backward.default"] == [layout]
    if copy_stream:
        assert streams.waits > 0


def _replay_equal_to_eager(executor: Executor, captured, model, batch) -> tuple:
    """One metered replay (its reads' strides recorded), its outputs torch.equal to the captured step's under the
    same seed; the meter and the recorded reads."""
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(1)
    with MemoryMeter() as meter, _ReadStrides() as reads:
        meter.track(*flat, *captured.constants())
        outputs = executor.run_flat(flat)
    torch.manual_seed(1)
    assert all(torch.equal(a, b) for a, b in zip(outputs, captured.run(model, *batch), strict=True))
    return meter, reads


def _with_devices(captured, devices: dict[int, str]):
    """The capture with its Graph's values on other devices (a CPU machine's stand-in for a CUDA capture)."""
    data = captured.graph.model_dump()
    for node in data["nodes"]:
        node["device"] = devices.get(node["id"], "cuda:0")
    return dataclasses.replace(captured, graph=Graph.model_validate(data))


@pytest.mark.parametrize("copy_stream", [False, True])
def test_the_executor_refuses_a_schedule_that_pages_a_cpu_value(transposed_model, copy_stream: bool) -> None:
    """The loss is a 0-d value; marked as living on the CPU of a CUDA step, paging it is refused before any copy
    (issue 22's crash came from the copy stream asking torch.cuda for a CPU stream)."""
    _, _, captured = transposed_model
    loss = next(n.id for n in captured.graph.nodes if n.name == "mse_loss")
    mixed = _with_devices(captured, {loss: "cpu"})
    steps: list[Step] = []
    for node_id in captured.graph.order:
        steps.append(Step(op="compute", node=node_id))
        steps += [Step(op="page_out", node=loss), Step(op="page_in", node=loss)] if node_id == loss else []
    schedule = Schedule(steps=tuple(steps))
    Executor(captured, schedule)  # legal where the CPU is the step's only device
    with pytest.raises(ScheduleError, match=f"node {loss} \\(mse_loss\\) lives on cpu, not on the accelerator") as no:
        Executor(mixed, schedule, copy_stream=RecordingStreams(stand_in=None) if copy_stream else False)
    assert "\n" not in str(no.value) and "remove its page_out/page_in" in str(no.value)


def test_an_arena_replay_pages_a_transposed_value_into_its_block(transposed_model) -> None:
    """The arena replay pages a value's own bytes (its storage is the whole arena buffer) and writes it back into
    its planned block: the same POET plan replays bit-identically, tanh_backward reading tanh with its strides."""
    from coop.runtime.executor import arena_placement

    model, batch, captured = transposed_model
    graph = captured.graph.with_random_replay()
    result = solve(graph, min_budget(graph), "poet", device_profile="a100-pcie4", remat=False, time_limit=30,
                   threads=1)
    assert result.schedule is not None, result.message
    assert "tanh" in {graph.node(s.node).name for s in result.schedule.steps if s.op == "page_out"}
    executor = Executor(captured, result.schedule, placement=arena_placement(Executor(captured, result.schedule)))
    assert executor.arena_program is not None and "whole_storage = False" in executor.code
    arena_bytes = executor.arena_program.buffer_bytes("cpu")
    for _ in range(2):  # the second step reuses the buffer
        meter, reads = _replay_equal_to_eager(executor, captured, model, batch)
        assert 0 < meter.host_peak_bytes < arena_bytes  # the values' bytes, not copies of the arena
    tanh = _fake_values(captured)[next(n.id for n in graph.nodes if n.name == "tanh")]
    readers = [(op, layouts) for op, layouts in reads.reads if "tanh_backward" in op]
    assert readers and all(layouts[1][:2] == (tuple(tanh.shape), tanh.stride()) for _, layouts in readers), readers
