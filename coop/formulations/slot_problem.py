"""A graph's computed nodes in the terms of a compute sequence, shared by Moccasin and the heuristics.

The slot axis of Moccasin (Bartan et al., ICML 2023) has one compute per slot; the heuristics of
:mod:`coop.formulations.heuristics` edit compute sequences over the same nodes. Both need the
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
    """
    if all(float(c).is_integer() for c in costs):
        return 1.0
    largest = max(costs, default=0.0)
    return 1e6 / largest if largest > 0 else 1.0
