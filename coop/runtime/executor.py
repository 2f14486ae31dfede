"""The static executor: replay any legal Schedule of a captured step (DESIGN.md, runtime).

From a :class:`~coop.graph_capture.Captured` step and a Schedule, :func:`build_program`
generates once a new fx program in schedule order: each ``compute v`` copies the fx nodes that
Graph node ``v`` owns (a recomputation copies them again, reading the most recent instances of
its inputs), ``page_out``/``page_in`` become copies to and from a host tier, and fx's code
generator releases every value right after its last use, so an instance lives exactly as long
as the simulator says (or less, when an explicit free comes later than its last read).
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
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import fx

from coop.errors import ScheduleError
from coop.graph import Graph
from coop.graph_capture import Captured
from coop.graph_capture.lower import output_nodes
from coop.graph_capture.trace import is_random
from coop.runtime.meter import host_pool
from coop.runtime.rng import output_device, restore_generator_state, save_generator_state, swap_generator_state
from coop.schedule import Schedule, Simulation, simulate, take_extras_promptly


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Copy a value to the host tier (pinned CPU memory on CUDA; the meter's host pool on CPU)."""
    with host_pool():
        if tensor.is_cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
            return host.copy_(tensor, non_blocking=True)
        return tensor.clone()


def to_device(host: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """Copy a value back from the host tier to the device it came from."""
    if torch.cuda.is_available() and host.is_pinned():
        return host.to("cuda", non_blocking=True)
    return host.clone()


class _Unavailable:
    """Marks an fx value that was freed or paged out; reading it is a bug in the schedule."""

    def __init__(self, why: str) -> None:
        self.why = why


class _ProgramBuilder:
    def __init__(self, captured: Captured, graph: Graph, replayed: set[int]) -> None:
        self.captured = captured
        self.graph_ir = graph  # the Graph the schedule is legal on (random draws recomputable or not)
        self.replayed = replayed  # random nodes the schedule recomputes: their generator state is saved
        self.saved_states: dict[fx.Node, fx.Node] = {}  # random fx node -> program value of its saved state
        self.source = captured.module.graph
        self.position = {n: i for i, n in enumerate(self.source.nodes)}
        self.by_name = {n.name: n for n in self.source.nodes}
        self.graph = fx.Graph()
        self.env: dict[fx.Node, Any] = {}
        self.hosts: dict[int, fx.Node] = {}
        self.computed: set[int] = set()
        self.last_random = -1

    def group(self, node_id: int) -> list[fx.Node]:
        return sorted((self.by_name[n] for n in self.captured.fx_names[node_id]), key=self.position.__getitem__)

    def lookup(self, node: fx.Node) -> fx.Node:
        value = self.env.get(node)
        if value is None or isinstance(value, _Unavailable):
            why = value.why if isinstance(value, _Unavailable) else "never computed"
            raise ScheduleError(f"the executor needs {node.name} (Graph node {self.captured.owner_of[node.name]}), which is {why}")
        return value

    def emit(self, node: fx.Node) -> None:
        new = self.graph.node_copy(node, self.lookup)
        new.meta = dict(node.meta)
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

    def compute(self, index: int, node_id: int) -> None:
        graph_node = self.graph_ir.node(node_id)
        first = node_id not in self.computed
        if not first and not graph_node.recomputable:
            raise ScheduleError(f"step {index} (compute %{node_id}): node {node_id} ({graph_node.name}) is not "
                                "recomputable (a random op or an extracted output); keep it instead")
        self.computed.add(node_id)
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
                    self.saved_states[node] = self.graph.call_function(save_generator_state, (device,))
                self.emit(node)
            else:
                self.replay(node)

    def replay(self, node: fx.Node) -> None:
        """Recompute a random op from the generator state saved before its first draw."""
        saved = self.saved_states[node]
        previous = self.graph.call_function(swap_generator_state, (saved,))
        self.emit(node)
        self.env[node] = self.graph.call_function(restore_generator_state, (previous, saved, self.env[node]))

    def drop(self, node_id: int, why: str) -> None:
        for node in self.group(node_id):
            self.env[node] = _Unavailable(why)

    def page_out(self, node_id: int) -> None:
        if self.captured.graph.node(node_id).caller_owned:
            return  # the caller holds its own reference; there is nothing the replay can free
        base = self._base(node_id)
        self.hosts[node_id] = self.graph.call_function(to_host, (self.lookup(base),))
        self.drop(node_id, "paged out")

    def page_in(self, node_id: int) -> None:
        if self.captured.graph.node(node_id).caller_owned:
            return
        base = self._base(node_id)
        self.env[base] = self.graph.call_function(to_device, (self.hosts.pop(node_id),))
        for node in self.group(node_id):
            # re-derive the views of the value; outputs taken from a tuple stay unavailable
            if self.position[node] > self.position[base] and all(
                not isinstance(self.env.get(a), _Unavailable) and a in self.env for a in node.all_input_nodes
            ):
                self.emit(node)

    def _base(self, node_id: int) -> fx.Node:
        for node in self.group(node_id):
            if isinstance(node.meta.get("val"), torch.Tensor):
                return node
        raise ScheduleError(f"node {node_id} has no tensor value to page")

    def finish(self) -> fx.GraphModule:
        outputs = [self.lookup(n) if n is not None else None for n in output_nodes(self.source)]
        self.graph.output(outputs)
        self.graph.lint()
        return fx.GraphModule(self.captured.module, self.graph)


def replay_graph(captured: Captured, replay_random: bool = True) -> Graph:
    """The Graph an executor's schedules are legal on: random draws recomputable when it replays them."""
    return captured.graph.with_random_replay() if replay_random else captured.graph


def build_program(captured: Captured, schedule: Schedule, replay_random: bool = True) -> fx.GraphModule:
    """Generate the replay program of a legal schedule (ScheduleError if it cannot be replayed)."""
    graph = replay_graph(captured, replay_random)
    simulate(graph, schedule)  # legality under contract 2, with the step and reason
    return _program(captured, graph, schedule)


def _program(captured: Captured, graph: Graph, schedule: Schedule) -> fx.GraphModule:
    """The replay program of a schedule already checked legal on ``graph``."""
    computes = Counter(step.node for step in schedule.steps if step.op == "compute")
    replayed = {v for v in graph.random_draws if computes[v] > 1}
    builder = _ProgramBuilder(captured, graph, replayed)
    builder.start()
    for index, step in enumerate(schedule.steps):
        if step.op == "compute":
            builder.compute(index, step.node)
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
    """

    def __init__(self, captured: Captured, schedule: Schedule, replay_random: bool = True) -> None:
        self.captured = captured
        self.graph = replay_graph(captured, replay_random)
        self.requested = schedule
        simulate(self.graph, schedule)  # refuse an illegal schedule with its own step numbers
        self.schedule = take_extras_promptly(self.graph, schedule)
        self.simulation: Simulation = simulate(self.graph, self.schedule)
        self.module = _program(captured, self.graph, self.schedule)  # self.schedule was just simulated

    @property
    def predicted_peak(self) -> int:
        """Predicted peak bytes of the replay (the one simulator on the replayed schedule)."""
        return self.simulation.peak

    def run_flat(self, flat_inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run on flat inputs: [loss, *gradients, *new buffer values]."""
        with torch.no_grad():
            return self.module(*flat_inputs)

    @property
    def code(self) -> str:
        return self.module.code
