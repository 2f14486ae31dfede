"""The CP-SAT retention-interval substrate that the interval models share.

Moccasin (Bartan, Li, Teague, Feng, Jain and Taylor, "Moccasin: Efficient Tensor Rematerialization for
Neural Networks", ICML 2023) puts a graph on a time axis of compute slots (one compute per slot): each
computed value v owns up to C retention intervals ``[s_vi, e_vi]`` with presence literals ``p_vi``, a
consumer's compute lies inside a present interval of each input, and one cumulative over the intervals
bounds memory. :mod:`coop.formulations.moccasin.intervals` is that model; :mod:`coop.formulations.monet.interval_model`
adds MONeT's implementation choices (Shah et al., ICLR 2021) and :mod:`coop.formulations.poet.intervals`
POET's paging (Patil et al., ICML 2022) on the same axis, and :mod:`coop.formulations.intervals.feasibility`
asks the feasibility question over the same slots. This module holds what they share, so that each of
them keeps only its paper's own variables and constraints:

* slot bounds: :func:`ancestor_and_descendant_counts`;
* the variables of one interval and the rules between a node's intervals: :func:`new_retention_bounds`,
  :func:`follow_previous`, :func:`pin_absent`, :func:`keep_last_to_end`, :func:`new_interval`, on the
  containers of :class:`IntervalModel`;
* precedence, "s_vi lies inside a present interval of u": :func:`add_covering` (with enforcement
  literals, an in-place end and a paged start offset) and :func:`add_precedences`;
* first computations (and random draws) in order: :func:`first_computation_pairs`,
  :func:`add_first_computation_order` and :func:`first_computations_in_order` (for a warm start), on :func:`coop.schedule.ordered_first_computations`, the rule
  :func:`coop.schedule.validate` enforces;
* hints and solutions: :func:`interval_hint`, :func:`hint_choices`, :func:`present_intervals`;
* schedules and retention spans: :func:`retention_spans`, :func:`retention_schedule`.

Every constraint is created in the order the callers created it before these pieces were shared, so the
models (``str(model.Proto())``) are unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.intervals.slots import SlotProblem
from coop.graph import Graph
from coop.schedule import Schedule, Step, ordered_first_computations, simulate, take_extras_promptly

#: One retention interval on the slot axis: computed (or paged in) at ``start``, resident through ``end``.
Interval = tuple[int, int]
#: One retention span with the implementation whose compute made it (None: the node itself).
RetentionSpan = tuple[int, int, str | None]
#: A precedence choice: (u, v, i, [b_uj for each interval j of u]); b_uj says interval j of u covers s_vi.
Choice = tuple[int, int, int, list[Any]]


# ==================================================================== the variables
@dataclass
class IntervalModel:
    """A CP-SAT model on ``horizon`` compute slots with the retention intervals of each node.

    ``starts[v][i]``, ``ends[v][i]``, ``present[v][i]``: Moccasin's ``s_vi``, ``e_vi`` and ``p_vi`` (a
    literal, or the constant True / a constant variable where the interval is always present);
    ``lows[v]``: the earliest slot of v (where absent intervals are pinned); ``choices``: the
    precedence choice literals :func:`add_covering` created, for the hint.
    """

    model: cp_model.CpModel
    horizon: int
    starts: dict[int, list[Any]] = field(default_factory=dict)
    ends: dict[int, list[Any]] = field(default_factory=dict)
    present: dict[int, list[Any]] = field(default_factory=dict)
    lows: dict[int, int] = field(default_factory=dict)
    choices: list[Choice] = field(default_factory=list)


def ancestor_and_descendant_counts(problem: SlotProblem) -> tuple[dict[int, int], dict[int, int]]:
    """The number of computed ancestors and descendants of each node (its slot bounds).

    Parameters
    ----------
    problem : SlotProblem
        The computed nodes in a topological order, with their computed inputs and consumers.

    Returns
    -------
    (ancestors, descendants) : tuple of dict
        Per node, how many computed nodes must be computed before its first computation (its earliest
        slot) and after it (so its first computation lies at most ``horizon - 1 - descendants`` ).
    """
    position = {v: k for k, v in enumerate(problem.order)}
    ancestors: dict[int, int] = {}
    for v in problem.order:
        bits = 0
        for u in problem.inputs[v]:
            bits |= ancestors[u] | (1 << position[u])
        ancestors[v] = bits
    descendants: dict[int, int] = {}
    for v in reversed(problem.order):
        bits = 0
        for c in problem.consumers[v]:
            bits |= descendants[c] | (1 << position[c])
        descendants[v] = bits
    return ({v: ancestors[v].bit_count() for v in problem.order}, {v: descendants[v].bit_count() for v in problem.order})


def new_retention_bounds(model: cp_model.CpModel, v: int, i: int, low: int, first_high: int, last: int
                         ) -> tuple[cp_model.IntVar, cp_model.IntVar]:
    """Moccasin's ``s_vi`` and ``e_vi``, named ``s_{v}_{i}`` and ``e_{v}_{i}``.

    Parameters
    ----------
    v, i : int
        The node and its interval.
    low : int
        The earliest slot of v (both variables start there).
    first_high : int
        The latest start of the first interval; later intervals may start up to ``last``.
    last : int
        The last slot of the horizon.

    Returns
    -------
    (s_vi, e_vi) : tuple of IntVar

    References
    ----------
    Bartan et al., "Moccasin: Efficient Tensor Rematerialization for Neural Networks", ICML 2023.
    """
    start = model.NewIntVar(low, first_high if i == 0 else last, f"s_{v}_{i}")
    end = model.NewIntVar(low, last, f"e_{v}_{i}")
    return start, end


def follow_previous(model: cp_model.CpModel, start: Any, present: Any, previous_end: Any, previous_present: Any
                    ) -> None:
    """Interval i of a node is present only after interval i - 1 is, and starts after it ends.

    Parameters
    ----------
    start, present : variables
        ``s_vi`` and ``p_vi`` of the later interval.
    previous_end, previous_present : variables
        ``e_v(i-1)`` and ``p_v(i-1)`` (the constant True adds no implication).
    """
    if previous_present is not True:
        model.AddImplication(present, previous_present)
    model.Add(start > previous_end).OnlyEnforceIf(present)  # intervals of one node never overlap


def pin_absent(model: cp_model.CpModel, start: Any, end: Any, present: Any, low: int) -> None:
    """An absent interval has ``s_vi = e_vi = low``: one value, so that no symmetric copies remain.

    Parameters
    ----------
    start, end, present : variables
        ``s_vi``, ``e_vi`` and the literal ``p_vi``.
    low : int
        The node's earliest slot.
    """
    model.Add(start == low).OnlyEnforceIf(present.Not())
    model.Add(end == low).OnlyEnforceIf(present.Not())


def keep_last_to_end(model: cp_model.CpModel, ends: Sequence[Any], present: Sequence[Any], last: int) -> None:
    """The last present interval of a graph output is retained to the horizon's last slot.

    Parameters
    ----------
    ends, present : sequences
        ``e_vi`` and ``p_vi`` of one output, i = 0, 1, ...
    last : int
        The last slot of the horizon.
    """
    for i, literal in enumerate(present):
        later = [present[i + 1].Not()] if i + 1 < len(present) else []
        enforce(model.Add(ends[i] == last), [literal, *later])


def new_interval(model: cp_model.CpModel, start: Any, size: Any, end: Any, presence: Any, name: str) -> Any:
    """An interval variable, optional unless ``presence`` is the constant True.

    Returns
    -------
    IntervalVar
    """
    if presence is True:
        return model.NewIntervalVar(start, size, end, name)
    return model.NewOptionalIntervalVar(start, size, end, presence, name)


def enforcement_literals(*literals: Any) -> list[Any] | None:
    """The enforcement literals of a constraint: those that are not the constant True.

    Returns
    -------
    list or None
        None when one of them is the constant False (the constraint is never enforced: add none).
    """
    if any(literal is False for literal in literals):
        return None
    return [literal for literal in literals if literal is not True]


def enforce(constraint: cp_model.Constraint, literals: Sequence[Any]) -> None:
    """Enforce ``constraint`` under those of ``literals`` that are not the constant True (all True: always).
    """
    variables = [literal for literal in literals if literal is not True]
    if variables:
        constraint.OnlyEnforceIf(variables)


# ==================================================================== precedence
def add_covering(built: IntervalModel, u: int, v: int, i: int, when: Sequence[Any], *, optional_first: bool = False,
                 paged: Sequence[Any] | None = None, in_place: Sequence[Any] = ()) -> None:
    """Under ``when``, ``s_vi`` lies inside a present interval of u: ``s_uj < s_vi <= e_uj`` for a chosen j.

    One interval of u that is always present needs no choice. Otherwise one literal ``b_{u}_{j}_{v}_{i}``
    per interval j of u picks the one covering ``s_vi`` (``b_uj => p_uj``), at least one is chosen under
    ``when``, and ``(u, v, i, [b_uj])`` is appended to ``built.choices``.

    Parameters
    ----------
    u, v, i : int
        The input, the consumer and the consumer's interval.
    when : sequence of literals
        When the interval reads u (empty: always).
    optional_first : bool
        Whether u's first interval may be absent too (MONeT's optional values).
    paged : sequence of literals or False, optional
        POET: ``g_uj`` per interval of u, true where it starts with a page-in; such a value is readable
        at its own slot: ``s_uj + 1 - g_uj <= s_vi``.
    in_place : sequence of literals
        MONeT: implementations of v that overwrite u; under one of them the covering interval ends at
        ``s_vi`` (``e_uj = s_vi``, that instance's last read).

    References
    ----------
    Bartan et al., ICML 2023 (precedence); Shah et al., "Memory Optimization for Deep Networks", ICLR 2021
    (in place); Patil et al., "POET: Training Neural Networks on Tiny Devices with Integrated
    Rematerialization and Paging", ICML 2022 (paging).
    """
    model = built.model
    s_v = built.starts[v][i]
    starts, ends, present = built.starts[u], built.ends[u], built.present[u]
    if len(starts) == 1 and not optional_first:
        enforce(model.Add(starts[0] < s_v), when)
        enforce(model.Add(ends[0] >= s_v), when)
        for literal in in_place:
            enforce(model.Add(ends[0] == s_v), [*when, literal])
        return
    chosen = []
    for j, (s_u, e_u, p_u) in enumerate(zip(starts, ends, present)):
        b = model.NewBoolVar(f"b_{u}_{j}_{v}_{i}")
        if j > 0 or optional_first:
            model.AddImplication(b, p_u)
        if paged is None:
            model.Add(s_u < s_v).OnlyEnforceIf(b)
        else:
            model.Add(s_u + 1 - (0 if paged[j] is False else paged[j]) <= s_v).OnlyEnforceIf(b)
        model.Add(e_u >= s_v).OnlyEnforceIf(b)
        for literal in in_place:
            enforce(model.Add(e_u == s_v), [b, literal])
        chosen.append(b)
    enforce(model.AddBoolOr(chosen), when)
    built.choices.append((u, v, i, chosen))


def add_precedences(problem: SlotProblem, built: IntervalModel, reads: Callable[[int, int], list[Any] | None],
                    paged: Mapping[int, Sequence[Any]] | None = None) -> None:
    """Every first computation follows its inputs' first ones; every reading interval of v is covered.

    For each node v and computed input u: ``s_u0 < s_v0``; then, unless v is an extra output (taken from
    its op, not computed from u), :func:`add_covering` for each interval i of v under ``reads(v, i)``.

    Parameters
    ----------
    reads : callable
        ``reads(v, i)``: the literals under which interval i of v computes (and so reads its inputs);
        None when it never does (POET's page-in intervals).
    paged : mapping, optional
        POET's ``g_uj`` per node (see :func:`add_covering`).

    References
    ----------
    Bartan et al., ICML 2023; Patil et al., ICML 2022.
    """
    model = built.model
    for v in problem.order:
        for u in problem.inputs[v]:
            model.Add(built.starts[u][0] < built.starts[v][0])  # first u precedes first v
            if v in problem.output_of:
                continue  # an extra output is taken from its op, not computed from u
            for i in range(len(built.starts[v])):
                when = reads(v, i)
                if when is not None:
                    add_covering(built, u, v, i, when, paged=None if paged is None else paged[u])


# ==================================================================== first computations in order
def first_computation_pairs(graph: Graph, order: Sequence[int], keep_order: bool) -> list[tuple[int, int]]:
    """The pairs (a, b) of nodes whose first computations a model must keep in that order.

    Parameters
    ----------
    order : sequence of int
        The nodes in the order to keep.
    keep_order : bool
        Keep every first computation in ``order``; else only the random draws'
        (:func:`coop.schedule.ordered_first_computations`, the rule :func:`coop.schedule.validate` enforces).

    Returns
    -------
    list of (a, b)
        Consecutive pairs: a's first computation precedes b's.
    """
    return list(itertools.pairwise(ordered_first_computations(graph, order, keep_order)))


def add_first_computation_order(built: IntervalModel, graph: Graph, order: Sequence[int], keep_order: bool) -> None:
    """``s_a0 < s_b0`` for each pair of :func:`first_computation_pairs`.

    Parameters
    ----------
    keep_order : bool
        Checkmate's restriction (every first computation in ``order``) or the random draws alone.

    References
    ----------
    Bartan et al., ICML 2023 (the published runs pin first computations; coop keeps their order).
    """
    for a, b in first_computation_pairs(graph, order, keep_order):
        built.model.Add(built.starts[a][0] < built.starts[b][0])


def first_computations_in_order(spans: Mapping[int, Sequence[Sequence[Any]]], order: Sequence[int]) -> bool:
    """Whether a warm start's first computations follow ``order`` (a model keeping it may then be hinted).

    Parameters
    ----------
    spans : mapping
        Per node its spans ``(start, end, ...)`` in slot order (each node of ``order`` has one).

    Returns
    -------
    bool
        Each node's first span starts before the next node's.
    """
    return all(spans[a][0][0] < spans[b][0][0] for a, b in itertools.pairwise(order))


# ==================================================================== hints and solutions
def interval_hint(rows: Sequence[Sequence[Any]], i: int, low: int, last: int, output: bool) -> tuple[bool, int, int]:
    """The hinted presence, start and end of interval i of a node from a warm start's spans.

    Parameters
    ----------
    rows : sequence of spans
        The node's spans in the warm start, ``(start, end, ...)`` in slot order.
    low : int
        The node's earliest slot (an absent interval is pinned there).
    last : int
        The horizon's last slot: a graph output's final span is retained to it, as the model has it
        (past the warm start's own last slot when the horizon has slack).
    output : bool
        Whether the node is a graph output.

    Returns
    -------
    (present, start, end) : tuple
    """
    if i >= len(rows):
        return False, low, low
    start, end = rows[i][0], rows[i][1]
    return True, start, last if output and i == len(rows) - 1 else end


def _retained_from_next_slot(span: Sequence[Any], slot: int) -> bool:
    return span[0] < slot <= span[1]


def hint_choices(built: IntervalModel, spans: Mapping[int, Sequence[Sequence[Any]]],
                 covers: Callable[[Sequence[Any], int], bool] = _retained_from_next_slot) -> None:
    """Hint every precedence choice ``b_uj``: true for the warm start's span of u covering ``s_vi``.

    Parameters
    ----------
    spans : mapping
        The warm start's spans per node, ``(start, end, ...)``.
    covers : callable
        ``covers(span, slot)``: whether the span makes u readable at the slot (default: computed before
        it and retained through it; POET: a paged-in span from its own slot).
    """
    for u, v, i, chosen in built.choices:
        covering = None
        rows = spans.get(v, [])
        if i < len(rows):
            s_v = rows[i][0]
            covering = next((j for j, span in enumerate(spans.get(u, [])) if covers(span, s_v)), None)
        for j, b in enumerate(chosen):
            built.model.AddHint(b, j == covering)


def literal_value(solver: cp_model.CpSolver, literal: Any) -> bool:
    """The value of a literal in the solver's solution; a constant True/False is itself.

    Parameters
    ----------
    solver : cp_model.CpSolver
        The solver after a solve.
    literal : Any
        A CP-SAT literal, or a constant bool.

    Returns
    -------
    bool
        The literal's value.
    """
    return literal if isinstance(literal, bool) else solver.BooleanValue(literal)


def present_intervals(solver: cp_model.CpSolver, built: IntervalModel) -> dict[int, list[tuple[int, int, int]]]:
    """The present intervals of a solution.

    Parameters
    ----------
    solver : CpSolver
        Holding a solution of ``built.model``.

    Returns
    -------
    dict
        Per node, ``(i, s_vi, e_vi)`` for each present interval i, in order.
    """
    return {v: [(i, solver.Value(s), solver.Value(e))
                for i, (s, e, p) in enumerate(zip(built.starts[v], built.ends[v], built.present[v]))
                if literal_value(solver, p)] for v in built.starts}


# ==================================================================== schedules <-> retention spans
def retention_spans(graph: Graph, schedule: Schedule, nodes: Iterable[int], *, in_place: bool
                    ) -> tuple[dict[int, list[RetentionSpan]], int]:
    """Each node's retention spans on the slot axis (one slot per compute) and the slot count.

    From the simulator's instances, so that a span is exactly the instance's lifetime. Extra outputs are
    first taken right after their op (:func:`coop.schedule.take_extras_promptly`, the same memory), so
    each one's span starts at its own compute slot, as the models have it.

    Parameters
    ----------
    nodes : iterable of int
        The nodes to list (each gets a list, empty when it is never computed).
    in_place : bool
        MONeT: an instance consumed by an in-place implementation ends at its consumer's slot (the
        model's ``e_uj = s_vi``).

    Returns
    -------
    (spans, slots) : tuple
        Per node ``(start, end, implementation)`` in slot order, and the number of compute slots.
    """
    schedule = take_extras_promptly(graph, schedule)
    sim = simulate(graph, schedule)
    slot_of_step: list[int] = []
    slot = -1
    consumed_at: dict[int, int] = {}
    current: dict[int, int] = {}
    impl_of: list[str | None] = []
    for step in schedule.steps:
        if step.op == "compute":
            slot += 1
            if in_place:
                impl = graph.node(step.node).implementation(step.impl)
                if impl is not None and impl.inplace_of is not None:
                    consumed_at[current[impl.inplace_of]] = slot
            current[step.node] = len(impl_of)
            impl_of.append(step.impl)
        slot_of_step.append(max(slot, 0))
    spans: dict[int, list[RetentionSpan]] = {v: [] for v in nodes}
    for k, inst in enumerate(sim.instances):
        # A span starts at its compute slot (an extra output's memory counts from its op's compute,
        # which the models add themselves).
        end = consumed_at.get(k, slot_of_step[inst.end])
        spans[inst.node].append((slot_of_step[inst.computed_at], end, impl_of[k]))
    for rows in spans.values():
        rows.sort()
    return spans, slot + 1


def retention_schedule(spans: Mapping[int, Sequence[RetentionSpan]], outputs: Collection[int],
                       consumed: Collection[tuple[int, int]] = ()) -> Schedule:
    """Computes at span starts in slot order; a free after the slot where a span ends.

    Parameters
    ----------
    spans : mapping
        Per node ``(start, end, implementation)`` in slot order (at most one start per slot).
    outputs : collection of int
        Graph outputs: their final span is never freed (it must be resident at the end).
    consumed : collection of (node, end)
        Spans consumed in place (MONeT): already gone, never freed.

    Returns
    -------
    Schedule
    """
    events = sorted((start, v, end, name, k == len(rows) - 1)
                    for v, rows in spans.items() for k, (start, end, name) in enumerate(rows))
    ends_at: dict[int, list[int]] = {}
    for _start, v, end, _name, last in events:
        if not (last and v in outputs) and (v, end) not in consumed:
            ends_at.setdefault(end, []).append(v)
    steps: list[Step] = []
    for start, v, _end, name, _last in events:
        steps.append(Step(op="compute", node=v, impl=name))
        steps.extend(Step(op="free", node=u) for u in ends_at.pop(start, []))
    return Schedule(steps=tuple(steps))


__all__ = ["Choice", "Interval", "IntervalModel", "RetentionSpan", "add_covering", "add_first_computation_order",
           "add_precedences", "ancestor_and_descendant_counts", "enforce", "enforcement_literals",
           "first_computation_pairs", "first_computations_in_order", "follow_previous", "hint_choices", "interval_hint", "keep_last_to_end",
           "literal_value", "new_interval", "new_retention_bounds", "pin_absent", "present_intervals",
           "retention_schedule", "retention_spans"]
