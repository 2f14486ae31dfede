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

The steps are :mod:`coop.schedule_steps`, the simulator :mod:`coop.simulator`, schedule files
:mod:`coop.schedule_files`; this module holds the validator and the draw-order rule, and every name of
those three is importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coop.errors import ScheduleError
from coop.graph import Graph, derived_from_graph
from coop.schedule_files import check_schedule_nodes, load_schedule, schedule_from_document, schedule_to_json
from coop.schedule_steps import SCHEDULE_FORMAT, Schedule, Step, StepOp
from coop.simulator import Instance, Intervals, PagingCosts, Simulation, relative_overhead, simulate


def take_extras_promptly(graph: Graph, schedule: Schedule) -> Schedule:
    """The schedule with each extra output's compute moved right after its op's first compute.

    The same memory at every compute (contract 2 counts an extra output from its op's first
    compute anyway) and the same cost; legal whenever ``schedule`` is. This is the order in which
    a replay takes the outputs of a multi-output op.

    Parameters
    ----------
    graph : Graph
        The graph, whose ``extra_outputs`` name each op's extra outputs.

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


__all__ = [
    "SCHEDULE_FORMAT",
    "Instance",
    "Intervals",
    "PagingCosts",
    "Schedule",
    "Simulation",
    "Step",
    "StepOp",
    "Validation",
    "check_schedule_nodes",
    "draws_out_of_order",
    "load_schedule",
    "ordered_first_computations",
    "prompt_order",
    "relative_overhead",
    "schedule_from_document",
    "schedule_to_json",
    "simulate",
    "take_extras_promptly",
    "validate",
]
