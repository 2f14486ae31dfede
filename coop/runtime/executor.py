"""The static executor: replay any legal Schedule of a captured step.

From a :class:`~coop.graph_capture.Captured` step and a Schedule, :func:`build_program` (and
:class:`Executor`) generates once a new fx program in schedule order, with the builder every replay
shares (:class:`coop.runtime.program_builder.ProgramBuilder`; the arena replay subclasses it): each ``compute v`` copies the fx nodes that
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
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn

from coop.errors import CaptureError, ScheduleError
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.fsdp import fsdp_version
from coop.graph_capture.fsdp import refusal as fsdp_refusal
from coop.runtime.arena_replay import build_arena_program
from coop.runtime.copy_stream import StreamAPI, copy_stream_for
from coop.runtime.paging import HostPool
from coop.runtime.placement import execution_placement
from coop.runtime.program_builder import SOURCE_NODE, ProgramBuilder, replayed_draws
from coop.schedule import Schedule, Simulation, simulate, take_extras_promptly


def replay_graph(captured: Captured, replay_random: bool = True) -> Graph:
    """The Graph an executor's schedules are legal on: random draws recomputable when it replays them.

    Parameters
    ----------
    replay_random : bool
        Whether the executor replays random draws from saved generator states.

    Returns
    -------
    Graph
        ``captured.graph.with_random_replay()`` with ``replay_random``, else ``captured.graph``.
    """
    return captured.graph.with_random_replay() if replay_random else captured.graph


def build_program(captured: Captured, schedule: Schedule, replay_random: bool = True) -> fx.GraphModule:
    """Generate the replay program of a legal schedule (ScheduleError if it cannot be replayed).

    Parameters
    ----------
    schedule : Schedule
        The schedule to replay, as given (extra outputs are not moved: :class:`Executor` moves them).
    replay_random : bool
        Whether the schedule may recompute random ops (:func:`replay_graph`).

    Returns
    -------
    fx.GraphModule
        The replay program (:class:`~coop.runtime.program_builder.ProgramBuilder`).
    """
    graph = replay_graph(captured, replay_random)
    simulate(graph, schedule)  # legality under contract 2, with the step and reason
    return ProgramBuilder(captured, graph, replayed_draws(graph, schedule)).run(schedule)


def saved_generator_bytes(graph: Graph, schedule: Schedule) -> int:
    """The most bytes of saved generator states a replay of ``schedule`` holds at once, on a CPU-only step.

    Each random op the schedule recomputes keeps the CPU generator's state from its first draw
    (:mod:`coop.runtime.rng`); a replay swaps in one more while it runs. The simulator does not count them (they
    are not values of the graph); the planner keeps the schedule's live peak this much below the budget.

    Parameters
    ----------
    graph : Graph
        The step's graph.

    Returns
    -------
    int
        Bytes: (replayed random ops + 1) times the size of the CPU generator's state; 0 when the schedule replays no
        draw or the step has an accelerator (the states are host memory there, outside its budget).
    """
    replayed = replayed_draws(graph, schedule)
    if graph.has_accelerator or not replayed:
        return 0
    state = torch.get_rng_state()
    return (len(replayed) + 1) * state.untyped_storage().nbytes()


def replayed_schedule(graph: Graph, schedule: Schedule,
                      simulation: Simulation | None = None) -> tuple[Schedule, Simulation]:
    """The schedule a replay runs (:func:`take_extras_promptly` of ``schedule``) and its simulation, simulating
    at most once; ScheduleError, with ``schedule``'s own step numbers, where ``schedule`` is illegal.

    Where the moved schedule has the very steps of ``schedule``, one simulation (``simulation``, else a new
    one) checks it and predicts the replay. Where only extra outputs move (:func:`_only_extras_move`), the
    moved schedule is legal exactly when ``schedule`` is, so only it is simulated (``schedule`` again only
    to word the refusal). Otherwise ``schedule`` is checked first (unless ``simulation`` says it is legal).

    Parameters
    ----------
    graph : Graph
        The Graph the schedule must be legal on.
    simulation : Simulation or None
        ``simulate(graph, schedule)`` where the caller already holds it (it then counts as checked).

    Returns
    -------
    tuple[Schedule, Simulation]
        The replayed schedule and its simulation.
    """
    replayed = take_extras_promptly(graph, schedule)
    if replayed.steps == schedule.steps:
        return replayed, simulation if simulation is not None else simulate(graph, schedule)
    if simulation is None and not _only_extras_move(graph, schedule):
        simulation = simulate(graph, schedule)  # refuse an illegal schedule with its own step numbers
    try:
        return replayed, simulate(graph, replayed)
    except ScheduleError:
        if simulation is None:
            simulate(graph, schedule)  # word the refusal with the schedule's own step numbers
        raise


def _only_extras_move(graph: Graph, schedule: Schedule) -> bool:
    """Whether :func:`take_extras_promptly` changes ``schedule`` only by moving each extra output's one plain
    compute up to right after its op's first compute, with no step in between touching that extra output (naming
    it, reading it, overwriting it in place): then every other step sees the same resident values in both
    schedules, and the moved one is legal exactly when ``schedule`` is."""
    extras = graph.extra_outputs
    moved = {e for group in extras.values() for e in group}
    if moved & set(extras):
        return False  # an op that is itself an extra output moves too
    nodes = {node.id: node for node in graph.nodes}
    pending: set[int] = set()  # extra outputs whose op has run and which the schedule has not taken yet
    ops_run: set[int] = set()
    for step in schedule.steps:
        node = nodes.get(step.node)
        if node is None:
            return False
        touched = {step.node}
        if step.op == "compute":
            impl = None if step.impl is None else node.implementation(step.impl)
            if step.impl is not None and impl is None:
                return False
            if impl is not None and impl.inplace_of is not None:
                touched.add(impl.inplace_of)
            touched.update(node.reads(impl))
            if step.node in moved:
                if step.node not in pending or step.impl is not None:
                    return False  # taken before its op, twice, or under an implementation
                pending.discard(step.node)
                touched.discard(step.node)
        if touched & pending:
            return False
        if step.op == "compute" and step.node in extras and step.node not in ops_run:
            ops_run.add(step.node)
            pending.update(extras[step.node])
    return not pending


class Executor:
    """A generated replay program for one Captured step and one Schedule.

    ``requested`` is the schedule as given; ``schedule`` the one replayed (extra outputs taken at
    their op's step, :func:`take_extras_promptly`: the same peak and cost) and ``simulation`` its
    prediction. With ``replay_random`` (the default) the schedule may recompute random ops; it is
    checked against ``graph`` = :func:`replay_graph`. The schedule is simulated once
    (:func:`replayed_schedule`), and not at all where the caller hands on its own simulation of a
    schedule that already takes its extra outputs at their op's step (an executor's ``schedule`` and
    ``simulation``).

    With ``placement`` (a :class:`~coop.runtime.placement.Placement` of ``executor.schedule`` made by
    :func:`~coop.runtime.placement.execution_placement`; see :func:`arena_placement`) every
    planned value is written at its planned offset in one buffer per device
    (:mod:`coop.runtime.arena_replay`); ``arena_program`` then says what the step allocates.

    With ``copy_stream`` (opt-in, not yet measured on a GPU) page-outs and page-ins run on a side CUDA
    stream, the compute stream waiting for a page-in only at the value's first read
    (:mod:`coop.runtime.copy_stream`); ``True`` uses torch.cuda's streams, a :class:`StreamAPI` object
    replaces them (tests record the protocol with a fake). It is refused with a one-line error without
    CUDA, for a schedule that pages nothing, and with ``placement``. The default (False) keeps the copies
    on the compute stream.

    The program runs as fx's generated Python code with every aten op bound once as a global
    (:func:`bind_ops`): the code fx prints (``module.code``), minus the attribute look-ups and
    the ``OpOverload.__call__`` frame per node. ``code`` is the source that runs.

    Parameters
    ----------
    schedule : Schedule
        The schedule to replay (ScheduleError, with its own step numbers, where it is illegal).
    replay_random : bool
        Whether the schedule may recompute random ops (:func:`replay_graph`).
    placement : Placement or None
        Replay inside one arena (one buffer) per device at this placement's offsets.
    copy_stream : bool or StreamAPI
        Page on a side CUDA stream (True: torch.cuda's; an object: its protocol).
    simulation : Simulation or None
        ``simulate(replay_graph(captured, replay_random), schedule)`` where the caller already holds it (it then
        counts as checked); computed when absent.
    host_pool : HostPool or None
        Where the ordinary replay's page-outs carve their host buffers (:class:`coop.runtime.paging.HostPool`);
        None: each allocates its own.
    """

    def __init__(self, captured: Captured, schedule: Schedule, replay_random: bool = True,
                 placement: Any = None, copy_stream: bool | StreamAPI = False, *,
                 simulation: Simulation | None = None, host_pool: HostPool | None = None) -> None:
        self.captured = captured
        self.graph = replay_graph(captured, replay_random)
        self.requested = schedule
        self.schedule, self.simulation = replayed_schedule(self.graph, schedule, simulation)
        self.placement = placement
        self.arena_program = None
        self.copy_stream = copy_stream_for(captured, self.schedule, copy_stream, placement)
        replayed = replayed_draws(self.graph, self.schedule)
        if placement is None:
            builder = ProgramBuilder(captured, self.graph, replayed, self.copy_stream, host_pool)
            self.module = builder.run(self.schedule)  # just simulated: legal
        else:
            self.module, self.arena_program = build_arena_program(
                captured, self.graph, self.schedule, self.simulation, replayed, placement)
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
    """The placement an arena replay of ``executor``'s schedule executes (aligned, packed).

    Parameters
    ----------
    executor : Executor
        The executor; its graph, schedule and own simulation of the schedule are used.

    Returns
    -------
    Any
        The execution placement (:func:`execution_placement`) of the schedule.
    """
    return execution_placement(executor.graph, executor.schedule, simulation=executor.simulation)


_OP_CALL = re.compile(r"\btorch\.ops\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\(")


def bind_ops(module: fx.GraphModule) -> tuple[Any, str]:
    """``module``'s generated forward with each ``torch.ops.NS.OP.OVERLOAD(`` bound once to the op's C++ callable.

    fx writes an aten call as ``torch.ops.aten.mm.default(...)``: four attribute look-ups and a
    Python ``OpOverload.__call__`` frame per node, every step. Bound as a global of the generated
    code to ``OpOverload._op`` (what ``__call__`` calls), each call is one global look-up into the
    dispatcher: the same kernels, the same dispatch (modes included), bit for bit. Measured on CPU
    (benchmarks/bench_replay_host.py, zoo models, one thread): a step takes 0.83-0.94x the time of
    fx's own code and 0.37-0.59x that of ``fx.Interpreter``.

    Parameters
    ----------
    module : fx.GraphModule
        The captured program.

    Returns
    -------
    tuple of (callable, str)
        The compiled ``forward`` function (called with the module as ``self``) and its rewritten source.
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


def unwrap_model(model: nn.Module, strict: bool = True) -> tuple[nn.Module, Any]:
    """The module to capture and the DistributedDataParallel wrapper around it (None without one).

    A DDP-wrapped model is captured without its wrapper; :class:`GradientSync` then hands the
    replayed gradients to the wrapper's own reducer. A ``torch.compile``d module (outside or inside DDP) is
    refused with ``strict``; without it its ``_orig_mod`` is captured, with a warning: coop's replay runs its own
    program of the eager step in place of the compiled one (same parameters, so training is unchanged).

    Parameters
    ----------
    model : nn.Module
        The user's model, wrapped or not.
    strict : bool
        Refuse a compiled module instead of planning its ``_orig_mod``.

    Returns
    -------
    tuple of (nn.Module, Any)
        The plain module and its DDP wrapper, or ``(model, None)`` when it is not DDP-wrapped.

    Raises
    ------
    CaptureError
        For a wrapper whose semantics a replay of the plain module cannot reproduce, naming the wrapper and the fix
        (among them DDP with the Python reducer, all all-reduces delayed, or ``mixed_precision``).
    """
    model = _uncompiled(model, strict)
    refusal = _refused_wrapper(model)
    if refusal:
        raise CaptureError(refusal)
    ddp_class = _ddp_class()
    if ddp_class is None or not isinstance(model, ddp_class):
        return model, None
    inner = _uncompiled(model.module, strict)
    if inner is not model.module:
        refusal = _refused_wrapper(inner)
        if refusal:
            raise CaptureError(refusal)
    if getattr(model, "_use_python_reducer", False) or getattr(model, "_delay_all_reduce_all_params", False):
        raise CaptureError("coop cannot sync gradients of a DistributedDataParallel that uses the Python reducer or "
                           "delays every all-reduce (compiled DDP); wrap the model in plain DistributedDataParallel")
    if getattr(model, "mixed_precision", None) is not None:
        raise CaptureError("coop cannot honour DistributedDataParallel(mixed_precision=...), which casts parameters "
                           "inside forward; use torch.autocast around plan.step instead")
    return inner, model


#: The one line that refuses a compiled module (``strict``) and the warning that plans its ``_orig_mod`` otherwise.
COMPILED_REFUSAL = ("coop cannot plan a torch.compile'd module (coop replays its own program of the eager step); pass "
                    "the uncompiled module (model._orig_mod) to coop.plan")
COMPILED_WARNING = ("coop.plan got a torch.compile'd module and plans its uncompiled model._orig_mod: coop's replay "
                    "replaces the compiled step, so plan.step runs eager kernels (bit-identical to eager, not to "
                    "compiled) while calling the model itself still runs compiled; pass strict=True to refuse instead")


def _uncompiled(model: nn.Module, strict: bool) -> nn.Module:
    """``model``'s ``_orig_mod`` when it is a torch.compile'd module (with a warning; refused with ``strict``)."""
    if not hasattr(model, "_orig_mod"):  # not compiled: no need to import torch._dynamo (slow) to know it
        return model
    from torch._dynamo.eval_frame import OptimizedModule  # lazy: torch._dynamo is slow to import

    if not isinstance(model, OptimizedModule):
        return model
    if strict:
        raise CaptureError(COMPILED_REFUSAL)
    warnings.warn(COMPILED_WARNING, UserWarning, stacklevel=4)
    return model._orig_mod


def _ddp_class() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel  # lazy: only where torch.distributed is available

    return DistributedDataParallel


def _refused_wrapper(model: nn.Module) -> str:
    """Why coop cannot plan for ``model`` as wrapped ('' when it can)."""
    from torch._dynamo.eval_frame import OptimizedModule  # lazy: torch._dynamo is slow to import

    if isinstance(model, OptimizedModule):
        return COMPILED_REFUSAL
    ddp_class = _ddp_class()
    for name, module in model.named_modules():
        where = f"submodule {name!r}" if name else "the model"
        if isinstance(module, nn.DataParallel):
            return (f"coop cannot plan through torch.nn.DataParallel ({where}), which splits every batch across GPUs "
                    "inside forward; pass its .module, or use DistributedDataParallel (one process per GPU)")
        if fsdp_version(module) == 1:
            return (f"coop cannot plan a model wrapped in FullyShardedDataParallel ({where}), FSDP1, whose flat "
                    "parameters are gathered inside forward; shard it with FSDP2's fully_shard, which coop plans")
        if name and ddp_class is not None and isinstance(module, ddp_class):
            return (f"coop cannot plan a DistributedDataParallel nested inside the model ({where}); wrap the whole "
                    "model in one DistributedDataParallel instead")
    sharded = fsdp_refusal(model)
    if sharded:
        return sharded
    if fsdp_version(model) == 2:  # its parameters are DTensor shards, which the capture reads as FSDP's local shards
        return ""
    for name, param in model.named_parameters():
        if type(param) is not nn.Parameter and type(param.data) is not torch.Tensor:
            return (f"coop cannot plan parameter {name!r}, a {type(param.data).__name__} (tensor parallel or another "
                    "tensor subclass); plan the model with plain tensors")
    return ""


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
            if grads[index] is not None:  # a parameter the loss does not reach: no hook fires for it, as in eager
                link = _ReleaseGradient.apply(link, params[index], grads[index])
        self.ddp._post_forward(link).backward()


def _gradient_ready_order(captured: Captured) -> list[int]:
    """Indices into ``captured.grad_names`` in the order the captured backward completes each gradient."""
    position = {node: index for index, node in enumerate(captured.module.graph.nodes)}
    outputs = captured.output_nodes()[captured.grad_slice]
    return sorted(range(len(outputs)), key=lambda i: (position.get(outputs[i], -1), i))


__all__ = ["SOURCE_NODE", "Executor", "GradientSync", "arena_placement", "bind_ops", "build_program", "recorded_program",
           "replay_graph", "replayed_schedule", "saved_generator_bytes", "unwrap_model"]
