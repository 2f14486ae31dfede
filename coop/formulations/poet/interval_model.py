"""POET's interval model on CP-SAT (the model of :mod:`coop.formulations.poet.intervals`): retention spans
that a compute or a page-in starts, the price coefficients, :func:`build_model`, hints, and a solution's
spans back to a schedule.

The solve around it (setting, warm starts, fallbacks) is :mod:`coop.formulations.poet.intervals`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.intervals.model import (
    IntervalModel,
    add_first_computation_order,
    add_precedences,
    ancestor_and_descendant_counts,
    enforcement_literals,
    follow_previous,
    hint_choices,
    interval_hint,
    keep_last_to_end,
    literal_value,
    new_interval,
    new_retention_bounds,
    pin_absent,
    present_intervals,
)
from coop.formulations.intervals.slots import SlotProblem
from coop.formulations.poet.setting import (
    node_price,
)
from coop.graph import Graph
from coop.schedule import Schedule, Step, simulate, take_extras_promptly

#: The largest price coefficient of the objective becomes this many integer units.
OBJECTIVE_RESOLUTION = 1e8
#: The runtime budget becomes this many integer units of seconds.
RUNTIME_RESOLUTION = 1e12

#: One residency interval on the slot axis: (first slot, last slot, started by a page-in).
Span = tuple[int, int, bool]


# ==================================================================== schedules <-> spans
def schedule_spans(graph: Graph, schedule: Schedule) -> tuple[dict[int, list[Span]], int] | None:
    """Each computed value's device-residency intervals on the slot axis, and the number of computes.

    From the simulator's instances: each stay of an instance on the device is one span; the first
    starts at the instance's compute, the others with a page-in (at the slot of the next compute). A
    stay with no compute in it is dropped (it changes no compute's memory), except an output's last,
    which is kept to the end.

    Returns
    -------
    (spans, count) or None
        Per computed value its ``(start, end, paged_in)`` in slot order and the number of computes; None if
        the schedule pages a caller-owned value (the model never does).
    """
    schedule = take_extras_promptly(graph, schedule)
    sim = simulate(graph, schedule)
    if any(len(device) != 1 for device in sim.owned_device.values()):
        return None
    computes_before, slot_at, count = [], [], 0
    for step in schedule.steps:
        computes_before.append(count)
        count += step.op == "compute"
        slot_at.append(count - 1)
    spans: dict[int, list[Span]] = {v: [] for v in graph.order}
    final = {inst.node: k for k, inst in enumerate(sim.instances)}
    for k, inst in enumerate(sim.instances):
        for piece, (first, last) in enumerate(inst.device):
            start = slot_at[inst.computed_at] if piece == 0 else computes_before[first]
            end = slot_at[last]
            kept_to_end = inst.node in graph.outputs and final[inst.node] == k and piece == len(inst.device) - 1
            if end < start and not kept_to_end:
                continue
            spans.setdefault(inst.node, []).append((start, max(start, end), piece > 0))
    return spans, count


def spans_to_schedule(problem: SlotProblem, spans: dict[int, list[Span]]) -> Schedule:
    """Per slot: its page-ins, its compute, then the page-outs and frees of the intervals ending there.

    Parameters
    ----------
    spans : dict
        Per computed value its present ``(start, end, paged_in)`` in slot order.

    Returns
    -------
    Schedule
        An interval followed by a page-in interval ends with a page-out; an output's last interval is
        kept to the end; every other interval ends with a free.
    """
    events: list[tuple[int, int, int, str]] = []
    for v, own in spans.items():
        for k, (start, end, paged_in) in enumerate(own):
            events.append((start, 0 if paged_in else 1, v, "page_in" if paged_in else "compute"))
            following = own[k + 1] if k + 1 < len(own) else None
            if following is not None and following[2]:
                events.append((end, 2, v, "page_out"))
            elif following is not None or v not in problem.outputs:
                events.append((end, 2, v, "free"))
    events.sort(key=lambda event: event[:3])
    return Schedule(steps=tuple(Step(op=op, node=v) for _, _, v, op in events))  # type: ignore[arg-type]


# ==================================================================== the CP-SAT model
@dataclass(frozen=True)
class Coefficients:
    """Integer prices per computed value: one recomputation, one page-out + page-in, and their seconds."""

    compute: dict[int, int]
    paging: dict[int, int]
    scale: float
    compute_s: dict[int, int]
    paging_s: dict[int, int]
    seconds_scale: float

    @classmethod
    def build(cls, setting: Any, order: list[int]) -> Coefficients:
        prices = {v: node_price(float(setting.graph.node(v).cost), setting.graph.node(v).mem, setting.profile)
                  for v in order}
        objective = setting.objective
        compute = {v: p.compute(objective) for v, p in prices.items()}
        paging = {v: p.pagein(objective) + p.pageout(objective) for v, p in prices.items()}
        largest = max([*compute.values(), *paging.values(), 0.0])
        scale = OBJECTIVE_RESOLUTION / largest if largest > 0 else 1.0
        baseline_s = sum(p.compute_s for p in prices.values())
        seconds_scale = RUNTIME_RESOLUTION / baseline_s if baseline_s > 0 else 1.0
        return cls({v: math.floor(c * scale) for v, c in compute.items()},
                   {v: math.floor(c * scale) for v, c in paging.items()}, scale,
                   {v: math.ceil(p.compute_s * seconds_scale) for v, p in prices.items()},
                   {v: math.ceil((p.pagein_s + p.pageout_s) * seconds_scale) for v, p in prices.items()},
                   seconds_scale)


@dataclass
class PoetIntervalModel(IntervalModel):
    """The residency intervals of :class:`IntervalModel` (``present[v][0]`` is True) with POET's kinds."""

    computed: dict[int, list[Any]] = field(default_factory=dict)  # c_vi: True, False or a literal
    paged: dict[int, list[Any]] = field(default_factory=dict)     # g_vi: True, False or a literal
    sizes: dict[int, list[Any]] = field(default_factory=dict)     # residency lengths (hinted: a complete hint)
    overflow: Any = None  # bytes over the budget, when the capacity is relaxed


def _kinds(built: PoetIntervalModel, v: int, i: int, can_recompute: bool, can_page: bool, p: Any) -> tuple[Any, Any]:
    """(c_vi, g_vi) of interval i: the first is computed; later ones are a recomputation or a page-in."""
    if i == 0:
        return True, False
    if can_recompute and can_page:
        c, g = built.model.NewBoolVar(f"c_{v}_{i}"), built.model.NewBoolVar(f"g_{v}_{i}")
        built.model.Add(c + g == p)
        return c, g
    return (p, False) if can_recompute else (False, p)


def build_model(problem: SlotProblem, coefficients: Coefficients, horizon: int, per_node: dict[int, int],
                setting: Any, keep_order: bool, relax_memory: bool = False) -> PoetIntervalModel:
    """The interval model (s_vi, e_vi, p_vi, c_vi, g_vi) on ``horizon`` slots; see :mod:`coop.formulations.poet.intervals`'s docstring.

    Parameters
    ----------
    coefficients : Coefficients
        The integer prices.
    horizon : int
        The number of compute slots.
    per_node : dict
        Per value its number of residency intervals (Moccasin's C).
    setting : PoetSetting
        POET's options (remat, paging, runtime budget).
    keep_order : bool
        First computations in ``problem.order``; else only the random draws.
    relax_memory : bool
        The capacity is a variable and the objective is the overflow over the budget alone: the baseline
        order is then a feasible start and CP-SAT walks the peak down to the budget.

    Returns
    -------
    PoetIntervalModel

    References
    ----------
    Patil et al., "POET: Training Neural Networks on Tiny Devices with Integrated Rematerialization and
    Paging", ICML 2022; Bartan et al., "Moccasin: Efficient Tensor Rematerialization for Neural Networks",
    ICML 2023 (the interval model, :mod:`coop.formulations.intervals.model`).
    """
    model = cp_model.CpModel()
    built = PoetIntervalModel(model, horizon)
    last = horizon - 1
    n_anc, n_desc = ancestor_and_descendant_counts(problem)
    residency, demands, runs = [], [], []
    objective, seconds = [], []
    for v in problem.order:
        lo = built.lows[v] = n_anc[v]
        can_recompute = setting.remat and problem.recomputable[v]
        can_page = may_page(setting, problem, v)
        for name in ("starts", "ends", "present", "computed", "paged", "sizes"):
            getattr(built, name)[v] = []
        for i in range(per_node[v]):
            s, e = new_retention_bounds(model, v, i, lo, last - n_desc[v], last)
            p = True if i == 0 else model.NewBoolVar(f"p_{v}_{i}")
            c, g = _kinds(built, v, i, can_recompute, can_page, p)
            size = model.NewIntVar(1, horizon, f"len_{v}_{i}")
            if v in problem.output_of and i == 0:  # an extra output exists from right after its op's first compute
                model.Add(e >= s)
                residency.append(model.NewIntervalVar(built.starts[problem.output_of[v]][0] + 1, size, e + 1, f"r_{v}"))
            else:
                residency.append(new_interval(model, s, size, e + 1, p, f"r_{v}_{i}"))
            demands.append(problem.mem[v])
            if c is not False:
                run = (model.NewFixedSizeIntervalVar(s, 1, f"run_{v}_{i}") if c is True
                       else model.NewOptionalFixedSizeIntervalVar(s, 1, c, f"run_{v}_{i}"))
                runs.append(run)
                if problem.workspace[v]:
                    residency.append(run)
                    demands.append(problem.workspace[v])
            seconds.append((c, coefficients.compute_s[v]))
            if i > 0:
                follow_previous(model, s, p, built.ends[v][-1], built.present[v][-1])
                pin_absent(model, s, e, p, lo)
                objective += [(c, coefficients.compute[v]), (g, coefficients.paging[v])]
                seconds.append((g, coefficients.paging_s[v]))
            for name, value in zip(("starts", "ends", "present", "computed", "paged", "sizes"), (s, e, p, c, g, size),
                                   strict=True):
                getattr(built, name)[v].append(value)
        if v in problem.outputs:  # the last present interval is kept to the end
            keep_last_to_end(model, built.ends[v], built.present[v], last)
    model.AddNoOverlap(runs)
    if relax_memory:
        most = max(sum(demands), problem.capacity)
        capacity = model.NewIntVar(0, most, "capacity")
        built.overflow = model.NewIntVar(0, max(0, most - problem.capacity), "overflow")
        model.Add(built.overflow >= capacity - problem.capacity)
        model.AddCumulative(residency, demands, capacity)
        model.AddHint(capacity, most)  # any hint fits the largest capacity: the hint stays complete
        model.AddHint(built.overflow, most - problem.capacity)
    else:
        model.AddCumulative(residency, demands, problem.capacity)
    # A compute interval of v reads its inputs (a page-in interval reads nothing); a value paged in at slot s
    # is readable at s, a computed one from s + 1.
    add_precedences(problem, built, lambda v, i: enforcement_literals(built.computed[v][i]), paged=built.paged)
    add_first_computation_order(built, problem.graph, problem.order, keep_order)
    if setting.runtime_budget is not None:
        limit = setting.runtime_budget * setting.graph.baseline_cost  # poet's: compute and paging seconds
        model.Add(_linear(seconds) <= math.floor(limit * (1 + 1e-9) * coefficients.seconds_scale))
    model.Minimize(built.overflow if relax_memory else _linear(objective))
    return built


def _linear(terms: list[tuple[Any, int]]) -> Any:
    """sum coef x lit over terms whose literal may be a constant True/False."""
    return sum(coef * (1 if lit is True else lit) for lit, coef in terms if lit is not False and coef)


def add_hint(built: PoetIntervalModel, spans: dict[int, list[Span]], problem: SlotProblem) -> None:
    """A complete hint from the warm start's spans: every s, e, p, c, g and precedence choice.

    Parameters
    ----------
    spans : dict
        The warm start's spans (:func:`schedule_spans`).
    """
    model, outputs = built.model, problem.outputs
    hinted: set[int] = set()  # c_vi or g_vi may be p_vi itself: hint each variable once

    def hint(var: Any, value: int | bool) -> None:
        if var is not True and var is not False and var.Index() not in hinted:
            hinted.add(var.Index())
            model.AddHint(var, value)

    for v in problem.order:
        own = spans.get(v, [])
        for i, s in enumerate(built.starts[v]):
            present, start, end = interval_hint(own, i, built.lows[v], built.horizon - 1, v in outputs)
            model.AddHint(s, start)
            model.AddHint(built.ends[v][i], end)
            if present:
                first = spans[problem.output_of[v]][0][0] + 1 if v in problem.output_of and i == 0 else start
                model.AddHint(built.sizes[v][i], end + 1 - first)
                paged_in = own[i][2]
                hint(built.present[v][i], True)
                hint(built.computed[v][i], not paged_in)
                hint(built.paged[v][i], paged_in)
            else:
                model.AddHint(built.sizes[v][i], 1)
                for var in (built.present[v][i], built.computed[v][i], built.paged[v][i]):
                    hint(var, False)
    hint_choices(built, spans, covers=_readable_at)


def _readable_at(span: Span, slot: int) -> bool:
    """Whether u's span makes it readable at ``slot``: a paged-in value from its own slot, a computed one after."""
    start, end, paged_in = span
    return start + (0 if paged_in else 1) <= slot <= end


def solution_spans(solver: cp_model.CpSolver, built: PoetIntervalModel) -> dict[int, list[Span]]:
    """The present residency intervals of a solution, each with whether a page-in starts it.

    Parameters
    ----------
    solver : CpSolver
        Its last solve found a solution (OPTIMAL or FEASIBLE).

    Returns
    -------
    dict
        Per computed value its ``(s_vi, e_vi, g_vi)`` in slot order.
    """
    return {v: [(start, end, literal_value(solver, built.paged[v][i])) for i, start, end in rows]
            for v, rows in present_intervals(solver, built).items()}


def may_page(setting: Any, problem: SlotProblem, v: int) -> bool:
    """Whether v may get page-in intervals: paging allowed, bytes to move, and v on an accelerator
    (:meth:`Graph.pageable`: a host value of a CUDA step is never paged; the validator refuses it).

    Parameters
    ----------
    setting : PoetSetting
        POET's setting (:func:`coop.formulations.poet.setting.poet_setting`): whether paging is allowed, the graph.

    Returns
    -------
    bool
        Whether the model gives v page-in intervals.
    """
    return setting.paging and problem.mem[v] > 0 and setting.graph.pageable(v)
