"""MONeT's joint choice of recomputation and implementations as a Moccasin-style interval model.

MONeT (Shah, Wu, Chandrashekaran, Goyal, Yu, "Memory Optimization for Deep Networks", ICLR 2021)
chooses, with checkpointing, how each operator runs: which values its backward reads, whether it
runs in place, which algorithm (with its workspace). Its MILP, like Checkmate's, is quadratic in
the graph; coop's stage model (:mod:`coop.formulations.monet`) stays the exact one for small graphs.
This module carries the implementation choice over to Moccasin's O(n) retention-interval model
(Bartan et al., ICML 2023; :mod:`coop.formulations.moccasin`), so that captured ResNet-50 (about
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
:func:`coop.schedule.simulate`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.monet_warm import usable_impls
from coop.formulations.slot_problem import integer_cost_scale
from coop.graph import Graph
from coop.schedule import Schedule, Step, ordered_first_computations, prompt_order, simulate, take_extras_promptly

#: One retention interval with its implementation: computed at ``start`` (slot), resident through ``end``.
Span = tuple[int, int, str | None]


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
    """Each node's retention spans on the slot axis (one slot per compute) with the implementation that
    made it, and the slot count. An instance consumed in place ends at its consumer's slot (the model's
    ``e_uj = s_vi``)."""
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
            impl = graph.node(step.node).implementation(step.impl)
            if impl is not None and impl.inplace_of is not None:
                consumed_at[current[impl.inplace_of]] = slot
            current[step.node] = len(impl_of)
            impl_of.append(step.impl)
        slot_of_step.append(max(slot, 0))
    spans: dict[int, list[Span]] = {v: [] for v in graph.order}
    spans.update({v: [] for v in graph.optional_ids})
    for k, inst in enumerate(sim.instances):
        end = consumed_at.get(k, slot_of_step[inst.end])
        spans[inst.node].append((slot_of_step[inst.computed_at], end, impl_of[k]))
    for rows in spans.values():
        rows.sort()
    return spans, slot + 1


def spans_to_schedule(problem: ImplProblem, spans: dict[int, list[Span]]) -> Schedule:
    """Computes at span starts in slot order (naming their implementation); a free after the slot where a
    span ends, except an output's final span and a span consumed in place (already gone)."""
    consumed: set[tuple[int, int]] = set()
    for v, rows in spans.items():
        for start, _end, name in rows:
            option = next(o for o in problem.options[v] if o.name == name)
            if option.inplace is not None:
                consumed.add((option.inplace, start))  # the instance of u ending at v's slot
    events = sorted((start, v, end, name, k == len(rows) - 1)
                    for v, rows in spans.items() for k, (start, end, name) in enumerate(rows))
    ends_at: dict[int, list[int]] = {}
    for _start, v, end, _name, last in events:
        if not (last and v in problem.outputs) and (v, end) not in consumed:
            ends_at.setdefault(end, []).append(v)
    steps: list[Step] = []
    for start, v, _end, name, _last in events:
        steps.append(Step(op="compute", node=v, impl=name))
        steps.extend(Step(op="free", node=u) for u in ends_at.pop(start, []))
    return Schedule(steps=tuple(steps))


# ==================================================================== the CP-SAT model
@dataclass
class ImplModel:
    model: cp_model.CpModel
    horizon: int
    starts: dict[int, list[Any]]
    ends: dict[int, list[Any]]
    present: dict[int, list[Any]]
    chosen: dict[int, list[list[Any]]]   # chosen[v][i][q]: x_viq
    lows: dict[int, int]
    choices: list[tuple[int, int, int, list[Any]]] = field(default_factory=list)  # (u, v, i, b_j)


def build_model(problem: ImplProblem, horizon: int, per_node: dict[int, int], keep_order: bool) -> ImplModel:
    """The interval model of the module docstring on ``horizon`` compute slots, ``per_node`` intervals each."""
    model = cp_model.CpModel()
    last = horizon - 1
    rank = {v: k for k, v in enumerate(problem.order)}
    built = ImplModel(model, horizon, {}, {}, {}, {}, {})
    demands: list[tuple[Any, int]] = []
    slots, cost_terms = [], []
    for v in problem.nodes:
        optional = v not in rank
        lo = rank[v] if keep_order and not optional else 0
        first_hi = last - (len(problem.order) - 1 - rank[v]) if keep_order and not optional else last
        built.lows[v] = lo
        starts, ends, present, chosen = [], [], [], []
        for i in range(per_node[v]):
            s = model.NewIntVar(lo, first_hi if i == 0 else last, f"s_{v}_{i}")
            e = model.NewIntVar(lo, last, f"e_{v}_{i}")
            p: Any = True if i == 0 and not optional else model.NewBoolVar(f"p_{v}_{i}")
            model.Add(e >= s)
            x = _implementation_literals(model, problem, v, i, p)
            _add_memory(model, problem, v, s, e, p, x, built, demands)
            slots.append(_interval(model, s, 1, s + 1, p, f"run_{v}_{i}"))
            if i > 0 or optional:
                model.Add(s == lo).OnlyEnforceIf(p.Not())  # absent intervals pinned: no symmetric copies
                model.Add(e == lo).OnlyEnforceIf(p.Not())
            if i > 0:
                if present[-1] is not True:
                    model.AddImplication(p, present[-1])
                model.Add(s > ends[-1]).OnlyEnforceIf(p)
            cost_terms.extend(option.cost * (1 if literal is True else literal)
                              for option, literal in zip(problem.options[v], x) if option.cost)
            starts.append(s)
            ends.append(e)
            present.append(p)
            chosen.append(x)
        built.starts[v], built.ends[v], built.present[v], built.chosen[v] = starts, ends, present, chosen
        if v in problem.outputs:  # the last present interval is retained to the end
            for i in range(per_node[v]):
                later = [present[i + 1].Not()] if i + 1 < per_node[v] else []
                _enforce(model.Add(ends[i] == last), [present[i], *later])
    model.AddNoOverlap(slots)
    if demands:
        model.AddCumulative([d[0] for d in demands], [d[1] for d in demands], max(problem.capacity, 0))
    _add_precedences(problem, built)
    _add_order(problem, built, keep_order)
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
            demands.append((_interval(model, op_start + 1, size, e + 1, literal, f"keep_{v}"), mem))
            continue
        size = model.NewIntVar(0, horizon, f"len_{s.Name()}_{mem}_{inplace}")
        start = s + 1 if inplace else s
        demands.append((_interval(model, start, size, e + 1, literal, f"keep_{s.Name()}_{mem}"), mem))
    for q, option in enumerate(options):
        if option.workspace:
            demands.append((_interval(model, s, 1, s + 1, x[q], f"ws_{s.Name()}_{q}"), option.workspace))


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
                _covered(model, built, u, v, i, reading, [x[q] for q in in_place])


