"""Paging on a side copy stream (issue 14, item 3), proven on CPU by its synchronization protocol.

No GPU runs here. The replay runs on CPU tensors with :class:`RecordingStreams`, a fake of the stream
API that keeps a log of every event record, stream wait and ``record_stream``; a dispatch mode adds
every aten op to the same log with the fake stream it was issued on, the storages it reads and writes
and the storages it allocates. :func:`violations` is the oracle, written here from CUDA's rules and
the caching allocator's documented contract, not from coop.runtime.copy_stream:

- streams run their own work in issue order; across streams, X happens before Y only through an
  event recorded on X's stream after X that Y's stream waited on before Y (vector clocks);
- two accesses of one storage, one of them a write, are ordered by happens-before (a paged-in value's
  consumer after its H2D copy, a page-out's D2H copy after the value's producer, a page-in's read of
  the host copy after the D2H copy that wrote it);
- a storage used on a stream other than the one it was allocated on is waited for by its own stream
  before the storage is freed: the caching allocator hands a freed block (one without
  ``record_stream``, which the protocol no longer uses) to the next allocation on the stream it was
  allocated on at once, and only that stream's later kernels are ordered after what it waited for
  (torch.Tensor.record_stream's documentation: "the caching allocator ... may reuse the memory
  immediately ... on the allocating stream"). The log learns when a storage is freed from a
  finalizer on its Python object, which PyTorch keeps as long as any tensor holds the storage.

The mutation checks drop one wait at a time and require a violation, so the oracle is not vacuous;
the random-schedule test requires no violation and bit-identical results.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import coop
from coop import Schedule, Step, capture, simulate
from coop.errors import CoopError
from coop.runtime.executor import Executor
from coop.runtime.program_builder import unread_page_ins
from coop.zoo import build

# ---------------------------------------------------------------- the recording fake of the stream API


_CUDA0 = torch.device("cuda", 0)
_CPU = torch.device("cpu")


@dataclass(eq=False)
class FakeStream:
    name: str
    device: torch.device = _CUDA0


@dataclass(eq=False)
class FakeEvent:
    log: list = field(repr=False)

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record", self, stream))


#: torch.cuda's own check of a device argument (``current_stream``, ``Stream``, ``torch.cuda.device``): it raises
#: ``ValueError: Expected a cuda device, but got: cpu`` before touching CUDA, so it runs on this CPU-only torch too.
_check_cuda_device = torch.cuda._utils._get_device_index


@dataclass
class RecordingStreams:
    """A :class:`coop.runtime.copy_stream.StreamAPI` on CPU tensors that logs what a CUDA run would enqueue.

    It refuses what torch.cuda refuses: a stream of a CPU device (``current_stream(cpu)``, ``Stream(cpu)``: torch's
    ValueError, from torch's own check). This machine has no GPU, so the replay's tensors are CPU tensors:
    ``stand_in`` names the device whose tensors play ``cuda:0`` in a recorded run (the CPU by default; None: none
    does, and every CPU tensor is refused as a CUDA build of torch refuses it). ``drop_wait``: the index of one
    call to leave out (a mutant protocol). :meth:`key` names storages for the log, which records when each
    is freed."""

    drop_wait: int | None = None
    stand_in: torch.device | None = _CPU
    log: list = field(default_factory=list, repr=False)
    waits: int = 0

    def __post_init__(self) -> None:
        self.compute = FakeStream("compute")
        self.current = self.compute
        self._keys: dict[int, int] = {}
        self._next_key = itertools.count()

    def key(self, tensor: torch.Tensor) -> tuple[int, bool]:
        """A name for ``tensor``'s storage, unique over the run, and whether it is new (first seen now); its
        free is logged as ``("free", key)`` when the last tensor on it goes."""
        storage = tensor.untyped_storage()
        known = self._keys.get(storage._cdata)
        if known is not None:
            return known, False
        key = next(self._next_key)
        self._keys[storage._cdata] = key
        weakref.finalize(storage, self._freed, storage._cdata, key)
        return key, True

    def _freed(self, cdata: int, key: int) -> None:
        if self._keys.get(cdata) == key:
            del self._keys[cdata]
        self.log.append(("free", key))

    def cuda_device(self, device: torch.device) -> torch.device:
        """The CUDA device torch.cuda would see for ``device``: ``cuda:0`` for the stand-in, else torch's own check."""
        device = torch.device(device)
        if device == self.stand_in:
            return _CUDA0
        _check_cuda_device(device, optional=True)
        return device

    def current_stream(self, device: torch.device) -> FakeStream:
        device = self.cuda_device(device)
        assert self.current.device == device, f"one device in this fake, not {device}"
        return self.current

    def new_stream(self, device: torch.device) -> FakeStream:
        return FakeStream(f"side{len([e for e in self.log if e[0] == 'stream'])}", self.cuda_device(device))

    def new_event(self) -> FakeEvent:
        return FakeEvent(self.log)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        previous, self.current = self.current, stream
        try:
            yield stream
        finally:
            self.current = previous

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        self.waits += 1
        if self.waits - 1 != self.drop_wait:
            self.log.append(("wait", stream, event))


class AccessLog(TorchDispatchMode):
    """Logs each aten op with the fake stream it is issued on and the storages it reads, writes and allocates
    (named by :meth:`RecordingStreams.key`, which logs their frees)."""

    def __init__(self, streams: RecordingStreams) -> None:
        super().__init__()
        self.streams = streams

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:  # metadata only: no kernel touches memory
            return out
        key = self.streams.key
        inputs = {key(a)[0] for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        outputs = dict(key(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        allocating_only = "empty" in func.__name__  # empty_like(x) reads x's shape, not its memory, and writes nothing
        written = {key(a)[0] for a, spec in _mutable_arguments(func, args, kwargs)}
        reads = set() if allocating_only else inputs
        allocs = {k for k, new in outputs.items() if new}
        writes = written | (set() if allocating_only else set(outputs))
        self.streams.log.append(("op", self.streams.current, reads - written, writes, allocs, str(func)))
        return out


def _mutable_arguments(func: Any, args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, Any]]:
    found = []
    for index, spec in enumerate(func._schema.arguments):
        if spec.alias_info is None or not spec.alias_info.is_write:
            continue
        value = args[index] if index < len(args) else kwargs.get(spec.name)
        found += [(t, spec) for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return found


# ---------------------------------------------------------------- the happens-before oracle


@dataclass
class _Access:
    stream: FakeStream
    clock: dict
    write: bool
    what: str


def violations(log: list, compute: FakeStream) -> list[str]:
    """Every race and every cross-stream use not waited for before a free in a recorded log (empty: it holds)."""
    clocks: dict[FakeStream, dict] = {}
    event_clock: dict[FakeEvent, dict] = {}
    accesses: dict[int, list[_Access]] = {}
    allocated_on: dict[int, FakeStream] = {}
    last_use: dict[tuple[int, FakeStream], tuple[int, str]] = {}  # (storage, user) -> user's clock, what
    found: list[str] = []

    def clock_of(stream: FakeStream) -> dict:
        return clocks.setdefault(stream, {})

    def check_waited(key: int, when: str) -> None:
        """The storage's own stream must have waited for every foreign use of it by now."""
        owner = allocated_on.get(key, compute)
        for (used, user), (tick, what) in list(last_use.items()):
            if used == key:
                if clock_of(owner).get(user, 0) < tick:
                    found.append(f"storage {key} (allocated on {owner.name}) used by {what} and {when} before "
                                 f"{owner.name} waited for that use")
                del last_use[(used, user)]

    for index, entry in enumerate(log):
        kind = entry[0]
        if kind == "record":
            _, event, stream = entry
            event_clock[event] = dict(clock_of(stream))
        elif kind == "wait":
            _, stream, event = entry
            clock = clock_of(stream)
            for other, tick in event_clock.get(event, {}).items():
                clock[other] = max(clock.get(other, 0), tick)
        elif kind == "free":
            check_waited(entry[1], f"freed (log entry {index})")
        elif kind == "op":
            _, stream, reads, writes, allocs, name = entry
            clock = clock_of(stream)
            clock[stream] = clock.get(stream, 0) + 1
            for key in allocs:  # the block may have served work queued earlier on this stream: a write for the oracle
                allocated_on[key] = stream
                accesses.setdefault(key, []).append(_Access(stream, dict(clock), True,
                                                            f"op {index} {name} allocating on {stream.name}"))
            for key, write in [(k, False) for k in reads] + [(k, True) for k in writes]:
                now = _Access(stream, dict(clock), write, f"op {index} {name} on {stream.name}")
                for before in accesses.get(key, []):
                    ordered = before.clock.get(before.stream, 0) <= now.clock.get(before.stream, 0)
                    if (before.write or write) and not ordered:
                        found.append(f"race on storage {key}: {before.what} and {now.what}")
                accesses.setdefault(key, []).append(now)
                if stream is not allocated_on.get(key, compute):
                    last_use[(key, stream)] = (clock[stream], now.what)
    for key in {used for used, _ in last_use}:  # alive at the end: the caller's next work runs on its stream
        check_waited(key, "still held at the end of the step")
    return found


# ---------------------------------------------------------------- running a schedule under the fake


@pytest.fixture(scope="module", params=["mlp", "transformer"])
def captured_model(request: pytest.FixtureRequest):
    model, batch, loss_fn = build(request.param, layers=1) if request.param == "transformer" else build("mlp")
    return model, batch, capture(model, batch, loss_fn)


def run_recorded(captured_model, schedule: Schedule, streams: RecordingStreams) -> list[torch.Tensor]:
    model, batch, captured = captured_model
    executor = Executor(captured, schedule, copy_stream=streams)
    flat = captured.flat_inputs(model, batch)
    torch.manual_seed(3)
    with AccessLog(streams) as access:
        outputs = executor.run_flat(flat)
    del access
    return outputs


_EAGER: dict[int, list[torch.Tensor]] = {}


def eager(captured_model) -> list[torch.Tensor]:
    """Loss, gradients and buffers of the captured step run by PyTorch (the seed of run_recorded), once per model."""
    model, batch, captured = captured_model
    if id(captured) not in _EAGER:
        torch.manual_seed(3)
        _EAGER[id(captured)] = captured.run(model, *batch)
    return _EAGER[id(captured)]


def _readers(graph, node_id: int) -> list[int]:
    return [i for i in graph.order if node_id in graph.node(i).inputs]


def pageable(graph) -> list[int]:
    """Computed values the executor can page: not caller-owned, with at least one reader."""
    return [v for v in graph.order if not graph.node(v).caller_owned and graph.node(v).mem > 0 and _readers(graph, v)]


def hand_schedule(graph, victims: int) -> Schedule:
    """Baseline order; ``victims`` values with distinct first readers paged out right after their compute and
    paged in one compute before their first reader (that compute runs while the copy may still be writing), so
    every wait of the protocol is the only one ordering its copy."""
    chosen: list[int] = []
    first_readers: set[int] = set()
    for value in sorted(pageable(graph), key=lambda v: -graph.node(v).mem):
        first = _readers(graph, value)[0]
        position = graph.order.index
        if first in first_readers or position(first) == position(value) + 1:
            continue
        chosen.append(value)
        first_readers.add(first)
        if len(chosen) == victims:
            break
    assert len(chosen) == victims
    steps: list[Step] = []
    before_reader = {v: graph.order[graph.order.index(_readers(graph, v)[0]) - 1] for v in chosen}
    for node_id in graph.order:
        steps += [Step(op="page_in", node=v) for v in chosen if before_reader[v] == node_id]
        steps.append(Step(op="compute", node=node_id))
        steps += [Step(op="page_out", node=node_id)] if node_id in chosen else []
    return Schedule(steps=tuple(steps))


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("victims", [1, 3])
def test_hand_schedules_keep_the_protocol_and_every_wait_is_needed(captured_model, victims: int) -> None:
    _, _, captured = captured_model
    schedule = hand_schedule(captured.graph, victims)
    streams = RecordingStreams()
    outputs = run_recorded(captured_model, schedule, streams)
    assert all(torch.equal(a, b) for a, b in zip(outputs, eager(captured_model), strict=True))
    assert violations(streams.log, streams.compute) == []
    # two waits per page-out (side after the producer, compute after the copy, before the block is freed) and two
    # per page-in (side after the compute stream allocated its storage, compute before the first reader), no
    # record_stream (the fake has none): hand-counted from the schedule
    assert streams.waits == 4 * victims
    for dropped in range(streams.waits):
        mutant = RecordingStreams(drop_wait=dropped)
        run_recorded(captured_model, schedule, mutant)
        assert any("race" in v or "waited for that use" in v for v in violations(mutant.log, mutant.compute)), \
            f"wait {dropped} not needed?"


def unread_schedule(graph, freed: bool) -> tuple[Schedule, int]:
    """Baseline order; one deterministic value paged out after its compute, paged in right away and, unread,
    freed (``freed``) or not, then recomputed before its first reader (over the paged-in instance when not freed):
    the page-in's copy is never read, so only the wait the replay emits for it orders it before its block returns
    to the compute stream's pool. Returns it and the page-in's step."""
    value = next(v for v in pageable(graph) if graph.node(v).recomputable and not graph.node(v).random
                 and graph.order.index(_readers(graph, v)[0]) - graph.order.index(v) > 1)
    steps: list[Step] = []
    for node_id in graph.order:
        if node_id == _readers(graph, value)[0]:
            steps.append(Step(op="compute", node=value))  # recomputed (its inputs live on until then)
        steps.append(Step(op="compute", node=node_id))
        if node_id == value:
            steps += [Step(op="page_out", node=value), Step(op="page_in", node=value)]
            steps += [Step(op="free", node=value)] if freed else []
    schedule = Schedule(steps=tuple(steps))
    return schedule, next(i for i, step in enumerate(schedule.steps) if step.op == "page_in")


@pytest.mark.parametrize("freed", [True, False], ids=["freed", "recomputed-over"])
def test_a_page_in_dropped_unread_is_waited_for_before_its_block_returns(captured_model, freed: bool) -> None:
    _, _, captured = captured_model
    schedule, page_in_step = unread_schedule(captured.graph, freed)
    simulate(captured.graph, schedule)  # legal
    assert unread_page_ins(captured.graph, schedule) == {page_in_step}
    streams = RecordingStreams()
    outputs = run_recorded(captured_model, schedule, streams)
    assert all(torch.equal(a, b) for a, b in zip(outputs, eager(captured_model), strict=True))
    assert violations(streams.log, streams.compute) == []
    assert streams.waits == 4  # page-out: side and compute; page-in: side, and compute at once (nothing reads it)
    mutant = RecordingStreams(drop_wait=3)  # the compute stream's wait for the unread copy
    run_recorded(captured_model, schedule, mutant)
    assert any("freed" in v and "waited for that use" in v for v in violations(mutant.log, mutant.compute))


def test_unread_page_ins_by_hand() -> None:
    """a -> b -> c (the output), a paged out and in five times: read by b (step 2), freed unread (5), paged out
    again (a page-out reads it: 9), recomputed over (11), left unread at the end (14); c's page-in (17) is read
    as the step's output."""
    graph = coop.Graph.model_validate({"nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 4, "cost": 0.0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 4, "cost": 1.0},
        {"id": 2, "name": "b", "inputs": [1], "mem": 4, "cost": 1.0},
        {"id": 3, "name": "c", "inputs": [2], "mem": 4, "cost": 1.0},
    ], "outputs": [3]})
    ops = [("compute", 1), ("page_out", 1), ("page_in", 1), ("compute", 2), ("page_out", 1), ("page_in", 1),
           ("free", 1), ("compute", 1), ("page_out", 1), ("page_in", 1), ("page_out", 1), ("page_in", 1),
           ("compute", 1), ("page_out", 1), ("page_in", 1), ("compute", 3), ("page_out", 3), ("page_in", 3)]
    schedule = Schedule(steps=tuple(Step(op=op, node=node) for op, node in ops))
    simulate(graph, schedule)  # legal
    assert unread_page_ins(graph, schedule) == {5, 11, 14}


def test_the_compute_stream_waits_at_the_first_reader_not_at_the_page_in(captured_model) -> None:
    """Overlap: a page-in placed early in the schedule queues its copy there, and the compute stream's wait
    comes only right before the value's first reader (compute ops run on the compute stream in between)."""
    _, _, captured = captured_model
    graph = captured.graph
    value = next(v for v in pageable(graph) if graph.order.index(_readers(graph, v)[0]) - graph.order.index(v) > 2)
    steps: list[Step] = []
    for node_id in graph.order:  # paged out and in right after its compute; its first reader comes 2+ steps later
        steps.append(Step(op="compute", node=node_id))
        if node_id == value:
            steps += [Step(op="page_out", node=value), Step(op="page_in", node=value)]
    schedule = Schedule(steps=tuple(steps))
    streams = RecordingStreams()
    outputs = run_recorded(captured_model, schedule, streams)
    assert all(torch.equal(a, b) for a, b in zip(outputs, eager(captured_model), strict=True))
    assert violations(streams.log, streams.compute) == []
    log = streams.log
    h2d = max(i for i, e in enumerate(log) if e[0] == "op" and e[1] is not streams.compute and "copy_" in e[5])
    # the compute stream's wait for the page-in (its wait for the page-out comes before the H2D copy)
    wait = next(i for i, e in enumerate(log) if i > h2d and e[0] == "wait" and e[1] is streams.compute)
    between = [e for e in log[h2d:wait] if e[0] == "op" and e[1] is streams.compute and e[3]]
    assert between, "the compute stream waited right at the page-in: no overlap"


def test_the_host_copy_is_ordered_by_the_side_stream(captured_model) -> None:
    """The page-in reads the host copy after the D2H copy wrote it only because both run on one side stream:
    a mutant that issues them on two streams is caught as a race on the host copy."""
    _, _, captured = captured_model
    mutant = _CopiesOnTwoStreams()
    run_recorded(captured_model, hand_schedule(captured.graph, 1), mutant)
    found = violations(mutant.log, mutant.compute)
    assert any("copy_.default on sideA" in v and "copy_.default on sideB" in v for v in found), found


class _CopiesOnTwoStreams(RecordingStreams):
    """A mutant whose copies alternate between two side streams, neither waiting on the other."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sides = itertools.cycle([FakeStream("sideA"), FakeStream("sideB")])

    def stream(self, stream: FakeStream):
        return super().stream(next(self.sides))


@st.composite
def paging_schedules(draw: st.DrawFn, graph) -> Schedule:
    """Random legal paging: baseline order, random values paged out and in again within random gaps between
    their uses (several round trips per value allowed), each page-out and page-in at a random step in its gap."""
    order = graph.order
    position = {v: i for i, v in enumerate(order)}
    candidates = pageable(graph)
    victims = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4, unique=True))
    inserts: list[tuple[int, int, Step]] = []  # (before baseline step i, sequence, step)
    sequence = itertools.count()
    for value in victims:
        uses = [position[value]] + [position[r] for r in _readers(graph, value)]
        gaps = [(a, b) for a, b in itertools.pairwise(uses) if b > a]
        for a, b in draw(st.lists(st.sampled_from(gaps), min_size=1, max_size=len(gaps), unique=True)):
            out_slot = draw(st.integers(a + 1, b))
            in_slot = draw(st.integers(out_slot, b))
            inserts.append((out_slot, next(sequence), Step(op="page_out", node=value)))
            inserts.append((in_slot, next(sequence), Step(op="page_in", node=value)))
    inserts.sort(key=lambda item: item[:2])
    steps: list[Step] = []
    pending = iter(inserts)
    item = next(pending, None)
    for index, node_id in enumerate(order):
        while item is not None and item[0] == index:
            steps.append(item[2])
            item = next(pending, None)
        steps.append(Step(op="compute", node=node_id))
    return Schedule(steps=tuple(steps))


@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no slow shrinking
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_paging_schedules_keep_the_protocol(captured_model, data: st.DataObject) -> None:
    _, _, captured = captured_model
    schedule = data.draw(paging_schedules(captured.graph))
    simulate(captured.graph, schedule)  # legal (the generator's own check)
    streams = RecordingStreams()
    outputs = run_recorded(captured_model, schedule, streams)
    assert all(torch.equal(a, b) for a, b in zip(outputs, eager(captured_model), strict=True))
    assert violations(streams.log, streams.compute) == []
    # mutant: the side stream never waits on the compute stream -> the first page-out's D2H copy races its producer
    never_waits = _NoSideWaits()
    run_recorded(captured_model, schedule, never_waits)
    assert any("race" in v for v in violations(never_waits.log, never_waits.compute))
    # mutant: the compute stream never waits on a page-in -> each paged-in value's next reader races its H2D copy
    never_waits = _NoComputeWaits()
    run_recorded(captured_model, schedule, never_waits)
    raced = {int(v.split(":")[0].split()[-1]) for v in violations(never_waits.log, never_waits.compute) if "race" in v}
    assert raced == _copied_in_and_read_on_compute(never_waits), "a paged-in value read without a wait went unreported"


def _copied_in_and_read_on_compute(streams: RecordingStreams) -> set[int]:
    """Storages written on a side stream (H2D copies; the host copies are read by side copies only) that an op on
    the compute stream reads: exactly those a replay without compute-stream waits reads too early."""
    ops = [entry for entry in streams.log if entry[0] == "op"]
    written_on_side = {key for entry in ops if entry[1] is not streams.compute for key in entry[3]}
    return {key for entry in ops if entry[1] is streams.compute for key in entry[2]} & written_on_side


class _NoComputeWaits(RecordingStreams):
    """A mutant protocol whose compute stream never waits for a page-in's copy."""

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        if stream is not self.compute:
            super().wait_event(stream, event)


class _NoSideWaits(RecordingStreams):
    """A mutant protocol whose side stream never waits for the compute stream."""

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        if stream is self.compute:
            super().wait_event(stream, event)


def test_copy_stream_is_refused_on_cpu_torch(captured_model) -> None:
    _, _, captured = captured_model
    schedule = hand_schedule(captured.graph, 1)
    with pytest.raises(coop.NeedsCudaError, match="copy_stream=True needs CUDA") as refused:
        Executor(captured, schedule, copy_stream=True)
    assert "\n" not in str(refused.value)


def test_copy_stream_is_refused_for_a_schedule_without_paging(captured_model) -> None:
    _, _, captured = captured_model
    with pytest.raises(CoopError, match="needs a schedule that pages") as refused:
        Executor(captured, Schedule.from_order(captured.graph.order), copy_stream=RecordingStreams())
    assert "\n" not in str(refused.value)


def test_without_the_option_the_program_is_unchanged(captured_model) -> None:
    """copy_stream=False (the default) generates the same code as before the option existed."""
    _, _, captured = captured_model
    schedule = hand_schedule(captured.graph, 1)
    default, explicit = Executor(captured, schedule), Executor(captured, schedule, copy_stream=False)
    assert default.code == explicit.code
    assert "coop_runtime_paging_page_out" in default.code and "copy_stream" not in default.code


def test_plan_refuses_copy_stream_on_cpu_before_solving() -> None:
    model, batch, _ = build("mlp")
    with pytest.raises(coop.NeedsCudaError, match="copy_stream=True needs CUDA") as refused:
        coop.plan(model, 0.9, batch, copy_stream=True)
    assert "\n" not in str(refused.value)


# ---------------------------------------------------------------- the fake refuses what torch.cuda refuses


def test_the_fake_refuses_a_cpu_device_as_torch_cuda_does() -> None:
    """torch.cuda.current_stream(cpu) and torch.cuda.Stream(cpu) raise this ValueError on a CUDA build (measured on
    an H100, issue 22; both go through torch.cuda._utils._get_device_index, which the fake calls)."""
    strict = RecordingStreams(stand_in=None)
    cpu = torch.device("cpu")
    for call in (strict.current_stream, strict.new_stream):
        with pytest.raises(ValueError, match="^Expected a cuda device, but got: cpu$"):
            call(cpu)
    assert strict.current_stream(torch.device("cuda", 0)) is strict.compute  # a CUDA device is accepted
    with pytest.raises(ValueError, match="Expected a cuda device, but got: meta"):
        RecordingStreams().new_stream(torch.device("meta"))  # only the stand-in plays cuda:0


def test_pinning_is_what_this_torch_does() -> None:
    """The paging copies allocate pinned host memory through torch itself (no fake in between): on this CPU-only
    build torch refuses pin_memory=True, so a copy that asked for it here would fail as it would in a user's run (a
    CUDA build without a driver, as `make test-oldest` installs, refuses it too, with its own message)."""
    from coop.runtime.paging import page_out, pin_host_copy

    assert not pin_host_copy(torch.device("cpu")) and pin_host_copy(torch.device("cuda", 1))
    if torch.cuda.is_available() or torch.accelerator.is_available():
        pytest.skip("an accelerator backend can pin memory here")
    with pytest.raises(RuntimeError, match="pin_memory=True requires|no NVIDIA driver"):
        torch.empty(1, pin_memory=True)
    with pytest.raises(RuntimeError, match="pin_memory=True requires|no NVIDIA driver"):
        page_out(torch.zeros(3), pin=True, non_blocking=True)


def test_paging_a_cpu_value_on_the_copy_stream_fails_as_it_did_on_the_h100() -> None:
    """Issue 22: a schedule paged a 0-d CPU scalar of a CUDA step and torch.cuda.current_stream(cpu) raised in
    CopyStream.page_out. The earlier fake accepted it; this one raises the same error. (Such a schedule no longer
    gets there: the validator refuses it, tests/test_paging.py.)"""
    from coop.runtime.copy_stream import CopyStream

    copies = CopyStream(RecordingStreams(stand_in=None))
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        copies.page_out(torch.zeros((), dtype=torch.int64), pin=False)


def test_a_page_out_copies_the_value_on_the_nodes_device_not_a_host_scalar_folded_in_first() -> None:
    """A Graph node of a CUDA step can hold a host tensor ahead of its device value (DELTA's first GPT-2 step on an
    H200 paged a CPU value: torch's 'Expected a cuda device, but got: cpu'); the value paged is the device one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from coop.runtime.program_builder import paged_value_name

    with FakeTensorMode():
        on_cuda = torch.empty(4, device="cuda")
    host_scalar = torch.zeros(())
    values = {"tuple": (on_cuda,), "seed": host_scalar, "out": on_cuda}
    names = ["tuple", "seed", "out"]
    assert paged_value_name(names, values, "cuda:0") == "out"
    assert paged_value_name(names, values, "cuda") == "out"
    assert paged_value_name(names, values, "cpu") == "seed"
    assert paged_value_name(["tuple"], values, "cuda:0") is None
    # a graph captured on meta for CUDA holds CPU fakes: the first tensor stands in
    assert paged_value_name(["tuple", "seed"], values, "cuda:0") == "seed"
