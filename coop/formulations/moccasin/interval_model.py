"""Moccasin's CP-SAT model (Bartan et al., ICML 2023): :func:`build_model` makes the retention intervals,
the cumulative memory and the precedences on :mod:`coop.formulations.intervals.model`; schedules become
intervals (hints) and a solution's intervals become a schedule; what a proof model may cost.

The solve around it (warm starts, rounds, the result) is :mod:`coop.formulations.moccasin.intervals`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from coop.formulations.intervals.model import (
    Interval,
    IntervalModel,
    add_first_computation_order,
    add_precedences,
    ancestor_and_descendant_counts,
    follow_previous,
    hint_choices,
    interval_hint,
    keep_last_to_end,
    new_retention_bounds,
    pin_absent,
    present_intervals,
    retention_schedule,
    retention_spans,
)
from coop.formulations.intervals.slots import SlotProblem
from coop.graph import Graph
from coop.schedule import Schedule

# ==================================================================== what a proof of optimality needs
#: Above this many retention intervals in all, the model that would prove optimality is not built.
PROOF_MAX_INTERVALS_FACTOR = 8
#: Above this many precedence choice literals, the model that would prove optimality is not built.
PROOF_MAX_CHOICES = 60_000


def _choice_literals(problem: SlotProblem, per_node: dict[int, int]) -> int:
    """How many precedence choice literals :func:`add_covering` creates for ``per_node``."""
    return sum(per_node[v] * per_node[u] for v in problem.order for u in problem.inputs[v] if per_node[u] > 1)


def proof_model_affordable(problem: SlotProblem, per_node: dict[int, int], horizon: int) -> bool:
    """Whether a model of these intervals and horizon stays small enough to build for a proof.

    Parameters
    ----------
    per_node : dict
        Per node its number of retention intervals.
    horizon : int
        The number of compute slots.

    Returns
    -------
    bool
        At most PROOF_MAX_INTERVALS_FACTOR intervals per node on average, a horizon of at most that many
        slots per node, and at most PROOF_MAX_CHOICES precedence choice literals.
    """
    n = len(problem.order)
    return (sum(per_node.values()) <= PROOF_MAX_INTERVALS_FACTOR * n and horizon <= PROOF_MAX_INTERVALS_FACTOR * n
            and _choice_literals(problem, per_node) <= PROOF_MAX_CHOICES)


# ==================================================================== schedules <-> intervals
def schedule_intervals(graph: Graph, schedule: Schedule) -> tuple[dict[int, list[Interval]], int]:
    """Each node's retention intervals on the slot axis (one slot per compute) and the slot count.

    Parameters
    ----------
    schedule : Schedule
        The warm start (legal under contract 2) whose intervals hint the model.

    Returns
    -------
    (intervals, slots) : tuple
        Per node of ``graph.order`` its ``(s_vi, e_vi)`` in slot order (:func:`retention_spans`: exactly the
        simulator's instances, each extra output taken right after its op), and the number of computes.
    """
    spans, slots = retention_spans(graph, schedule, graph.order, in_place=False)
    return {v: [(start, end) for start, end, _ in rows] for v, rows in spans.items()}, slots


def intervals_to_schedule(problem: SlotProblem, intervals: dict[int, list[Interval]]) -> Schedule:
    """Computes at interval starts in time order; a free after the slot where an interval ends.

    Parameters
    ----------
    intervals : dict
        Per node its present intervals ``(s_vi, e_vi)`` in slot order.

    Returns
    -------
    Schedule
        The final interval of a graph output is never freed (it must be resident at the end).
    """
    return retention_schedule({v: [(start, end, None) for start, end in ivs] for v, ivs in intervals.items()},
                              problem.outputs)


# ==================================================================== the CP-SAT model
@dataclass
class MoccasinModel(IntervalModel):
    """The Moccasin model: s_vi, e_vi, p_vi of :class:`IntervalModel` (``p_v0`` the constant 1), the extra
    cost ``sum cost_v p_vi`` over the recomputations and, with a relaxed capacity, the overflow."""

    extra_cost: Any = 0
    overflow: Any = None  # set when the memory capacity is relaxed (see build_model)


def build_model(problem: SlotProblem, horizon: int, intervals_per_node: dict[int, int], keep_order: bool,
                relax_memory: bool = False) -> MoccasinModel:
    """The Moccasin model (the paper's s_vi, e_vi, p_vi) on ``horizon`` compute slots.

    Parameters
    ----------
    horizon : int
        The number of compute slots.
    intervals_per_node : dict
        Per node its number of retention intervals (the paper's C, 1 for a non-recomputable node).
    keep_order : bool
        First computations in ``problem.order`` (Checkmate's restriction); else only the random draws.
    relax_memory : bool
        The cumulative's capacity becomes a variable and the objective adds ``weight x overflow`` over the
        budget, with weight above any total cost: every solution with less overflow is better, so a
        feasible start (store-all) always exists and CP-SAT's search walks the peak down to the budget
        before it trades cost. Its bound stays a valid bound on the cost of the unrelaxed model (whose
        solutions are those with zero overflow).

    Returns
    -------
    MoccasinModel

    References
    ----------
    Bartan et al., "Moccasin: Efficient Tensor Rematerialization for Neural Networks", ICML 2023.
    """
    built = MoccasinModel(cp_model.CpModel(), horizon)
    model = built.model
    last = horizon - 1
    n_anc, n_desc = ancestor_and_descendant_counts(problem)
    retention, demands, compute_slots = [], [], []
    cost_terms = []
    for v in problem.order:
        lo = built.lows[v] = n_anc[v]
        starts: list[Any] = []
        ends: list[Any] = []
        present: list[Any] = []
        built.starts[v], built.ends[v], built.present[v] = starts, ends, present
        for i in range(intervals_per_node[v]):
            # Retention interval i of v: [s_vi, e_vi], present when p_vi (the first one always).
            s, e = new_retention_bounds(model, v, i, lo, last - n_desc[v], last)
            p = model.NewConstant(1) if i == 0 else model.NewBoolVar(f"p_{v}_{i}")
            size = model.NewIntVar(1, horizon, f"len_{v}_{i}")
            if v in problem.output_of:
                # An extra output exists from right after its op's first compute (contract 2),
                # wherever its own (free) compute slot lies; it reads nothing.
                op_start = built.starts[problem.output_of[v]][0]
                model.Add(e >= s)
                retention.append(model.NewIntervalVar(op_start + 1, size, e + 1, f"keep_{v}_{i}"))
            else:
                retention.append(model.NewOptionalIntervalVar(s, size, e + 1, p, f"keep_{v}_{i}"))
            demands.append(problem.mem[v])
            unit = model.NewOptionalFixedSizeIntervalVar(s, 1, p, f"run_{v}_{i}")  # its compute, at s_vi
            compute_slots.append(unit)
            if problem.workspace[v]:
                retention.append(unit)
                demands.append(problem.workspace[v])
            if i > 0:
                follow_previous(model, s, p, ends[-1], present[-1])
                pin_absent(model, s, e, p, lo)
                cost_terms.append(problem.cost[v] * p)  # a recomputation costs cost_v
            starts.append(s)
            ends.append(e)
            present.append(p)
        if v in problem.outputs:
            keep_last_to_end(model, ends, present, last)
    model.AddNoOverlap(compute_slots)  # one compute per slot
    built.extra_cost = sum(cost_terms)
    objective = built.extra_cost
    # Memory: one cumulative over the retention intervals (and workspaces), capacity budget - caller-owned bytes.
    if relax_memory:
        most = sum(problem.mem.values()) + sum(problem.workspace.values())
        capacity = model.NewIntVar(0, max(most, problem.capacity), "capacity")
        overflow = model.NewIntVar(0, max(most - problem.capacity, 0), "overflow")
        model.Add(overflow >= capacity - problem.capacity)
        model.AddCumulative(retention, demands, capacity)
        weight = sum(problem.cost.values()) * max(intervals_per_node.values()) + 1
        objective = objective + weight * overflow
        built.overflow = overflow
    elif retention:
        model.AddCumulative(retention, demands, problem.capacity)
    # Precedence: every present interval of v is computed inside a present interval of each input u.
    add_precedences(problem, built, lambda v, i: [] if i == 0 else [built.present[v][i]])
    # Random ops (Node.random) draw in the captured order even without keep_order, or the replay would
    # draw different numbers than eager PyTorch.
    add_first_computation_order(built, problem.graph, problem.order, keep_order)
    model.Minimize(objective)
    return built


def add_hint(built: MoccasinModel, intervals: dict[int, list[Interval]], outputs: set[int]) -> None:
    """A complete hint: every s, e, p and precedence choice of the warm-start schedule.

    The model retains an output's last interval to its last slot (``horizon - 1``), which lies past
    the warm start's own last slot when the horizon has slack: the hint ends it there too, or the
    hint would be infeasible from the start.

    Parameters
    ----------
    intervals : dict
        Per node its warm start's intervals (:func:`schedule_intervals`).
    outputs : set of int
        The graph's outputs.
    """
    model = built.model
    for v, ivs in intervals.items():
        for i, s in enumerate(built.starts[v]):
            present, start, end = interval_hint(ivs, i, built.lows[v], built.horizon - 1, v in outputs)
            model.AddHint(s, start)
            model.AddHint(built.ends[v][i], end)
            if i > 0 or not present:  # p_v0 is the constant 1
                model.AddHint(built.present[v][i], present)
    hint_choices(built, intervals)


def solution_intervals(solver: cp_model.CpSolver, built: MoccasinModel) -> dict[int, list[Interval]]:
    """The present intervals of CP-SAT's solution, per node in slot order (for :func:`intervals_to_schedule`).

    Parameters
    ----------
    solver : cp_model.CpSolver
        The solver, after a solve that found a solution.

    Returns
    -------
    dict
        Per node its present ``(s_vi, e_vi)``.
    """
    return {v: [(start, end) for _, start, end in rows] for v, rows in present_intervals(solver, built).items()}
