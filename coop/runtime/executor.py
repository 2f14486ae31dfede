"""The static executor: replay any legal Schedule of a captured step (DESIGN.md, runtime).

From a :class:`~coop.graph_capture.Captured` step and a Schedule, :func:`build_program`
generates once a new fx program in schedule order: each ``compute v`` copies the fx nodes that
Graph node ``v`` owns (a recomputation copies them again, reading the most recent instances of
its inputs), ``page_out``/``page_in`` become copies to and from a host tier, and fx's code
generator releases every value right after its last use, so an instance lives exactly as long
as the simulator says (or less, when an explicit free comes later than its last read).

Paging copies are :func:`coop.runtime.paging.page_out` / :func:`~coop.runtime.paging.page_in`, the same
in the ordinary replay, on a copy stream and in the arena replay: a value's whole storage goes to the
host and comes back on the exact device it left (``cuda:1`` stays ``cuda:1``) with its dtype, shape,
strides and storage offset, so the views the captured program takes of it hold (issue 22). The host
buffer is pinned where the value's traced device is CUDA, decided here once per page-out
(:func:`~coop.runtime.paging.pin_host_copy`). Only values on an accelerator are paged: the executor
validates every schedule first (:func:`coop.schedule.simulate`), which refuses a page step of a host
value of an accelerator step (:meth:`coop.graph.Graph.pageable`) in one line. A page step of a
caller-owned value (an input, a parameter) is legal but replays as nothing: the caller holds it.

Random ops make their first draws in the captured program's relative order, so the replay draws
the same numbers as eager PyTorch. With ``replay_random`` (the default) a schedule may also
recompute them: the program saves the generator state right before the first draw of each random
op that the schedule recomputes, and a recomputation sets that state, reruns the op and restores
the generator (:mod:`coop.runtime.rng`), so it yields the same bits and later draws are
unaffected. Such a schedule is legal on :meth:`Graph.with_random_replay`, the graph the executor
validates against; the saved states are host memory and never count against the device budget.

Extra outputs of a multi-output op (``convolution_backward``'s weight gradient, batch norm's saved
statistics) are Graph nodes of their own (``Node.output_of``), which contract 2 counts from the
op's first compute whatever step the schedule takes them at. The executor replays
:func:`coop.schedule.take_extras_promptly` of the schedule (each extra output taken right after
its op's first compute: the same memory and cost), so the op's output tuple dies at the op's step
instead of living until a far-away ``getitem``.

A compute that names an implementation (MONeT, ``Step.impl``) copies that implementation's fx
program from the capture (``Captured.impl_fx``, :mod:`coop.graph_capture.alternatives`) in place of
the node's storage-owning fx node, and an optional value (a compact mask) runs its own program
(``Captured.optional_fx``) only where the schedule computes it. An in-place implementation emits
the in-place aten op (``relu_``, ``masked_fill_``) on the overwritten value, which the replay then
treats as gone, as the simulator does.

The context a replay runs in lives here too, shared by the static and the dynamic replay:
:func:`recorded_program` (autocast off: the capture holds its own casts), :func:`unwrap_model`
(DistributedDataParallel unwrapped, wrappers coop cannot honour refused) and
:class:`GradientSync` (a DDP wrapper's own reducer all-reducing the replayed gradients). What a
replay hands back to the model is written by :meth:`Captured.write_back`.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn

from coop.errors import CaptureError, ScheduleError
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.trace import is_random
from coop.runtime.copy_stream import CopyStream, StreamAPI, copy_stream_for
from coop.runtime.paging import page_in, page_out, pin_host_copy
from coop.runtime.rng import output_device, restore_generator_state, save_generator_state, swap_generator_state
from coop.schedule import Schedule, Simulation, simulate, take_extras_promptly


class _Unavailable:
    """Marks an fx value that was freed or paged out; reading it is a bug in the schedule."""

    def __init__(self, why: str) -> None:
        self.why = why


class _Deferred:
    """A paged-in value (or a view of one) whose program nodes are emitted at its first read (``emit_now``):
    with a copy stream, the compute stream waits for the page-in's copy as late as the schedule allows."""

    def __init__(self, emit_now: Any) -> None:
        self.emit_now = emit_now


