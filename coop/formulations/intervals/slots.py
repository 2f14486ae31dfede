"""A graph's computed nodes in the terms of a compute sequence, shared by Moccasin and the heuristics.

The slot axis of Moccasin (Bartan et al., ICML 2023) has one compute per slot; the heuristics of
:mod:`coop.formulations.heuristics.fast_schedules` edit compute sequences over the same nodes. Both need the
computed nodes in the baseline order (extra outputs right after their op), their computed inputs
and consumers, sizes, integer costs and the capacity left once caller-owned values are resident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from coop.graph import Graph
from coop.schedule import prompt_order


@dataclass
class SlotProblem:
    """The computed nodes of a graph with their integer costs and the memory capacity."""

    graph: Graph
    budget: int
    order: list[int]
    inputs: dict[int, list[int]]  # computed inputs only; caller-owned ones are always resident
    consumers: dict[int, list[int]]
    mem: dict[int, int]
    workspace: dict[int, int]
    cost: dict[int, int]  # integer costs for CP-SAT (scaled when the graph's are fractional)
    cost_scale: float
    recomputable: dict[int, bool]
    outputs: set[int]
    capacity: int  # budget - caller-owned bytes
    output_of: dict[int, int] = field(default_factory=dict)  # extra output -> its op

    @classmethod
    def build(cls, graph: Graph, budget: int) -> SlotProblem:
        """The slot problem of ``graph`` under ``budget`` (bytes, caller-owned values included).

        Returns
        -------
        SlotProblem
            Its computed nodes in ``prompt_order(graph)`` (extra outputs right after their op: the same memory).
        """
        order = list(prompt_order(graph))  # extra outputs right after their op: the same memory
        computed = set(order)
        inputs = {v: [u for u in graph.node(v).inputs if u in computed] for v in order}
        consumers = {v: [c for c in graph.consumers[v] if c in computed] for v in order}
        raw_costs = [graph.node(v).cost for v in order]
        scale = integer_cost_scale(raw_costs)
        return cls(
            graph=graph,
            budget=budget,
            order=order,
            inputs=inputs,
            consumers=consumers,
            mem={v: graph.node(v).mem for v in order},
            workspace={v: graph.node(v).workspace for v in order},
            cost={v: math.floor(graph.node(v).cost * scale) for v in order},
            cost_scale=scale,
            recomputable={v: graph.node(v).recomputable for v in order},
            outputs={v for v in graph.outputs if v in computed},
            capacity=budget - graph.caller_owned_bytes,
            output_of={v: graph.node(v).output_of for v in order if graph.node(v).output_of is not None},
        )


def integer_cost_scale(costs: list[float]) -> float:
    """1 for integer costs (the objective is then exact); else a factor giving ~1e6 resolution.

    Scaled costs are rounded down (see :meth:`SlotProblem.build`), so the model's objective never
    exceeds a schedule's true cost and CP-SAT's bound stays a valid lower bound.

    Returns
    -------
    float
    """
    if all(float(c).is_integer() for c in costs):
        return 1.0
    largest = max(costs, default=0.0)
    return 1e6 / largest if largest > 0 else 1.0


#: Cap on a per-node interval count when nothing bounds it (only the consumer recursion does).
_UNBOUNDED = 10**6


def sufficient_intervals(problem: SlotProblem, extra_cost: float | None) -> dict[int, int]:
    """Per node, an upper bound on its computations in some schedule that is at least as good.

    Take any legal schedule whose first computations are in baseline order and whose extra cost
    (cost - baseline cost, in the graph's cost units) is at most ``extra_cost`` (None: any cost).
    Dropping a computation whose instance is never read, that is not the node's first and not
    the final instance of an output, lowers neither legality nor first-computation order and
    raises neither cost nor any step's memory. After dropping all such computations, each
    instance of v other than its first and an output's final one is read by a computation of a
    consumer, and one consumer computation reads one instance of v, so
    ``computations(v) <= 1 + [v is an output] + sum over consumers c of computations(c)``; and a
    node with cost c_v > 0 is recomputed at most ``floor(extra_cost / c_v)`` times. Non-recomputable
    nodes are computed once. Evaluated in reverse baseline (topological) order.

    Parameters
    ----------
    extra_cost : float or None
        The most extra cost (graph cost units) of the schedules considered; None: any.

    Returns
    -------
    dict
        Per node its most computations.
    """
    limits: dict[int, int] = {}
    for v in reversed(problem.order):
        if not problem.recomputable[v]:
            limits[v] = 1
            continue
        reads = sum(limits[c] for c in problem.consumers[v]) + (1 if v in problem.outputs else 0)
        limit = min(1 + reads, _UNBOUNDED)
        cost = problem.graph.node(v).cost
        if extra_cost is not None and cost > 0:
            limit = min(limit, 1 + math.floor(extra_cost / cost + 1e-9))
        limits[v] = limit
    return limits


def sufficient_horizon(problem: SlotProblem, limits: dict[int, int], extra_cost: float | None) -> int:
    """The most computations such a schedule makes.

    Parameters
    ----------
    limits : dict
        Per node its most computations (:func:`sufficient_intervals`).

    Returns
    -------
    int
        n plus the most recomputations that ``limits`` allow within ``extra_cost`` (cheapest first, which
        maximises their number).
    """
    recomputations = 0
    remaining = math.inf if extra_cost is None else extra_cost + 1e-9
    for v in sorted(problem.order, key=lambda v: problem.graph.node(v).cost):
        allowed = limits[v] - 1
        cost = problem.graph.node(v).cost
        if allowed <= 0:
            continue
        taken = allowed if cost <= 0 or math.isinf(remaining) else min(allowed, math.floor(remaining / cost))
        recomputations += taken
        remaining -= taken * cost
    return len(problem.order) + min(recomputations, _UNBOUNDED)
