"""Schedules and their one simulator and validator (contract 2: the Schedule and its memory semantics).

A :class:`Schedule` is a sequence of steps: ``compute v`` makes a new resident instance of v from
the most recent resident instances of its inputs, ``free v`` drops the resident instance of v, and
``page_out v`` / ``page_in v`` move it between device memory and a host tier (only device
residency counts against the budget).

Memory semantics (those of Checkmate, Jain et al. 2020, and Moccasin, Bartan et al. 2023):

* An instance with no explicit free lives from the step that computes it through the last step
  that reads it; an instance nobody reads lives only at its own step. The final instance of a
  graph output lives to the end.
* Caller-owned values (inputs, parameters, buffers) are resident for the whole step unless a
  step pages them out; a schedule never computes or frees them.
* Only values on an accelerator are paged (:meth:`Graph.pageable`): a host value inside a step that
  runs on an accelerator (a 0-d CPU scalar, a CPU RNG seed) is already host memory and counts
  against no device budget, so a page step of it is illegal. A step captured on the CPU alone has
  no accelerator; there the CPU stands in for the device and its values are pageable.
* Memory at a step is the sum of the device-resident instances alive at that step, plus the
  workspace of the node computed there. The peak is the maximum over steps.
* An extra output of a multi-output op (``Node.output_of``) is produced by the op's first
  compute, whenever the schedule takes it: its instance counts from the step after that compute
  (the op's workspace covers it at the step itself). Its own compute step costs nothing, does not
  read the op (which may be gone by then) and must come after the op's first compute; a
  recomputation of the op makes a fresh copy that is dropped at once (again its workspace).
* Implementations (MONeT, Shah et al. 2021; ``Node.impls``): a compute that names ``impl`` costs
  that implementation's ``cost``, makes an instance of its ``mem`` and needs its ``workspace``, and
  reads the implementation's ``inputs`` (when it names them) instead of the node's: a backward that
  reads a compact mask needs the mask resident, not the activation. A compute with no ``impl``
  runs the node's own fields. An implementation's workspace covers the op's extra outputs at its
  step as the node's does, also where it hands out storages it read instead of allocating them (a
  split convolution backward passes on its optional value W's weight and bias gradients): those
  bytes then count twice at that one step, an upper bound of what a meter sees, never less.
* Optional values (``Node.optional``, e.g. that mask) need not be computed; when a step computes
  one it is an ordinary value. Every non-optional computed node (every node of ``graph.order``)
  is computed at least once.
* In place (``Impl.inplace_of = u``): the compute consumes the resident instance of u, which it
  also reads. That instance ends at the step before; the new value's instance starts at the step
  with the consumed instance's bytes (the storage moves: no new bytes). Nothing may read, free or
  page that instance of u afterwards (it is no longer resident: a later read of u needs u
  recomputed), and an output u must be recomputed to be resident at the end.

:func:`simulate` is the only implementation of these semantics; every formulation, the
validator, the executor's predictions and the CLI call it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from coop.errors import ScheduleError
from coop.graph import Graph, Impl, Node, derived_from_graph
from coop.graph_files import read_json_file
from coop.limits import MAX_BUDGET
from coop.text import json_type_name, short_repr

SCHEDULE_FORMAT = "coop.schedule/1"

StepOp = Literal["compute", "free", "page_out", "page_in"]


class Step(BaseModel):
    """One schedule step; ``impl`` names a node implementation (MONeT) for a compute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: StepOp
    node: int
    impl: str | None = None

    def __str__(self) -> str:
        return f"{self.op} %{self.node}" + (f" [{self.impl}]" if self.impl else "")


@functools.lru_cache(maxsize=65536, typed=True)
def _compute_step(node: int) -> Step:
    """``compute node`` (steps are frozen, so one object serves every schedule: the local search builds thousands)."""
    return Step(op="compute", node=node)


