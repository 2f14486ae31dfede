"""The one simulator: :func:`simulate` runs a schedule under contract 2's memory semantics (written
in :mod:`coop.schedule`'s docstring) and reports its peak, cost and every instance's lifetime.

Pass 1 walks the steps (legality, and each instance's start, last read and explicit end) with one handler
per step kind (``_compute``, ``_free``, ``_page_out``, ``_page_in``, dispatched from ``_STEP_HANDLERS``), pass 2
turns them into lifetimes, device intervals and memory per step. Everything here is importable from
:mod:`coop.schedule` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coop.errors import ScheduleError
from coop.graph import Graph, Impl, Node
from coop.schedule_steps import Schedule, Step

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
    num_steps = len(schedule.steps)
    index = {n.id: n for n in graph.nodes}
    walk = _walk(graph, index, schedule.steps, paging)  # pass 1: legality, starts, reads, ends
    _check_end(graph, index, walk, num_steps)
    instances, owned_device, memory = _lifetimes(graph, index, walk, num_steps)  # pass 2: lifetimes, memory per step
    peak = max(memory) if memory else graph.caller_owned_bytes
    return Simulation(
        peak=peak,
        cost=walk.cost + walk.page_cost,
        baseline_cost=graph.baseline_cost,
        memory=memory,
        instances=instances,
        recomputations=walk.recomputations,
        page_cost=walk.page_cost,
        workspace=walk.workspace,
        owned_device=owned_device,
    )


@dataclass(slots=True)
class _Walk:
    """Pass 1 of :func:`simulate` under way, then what it found: per instance (index k, in compute order) its node,
    start, first counted step, last read and explicit end; the values resident and on the device at the end; the
    paging gaps; cost, page cost, recomputations, and per step the workspace and new bytes."""

    graph: Graph
    index: dict[int, Node]
    paging: PagingCosts
    workspace: list[int]
    new_mem: list[int]
    current: dict[int, int] = field(default_factory=dict)  # node -> index into starts of its resident instance
    starts: list[int] = field(default_factory=list)
    alive_from: list[int] = field(default_factory=list)  # the step from which an instance counts (its start, or after its op)
    first_compute: dict[int, int] = field(default_factory=dict)
    inst_node: list[int] = field(default_factory=list)
    last_read: list[int] = field(default_factory=list)
    explicit_end: list[int | None] = field(default_factory=list)
    on_device: dict[int, bool] = field(default_factory=dict)
    # Steps off the device, half-open [page_out step, page_in or retiring step), in step order:
    # per instance (index into starts) for computed values, per node for caller-owned ones.
    device_gaps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    owned_gaps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    paged_at: dict[int, int] = field(default_factory=dict)
    computed: set[int] = field(default_factory=set)
    cost: float = 0.0
    page_cost: float = 0.0
    recomputations: int = 0


def _walk(graph: Graph, index: dict[int, Node], steps: tuple[Step, ...], paging: PagingCosts) -> _Walk:
    """Pass 1 of :func:`simulate`: each step's legality, and each instance's start, last read and
    explicit end (ScheduleError at the first illegal step); one handler per step kind (:data:`_STEP_HANDLERS`)."""
    num_steps = len(steps)
    walk = _Walk(graph, index, paging, workspace=[0] * num_steps, new_mem=[0] * num_steps)
    walk.on_device.update((v, True) for v in graph.caller_owned_ids)
    handlers, node_of = _STEP_HANDLERS, index.get
    for j, step in enumerate(steps):
        node = node_of(step.node)
        if node is None:
            raise ScheduleError(f"step {j} ({step}): node {step.node} is not in graph {graph.name!r}", step=j)
        handlers[step.op](walk, node, step, j)
    return walk


def _compute(walk: _Walk, node: Node, step: Step, j: int) -> None:
    """A ``compute`` step: its inputs resident on the device, a new instance of the node (an in-place
    implementation retires the instance it overwrites, its bytes moving to the new one)."""
    node_id, output_of = node.id, node.output_of
    if node.caller_owned:
        raise ScheduleError(f"step {j} ({step}): node {node_id} is a caller-owned {node.kind}; it is never computed", step=j)
    first_compute, current, on_device, last_read = walk.first_compute, walk.current, walk.on_device, walk.last_read
    if output_of is not None and output_of not in first_compute:
        raise ScheduleError(f"step {j} ({step}): node {node_id} ({node.name}) is an extra output of node "
                            f"{output_of}, which has not run yet; compute {output_of} first", step=j)
    impl = _implementation(node, step, j)
    index = walk.index
    for source in node.reads(impl) if output_of is None else ():
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
    computed = walk.computed
    recomputed = node_id in computed
    if recomputed and not node.recomputable:
        raise ScheduleError(f"step {j} ({step}): node {node_id} ({node.name}) is not recomputable (a random op "
                            "or an extra output); it may be computed only once", step=j)
    step_cost, step_mem, step_workspace = (node.cost, node.mem, node.workspace) if impl is None else (
        impl.cost, impl.mem, impl.workspace)
    starts, new_mem, explicit_end = walk.starts, walk.new_mem, walk.explicit_end
    if impl is not None and impl.inplace_of is not None:
        # The storage of the consumed instance becomes the new value's: its bytes move.
        consumed = current[impl.inplace_of]
        step_mem = new_mem[starts[consumed]]
        explicit_end[consumed] = j - 1
        _retire(walk, impl.inplace_of, j)
    if node_id in current:
        _retire(walk, node_id, j)
    current[node_id] = len(starts)
    starts.append(j)
    walk.alive_from.append(j if output_of is None else first_compute[output_of] + 1)
    first_compute.setdefault(node_id, j)
    walk.inst_node.append(node_id)
    last_read.append(j)
    explicit_end.append(None)
    on_device[node_id] = True
    if recomputed:
        walk.recomputations += 1
    else:
        computed.add(node_id)
    walk.cost += step_cost
    walk.workspace[j] = step_workspace
    new_mem[j] = step_mem


def _free(walk: _Walk, node: Node, step: Step, j: int) -> None:
    """A ``free`` step: the node's resident instance ends at the step before."""
    if node.caller_owned:
        raise ScheduleError(f"step {j} ({step}): node {node.id} is a caller-owned {node.kind}; it is never freed", step=j)
    k = walk.current.get(node.id)
    if k is None:
        raise ScheduleError(f"step {j} ({step}): node {node.id} is not resident", step=j)
    walk.explicit_end[k] = j - 1
    _retire(walk, node.id, j)


