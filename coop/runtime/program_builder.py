"""The replay program builder: turns a legal Schedule of a captured step into a new fx program.

:class:`ProgramBuilder` is the one walk every replay shares (the ordinary replay of
:mod:`coop.runtime.executor`, the arena replay of :mod:`coop.runtime.arena_replay`, and any
later one, e.g. a CUDA-graph replay). Like :class:`torch.fx.Interpreter`, it is a fixed walk
with documented override points: a subclass changes one concept (where a computed value is
written, how a value leaves and comes back) by overriding the method for it and calling
``super()`` for the rest.

**The walk.** :meth:`ProgramBuilder.run` builds the program of one schedule::

    start()                                  # placeholders, get_attr, views of caller-owned values
    for index, step in enumerate(schedule.steps):
        run_step(index, step)                # dispatches on step.op:
            compute(index, node_id, impl)    #   "compute"  -> emit(fx node) for each fx node Graph node owns
            drop(node_id, why)               #   "free"     -> the value's fx nodes become Unavailable
            page_out(index, node_id)         #   "page_out" -> a copy to the host tier, then drop
            page_in(index, node_id)          #   "page_in"  -> a copy back, and the value's views re-derived
    return finish()                          # the output node; the fx.GraphModule

The builder reads the captured fx graph (``source``) and writes the replay graph (``program``),
keeping in ``env`` the program value that currently stands for each captured fx node. A value
that is not resident maps to an :class:`Unavailable` saying why; reading it (:meth:`lookup`) is a
bug in the schedule and raises :class:`~coop.errors.ScheduleError`. fx's code generator then frees
every program value right after its last use, so an instance lives exactly as long as the
simulator (:func:`coop.schedule.simulate`) says, or less.

**Override points** (each documented on the method):

- :meth:`emit`: copy one captured fx node into the program (the arena replay writes it into its
  planned view of the arena instead);
- :meth:`compute`: one ``compute`` step (random draws, replays of them, implementations);
- :meth:`drop`: one value becomes unavailable (a ``free`` step, an in-place overwrite, a page-out);
- :meth:`page_out` / :meth:`page_in`: the copies to and from the host tier (the arena replay
  copies a value back into its block);
- :meth:`start` / :meth:`finish`: the program's head and its output;
- :meth:`run_step`: the dispatch of one step, for a subclass that keeps per-step state.

A builder builds one program: make a new one per schedule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx

from coop.errors import ScheduleError
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.trace import is_random
from coop.runtime.copy_stream import CopyStream
from coop.runtime.paging import HostPool, page_in, page_out, pin_host_copy
from coop.runtime.rng import output_device, restore_generator_state, save_generator_state, swap_generator_state
from coop.schedule import Schedule, Step

#: The key of a replay program node's ``meta`` that names the captured fx node it copies.
SOURCE_NODE = "coop_source_node"


class Unavailable:
    """Marks an fx value that was freed or paged out; reading it is a bug in the schedule.

    Parameters
    ----------
    why : str
        What made it unavailable ("freed at step 7", "paged out"), quoted by the error a read raises.
    """

    def __init__(self, why: str) -> None:
        self.why = why


class _Deferred:
    """A paged-in value (or a view of one) whose program nodes are emitted at its first read (``emit_now``):
    with a copy stream, the compute stream waits for the page-in's copy as late as the schedule allows.
    ``waits``: emitting it is the compute stream's wait for the copy (not a view's re-derivation)."""

    def __init__(self, emit_now: Any, waits: bool = False) -> None:
        self.emit_now = emit_now
        self.waits = waits


def unread_page_ins(graph: Graph, schedule: Schedule) -> set[int]:
    """The indices of the ``page_in`` steps whose value no step reads before it is freed, paged out again or
    recomputed (nor the step's outputs at the end): with a copy stream the replay waits for their copies at once,
    since a value's block may return to the compute stream's pool only after the compute stream waited for the
    copy into it (:mod:`coop.runtime.copy_stream`), and nothing reads it later to wait there.

    Parameters
    ----------
    graph : Graph
        The graph the schedule is legal on.

    Returns
    -------
    set of int
        Step indices; a page-out of the value counts as a read (it reads the value to copy it).
    """
    read_next = set(graph.outputs)  # values whose next event, walking back from the end, is a read
    unread: set[int] = set()
    for index in range(len(schedule.steps) - 1, -1, -1):
        step = schedule.steps[index]
        if step.op == "compute":
            node = graph.node(step.node)
            read_next.discard(step.node)  # a compute starts a new instance: the one before ends here
            read_next.update(node.reads(node.implementation(step.impl)))
        elif step.op == "free":
            read_next.discard(step.node)
        elif step.op == "page_out":
            read_next.add(step.node)
        elif step.node not in read_next:  # a page_in nobody reads
            unread.add(index)
    return unread


def replayed_draws(graph: Graph, schedule: Schedule) -> set[int]:
    """The random nodes a schedule recomputes: a replay saves their generator state before the first draw.

    Parameters
    ----------
    graph : Graph
        The Graph the schedule is legal on.

    Returns
    -------
    set[int]
        The ids of the random draws (:attr:`Graph.random_draws`) that ``schedule`` computes more than once.
    """
    computes = Counter(step.node for step in schedule.steps if step.op == "compute")
    return {v for v in graph.random_draws if computes[v] > 1}


class ProgramBuilder:
    """Writes the replay fx program of one schedule (the walk and its override points: the module docstring).

    Parameters
    ----------
    captured : Captured
        The captured step: its fx program (``captured.module.graph``, read as ``source``) and which fx
        nodes each Graph node owns (``captured.fx_names``).
    graph : Graph
        The coop Graph the schedule is legal on (``schedule_graph``: random draws recomputable or not).
    replayed : set[int]
        The random nodes the schedule recomputes (:func:`replayed_draws`): their generator state is saved
        before the first draw.
    copy_stream : CopyStream or None
        Where page-outs and page-ins run (:mod:`coop.runtime.copy_stream`); None: on the compute stream.
    host_pool : HostPool or None
        Where page-outs on the compute stream carve their host buffers (:class:`coop.runtime.paging.HostPool`);
        None: each allocates its own.
    """

    #: Page a value's whole storage (its own: storage offset kept); False where values share one buffer (arena).
    page_whole_storage = True

    def __init__(self, captured: Captured, graph: Graph, replayed: set[int],
                 copy_stream: CopyStream | None = None, host_pool: HostPool | None = None) -> None:
        self.copy_stream = copy_stream
        self.waited_at_once: set[int] = set()  # page_in steps whose copy is waited for at once (set by run)
        self.host_pool = host_pool
        self.captured = captured
        self.schedule_graph = graph  # the coop Graph the schedule is legal on (random draws recomputable or not)
        self.replayed = replayed  # random nodes the schedule recomputes: their generator state is saved
        self.saved_states: dict[fx.Node, fx.Node] = {}  # random fx node -> program value of its saved state
        self.source = captured.module.graph  # the captured fx graph, read
        self.position = {n: i for i, n in enumerate(self.source.nodes)}
        self.by_name = {n.name: n for n in self.source.nodes}
        self.program = fx.Graph()  # the replay fx graph, written in schedule order
        self.env: dict[fx.Node, Any] = {}  # captured fx node -> its program value (or Unavailable)
        self.hosts: dict[int, fx.Node] = {}  # paged-out value id -> the program value of its HostCopy
        self.computed: set[int] = set()
        self.last_random = -1
        self.optional_values: dict[int, Any] = {}  # optional value id -> its program value (or Unavailable)

    # ---------------------------------------------------------------- the walk
    def run(self, schedule: Schedule) -> fx.GraphModule:
        """Build the program of ``schedule``: :meth:`start`, :meth:`run_step` for each step, :meth:`finish`.

        Parameters
        ----------
        schedule : Schedule
            A schedule already checked legal on ``schedule_graph`` (:func:`coop.schedule.simulate`).

        Returns
        -------
        fx.GraphModule
            The replay program: the captured step's flat inputs in, its flat outputs out.
        """
        self.start()
        self.waited_at_once = unread_page_ins(self.schedule_graph, schedule) if self.copy_stream is not None else set()
        for index, step in enumerate(schedule.steps):
            self.run_step(index, step)
        return self.finish()

    def run_step(self, index: int, step: Step) -> None:
        """Dispatch step ``index`` to :meth:`compute`, :meth:`drop`, :meth:`page_out` or :meth:`page_in`.

        Called once per step, in schedule order, between :meth:`start` and :meth:`finish`. Override it to keep
        state per step (the arena replay tracks the step and the instance it computes), calling ``super()``.
        """
        if step.op == "compute":
            self.compute(index, step.node, step.impl)
        elif step.op == "free":
            self.drop(step.node, f"freed at step {index}")
        elif step.op == "page_out":
            self.page_out(index, step.node)
        else:
            self.page_in(index, step.node)

    # ---------------------------------------------------------------- reading and writing values
    def group(self, node_id: int) -> list[fx.Node]:
        """The captured fx nodes Graph node ``node_id`` owns, in the captured program's order (its
        storage-owning node first, then the views and tuple items folded into it)."""
        return sorted((self.by_name[n] for n in self.captured.fx_names[node_id]), key=self.position.__getitem__)

    def lookup(self, node: fx.Node) -> fx.Node:
        """The program value standing for captured fx node ``node`` now (a deferred page-in is waited for
        here, at its first read); ScheduleError where the value is unavailable or was never computed."""
        value = self.env.get(node)
        if isinstance(value, _Deferred):  # the first read of a paged-in value: wait for its copy here
            value.emit_now()
            value = self.env.get(node)
        if value is None or isinstance(value, Unavailable):
            why = value.why if isinstance(value, Unavailable) else "never computed"
            raise ScheduleError(f"the executor needs {node.name} (Graph node {self.captured.owner_of[node.name]}), which is {why}")
        return value

    def emit(self, node: fx.Node) -> None:
        """Copy captured fx node ``node`` into the program, its arguments read by :meth:`lookup`.

        Called for every captured fx node the walk computes (by :meth:`start`, :meth:`compute`, and when
        :meth:`page_in` re-derives views). It must leave in ``env[node]`` the program value that stands for
        ``node`` from now on; the copy's ``meta`` names its source under :data:`SOURCE_NODE`. The arena
        replay overrides it to write the value into its planned view.
        """
        new = self.program.node_copy(node, self.lookup)
        new.meta = dict(node.meta) | {SOURCE_NODE: node.name}
        self.env[node] = new

    # ---------------------------------------------------------------- the head and the output
    def start(self) -> None:
        """Emit the program's head before the first step: the placeholders (the flat inputs), the ``get_attr``
        constants, then the views of caller-owned values (a transposed weight costs nothing, so it is made
        up front). A subclass adds its own inputs here (the arena replay: one buffer per device)."""
        for node in self.source.nodes:
            if node.op == "placeholder":
                self.emit(node)
        for node in self.source.nodes:
            if node.op == "get_attr":
                self.emit(node)
        for node_id in self.captured.graph.caller_owned_ids:
            for node in self.group(node_id)[1:]:
                self.emit(node)

    def finish(self) -> fx.GraphModule:
        """Emit the output node after the last step (the captured step's outputs, each looked up: a value the
        schedule left unavailable raises) and return the linted program as an fx.GraphModule."""
        outputs = [self.lookup(n) if n is not None else None for n in self.captured.output_nodes()]
        self.wait_for_pending_copies()  # none are left where unread_page_ins saw every read: a safety net
        self.program.output(outputs)
        self.program.lint()
        return fx.GraphModule(self.captured.module, self.program)

    # ---------------------------------------------------------------- compute
    def compute(self, index: int, node_id: int, impl: str | None = None) -> None:
        """Step ``index``, ``compute node_id`` (under implementation ``impl``, MONeT): :meth:`emit` each fx node
        the Graph node owns.

        A random op's first compute saves the generator state first where the schedule recomputes it
        (``replayed``) and must keep the captured order of first draws; a later compute of it replays that
        state (:meth:`replay`). An optional value, or a node under an implementation, runs its own captured
        program (:meth:`compute_alternative`). ScheduleError for a recomputation the Graph forbids.
        """
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
        """The program value of optional value ``node_id`` now (as :meth:`lookup` for an fx node)."""
        value = self.optional_values.get(node_id)
        if isinstance(value, _Deferred):
            value.emit_now()
            value = self.optional_values.get(node_id)
        if value is None or isinstance(value, Unavailable):
            why = value.why if isinstance(value, Unavailable) else "never computed"
            raise ScheduleError(f"the executor needs optional value {node_id}, which is {why}")
        return value

    def replay(self, node: fx.Node) -> None:
        """Recompute a random op from the generator state saved before its first draw."""
        saved = self.saved_states[node]
        previous = self.program.call_function(swap_generator_state, (saved,))
        self.emit(node)
        self.env[node] = self.program.call_function(restore_generator_state, (previous, saved, self.env[node]))

    # ---------------------------------------------------------------- free and paging
    def drop(self, node_id: int, why: str) -> None:
        """Make Graph node ``node_id``'s value (each fx node it owns) :class:`Unavailable` for ``why``.

        Called for a ``free`` step (``why`` = "freed at step N"), for the value an in-place implementation
        overwrites, and by :meth:`page_out`. It emits nothing: fx frees a program value after its last use.
        """
        if node_id in self.optional_values:
            self.wait_for_pending_copies([(self.optional_values, node_id)])
            self.optional_values[node_id] = Unavailable(why)
            return
        self.wait_for_pending_copies([(self.env, node) for node in self.group(node_id)])
        for node in self.group(node_id):
            self.env[node] = Unavailable(why)

    def wait_for_pending_copies(self, entries: list[tuple[dict, Any]] | None = None) -> None:
        """Emit the compute stream's wait of each page-in in ``entries`` (``(store, key)``; None: every entry of
        the program) whose value was never read: the block may return to the compute stream's pool only after its
        copy (:mod:`coop.runtime.copy_stream`). A view that was never read is left unemitted."""
        if entries is None:
            entries = [(store, key) for store in (self.env, self.optional_values) for key in list(store)]
        for store, key in entries:
            value = store.get(key)
            if isinstance(value, _Deferred) and value.waits:
                value.emit_now()

    def page_out(self, index: int, node_id: int) -> None:
        """Step ``index``, ``page_out node_id``: emit a copy of the value to the host tier
        (:func:`coop.runtime.paging.page_out`: its whole storage, layout and device kept, pinned where its device
        is CUDA; with a copy stream, on the side stream), keep the copy in ``hosts`` for :meth:`page_in`, and
        :meth:`drop` the value. A caller-owned value emits nothing (the caller holds it)."""
        if self.captured.graph.node(node_id).caller_owned:
            return  # the caller holds its own reference; there is nothing the replay can free
        optional = node_id in self.optional_values
        value = self.optional_value(node_id) if optional else self.lookup(self.base_of(node_id))
        pin = pin_host_copy(self._device(node_id, value))
        if self.copy_stream is None:
            options = {"pin": pin, "non_blocking": pin} | ({} if self.page_whole_storage else {"whole_storage": False})
            target = page_out if self.host_pool is None else self.host_pool.page_out
            self.hosts[node_id] = self.program.call_function(target, (value,), options)
        else:
            self.hosts[node_id] = self.program.call_function(self.copy_stream.page_out, (value,), {"pin": pin})
        if optional:
            self.optional_values[node_id] = Unavailable("paged out")
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

    def page_in(self, index: int, node_id: int) -> None:
        """Step ``index``, ``page_in node_id``: emit the copy back from the host tier (the one :meth:`page_out`
        made), make it the value's program value, and re-emit the value's views (:meth:`rederived_views`). With
        a copy stream the compute stream's wait is emitted at the value's first read
        (:meth:`page_in_on_copy_stream`). A caller-owned value emits nothing."""
        if self.captured.graph.node(node_id).caller_owned:
            return
        if self.copy_stream is not None:
            self.page_in_on_copy_stream(index, node_id)
            return
        if node_id in self.optional_values:
            self.optional_values[node_id] = self.paged_in(node_id)
            return
        base = self.base_of(node_id)
        self.env[base] = self.paged_in(node_id)
        for node in self.rederived_views(node_id, base):
            self.emit(node)

    def page_in_on_copy_stream(self, index: int, node_id: int) -> None:
        """Queue the page-in's copy now; the compute stream's wait (and the value's views) come at its first read,
        or at once where nothing reads it before it goes (:func:`unread_page_ins`)."""
        pending = self.program.call_function(self.copy_stream.page_in, (self.hosts.pop(node_id),))

        def wait_for(store: dict, key: Any) -> _Deferred:
            def emit_now() -> None:
                store[key] = self.program.call_function(self.copy_stream.wait, (pending,))
            return _Deferred(emit_now, waits=True)

        if node_id in self.optional_values:
            self.optional_values[node_id] = wait_for(self.optional_values, node_id)
            if index in self.waited_at_once:
                self.wait_for_pending_copies([(self.optional_values, node_id)])
            return
        base = self.base_of(node_id)
        self.env[base] = wait_for(self.env, base)
        if index in self.waited_at_once:
            self.wait_for_pending_copies([(self.env, base)])
        group = set(self.group(node_id))
        for node in self.rederived_views(node_id, base):
            if all(a in group for a in node.all_input_nodes):  # a view of the value: emitted at its first read too
                self.env[node] = _Deferred(lambda node=node: self.emit(node))
            else:  # it reads other values too
                self.emit(node)

    def rederived_views(self, node_id: int, base: fx.Node) -> Iterator[fx.Node]:
        """The fx nodes of ``node_id`` to re-emit after its storage-owning node ``base`` is paged back in: those
        after ``base`` whose inputs are all available. Each is tested when the caller asks for it, after the
        ones before it were emitted; outputs taken from a tuple stay unavailable."""
        for node in self.group(node_id):
            if self.position[node] > self.position[base] and all(
                not isinstance(self.env.get(a), Unavailable) and a in self.env for a in node.all_input_nodes
            ):
                yield node

    def base_of(self, node_id: int) -> fx.Node:
        """The fx node that holds Graph node ``node_id``'s tensor: the one a page-out copies."""
        group = self.group(node_id)
        name = paged_value_name([n.name for n in group], {n.name: n.meta.get("val") for n in group},
                                self.captured.graph.node(node_id).device)
        if name is None:
            raise ScheduleError(f"node {node_id} has no tensor value to page")
        return self.by_name[name]


def paged_value_name(names: list[str], values: dict[str, Any], device: str | None) -> str | None:
    """Of a Graph node's fx values (``names``, in program order), the one whose storage a page-out copies.

    The first tensor on the node's own device (:attr:`coop.graph.Node.device`, the device of the storage it
    owns): a group can hold a tensor of another device first (a host scalar folded in ahead of the device
    value), and paging that one would copy a host value to the host. Where none is on that device (a node
    without a recorded device; a graph captured on meta for another device, whose values are CPU fakes) the
    first tensor; None where the node holds no tensor.

    Parameters
    ----------
    names : list of str
        The node's fx value names, in program order.
    values : dict of str to Any
        The captured value (``meta["val"]``) of each name.
    device : str or None
        The node's device (``"cuda:0"``, ``"cuda"``, ``"cpu"``; None where unrecorded).

    Returns
    -------
    str or None
        The name of the value to page.
    """
    tensors = [name for name in names if isinstance(values.get(name), torch.Tensor)]
    return next((name for name in tensors if _on_device(values[name], device)), tensors[0] if tensors else None)


def _on_device(value: torch.Tensor, device: str | None) -> bool:
    """Whether ``value`` lives on ``device`` ("cuda" matches every CUDA index, "cuda:0" only index 0)."""
    if device is None:
        return False
    wanted = torch.device(device)
    return value.device.type == wanted.type and wanted.index in (None, value.device.index)


__all__ = ["SOURCE_NODE", "ProgramBuilder", "Unavailable", "paged_value_name", "replayed_draws"]