class Schedule(BaseModel):
    """An ordered list of steps over a graph's node ids."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: tuple[Step, ...]

    @classmethod
    def from_order(cls, order: list[int] | tuple[int, ...]) -> Schedule:
        """A schedule that computes these nodes in this order and frees each after last use."""
        return cls(steps=tuple(_compute_step(i) for i in order))

    @property
    def compute_count(self) -> int:
        return sum(1 for s in self.steps if s.op == "compute")

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        return "\n".join(f"{i:5d}: {s}" for i, s in enumerate(self.steps))


#: Inclusive step ranges (first, last) during which a value is on the device.
Intervals = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Instance:
    """One resident copy of a value of ``mem`` bytes, alive from ``start`` through ``end``
    (inclusive): from its compute, or for an extra output from right after its op's first compute.

    ``device`` is where it counts against the budget: ``[start, end]`` less the steps it spends
    paged out to the host, one interval per stay on the device (empty if it never is).
    """

    node: int
    start: int
    end: int
    mem: int = 0
    computed_at: int = -1  # the step that computes (takes) it; ``start`` for all but extra outputs
    device: Intervals = ()


def relative_overhead(extra_cost: float, baseline_cost: float) -> float:
    """Extra compute as a fraction of the baseline cost (Moccasin's TDI): 0.05 is 5 % more work.

    The one overhead formula: the simulator, the online engines and the dynamic fallback report it.
    A graph whose baseline costs nothing has no overhead.

    Parameters
    ----------
    extra_cost : float
        The cost above the baseline, in the graph's cost units.
    baseline_cost : float
        The cost of the baseline order, in the same units.

    Returns
    -------
    float
        ``extra_cost / baseline_cost``; 0.0 when ``baseline_cost`` is 0.
    """
    return extra_cost / baseline_cost if baseline_cost else 0.0


@dataclass
class Simulation:
    """What the simulator found: peak and cost, and the memory at every step.

    ``memory[j]`` is the sum of the device intervals alive at step j (``instances[k].device`` and
    ``owned_device``) plus ``workspace[j]``, the workspace of the node computed at step j (of the
    implementation it names) or 0; static address placement reads the same three.
    """

    peak: int
    cost: float
    baseline_cost: float
    memory: list[int] = field(repr=False)
    instances: list[Instance] = field(repr=False)
    recomputations: int = 0
    page_cost: float = 0.0
    workspace: list[int] = field(default_factory=list, repr=False)
    #: Each caller-owned value's device intervals: the whole step unless the schedule pages it.
    owned_device: dict[int, Intervals] = field(default_factory=dict, repr=False)

    @property
    def overhead(self) -> float:
        """Extra compute relative to the baseline: (cost - baseline) / baseline."""
        return relative_overhead(self.cost - self.baseline_cost, self.baseline_cost)

    @property
    def peak_step(self) -> int:
        return max(range(len(self.memory)), key=self.memory.__getitem__) if self.memory else 0


@dataclass(frozen=True)
class PagingCosts:
    """Cost of moving a value of ``mem`` bytes to or from the host tier: latency + mem / bandwidth."""

    latency: float = 0.0
    bandwidth: float = float("inf")

    def cost(self, mem: int) -> float:
        return self.latency + mem / self.bandwidth


def simulate(graph: Graph, schedule: Schedule, paging: PagingCosts | None = None) -> Simulation:
    """Run the schedule under contract 2's semantics; raise ScheduleError at the first illegal step.

    O(steps + reads). Legal means: every step names a node of the graph; a compute reads only
    device-resident instances (those its implementation reads) and never targets a caller-owned
    value; free/page steps act on a resident instance, page steps only on a value the graph says is
    pageable (:meth:`Graph.pageable`: on an accelerator, not a host value); every non-optional computed node is
    computed at least once; every output is resident at the end; an ``impl`` names one of the
    node's implementations; an in-place compute consumes the instance it overwrites.

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    schedule : Schedule
        The steps to run.
    paging : PagingCosts or None
        The cost of each page_out and page_in step; None: ``PagingCosts()``.

    Returns
    -------
    Simulation
        Peak and per-step memory (graph units), cost (compute plus paging), page cost,
        recomputations, per-step workspace, every instance's lifetime and device intervals, and the
        device intervals of the caller-owned values.

    Raises
    ------
    ScheduleError
        At the first illegal step (its index in ``step``), or when a node is never computed or an
        output is not resident on the device at the end.

    Examples
    --------
    >>> from coop import Graph, Node, Schedule, simulate
    >>> graph = Graph(outputs=(2,), nodes=[Node(id=0, name="x", mem=4, cost=0, kind="input"),
    ...     Node(id=1, name="a", inputs=(0,), mem=8, cost=1), Node(id=2, name="b", inputs=(1,), mem=2, cost=1)])
    >>> schedule = Schedule.from_order(graph.order)
    >>> print(schedule)
        0: compute %1
        1: compute %2
    >>> simulate(graph, schedule)
    Simulation(peak=14, cost=2.0, baseline_cost=2.0, recomputations=0, page_cost=0.0)
    """
    paging = paging or PagingCosts()
    steps = schedule.steps
    num_steps = len(steps)
    index = {n.id: n for n in graph.nodes}
    outputs = set(graph.outputs)

    # Pass 1: legality, and each instance's start, last read and explicit end.
    current: dict[int, int] = {}  # node -> index into starts of its resident instance
    starts: list[int] = []
    alive_from: list[int] = []  # the step from which an instance counts (its start, or after its op)
    first_compute: dict[int, int] = {}
    inst_node: list[int] = []
    last_read: list[int] = []
    explicit_end: list[int | None] = []
    on_device: dict[int, bool] = {v: True for v in graph.caller_owned_ids}
    # Steps off the device, half-open [page_out step, page_in or retiring step), in step order:
    # per instance (index into starts) for computed values, per node for caller-owned ones.
    device_gaps: dict[int, list[tuple[int, int]]] = {}
    owned_gaps: dict[int, list[tuple[int, int]]] = {}
    paged_at: dict[int, int] = {}
    computed: set[int] = set()
    cost = 0.0
    page_cost = 0.0
    recomputations = 0
    workspace = [0] * num_steps
    new_mem = [0] * num_steps

    for j, step in enumerate(steps):
        node = index.get(step.node)
        if node is None:
            raise ScheduleError(f"step {j} ({step}): node {step.node} is not in graph {graph.name!r}", step=j)
        if step.op == "compute":
            if node.caller_owned:
                raise ScheduleError(f"step {j} ({step}): node {node.id} is a caller-owned {node.kind}; it is never computed", step=j)
            if node.output_of is not None and node.output_of not in first_compute:
                raise ScheduleError(f"step {j} ({step}): node {node.id} ({node.name}) is an extra output of node "
                                    f"{node.output_of}, which has not run yet; compute {node.output_of} first", step=j)
            impl = _implementation(node, step, j)
            for source in node.reads(impl) if node.output_of is None else ():
                if index[source].caller_owned:
                    if not on_device[source]:
                        raise ScheduleError(f"step {j} ({step}): input {source} is paged out; page it in first", step=j)
                    continue
                k = current.get(source)
                if k is None:
                    raise ScheduleError(f"step {j} ({step}): input {source} is not resident (never computed or freed)", step=j)
                if not on_device.get(source, True):
                    raise ScheduleError(f"step {j} ({step}): input {source} is paged out; page it in first", step=j)
                last_read[k] = j
            if node.id in computed and not node.recomputable:
                raise ScheduleError(f"step {j} ({step}): node {node.id} ({node.name}) is not recomputable (a random op "
                                    "or an extra output); it may be computed only once", step=j)
            step_cost, step_mem, step_workspace = (node.cost, node.mem, node.workspace) if impl is None else (
                impl.cost, impl.mem, impl.workspace)
            if impl is not None and impl.inplace_of is not None:
                # The storage of the consumed instance becomes the new value's: its bytes move.
                consumed = current[impl.inplace_of]
                step_mem = new_mem[starts[consumed]]
                explicit_end[consumed] = j - 1
                _retire(current, impl.inplace_of, on_device, paged_at, device_gaps, j)
            if node.id in current:
                _retire(current, node.id, on_device, paged_at, device_gaps, j)
            current[node.id] = len(starts)
            starts.append(j)
            alive_from.append(j if node.output_of is None else first_compute[node.output_of] + 1)
            first_compute.setdefault(node.id, j)
            inst_node.append(node.id)
            last_read.append(j)
            explicit_end.append(None)
            on_device[node.id] = True
            if node.id in computed:
                recomputations += 1
            computed.add(node.id)
            cost += step_cost
            workspace[j] = step_workspace
            new_mem[j] = step_mem
        elif step.op == "free":
            if node.caller_owned:
                raise ScheduleError(f"step {j} ({step}): node {node.id} is a caller-owned {node.kind}; it is never freed", step=j)
            k = current.get(node.id)
            if k is None:
                raise ScheduleError(f"step {j} ({step}): node {node.id} is not resident", step=j)
            explicit_end[k] = j - 1
            _retire(current, node.id, on_device, paged_at, device_gaps, j)
        elif not graph.pageable(node.id):  # a page_out or page_in of a host value
            raise ScheduleError(_not_pageable(graph, node, step, j), step=j)
        elif step.op == "page_out":
            resident = node.caller_owned or node.id in current
            if not resident or not on_device.get(node.id, True):
                raise ScheduleError(f"step {j} ({step}): node {node.id} is not resident on the device", step=j)
            on_device[node.id] = False
            paged_at[node.id] = j
            page_cost += paging.cost(_resident_mem(node, current, starts, new_mem))
        else:  # page_in
            if on_device.get(node.id, True) or not (node.caller_owned or node.id in current):
                raise ScheduleError(f"step {j} ({step}): node {node.id} is not paged out", step=j)
            on_device[node.id] = True
            gaps = owned_gaps.setdefault(node.id, []) if node.caller_owned else device_gaps.setdefault(current[node.id], [])
            gaps.append((paged_at.pop(node.id), j))
            page_cost += paging.cost(_resident_mem(node, current, starts, new_mem))

    missing = [v for v in graph.order if v not in computed]  # optional values are not in the order
    if missing:
        raise ScheduleError(f"node {missing[0]} ({index[missing[0]].name}) is never computed; every node must be computed at least once")
    for output in graph.outputs:
        if index[output].caller_owned:
            if not on_device[output]:
                raise ScheduleError(f"output {output} is paged out at the end; page it in")
            continue
        if output not in current:
            raise ScheduleError(f"output {output} ({index[output].name}) is not resident at the end")
        if not on_device[output]:
            raise ScheduleError(f"output {output} ({index[output].name}) is paged out at the end; page it in")
    for node_id, since in paged_at.items():  # still on the host at the end
        gaps = owned_gaps.setdefault(node_id, []) if index[node_id].caller_owned else device_gaps.setdefault(current[node_id], [])
        gaps.append((since, num_steps))

    # Pass 2: lifetimes and device intervals, then memory per step with a difference array.
    last_step = max(num_steps, 1) - 1  # caller-owned values are resident even in a step with no steps
    delta = [0] * (last_step + 2)
    instances: list[Instance] = []
    final_instance = {node_id: k for node_id, k in current.items()}
    for k, start in enumerate(starts):
        node_id = inst_node[k]
        end = explicit_end[k]
        if end is None:
            end = num_steps - 1 if (node_id in outputs and final_instance.get(node_id) == k) else last_read[k]
        end = max(end, start)
        mem = new_mem[start]
        if k in device_gaps:
            device = _on_device(alive_from[k], end, device_gaps[k])
            for first, last in device:
                delta[first] += mem
                delta[last + 1] -= mem
        else:  # never paged: on the device for its whole lifetime
            device = ((alive_from[k], end),)
            delta[alive_from[k]] += mem
            delta[end + 1] -= mem
        instances.append(Instance(node_id, alive_from[k], end, mem, start, device))
    owned_device: dict[int, Intervals] = {}
    for node_id in graph.caller_owned_ids:
        mem = index[node_id].mem
        owned_device[node_id] = _on_device(0, last_step, owned_gaps.get(node_id, ()))
        for first, last in owned_device[node_id]:
            delta[first] += mem
            delta[last + 1] -= mem
    memory = []
    running = 0
    for j in range(num_steps):
        running += delta[j]
        memory.append(running + workspace[j])
    peak = max(memory) if memory else graph.caller_owned_bytes
    return Simulation(
        peak=peak,
        cost=cost + page_cost,
        baseline_cost=graph.baseline_cost,
        memory=memory,
        instances=instances,
        recomputations=recomputations,
        page_cost=page_cost,
        workspace=workspace,
        owned_device=owned_device,
    )


def _not_pageable(graph: Graph, node: Node, step: Step, j: int) -> str:
    """Why a page step of a host value (:meth:`Graph.pageable` False) is refused, and the fix, in one line."""
    accelerators = ", ".join(d for d in graph.devices if d not in (None, "cpu"))
    return (f"step {j} ({step}): node {node.id} ({node.name}) lives on {node.device}, not on the accelerator "
            f"({accelerators}) whose memory the budget bounds; only accelerator values can be paged: remove its "
            "page_out/page_in and keep it resident (it is host memory already)")


def _on_device(first: int, last: int, gaps: list[tuple[int, int]] | tuple[()]) -> Intervals:
    """The inclusive range ``[first, last]`` less the half-open paging ``gaps`` (in step order)."""
    if not gaps:
        return ((first, last),)
    pieces: list[tuple[int, int]] = []
    cursor = first
    for gap_start, gap_end in gaps:
        if gap_end <= cursor or gap_start > last:
            continue
        if gap_start > cursor:
            pieces.append((cursor, gap_start - 1))
        cursor = gap_end
    if cursor <= last:
        pieces.append((cursor, last))
    return tuple(pieces)


def _implementation(node: Node, step: Step, j: int) -> Impl | None:
    """The implementation a compute step names (None: the node's own fields); ScheduleError if unknown."""
    if step.impl is None:
        return None
    impl = node.implementation(step.impl)
    if impl is not None:
        return impl
    names = ", ".join(i.name for i in node.impls) or "none"
    raise ScheduleError(f"step {j} ({step}): node {node.id} has no implementation {step.impl!r} (has: {names})", step=j)


def _resident_mem(node: Any, current: dict[int, int], starts: list[int], new_mem: list[int]) -> int:
    """Bytes of the resident instance of node (its implementation's size, not the default one)."""
    return node.mem if node.caller_owned else new_mem[starts[current[node.id]]]


def _retire(current: dict[int, int], node_id: int, on_device: dict[int, bool], paged_at: dict[int, int],
            device_gaps: dict[int, list[tuple[int, int]]], j: int) -> None:
    """Drop the resident instance of node_id (superseded or freed), closing any paging gap."""
    k = current.pop(node_id)
    if not on_device.get(node_id, True):
        device_gaps.setdefault(k, []).append((paged_at.pop(node_id), j))
    on_device[node_id] = True


def take_extras_promptly(graph: Graph, schedule: Schedule) -> Schedule:
    """The schedule with each extra output's compute moved right after its op's first compute.

    The same memory at every compute (contract 2 counts an extra output from its op's first
    compute anyway) and the same cost; legal whenever ``schedule`` is. This is the order in which
    a replay takes the outputs of a multi-output op.

    Parameters
    ----------
    graph : Graph
        The graph, whose ``extra_outputs`` name each op's extra outputs.
    schedule : Schedule
        The schedule to reorder.

    Returns
    -------
    Schedule
        The reordered schedule; ``schedule`` itself when the graph has no extra outputs.
    """
    extras = graph.extra_outputs
    if not extras:
        return schedule
    moved = {e for group in extras.values() for e in group}
    steps: list[Step] = []
    placed: set[int] = set()
    for step in schedule.steps:
        if step.op == "compute" and step.node in moved:
            if step.node in placed:
                continue  # already taken right after its op
            placed.add(step.node)  # a schedule that takes it before its op is left for simulate to refuse
        steps.append(step)
        if step.op == "compute" and step.node in extras:
            for extra in extras[step.node]:
                if extra not in placed:
                    steps.append(Step(op="compute", node=extra))
                    placed.add(extra)
    return Schedule(steps=tuple(steps))


@derived_from_graph
def prompt_order(graph: Graph) -> tuple[int, ...]:
    """``graph.order`` with each extra output moved right after its op (:func:`take_extras_promptly`).

    The same memory as ``order`` (contract 2 counts an extra output from its op's first compute),
    with no step in between that undercounts it: the order the formulations number their stages
    by and the online engines run.

    Parameters
    ----------
    graph : Graph
        The graph whose baseline order is reordered.

    Returns
    -------
    tuple of int
        The node ids in that order; ``graph.order`` itself when the graph has no extra outputs.
    """
    if not graph.extra_outputs:
        return graph.order
    return tuple(step.node for step in take_extras_promptly(graph, Schedule.from_order(graph.order)).steps)


@dataclass
class Validation:
    """The validator's verdict: ok, or the first illegal step and why; peak and cost if legal.

    ``simulation`` is the one simulator's run behind the verdict (None where the schedule is
    illegal), so that a caller that goes on to replay the schedule need not simulate it again.
    """

    ok: bool
    reason: str = ""
    step: int | None = None
    peak: int | None = None
    cost: float | None = None
    overhead: float | None = None
    budget: int | None = None
    simulation: Simulation | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "simulation"}


def ordered_first_computations(graph: Graph, order: Sequence[int], keep_order: bool) -> list[int]:
    """The nodes of ``order`` whose first computations a model must keep in that order.

    All of them with ``keep_order``, else the random draws among them (:attr:`Graph.random_draws`: one
    generator, drawn in eager PyTorch's order, or the replay draws other numbers).

    Parameters
    ----------
    graph : Graph
        The graph, whose ``random_draws`` are kept in order.
    order : Sequence of int
        The node ids in their order.
    keep_order : bool
        Whether every node's first computation keeps its place in ``order``.

    Returns
    -------
    list of int
        Those nodes, in ``order``'s order.
    """
    return list(order) if keep_order else [v for v in order if v in graph.random_draws]


def draws_out_of_order(graph: Graph, schedule: Schedule) -> tuple[int, int] | None:
    """The first (step index, node) whose first computation draws out of ``graph.order`` among the random draws.

    The rule :func:`validate` enforces.

    Parameters
    ----------
    graph : Graph
        The graph, whose ``random_draws`` are checked.
    schedule : Schedule
        The schedule whose first computations are checked.

    Returns
    -------
    tuple of (int, int) or None
        The step index and node of the first random draw computed out of order; None when every
        random draw is first computed in ``graph.order``.
    """
    expected = iter(ordered_first_computations(graph, graph.order, keep_order=False))
    seen: set[int] = set()
    for index, step in enumerate(schedule.steps):
        if step.op != "compute" or step.node in seen or step.node not in graph.random_draws:
            continue
        seen.add(step.node)
        if step.node != next(expected, None):
            return index, step.node
    return None


def validate(graph: Graph, schedule: Schedule, budget: int | None = None) -> Validation:
    """Check a schedule: legal under contract 2 and, when a budget is given, within it.

    Legal also means the random draws are first computed in ``graph.order``
    (:func:`draws_out_of_order`).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    schedule : Schedule
        The schedule to check.
    budget : int or None
        The memory budget in graph units; None: no budget.

    Returns
    -------
    Validation
        ``ok`` with the peak, cost, overhead and simulation; else ``ok=False`` with the reason and
        the step (an illegal step's, an out-of-order draw's, or the peak step when over budget).
        An illegal schedule is reported here, not raised.

    Examples
    --------
    >>> from coop import Graph, Node, Schedule, Step, validate
    >>> graph = Graph(outputs=(2,), nodes=[Node(id=0, name="x", mem=4, cost=0, kind="input"),
    ...     Node(id=1, name="a", inputs=(0,), mem=8, cost=1), Node(id=2, name="b", inputs=(1,), mem=2, cost=1)])
    >>> validate(graph, Schedule.from_order(graph.order), budget=14).ok
    True
    >>> validate(graph, Schedule.from_order(graph.order), budget=12).reason
    'step 1: memory 14 exceeds the budget 12'
    >>> validate(graph, Schedule(steps=(Step(op="compute", node=2),))).ok
    False
    """
    try:
        sim = simulate(graph, schedule)
    except ScheduleError as exc:
        return Validation(ok=False, reason=str(exc), step=exc.step, budget=budget)
    result = Validation(ok=True, peak=sim.peak, cost=sim.cost, overhead=sim.overhead, budget=budget, simulation=sim)
    broken = draws_out_of_order(graph, schedule)
    if broken is not None:
        step, node = broken
        return Validation(ok=False, step=step, budget=budget,
                          reason=f"step {step} (compute %{node}): random op first drawn out of graph.order, so a replay "
                                 "would draw other numbers than eager PyTorch; keep the random draws' first "
                                 "computations in graph.order")
    if budget is not None and sim.peak > budget:
        result.ok = False
        result.step = sim.peak_step
        result.reason = f"step {sim.peak_step}: memory {sim.peak} exceeds the budget {budget}"
    return result


# -------------------------------------------------------------------- schedule JSON
def schedule_to_json(
    graph: Graph,
    schedule: Schedule,
    *,
    budget: int,
    formulation: str,
    solver: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Contract 2's schedule JSON (node ids of the input graph, unchanged).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs; its name and sha256 go into the document.
    schedule : Schedule
        The schedule to write.
    budget : int
        The budget it was solved for, in graph units.
    formulation : str
        The name of the formulation that made it.
    solver : dict or None
        The solver's report; None: a heuristic's (status ``"heuristic"``, the simulated cost as
        objective).

    Returns
    -------
    dict
        The document, with the steps and the predicted peak, cost, baseline cost and overhead.

    Raises
    ------
    ScheduleError
        When the schedule is illegal (from :func:`simulate`).
    """
    sim = simulate(graph, schedule)
    return {
        "format": SCHEDULE_FORMAT,
        "graph": {"name": graph.name, "sha256": graph.sha256},
        "budget": budget,
        "formulation": formulation,
        "steps": [s.model_dump(exclude_none=True) for s in schedule.steps],
        "predicted": {
            "peak": sim.peak,
            "cost": sim.cost,
            "baseline_cost": sim.baseline_cost,
            "overhead": sim.overhead,
        },
        "solver": solver or {"status": "heuristic", "wall_s": 0.0, "objective": sim.cost, "bound": None, "gap": None},
    }


def load_schedule(path: str | Path) -> tuple[Schedule, dict[str, Any]]:
    """Read schedule JSON; returns the Schedule and the whole document.

    Anything malformed (unreadable, not JSON, another format, a step with an unknown op, a missing
    or mistyped field) raises one-line ScheduleError naming the file, the step index and the fix.

    Parameters
    ----------
    path : str or Path
        The schedule file.

    Returns
    -------
    tuple of (Schedule, dict)
        The schedule and the parsed document.

    Raises
    ------
    ScheduleError
        When the file is malformed as above.
    """
    path = Path(path)
    data = read_json_file(path, "schedule", ScheduleError)
    return schedule_from_document(data, origin=str(path)), data


def schedule_from_document(data: Any, origin: str = "schedule") -> Schedule:
    """The Schedule of a parsed schedule document, every field checked (contract 2's JSON).

    Parameters
    ----------
    data : Any
        The parsed JSON document.
    origin : str
        What the document came from (a file's path), for messages.

    Returns
    -------
    Schedule
        The document's steps.

    Raises
    ------
    ScheduleError
        When ``data`` is not an object, has another format, or a field or step is missing or
        malformed.
    """
    if not isinstance(data, dict):
        raise ScheduleError(f"{origin} is not a coop schedule: it holds {json_type_name(data)}, not an object "
                            f"with \"format\": {SCHEDULE_FORMAT!r}")
    if data.get("format") != SCHEDULE_FORMAT:
        found = "has no 'format'" if "format" not in data else f"has format {short_repr(data['format'])}"
        raise ScheduleError(f"{origin} is not a coop schedule: it {found}, expected {SCHEDULE_FORMAT!r} "
                            "(write it with coop solve -o)")
    _check_document_fields(data, origin)
    steps = data["steps"]
    return Schedule(steps=tuple(_parse_step(raw, index, origin) for index, raw in enumerate(steps)))


#: The optional top-level fields of a schedule document and the JSON types they must hold.
_DOCUMENT_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "graph": ((dict,), "an object {name, sha256}"),
    "formulation": ((str,), "a string"),
    "predicted": ((dict,), "an object {peak, cost, baseline_cost, overhead}"),
    "solver": ((dict,), "an object {status, wall_s, objective, bound, gap}"),
}


def _check_document_fields(data: dict[str, Any], origin: str) -> None:
    """Types of the document's fields (its steps are checked one by one by :func:`_parse_step`)."""
    if "steps" not in data:
        raise ScheduleError(f"{origin}: field 'steps' is missing; a schedule lists its steps")
    if not isinstance(data["steps"], list):
        raise ScheduleError(f"{origin}: field 'steps' holds {json_type_name(data['steps'])}; it must be a list of "
                            "{op, node} objects")
    for key, (types, rule) in _DOCUMENT_FIELDS.items():
        if data.get(key) is not None and not isinstance(data[key], types):
            raise ScheduleError(f"{origin}: field {key!r} is {short_repr(data[key])}; it must be {rule} or absent")
    budget = data.get("budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ScheduleError(f"{origin}: field 'budget' is {short_repr(budget)}; it must be a positive integer "
                            "(bytes or graph units) or absent")
    if budget is not None and budget > MAX_BUDGET:
        raise ScheduleError(f"{origin}: field 'budget' is {short_repr(budget)}, larger than coop accepts "
                            "(2**60 = 1 EiB); check its unit, or leave it out and pass --budget")
    made_for = data.get("graph") or {}
    for key in ("name", "sha256"):
        if made_for.get(key) is not None and not isinstance(made_for[key], str):
            raise ScheduleError(f"{origin}: field 'graph.{key}' is {short_repr(made_for[key])}; it must be a string")
    peak = (data.get("predicted") or {}).get("peak")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, int)):
        raise ScheduleError(f"{origin}: field 'predicted.peak' is {short_repr(peak)}; it must be an integer or absent")


def _parse_step(raw: Any, index: int, origin: str) -> Step:
    """One step, strictly typed: ``"node": "3"`` or ``true`` is refused, not converted."""
    where = f"{origin}: step {index}"
    if not isinstance(raw, dict):
        raise ScheduleError(f"{where} holds {json_type_name(raw)}; it must be an object {{op, node}} or {{op, node, impl}}")
    try:
        return Step.model_validate(raw, strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "?"
        rule = _STEP_RULES.get(field, "")
        if error["type"] == "missing":
            problem = f"field {field!r} is missing; add it as {rule}"
        elif error["type"] == "extra_forbidden":
            problem = f"unknown field {field!r}; a step has only op, node and impl"
        else:
            problem = f"field {field!r} is {short_repr(error['input'])}; it must be {rule}"
        raise ScheduleError(f"{where}: {problem}") from None


_STEP_RULES: dict[str, str] = {
    "op": "one of " + ", ".join(repr(op) for op in StepOp.__args__),
    "node": "an integer node id of the graph",
    "impl": "the name of one of the node's implementations (a string) or absent",
}


def check_schedule_nodes(graph: Graph, schedule: Schedule, origin: str = "schedule") -> None:
    """Every step names a node of ``graph`` and, for a compute, one of its implementations.

    These are input errors of a schedule file (it does not belong to this graph), told apart from an
    illegal order of legal steps, which :func:`validate` reports as its verdict.

    Parameters
    ----------
    graph : Graph
        The graph the schedule should belong to.
    schedule : Schedule
        The schedule read from the file.
    origin : str
        What the schedule came from (a file's path), for messages.

    Returns
    -------
    None

    Raises
    ------
    ScheduleError
        When a step names a node not in ``graph``, a step other than a compute names an
        implementation, or a compute names an implementation the node lacks.
    """
    for index, step in enumerate(schedule.steps):
        where = f"{origin}: step {index} ({step})"
        if step.node not in graph:
            raise ScheduleError(f"{where}: node {step.node} is not in graph {graph.name!r}; was the schedule "
                                "solved for another graph?")
        if step.impl is None:
            continue
        node = graph.node(step.node)
        names = [impl.name for impl in node.impls]
        if step.op != "compute":
            raise ScheduleError(f"{where}: only a compute step names an implementation; remove 'impl'")
        if step.impl not in names:
            raise ScheduleError(f"{where}: node {node.id} ({node.name}) has no implementation {step.impl!r}; "
                                f"use one of: {', '.join(names) or 'none (remove impl)'}")
