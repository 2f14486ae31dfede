"""MONeT's joint choice of recomputation and implementations as a Moccasin-style interval model.

MONeT (Shah, Wu, Chandrashekaran, Goyal, Yu, "Memory Optimization for Deep Networks", ICLR 2021)
chooses, with checkpointing, how each operator runs: which values its backward reads, whether it
runs in place, which algorithm (with its workspace). Its MILP, like Checkmate's, is quadratic in
the graph; coop's stage model (:mod:`coop.formulations.monet.milp`) stays the exact one for small graphs.
This module carries the implementation choice over to Moccasin's O(n) retention-interval model
(Bartan et al., ICML 2023; :mod:`coop.formulations.moccasin.intervals`), so that captured ResNet-50 (about
800 nodes), MobileNetV2, VGG-16, U-Nets and GPT-2 are solved within seconds to minutes:

* per node v up to C retention intervals ``[s_vi, e_vi]`` on the compute-slot axis (the first
  present unless v is ``optional``: then every one may be absent), presence ``p_vi``;
* per interval and implementation q a literal ``x_viq`` with ``sum_q x_viq = p_vi``; the objective is
  ``sum cost_q x_viq`` (the implementation's own cost, first computations included);
* memory: one ``AddCumulative`` over optional retention intervals, one per interval and group of
  implementations with the same output size (presence: the group's literals), and per implementation
  with a workspace an optional unit interval at ``s_vi``; capacity = budget - caller-owned bytes;
* precedence follows the chosen implementation's inputs: when an implementation reading u is
  chosen, ``s_vi`` lies inside a present interval of u (``s_uj < s_vi <= e_uj``); an input read
  by every implementation orders the first computations as Moccasin does;
* in place (``Impl.inplace_of = u``): the covering interval of u ends exactly at ``s_vi``
  (``e_uj = s_vi``: it is that instance's last read, so no later reader) and v's retention interval
  for that choice starts at ``s_vi + 1``: at its step the moved bytes are counted once, as u's;
* first computations of the regular nodes follow ``prompt_order(graph)`` on training-step graphs
  (Checkmate's and the stage model's restriction); optional values may go anywhere.

The model is a *restricted* one (C intervals, the warm start's slots plus a slack), so its optimum
is reported as ``feasible`` with ``extra["restricted_bound"]``, never as ``optimal``; with
``recompute=False`` (MONeT's "implementation choice only" ablation: every node computed once) it
contains every such schedule whose first computations keep the order, and CP-SAT's OPTIMAL there is
reported as ``optimal`` with the space named in the message. Every schedule is checked by
:func:`coop.schedule.simulate`. The interval variables, precedence (:func:`add_covering` with the in-place
end), first-computation order, hints and solution to schedule come from the substrate
:mod:`coop.formulations.intervals.model`, shared with Moccasin's and POET's interval models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.intervals.model import (
    IntervalModel,
    RetentionSpan,
    add_covering,
    add_first_computation_order,
    follow_previous,
    hint_choices,
    interval_hint,
    keep_last_to_end,
    new_interval,
    new_retention_bounds,
    pin_absent,
    present_intervals,
    retention_schedule,
    retention_spans,
)
from coop.formulations.intervals.slots import integer_cost_scale
from coop.formulations.monet.warm import usable_impls
from coop.graph import Graph
from coop.schedule import Schedule, prompt_order

#: One retention interval with its implementation: computed at ``start`` (slot), resident through ``end``.
Span = RetentionSpan


@dataclass(frozen=True)
class Option:
    """One implementation of a node as the model sees it."""

    name: str | None
    cost: int           # scaled integer cost (floored: the model never overstates a cost)
    mem: int
    workspace: int
    reads: tuple[int, ...]   # computed values it reads (caller-owned ones are always resident)
    inplace: int | None


@dataclass
class ImplProblem:
    """The computed nodes (regular ones in ``prompt_order``, then optional values) with their options."""

    graph: Graph
    budget: int
    order: list[int]
    optional: list[int]
    options: dict[int, list[Option]]
    recomputable: dict[int, bool]
    outputs: set[int]
    output_of: dict[int, int]
    capacity: int
    cost_scale: float

    @property
    def nodes(self) -> list[int]:
        return self.order + self.optional

    @classmethod
    def build(cls, graph: Graph, budget: int, exact: bool) -> ImplProblem:
        """The nodes of ``graph`` with their usable implementations under ``budget``.

        Parameters
        ----------
        budget : int
            Bytes, caller-owned values included.
        exact : bool
            Only implementations that compute exactly the same values.

        Returns
        -------
        ImplProblem
        """
        order = list(prompt_order(graph))
        optional = list(graph.optional_ids)
        owned = set(graph.caller_owned_ids)
        raw: dict[int, list[tuple[Any, Any]]] = {}
        for v in order + optional:
            node = graph.node(v)
            raw[v] = [(None, node), *((impl, impl) for impl in usable_impls(graph, node, exact))]
        scale = integer_cost_scale([source.cost for rows in raw.values() for _, source in rows])
        options: dict[int, list[Option]] = {}
        for v, rows in raw.items():
            node = graph.node(v)
            options[v] = [Option(
                name=None if impl is None else impl.name, cost=math.floor(source.cost * scale), mem=source.mem,
                workspace=source.workspace,
                reads=() if node.output_of is not None else tuple(i for i in node.reads(impl) if i not in owned),
                inplace=None if impl is None else impl.inplace_of) for impl, source in rows]
        return cls(graph=graph, budget=budget, order=order, optional=optional, options=options,
                   recomputable={v: graph.node(v).recomputable for v in order + optional},
                   outputs={v for v in graph.outputs if v not in owned},
                   output_of={v: graph.node(v).output_of for v in order if graph.node(v).output_of is not None},
                   capacity=budget - graph.caller_owned_bytes, cost_scale=scale)


# ==================================================================== schedules <-> spans
def schedule_spans(graph: Graph, schedule: Schedule) -> tuple[dict[int, list[Span]], int]:
    """Each node's retention spans on the slot axis (one slot per compute) with the implementation that made it.

    Parameters
    ----------
    schedule : Schedule
        A legal schedule of ``graph``.

    Returns
    -------
    (spans, slots) : tuple
        Per regular and optional node its ``(start, end, implementation)`` in slot order, an instance
        consumed in place ending at its consumer's slot (the model's ``e_uj = s_vi``), and the slot count.
    """
    return retention_spans(graph, schedule, [*graph.order, *graph.optional_ids], in_place=True)


def spans_to_schedule(problem: ImplProblem, spans: dict[int, list[Span]]) -> Schedule:
    """Computes at span starts in slot order (naming their implementation); a free after the slot where a span ends.

    Parameters
    ----------
    spans : dict
        Per node its present spans ``(start, end, implementation)`` in slot order.

    Returns
    -------
    Schedule
        An output's final span is never freed, nor a span consumed in place (already gone).
    """
    consumed: set[tuple[int, int]] = set()
    for v, rows in spans.items():
        for start, _end, name in rows:
            option = next(o for o in problem.options[v] if o.name == name)
            if option.inplace is not None:
                consumed.add((option.inplace, start))  # the instance of u ending at v's slot
    return retention_schedule(spans, problem.outputs, consumed)


# ==================================================================== the CP-SAT model
@dataclass
class ImplModel(IntervalModel):
    """The retention intervals of :class:`IntervalModel` (``p_v0`` True unless v is optional) with MONeT's
    implementation literals ``chosen[v][i][q]``: x_viq."""

    chosen: dict[int, list[list[Any]]] = field(default_factory=dict)


def build_model(problem: ImplProblem, horizon: int, per_node: dict[int, int], keep_order: bool) -> ImplModel:
    """The interval model of the module docstring on ``horizon`` compute slots.

    Parameters
    ----------
    horizon : int
        The number of compute slots.
    per_node : dict
        Per node its number of retention intervals (Moccasin's C).
    keep_order : bool
        First computations of the regular nodes in ``problem.order``; else only the random draws.

    Returns
    -------
    ImplModel

    References
    ----------
    Shah et al., "Memory Optimization for Deep Networks", ICLR 2021; Bartan et al., "Moccasin: Efficient
    Tensor Rematerialization for Neural Networks", ICML 2023.
    """
    model = cp_model.CpModel()
    last = horizon - 1
    rank = {v: k for k, v in enumerate(problem.order)}
    built = ImplModel(model, horizon)
    demands: list[tuple[Any, int]] = []
    slots, cost_terms = [], []
    for v in problem.nodes:
        optional = v not in rank
        lo = rank[v] if keep_order and not optional else 0
        first_hi = last - (len(problem.order) - 1 - rank[v]) if keep_order and not optional else last
        built.lows[v] = lo
        starts, ends, present, chosen = [], [], [], []
        for i in range(per_node[v]):
            s, e = new_retention_bounds(model, v, i, lo, first_hi, last)
            p: Any = True if i == 0 and not optional else model.NewBoolVar(f"p_{v}_{i}")
            model.Add(e >= s)
            x = _implementation_literals(model, problem, v, i, p)
            _add_memory(model, problem, v, s, e, p, x, built, demands)
            slots.append(new_interval(model, s, 1, s + 1, p, f"run_{v}_{i}"))
            if i > 0 or optional:
                pin_absent(model, s, e, p, lo)
            if i > 0:
                follow_previous(model, s, p, ends[-1], present[-1])
            cost_terms.extend(option.cost * (1 if literal is True else literal)
                              for option, literal in zip(problem.options[v], x) if option.cost)
            starts.append(s)
            ends.append(e)
            present.append(p)
            chosen.append(x)
        built.starts[v], built.ends[v], built.present[v], built.chosen[v] = starts, ends, present, chosen
        if v in problem.outputs:  # the last present interval is retained to the end
            keep_last_to_end(model, ends, present, last)
    model.AddNoOverlap(slots)
    if demands:
        model.AddCumulative([d[0] for d in demands], [d[1] for d in demands], max(problem.capacity, 0))
    _add_precedences(problem, built)
    add_first_computation_order(built, problem.graph, problem.order, keep_order)
    model.Minimize(sum(cost_terms))
    return built


def _implementation_literals(model: cp_model.CpModel, problem: ImplProblem, v: int, i: int, p: Any) -> list[Any]:
    """x_viq: exactly one implementation when the interval is present, none when it is absent."""
    options = problem.options[v]
    if len(options) == 1:
        return [p]
    x = [model.NewBoolVar(f"x_{v}_{i}_{q}") for q in range(len(options))]
    model.Add(sum(x) == (1 if p is True else p))
    return x


def _any_of(model: cp_model.CpModel, literals: list[Any], name: str) -> Any:
    """A literal equal to the sum of mutually exclusive ``literals``."""
    if len(literals) == 1:
        return literals[0]
    group = model.NewBoolVar(name)
    model.Add(group == sum(literals))
    return group


def _add_memory(model: cp_model.CpModel, problem: ImplProblem, v: int, s: Any, e: Any, p: Any, x: list[Any],
                built: ImplModel, demands: list[tuple[Any, int]]) -> None:
    """Retention intervals per group of implementations with one output size (in place: from s + 1, the
    step itself holds the overwritten input's bytes), and each implementation's workspace at s."""
    options = problem.options[v]
    horizon = built.horizon
    groups: dict[tuple[int, bool], list[int]] = {}
    for q, option in enumerate(options):
        groups.setdefault((option.mem, option.inplace is not None), []).append(q)
    for (mem, inplace), members in groups.items():
        if mem == 0:
            continue
        literal = p if len(members) == len(options) else _any_of(model, [x[q] for q in members], f"g_{v}_{s.Name()}_{mem}")
        if v in problem.output_of:
            # An extra output exists from right after its op's first compute (contract 2).
            op_start = built.starts[problem.output_of[v]][0]
            size = model.NewIntVar(1, horizon, f"len_{v}_{s.Name()}")
            demands.append((new_interval(model, op_start + 1, size, e + 1, literal, f"keep_{v}"), mem))
            continue
        size = model.NewIntVar(0, horizon, f"len_{s.Name()}_{mem}_{inplace}")
        start = s + 1 if inplace else s
        demands.append((new_interval(model, start, size, e + 1, literal, f"keep_{s.Name()}_{mem}"), mem))
    for q, option in enumerate(options):
        if option.workspace:
            demands.append((new_interval(model, s, 1, s + 1, x[q], f"ws_{s.Name()}_{q}"), option.workspace))


def _add_precedences(problem: ImplProblem, built: ImplModel) -> None:
    """A chosen implementation's inputs are resident at its slot; an in-place one ends its input's instance there."""
    model = built.model
    for v in problem.nodes:
        options = problem.options[v]
        if v in problem.output_of:
            model.Add(built.starts[problem.output_of[v]][0] < built.starts[v][0])
            continue
        for u in sorted({u for o in options for u in o.reads}):
            readers = [q for q, o in enumerate(options) if u in o.reads]
            in_place = [q for q, o in enumerate(options) if o.inplace == u]
            every = len(readers) == len(options)
            if every and u not in problem.optional and v not in problem.optional:
                model.Add(built.starts[u][0] < built.starts[v][0])  # v's first compute reads u's first instance
            for i in range(len(built.starts[v])):
                x = built.chosen[v][i]
                reading = built.present[v][i] if every else _any_of(model, [x[q] for q in readers], f"r_{u}_{v}_{i}")
                add_covering(built, u, v, i, [reading], optional_first=u in problem.optional,
                             in_place=[x[q] for q in in_place])


def add_hint(problem: ImplProblem, built: ImplModel, spans: dict[int, list[Span]]) -> None:
    """A complete hint: every s, e, p, x and precedence choice of the warm-start schedule.

    Parameters
    ----------
    spans : dict
        The warm start's spans (:func:`schedule_spans`); an output's final span is hinted to reach the
        horizon's last slot, as the model has it.
    """
    model = built.model
    options = problem.options
    for v, starts in built.starts.items():
        rows = spans.get(v, [])
        for i, s in enumerate(starts):
            present, start, end = interval_hint(rows, i, built.lows[v], built.horizon - 1, v in problem.outputs)
            name = rows[i][2] if present else None
            model.AddHint(s, start)
            model.AddHint(built.ends[v][i], end)
            if built.present[v][i] is not True:
                model.AddHint(built.present[v][i], present)
            x = built.chosen[v][i]
            if len(x) > 1:
                for q, literal in enumerate(x):
                    model.AddHint(literal, bool(present and options[v][q].name == name))
    hint_choices(built, spans)


def solution_spans(solver: cp_model.CpSolver, problem: ImplProblem, built: ImplModel) -> dict[int, list[Span]]:
    """The present intervals of a solution with their chosen implementations.

    Parameters
    ----------
    solver : CpSolver
        Holding a solution of ``built.model``.

    Returns
    -------
    dict
        Per node its ``(s_vi, e_vi, implementation)`` in slot order.
    """
    result: dict[int, list[Span]] = {}
    for v, rows in present_intervals(solver, built).items():
        result[v] = []
        for i, start, end in rows:
            x = built.chosen[v][i]
            q = next(q for q, literal in enumerate(x) if literal is True or solver.BooleanValue(literal))
            result[v].append((start, end, problem.options[v][q].name))
    return result


__all__ = ["ImplModel", "ImplProblem", "Option", "Span", "add_hint", "build_model", "schedule_spans",
           "solution_spans", "spans_to_schedule"]
