"""Warm starts for MONeT's interval model (Shah et al. 2021): schedules that choose implementations.

MONeT's solver starts from a feasible point; coop's interval model (:mod:`coop.formulations.monet.interval_model`)
is hinted with the cheapest of:

* the best remat-only schedule (Moccasin, Bartan et al. 2023, on ``graph.remat_only()``): every
  node runs its default implementation, so the schedule is legal on the graph with implementations
  and monet is never worse than it;
* the *lightest-implementation* schedule for budgets that recomputation alone cannot reach:
  each node takes the implementation that keeps the fewest bytes around it
  (:func:`lightest_choices`: what it reads, its output and its workspace; a ReLU backward reading a
  1-byte mask instead of the float activation), the graph with those choices fixed
  (:func:`fixed_impl_graph`: a plain graph, the optional values that the choices read made regular)
  is solved by Moccasin, and the schedule carries the choices back;
* either one after :func:`apply_in_place`: a compute whose overwritten input's instance is read
  for the last time at that very step runs in place (MONeT's in-place choice) when that costs no more.

Every schedule is judged by :func:`coop.schedule.simulate`.
"""

from __future__ import annotations

from coop.errors import CoopError
from coop.graph import Graph, Impl, Node
from coop.schedule import Schedule, ScheduleError, Step, prompt_order, simulate

#: A node's implementation by name (None: the node's own fields).
Choice = str | None


def usable_impls(graph: Graph, node: Node, exact: bool) -> list[Impl]:
    """The implementations a plan may choose for ``node``.

    Exact ones only under ``exact``, and an in-place one only where every implementation of the
    overwritten node has its size (then the moved bytes are the same whichever one made the
    overwritten instance).

    Parameters
    ----------
    graph : Graph
        The graph ``node`` belongs to.
    node : Node
        The node whose implementations are filtered.
    exact : bool
        Leave out the implementations that are not exact.

    Returns
    -------
    list of Impl
        The usable implementations, in the node's order.
    """
    usable = []
    for impl in node.impls:
        if exact and not impl.exact:
            continue
        if impl.inplace_of is not None:
            target = graph.node(impl.inplace_of)
            if target.mem != impl.mem or any(other.mem != impl.mem for other in target.impls):
                continue
        usable.append(impl)
    return usable


def lightest_choices(graph: Graph, exact: bool) -> dict[int, Choice]:
    """Per computed node the out-of-place implementation with the fewest bytes around it.

    The bytes are those read (computed values only), made and worked in; ties go to the cheaper
    one. In place is left to :func:`apply_in_place`.

    Parameters
    ----------
    exact : bool
        Only exact implementations (:func:`usable_impls`).

    Returns
    -------
    dict of int to Choice
        For every computed node that is not optional or an extra output, the chosen implementation's
        name (None: the node's own fields).
    """
    choices: dict[int, Choice] = {}
    for node in graph.nodes:
        if node.caller_owned or node.optional or node.output_of is not None:
            continue
        options: list[tuple[int, float, Choice]] = []
        for impl in [None, *usable_impls(graph, node, exact)]:
            if impl is not None and impl.inplace_of is not None:
                continue
            reads = sum(graph.node(i).mem for i in node.reads(impl) if not graph.node(i).caller_owned)
            source = impl or node
            options.append((reads + source.mem + source.workspace, source.cost, None if impl is None else impl.name))
        choices[node.id] = min(options, key=lambda o: (o[0], o[1]))[2]
    return choices


def fixed_impl_graph(graph: Graph, choices: dict[int, Choice]) -> Graph:
    """The graph with every node's implementation fixed to ``choices`` (no in-place ones).

    A plain graph with the same node ids, whose schedules are legal on ``graph`` once each compute
    names its choice (:func:`with_choices`). The optional values the choices read become regular
    nodes; the others are left out.

    Parameters
    ----------
    choices : dict of int to Choice
        Each node's chosen implementation (None or absent: its own fields).

    Returns
    -------
    Graph
        The plain graph, named ``"<name>+impls"``, in the order of :func:`order_with_optional`.

    Raises
    ------
    CoopError
        When a choice is an in-place implementation.
    """
    needed: set[int] = set()
    stack = [i for node_id, name in choices.items() for i in graph.node(node_id).reads(
        graph.node(node_id).implementation(name)) if graph.node(i).optional]
    while stack:
        value = stack.pop()
        if value not in needed:
            needed.add(value)
            stack.extend(i for i in graph.node(value).inputs if graph.node(i).optional)
    nodes = []
    for node in graph.nodes:
        if node.optional and node.id not in needed:
            continue
        data = node.model_dump() | {"impls": (), "optional": False}
        impl = node.implementation(choices.get(node.id))
        if impl is not None:
            if impl.inplace_of is not None:
                raise CoopError(f"node {node.id}: in-place implementation {impl.name!r} cannot be fixed in a plain graph")
            data |= {"cost": impl.cost, "mem": impl.mem, "workspace": impl.workspace, "inputs": node.reads(impl)}
        nodes.append(data)
    order = order_with_optional(graph, needed)
    return Graph.model_validate({"name": f"{graph.name}+impls", "nodes": nodes, "outputs": graph.outputs,
                                 "order": order, "meta": graph.meta})