class _ProgramBuilder:
    """Writes the replay fx program of one schedule: copies nodes of the captured fx graph (``source``) into
    ``program`` in schedule order, by the coop Graph (``schedule_graph``) the schedule is legal on. With
    ``copy_stream`` page-outs and page-ins go through it (:mod:`coop.runtime.copy_stream`)."""

    #: Page a value's whole storage (its own: storage offset kept); False where values share one buffer (arena).
    page_whole_storage = True

    def __init__(self, captured: Captured, graph: Graph, replayed: set[int],
                 copy_stream: CopyStream | None = None) -> None:
        self.copy_stream = copy_stream
        self.captured = captured
        self.schedule_graph = graph  # the coop Graph the schedule is legal on (random draws recomputable or not)
        self.replayed = replayed  # random nodes the schedule recomputes: their generator state is saved
        self.saved_states: dict[fx.Node, fx.Node] = {}  # random fx node -> program value of its saved state
        self.source = captured.module.graph  # the captured fx graph, read
        self.position = {n: i for i, n in enumerate(self.source.nodes)}
        self.by_name = {n.name: n for n in self.source.nodes}
        self.program = fx.Graph()  # the replay fx graph, written in schedule order
        self.env: dict[fx.Node, Any] = {}
        self.hosts: dict[int, fx.Node] = {}  # paged-out value id -> the program value of its HostCopy
        self.computed: set[int] = set()
        self.last_random = -1
        self.optional_values: dict[int, Any] = {}  # optional value id -> its program value (or _Unavailable)

    def group(self, node_id: int) -> list[fx.Node]:
        return sorted((self.by_name[n] for n in self.captured.fx_names[node_id]), key=self.position.__getitem__)

    def lookup(self, node: fx.Node) -> fx.Node:
        value = self.env.get(node)
        if isinstance(value, _Deferred):  # the first read of a paged-in value: wait for its copy here
            value.emit_now()
            value = self.env.get(node)
        if value is None or isinstance(value, _Unavailable):
            why = value.why if isinstance(value, _Unavailable) else "never computed"
            raise ScheduleError(f"the executor needs {node.name} (Graph node {self.captured.owner_of[node.name]}), which is {why}")
        return value

    def emit(self, node: fx.Node) -> None:
        new = self.program.node_copy(node, self.lookup)
        new.meta = dict(node.meta) | {SOURCE_NODE: node.name}
        self.env[node] = new

    def start(self) -> None:
        for node in self.source.nodes:
            if node.op == "placeholder":
                self.emit(node)
        for node in self.source.nodes:
            if node.op == "get_attr":
                self.emit(node)
        # views of caller-owned values (e.g. a transposed weight) cost nothing: make them up front
        for node_id in self.captured.graph.caller_owned_ids:
            for node in self.group(node_id)[1:]:
                self.emit(node)

    def compute(self, index: int, node_id: int, impl: str | None = None) -> None:
        graph_node = self.schedule_graph.node(node_id)
        first = node_id not in self.computed
        if not first and not graph_node.recomputable:
            raise ScheduleError(f"step {index} (compute %{node_id}): node {node_id} ({graph_node.name}) is not "
                                "recomputable (a random op or an extracted output); keep it instead")
        self.computed.add(node_id)
        if graph_node.optional or impl is not None:
            self.compute_alternative(index, node_id, impl)
            return
        for node in self.group(node_id):
            if not is_random(node):
                self.emit(node)
            elif first:
                if self.position[node] < self.last_random:
                    raise ScheduleError(f"step {index} (compute %{node_id}): random op {node.name} runs out of the "
                                        "captured order, so it would draw different numbers than eager PyTorch")
                self.last_random = self.position[node]
                if node_id in self.replayed:
                    device = str(output_device(node))
                    self.saved_states[node] = self.program.call_function(save_generator_state, (device,))
                self.emit(node)
            else:
                self.replay(node)

    def compute_alternative(self, index: int, node_id: int, impl: str | None) -> None:
        """An optional value, or node ``node_id`` under implementation ``impl``: the captured program of it
        (:mod:`coop.graph_capture.alternatives`); an in-place one consumes the value it overwrites."""
        graph_node = self.schedule_graph.node(node_id)
        where = f"step {index} (compute %{node_id}" + (f" [{impl}])" if impl else ")")
        if graph_node.optional:
            program = self.captured.optional_fx.get(node_id)
        else:
            program = self.captured.impl_fx.get(node_id, {}).get(impl or "")
        if program is None:
            raise ScheduleError(f"{where}: the capture has no fx program for it; capture with alternatives=True")
        value = self.run_program(program)
        if graph_node.optional:
            self.optional_values[node_id] = value
            return
        group = self.group(node_id)
        value.meta = {**value.meta, **group[0].meta}
        self.env[group[0]] = value
        for node in group[1:]:  # the folded views of the value
            self.emit(node)
        consumed = graph_node.implementation(impl).inplace_of
        if consumed is not None:
            self.drop(consumed, f"overwritten in place at step {index}")

    def run_program(self, program: Any) -> fx.Node:
        """Copy an implementation's fx program into the replay, its placeholders bound to the values it reads."""
        local: dict[fx.Node, fx.Node] = {}
        placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
        for placeholder, read in zip(placeholders, program.reads, strict=True):
            local[placeholder] = self.lookup(self.by_name[read]) if isinstance(read, str) else self.optional_value(read)
        for node in program.calls:
            new = self.program.node_copy(node, local.__getitem__)
            new.meta = dict(node.meta)
            local[node] = new
        return local[program.output]

    def optional_value(self, node_id: int) -> fx.Node:
        value = self.optional_values.get(node_id)
        if isinstance(value, _Deferred):
            value.emit_now()
            value = self.optional_values.get(node_id)
        if value is None or isinstance(value, _Unavailable):
            why = value.why if isinstance(value, _Unavailable) else "never computed"
            raise ScheduleError(f"the executor needs optional value {node_id}, which is {why}")
        return value

    def replay(self, node: fx.Node) -> None:
        """Recompute a random op from the generator state saved before its first draw."""
        saved = self.saved_states[node]
        previous = self.program.call_function(swap_generator_state, (saved,))
        self.emit(node)
        self.env[node] = self.program.call_function(restore_generator_state, (previous, saved, self.env[node]))

    def drop(self, node_id: int, why: str) -> None:
        if node_id in self.optional_values:
            self.optional_values[node_id] = _Unavailable(why)
            return
        for node in self.group(node_id):
            self.env[node] = _Unavailable(why)

    def page_out(self, node_id: int) -> None:
        """Copy the value to the host tier (:func:`coop.runtime.paging.page_out`: its whole storage, layout and
        device kept), pinned where its device is CUDA; with a copy stream, on the side stream."""
        if self.captured.graph.node(node_id).caller_owned:
            return  # the caller holds its own reference; there is nothing the replay can free
        optional = node_id in self.optional_values
        value = self.optional_value(node_id) if optional else self.lookup(self._base(node_id))
        pin = pin_host_copy(self._device(node_id, value))
        if self.copy_stream is None:
            options = {"pin": pin, "non_blocking": pin} | ({} if self.page_whole_storage else {"whole_storage": False})
            self.hosts[node_id] = self.program.call_function(page_out, (value,), options)
        else:
            self.hosts[node_id] = self.program.call_function(self.copy_stream.page_out, (value,), {"pin": pin})
        if optional:
            self.optional_values[node_id] = _Unavailable("paged out")
        else:
            self.drop(node_id, "paged out")

    def _device(self, node_id: int, value: fx.Node) -> torch.device:
        """The device a value lives on: its traced value's, else the Graph's record of it."""
        fake = value.meta.get("val")
        if isinstance(fake, torch.Tensor):
            return fake.device
        return torch.device(self.schedule_graph.node(node_id).device or "cpu")

    def paged_in(self, node_id: int) -> fx.Node:
        """The program value of a page-in on the compute stream (:func:`coop.runtime.paging.page_in`)."""
        return self.program.call_function(page_in, (self.hosts.pop(node_id),))  # non_blocking where pinned

    def page_in(self, node_id: int) -> None:
        if self.captured.graph.node(node_id).caller_owned:
            return
        if self.copy_stream is not None:
            self.page_in_on_copy_stream(node_id)
            return
        if node_id in self.optional_values:
            self.optional_values[node_id] = self.paged_in(node_id)
            return
        base = self._base(node_id)
        self.env[base] = self.paged_in(node_id)
        for node in self.group(node_id):
            # re-derive the views of the value; outputs taken from a tuple stay unavailable
            if self.position[node] > self.position[base] and all(
                not isinstance(self.env.get(a), _Unavailable) and a in self.env for a in node.all_input_nodes
            ):
                self.emit(node)

    def page_in_on_copy_stream(self, node_id: int) -> None:
        """Queue the page-in's copy now; the compute stream's wait (and the value's views) come at its first read."""
        pending = self.program.call_function(self.copy_stream.page_in, (self.hosts.pop(node_id),))

        def wait_for(store: dict, key: Any) -> _Deferred:
            def emit_now() -> None:
                store[key] = self.program.call_function(self.copy_stream.wait, (pending,))
            return _Deferred(emit_now)

        if node_id in self.optional_values:
            self.optional_values[node_id] = wait_for(self.optional_values, node_id)
            return
        base = self._base(node_id)
        self.env[base] = wait_for(self.env, base)
        group = set(self.group(node_id))
        for node in self.group(node_id):
            if self.position[node] > self.position[base] and all(
                not isinstance(self.env.get(a), _Unavailable) and a in self.env for a in node.all_input_nodes
            ):  # a view of the value is emitted at its first read too, unless it reads other values
                if all(a in group for a in node.all_input_nodes):
                    self.env[node] = _Deferred(lambda node=node: self.emit(node))
                else:
                    self.emit(node)

    def _base(self, node_id: int) -> fx.Node:
        for node in self.group(node_id):
            if isinstance(node.meta.get("val"), torch.Tensor):
                return node
        raise ScheduleError(f"node {node_id} has no tensor value to page")

    def finish(self) -> fx.GraphModule:
        outputs = [self.lookup(n) if n is not None else None for n in self.captured.output_nodes()]
        self.program.output(outputs)
        self.program.lint()
        return fx.GraphModule(self.captured.module, self.program)