def _page_out(walk: _Walk, node: Node, step: Step, j: int) -> None:
    """A ``page_out`` step: a resident, pageable value leaves the device (a gap opens), priced by ``paging``."""
    if not walk.graph.pageable(node.id):
        raise ScheduleError(_not_pageable(walk.graph, node, step, j), step=j)
    resident = node.caller_owned or node.id in walk.current
    if not resident or not walk.on_device.get(node.id, True):
        raise ScheduleError(f"step {j} ({step}): node {node.id} is not resident on the device", step=j)
    walk.on_device[node.id] = False
    walk.paged_at[node.id] = j
    walk.page_cost += walk.paging.cost(_resident_mem(node, walk))


def _page_in(walk: _Walk, node: Node, step: Step, j: int) -> None:
    """A ``page_in`` step: a paged-out value comes back (its gap closes), priced by ``paging``."""
    if not walk.graph.pageable(node.id):
        raise ScheduleError(_not_pageable(walk.graph, node, step, j), step=j)
    current = walk.current
    if walk.on_device.get(node.id, True) or not (node.caller_owned or node.id in current):
        raise ScheduleError(f"step {j} ({step}): node {node.id} is not paged out", step=j)
    walk.on_device[node.id] = True
    gaps = walk.owned_gaps.setdefault(node.id, []) if node.caller_owned else walk.device_gaps.setdefault(current[node.id], [])
    gaps.append((walk.paged_at.pop(node.id), j))
    walk.page_cost += walk.paging.cost(_resident_mem(node, walk))


#: Pass 1's handler of each step kind (:data:`coop.schedule_steps.StepOp`).
_STEP_HANDLERS: dict[str, Callable[[_Walk, Node, Step, int], None]] = {
    "compute": _compute,
    "free": _free,
    "page_out": _page_out,
    "page_in": _page_in,
}


def _check_end(graph: Graph, index: dict[int, Node], walk: _Walk, num_steps: int) -> None:
    """Every non-optional node computed, every output resident on the device at the end; close the paging
    gaps of values still on the host at the end."""
    computed, current, on_device = walk.computed, walk.current, walk.on_device
    paged_at, owned_gaps, device_gaps = walk.paged_at, walk.owned_gaps, walk.device_gaps
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


def _lifetimes(graph: Graph, index: dict[int, Node], walk: _Walk,
               num_steps: int) -> tuple[list[Instance], dict[int, Intervals], list[int]]:
    """Pass 2 of :func:`simulate`: every instance's lifetime and device intervals, the caller-owned values'
    device intervals, then memory per step with a difference array."""
    outputs = set(graph.outputs)
    current, starts, inst_node, explicit_end = walk.current, walk.starts, walk.inst_node, walk.explicit_end
    last_read, new_mem, device_gaps, alive_from = walk.last_read, walk.new_mem, walk.device_gaps, walk.alive_from
    owned_gaps, workspace = walk.owned_gaps, walk.workspace
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
    return instances, owned_device, memory


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


def _resident_mem(node: Node, walk: _Walk) -> int:
    """Bytes of the resident instance of node (its implementation's size, not the default one)."""
    return node.mem if node.caller_owned else walk.new_mem[walk.starts[walk.current[node.id]]]


def _retire(walk: _Walk, node_id: int, j: int) -> None:
    """Drop the resident instance of node_id (superseded or freed), closing any paging gap."""
    k = walk.current.pop(node_id)
    on_device = walk.on_device
    if not on_device.get(node_id, True):
        walk.device_gaps.setdefault(k, []).append((walk.paged_at.pop(node_id), j))
    on_device[node_id] = True