def _covered(model: cp_model.CpModel, built: ImplModel, u: int, v: int, i: int, reading: Any,
             in_place: list[Any]) -> None:
    """When ``reading``: s_vi lies in a present interval of u (b_j picks it); under an in-place literal
    that interval ends at s_vi."""
    s_v = built.starts[v][i]
    chosen = []
    for j, (s_u, e_u, p_u) in enumerate(zip(built.starts[u], built.ends[u], built.present[u])):
        if len(built.starts[u]) == 1 and p_u is True:
            b = reading
        else:
            b = model.NewBoolVar(f"b_{u}_{j}_{v}_{i}")
            if p_u is not True:
                model.AddImplication(b, p_u)
            chosen.append(b)
        _enforce(model.Add(s_u < s_v), [b])
        _enforce(model.Add(e_u >= s_v), [b])
        for literal in in_place:
            _enforce(model.Add(e_u == s_v), [b, literal])
    if chosen:
        _enforce(model.AddBoolOr(chosen), [reading])
        built.choices.append((u, v, i, chosen))


def _enforce(constraint: Any, literals: list[Any]) -> None:
    """Enforce ``constraint`` under the literals that are not the constant True (all of them: always)."""
    variables = [literal for literal in literals if literal is not True]
    if variables:
        constraint.OnlyEnforceIf(variables)


def _interval(model: cp_model.CpModel, start: Any, size: Any, end: Any, presence: Any, name: str) -> Any:
    if presence is True:
        return model.NewIntervalVar(start, size, end, name)
    return model.NewOptionalIntervalVar(start, size, end, presence, name)


def _add_order(problem: ImplProblem, built: ImplModel, keep_order: bool) -> None:
    """First computations in the baseline order (or, without ``keep_order``, the random draws in it)."""
    order = ordered_first_computations(problem.graph, problem.order, keep_order)
    for a, b in itertools.pairwise(order):
        built.model.Add(built.starts[a][0] < built.starts[b][0])


def add_hint(problem: ImplProblem, built: ImplModel, spans: dict[int, list[Span]]) -> None:
    """A complete hint: every s, e, p, x and precedence choice of the warm-start schedule (an output's
    final span reaching the horizon's last slot, as the model has it)."""
    model = built.model
    options = problem.options
    for v, starts in built.starts.items():
        rows = spans.get(v, [])
        for i, s in enumerate(starts):
            present = i < len(rows)
            start, end, name = rows[i] if present else (built.lows[v], built.lows[v], None)
            if present and v in problem.outputs and i == len(rows) - 1:
                end = built.horizon - 1
            model.AddHint(s, start)
            model.AddHint(built.ends[v][i], end)
            if built.present[v][i] is not True:
                model.AddHint(built.present[v][i], present)
            x = built.chosen[v][i]
            if len(x) > 1:
                for q, literal in enumerate(x):
                    model.AddHint(literal, bool(present and options[v][q].name == name))
    for u, v, i, chosen in built.choices:
        covering = None
        rows = spans.get(v, [])
        if i < len(rows):
            s_v = rows[i][0]
            covering = next((j for j, (s, e, _) in enumerate(spans.get(u, [])) if s < s_v <= e), None)
        for j, b in enumerate(chosen):
            model.AddHint(b, j == covering)


def solution_spans(solver: cp_model.CpSolver, problem: ImplProblem, built: ImplModel) -> dict[int, list[Span]]:
    """The present intervals of a solution with their chosen implementations."""
    result: dict[int, list[Span]] = {}
    for v in built.starts:
        rows = []
        for s, e, p, x in zip(built.starts[v], built.ends[v], built.present[v], built.chosen[v]):
            if p is True or solver.BooleanValue(p):
                q = next(q for q, literal in enumerate(x) if literal is True or solver.BooleanValue(literal))
                rows.append((solver.Value(s), solver.Value(e), problem.options[v][q].name))
        result[v] = rows
    return result


__all__ = ["ImplModel", "ImplProblem", "Option", "Span", "add_hint", "build_model", "schedule_spans",
           "solution_spans", "spans_to_schedule"]