def replay_graph(captured: Captured, replay_random: bool = True) -> Graph:
    """The Graph an executor's schedules are legal on: random draws recomputable when it replays them."""
    return captured.graph.with_random_replay() if replay_random else captured.graph


def build_program(captured: Captured, schedule: Schedule, replay_random: bool = True) -> fx.GraphModule:
    """Generate the replay program of a legal schedule (ScheduleError if it cannot be replayed)."""
    graph = replay_graph(captured, replay_random)
    simulate(graph, schedule)  # legality under contract 2, with the step and reason
    return _program(captured, graph, schedule)


def _replayed_draws(graph: Graph, schedule: Schedule) -> set[int]:
    """Random nodes the schedule recomputes: their generator state is saved before the first draw."""
    computes = Counter(step.node for step in schedule.steps if step.op == "compute")
    return {v for v in graph.random_draws if computes[v] > 1}


#: The key of a replay program node's ``meta`` that names the captured fx node it copies.
SOURCE_NODE = "coop_source_node"


def saved_generator_bytes(graph: Graph, schedule: Schedule) -> int:
    """The most bytes of saved generator states a replay of ``schedule`` holds at once, on a step whose values all
    live on the CPU (0 on a step with an accelerator: the states are host memory there, outside its budget).

    Each random op the schedule recomputes keeps the CPU generator's state from its first draw
    (:mod:`coop.runtime.rng`); a replay swaps in one more while it runs. The simulator does not count them (they
    are not values of the graph); the planner keeps the schedule's live peak this much below the budget.
    """
    replayed = _replayed_draws(graph, schedule)
    if graph.has_accelerator or not replayed:
        return 0
    state = torch.get_rng_state()
    return (len(replayed) + 1) * state.untyped_storage().nbytes()