def order_with_optional(graph: Graph, values: set[int]) -> list[int]:
    """``prompt_order(graph)`` with each of ``values`` (optional values) placed early.

    Each is placed before the first node (not an extra output) that comes once its inputs are
    placed, so before every node that may read it; values that become ready together keep the
    graph's node order.

    Returns
    -------
    list of int
        The order; values whose inputs are never placed come last.
    """
    placed = set(graph.caller_owned_ids)
    pending = [node.id for node in graph.nodes if node.id in values]
    result: list[int] = []

    def flush() -> None:
        progress = True
        while progress:
            progress = False
            for value in list(pending):
                if all(i in placed for i in graph.node(value).inputs):
                    result.append(value)
                    placed.add(value)
                    pending.remove(value)
                    progress = True

    for node_id in prompt_order(graph):
        if graph.node(node_id).output_of is None:
            flush()
        result.append(node_id)
        placed.add(node_id)
    flush()
    return result + pending


def with_choices(schedule: Schedule, choices: dict[int, Choice]) -> Schedule:
    """The schedule with every compute naming its node's chosen implementation.

    Parameters
    ----------
    schedule : Schedule
        A schedule, typically of :func:`fixed_impl_graph`'s graph.
    choices : dict of int to Choice
        Each node's chosen implementation (absent: None, its own fields).

    Returns
    -------
    Schedule
        The schedule with each compute's ``impl`` set; other steps unchanged.
    """
    return Schedule(steps=tuple(Step(op=s.op, node=s.node, impl=choices.get(s.node)) if s.op == "compute" else s
                                for s in schedule.steps))


def apply_in_place(graph: Graph, schedule: Schedule, exact: bool) -> Schedule:
    """Run computes in place where that is free.

    The compute of v whose in-place implementation reads what v's current one reads, costs no
    more, and overwrites an instance whose last read is this very step (and that is not an
    output's final instance). Each such step then adds no bytes and the instance's free disappears;
    peak and cost never rise.

    Parameters
    ----------
    exact : bool
        Only exact implementations (:func:`usable_impls`).

    Returns
    -------
    Schedule
        The converted schedule; ``schedule`` when nothing changes (or, defensively, when the result
        does not simulate or would raise the peak or cost).
    """
    if not any(impl.inplace_of is not None for node in graph.nodes for impl in node.impls):
        return schedule
    sim = simulate(graph, schedule)
    steps = list(schedule.steps)
    current: dict[int, int] = {}
    final = {}
    k = 0
    for step in steps:
        if step.op == "compute":
            final[step.node] = k
            k += 1
    outputs = set(graph.outputs)
    drop: set[int] = set()
    consumed_instances: set[int] = set()
    k = 0
    changed = False
    for j, step in enumerate(steps):
        if step.op != "compute":
            continue
        node = graph.node(step.node)
        impl = _in_place_candidate(graph, node, node.implementation(step.impl), exact)
        if impl is not None and impl.inplace_of in current:
            consumed = current[impl.inplace_of]
            instance = sim.instances[consumed]
            final_output = impl.inplace_of in outputs and final[impl.inplace_of] == consumed
            if instance.end == j and not final_output and consumed not in consumed_instances:
                steps[j] = Step(op="compute", node=step.node, impl=impl.name)
                if j + 1 < len(steps) and steps[j + 1] == Step(op="free", node=impl.inplace_of):
                    drop.add(j + 1)
                consumed_instances.add(consumed)
                changed = True
        current[step.node] = k
        k += 1
    if not changed:
        return schedule
    result = Schedule(steps=tuple(s for j, s in enumerate(steps) if j not in drop))
    try:
        after = simulate(graph, result)
    except ScheduleError:
        return schedule
    return result if after.peak <= sim.peak and after.cost <= sim.cost + 1e-9 else schedule


def _in_place_candidate(graph: Graph, node: Node, current: Impl | None, exact: bool) -> Impl | None:
    reads = set(node.reads(current))
    cost = (current or node).cost
    for impl in usable_impls(graph, node, exact):
        if impl.inplace_of is not None and set(node.reads(impl)) == reads and impl.cost <= cost:
            return impl
    return None


__all__ = ["apply_in_place", "fixed_impl_graph", "lightest_choices", "order_with_optional", "usable_impls",
           "with_choices"]
