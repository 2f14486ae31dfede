"""A structured warm start: keep what is expensive to compute, rebuild the cheap rest just in time.

A convolutional network's forward is mostly conv -> batch norm -> ReLU stacks. The convolution is
where the time goes; batch norm and ReLU are cheap, yet each stores an activation as large as the
convolution's for the backward. MONeT (Shah et al. 2021, section 5) and Checkmate's published
ResNet schedules (Jain et al. 2020) keep the convolution outputs and recompute batch norm and ReLU
right before the backward reads them. :func:`cheap_recompute_schedule` builds that schedule for any
Graph: every forward value that is recomputable, not expensive (:func:`is_expensive`: convolutions,
matrix products, attention; on a graph without op names, a cost above the median of forward
nodes), not random and not a graph output is used by the forward as captured, dropped after its
last forward read (the one simulator frees an instance after its last use), and computed again
right before each backward reader, together with the cheap values it reads that are gone too (a
ReLU rebuilt with its batch norm from the kept convolution), so that a rebuilt instance dies right
after its reader: the backward's peak drops by the cheap activations it no longer holds, at the cost
of one rebuild per read (the solver the warm start is handed merges rebuilds where memory allows). It is a warm start (:mod:`coop.formulations.heuristics.warm_start`), not a solver: the
caller checks it against the budget.
"""

from __future__ import annotations

import statistics

from coop.graph import Graph, Node
from coop.schedule import Schedule, Step

#: Op name fragments of the operators whose outputs are kept (aten names as capture records them).
EXPENSIVE_OPS = ("convolution", "addmm", ".mm.", ".bmm.", "matmul", "linear", "attention", "embedding")


def is_expensive(graph: Graph, node: Node) -> bool:
    """Whether ``node``'s output is kept: an expensive op by name, or by cost on a graph without op names.

    Parameters
    ----------
    graph : Graph
        The graph ``node`` belongs to.

    Returns
    -------
    bool
        On a graph with op names: whether ``node.op`` contains one of ``EXPENSIVE_OPS``; else whether
        its cost is above the median of the forward nodes' costs.
    """
    if any(node.op for node in graph.nodes if not node.caller_owned):
        return any(fragment in node.op for fragment in EXPENSIVE_OPS)
    forward_costs = [n.cost for n in graph.nodes if n.kind == "forward"]
    return bool(forward_costs) and node.cost > statistics.median(forward_costs)


def cheap_recompute_schedule(graph: Graph, budget: int | None = None) -> Schedule | None:
    """The schedule of the module docstring, or None where it recomputes nothing.

    None when no cheap forward value is read by the backward.

    Parameters
    ----------
    budget : int or None
        Unused: the caller checks the fit.

    Returns
    -------
    Schedule or None
        The schedule of computes, each backward node preceded by rebuilds of the cheap forward
        values it reads; None where nothing is rebuilt.
    """
    del budget
    outputs = set(graph.outputs)
    cheap = {n.id for n in graph.nodes if n.kind == "forward" and n.recomputable and not n.random and not n.optional
             and n.output_of is None and n.id not in outputs and not is_expensive(graph, n)}
    steps: list[Step] = []
    rebuilt: set[int] = set()

    def rebuild(value: int) -> None:
        for source in graph.node(value).inputs:
            if source in cheap and source not in rebuilt:
                rebuild(source)
        steps.append(Step(op="compute", node=value))
        rebuilt.add(value)

    recomputed = False
    for node_id in graph.order:
        node = graph.node(node_id)
        if node.kind == "backward":
            for source in node.inputs:
                if source in cheap and source not in rebuilt:
                    rebuild(source)
                    recomputed = True
            rebuilt.clear()  # each reader rebuilds its own: an instance dies right after its reader
        steps.append(Step(op="compute", node=node_id))
    return Schedule(steps=tuple(steps)) if recomputed else None


__all__ = ["EXPENSIVE_OPS", "cheap_recompute_schedule", "is_expensive"]