def _program(captured: Captured, graph: Graph, schedule: Schedule,
             copy_stream: CopyStream | None = None) -> fx.GraphModule:
    """The replay program of a schedule already checked legal on ``graph`` (paging on ``copy_stream`` if given)."""
    builder = _ProgramBuilder(captured, graph, _replayed_draws(graph, schedule), copy_stream)
    builder.start()
    for index, step in enumerate(schedule.steps):
        if step.op == "compute":
            builder.compute(index, step.node, step.impl)
        elif step.op == "free":
            builder.drop(step.node, f"freed at step {index}")
        elif step.op == "page_out":
            builder.page_out(step.node)
        else:
            builder.page_in(step.node)
    return builder.finish()


class Executor:
    """A generated replay program for one Captured step and one Schedule.

    ``requested`` is the schedule as given; ``schedule`` the one replayed (extra outputs taken at
    their op's step, :func:`take_extras_promptly`: the same peak and cost) and ``simulation`` its
    prediction. With ``replay_random`` (the default) the schedule may recompute random ops; it is
    checked against ``graph`` = :func:`replay_graph`.

    With ``arena`` (a :class:`~coop.online.static_arena.Placement` of ``executor.schedule`` made by
    :func:`~coop.online.static_arena.execution_placement`; see :func:`arena_placement`) every
    planned value is written at its planned offset in one buffer per device
    (:mod:`coop.runtime.arena_replay`); ``arena_program`` then says what the step allocates.

    With ``copy_stream`` (opt-in, not yet measured on a GPU) page-outs and page-ins run on a side CUDA
    stream, the compute stream waiting for a page-in only at the value's first read
    (:mod:`coop.runtime.copy_stream`); ``True`` uses torch.cuda's streams, a :class:`StreamAPI` object
    replaces them (tests record the protocol with a fake). It is refused with a one-line error without
    CUDA, for a schedule that pages nothing, and with ``arena``. The default (False) keeps the copies
    on the compute stream.

    The program runs as fx's generated Python code with every aten op bound once as a global
    (:func:`bind_ops`): the code fx prints (``module.code``), minus the attribute look-ups and
    the ``OpOverload.__call__`` frame per node. ``code`` is the source that runs.
    """

    def __init__(self, captured: Captured, schedule: Schedule, replay_random: bool = True,
                 arena: Any = None, copy_stream: bool | StreamAPI = False) -> None:
        self.captured = captured
        self.graph = replay_graph(captured, replay_random)
        self.requested = schedule
        simulate(self.graph, schedule)  # refuse an illegal schedule with its own step numbers
        self.schedule = take_extras_promptly(self.graph, schedule)
        self.simulation: Simulation = simulate(self.graph, self.schedule)
        self.placement = arena
        self.arena_program = None
        self.copy_stream = copy_stream_for(captured, self.schedule, copy_stream, arena)
        if arena is None:
            self.module = _program(captured, self.graph, self.schedule, self.copy_stream)  # just simulated
        else:
            from coop.runtime.arena_replay import build_arena_program

            self.module, self.arena_program = build_arena_program(
                captured, self.graph, self.schedule, self.simulation, _replayed_draws(self.graph, self.schedule), arena)
        self._forward, self._source = bind_ops(self.module)

    @property
    def predicted_peak(self) -> int:
        """Predicted peak bytes of the replay: the simulator's, or with an arena the caller-owned
        bytes + the arena buffers (arena, scratch, output slots) + the largest workspace the arena replay reports."""
        if self.arena_program is None:
            return self.simulation.peak
        owned = sum(self.graph.node(v).mem for v in self.graph.caller_owned_ids)
        buffers = sum(self.arena_program.buffer_bytes(d) for d in self.arena_program.devices)
        return owned + buffers + self.arena_program.max_transient

    def run_flat(self, flat_inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run on flat inputs: [loss, *gradients, *new buffer values]."""
        with torch.no_grad(), recorded_program():
            if self.arena_program is not None:  # its persistent buffers, and the loss and new .grads into slots
                return self.arena_program.run(self._forward, self.module, flat_inputs)
            return self._forward(self.module, *flat_inputs)

    @property
    def code(self) -> str:
        """The Python source of the replay that runs (fx's code with the aten ops bound as globals)."""
        return self._source


def arena_placement(executor: Executor) -> Any:
    """The placement an arena replay of ``executor``'s schedule executes (aligned, packed)."""
    from coop.online.static_arena import execution_placement

    return execution_placement(executor.graph, executor.schedule)


_OP_CALL = re.compile(r"\btorch\.ops\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\(")


def bind_ops(module: fx.GraphModule) -> tuple[Any, str]:
    """``module``'s generated forward with each ``torch.ops.NS.OP.OVERLOAD(`` bound once to the op's C++ callable.

    fx writes an aten call as ``torch.ops.aten.mm.default(...)``: four attribute look-ups and a
    Python ``OpOverload.__call__`` frame per node, every step. Bound as a global of the generated
    code to ``OpOverload._op`` (what ``__call__`` calls), each call is one global look-up into the
    dispatcher: the same kernels, the same dispatch (modes included), bit for bit. Measured on CPU
    (benchmarks/bench_replay_host.py, zoo models, one thread): a step takes 0.83-0.94x the time of
    fx's own code and 0.37-0.59x that of ``fx.Interpreter``.
    """
    python_code = module.graph.python_code(root_module="self")
    namespace = dict(python_code.globals)

    def bind(match: re.Match[str]) -> str:
        namespace_name, op_name, overload_name = match.groups()
        overload = getattr(getattr(getattr(torch.ops, namespace_name), op_name), overload_name)
        name = f"_op_{namespace_name}_{op_name}_{overload_name}"
        namespace[name] = overload._op if isinstance(overload, torch._ops.OpOverload) else overload
        return name + "("

    source = _OP_CALL.sub(bind, python_code.src)
    exec(compile(source, f"<coop replay {id(module):x}>", "exec"), namespace)  # noqa: S102 (fx's own generated code)
    return namespace["forward"], source


# ---------------------------------------------------------------- the training context of a replay
@contextlib.contextmanager
def recorded_program() -> Iterator[None]:
    """Run a captured program as recorded: autocast off, since the capture already holds its casts.

    An ambient ``torch.autocast`` would cast the recorded ops' inputs a second time (and crash on
    a program captured without it); the planner re-captures for another autocast setting instead.
    """
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            if device == "cpu" or torch.cuda.is_available():
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def unwrap_model(model: nn.Module) -> tuple[nn.Module, Any]:
    """The module to capture and the DistributedDataParallel wrapper around it (None without one).

    A DDP-wrapped model is captured without its wrapper; :class:`GradientSync` then hands the
    replayed gradients to the wrapper's own reducer. Wrappers whose semantics a replay of the
    plain module cannot reproduce are refused with a CaptureError naming the wrapper and the fix.
    """
    refusal = _refused_wrapper(model)
    if refusal:
        raise CaptureError(refusal)
    ddp_class = _ddp_class()
    if ddp_class is None or not isinstance(model, ddp_class):
        return model, None
    if getattr(model, "_use_python_reducer", False) or getattr(model, "_delay_all_reduce_all_params", False):
        raise CaptureError("coop cannot sync gradients of a DistributedDataParallel that uses the Python reducer or "
                           "delays every all-reduce (compiled DDP); wrap the model in plain DistributedDataParallel")
    if getattr(model, "mixed_precision", None) is not None:
        raise CaptureError("coop cannot honour DistributedDataParallel(mixed_precision=...), which casts parameters "
                           "inside forward; use torch.autocast around plan.step instead")
    return model.module, model


def _ddp_class() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def _refused_wrapper(model: nn.Module) -> str:
    """Why coop cannot plan for ``model`` as wrapped ('' when it can)."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(model, OptimizedModule):
        return ("coop cannot plan a torch.compile'd module (coop replays its own program of the eager step); pass the "
                "uncompiled module (model._orig_mod) to coop.plan")
    ddp_class = _ddp_class()
    for name, module in model.named_modules():
        where = f"submodule {name!r}" if name else "the model"
        if isinstance(module, nn.DataParallel):
            return (f"coop cannot plan through torch.nn.DataParallel ({where}), which splits every batch across GPUs "
                    "inside forward; pass its .module, or use DistributedDataParallel (one process per GPU)")
        if _is_fsdp(module):
            return (f"coop cannot plan a model sharded by FSDP ({where}: {type(module).__name__}), whose parameters are "
                    "gathered inside forward; plan the unsharded module, or use DistributedDataParallel")
        if name and ddp_class is not None and isinstance(module, ddp_class):
            return (f"coop cannot plan a DistributedDataParallel nested inside the model ({where}); wrap the whole "
                    "model in one DistributedDataParallel instead")
    for name, param in model.named_parameters():
        if type(param) is not nn.Parameter and type(param.data) is not torch.Tensor:
            return (f"coop cannot plan parameter {name!r}, a {type(param.data).__name__} (tensor parallel or another "
                    "tensor subclass); plan the model with plain tensors")
    return ""


def _is_fsdp(module: nn.Module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return isinstance(module, (FullyShardedDataParallel, FSDPModule))


class _ReleaseGradient(torch.autograd.Function):
    """One link of a chain that hands precomputed gradients to autograd, one parameter at a time.

    Its backward passes ``gradient`` to ``param`` (autograd's AccumulateGrad then adds it to
    ``param.grad`` exactly as in eager backward and fires the hooks registered on it: DDP's
    reducer) and the upstream gradient to the next link. AccumulateGrad runs before the next link
    (the engine runs the most recently created node last), so parameters become ready in chain order.
    """

    @staticmethod
    def forward(ctx: Any, link: torch.Tensor, param: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        ctx.gradient = gradient
        return link.detach().clone()

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        gradient, ctx.gradient = ctx.gradient, None
        return upstream, gradient, None


class GradientSync:
    """Gradients of a replayed step synchronized by a DistributedDataParallel wrapper's own reducer.

    The replay bypasses ``module.forward`` and autograd, so DDP's all-reduce hooks would never
    fire. Instead every step runs DDP's own machinery around the replay: ``_pre_forward`` (buffer
    broadcast from rank 0, bucket rebuild, ``prepare_for_forward``) before it, and after it
    ``_post_forward`` on a scalar whose backward releases each replayed gradient into autograd in
    eager's ready order (the order the captured backward produced them). The reducer therefore
    sees the hooks eager backward fires: the same buckets (``bucket_cap_mb``, the smaller first
    bucket, rebuilt from the ready order after the first step), the same division by the world size,
    the same collectives in the same order, comm hooks and ``no_sync()`` gradient accumulation
    included, so every rank ends bit-identical to DDP eager.
    """

    def __init__(self, ddp: nn.Module, captured: Captured) -> None:
        self.ddp = ddp
        self.ready_order = _gradient_ready_order(captured)

    def before_step(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """DDP's pre-forward: sync buffers, prepare the reducer; returns the batch DDP would forward."""
        inputs, _ = self.ddp._pre_forward(*batch)
        return tuple(inputs)

    def release(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Accumulate ``grads`` into ``params`` through autograd, so DDP's hooks reduce them."""
        link = torch.zeros((), dtype=torch.float32, device=params[0].device if params else "cpu")
        for index in reversed(self.ready_order):
            link = _ReleaseGradient.apply(link, params[index], grads[index])
        self.ddp._post_forward(link).backward()


def _gradient_ready_order(captured: Captured) -> list[int]:
    """Indices into ``captured.grad_names`` in the order the captured backward completes each gradient."""
    position = {node: index for index, node in enumerate(captured.module.graph.nodes)}
    outputs = captured.output_nodes()[captured.grad_slice]
    return sorted(range(len(outputs)), key=lambda i: (position.get(outputs[i], -1), i))

