"""A plan's predicted overhead on the scale the user measures it: its replayed step against the eager step.

``plan.benchmark`` measures ``plan step / eager step - 1``. The schedule's node costs predict the replay; the eager
step runs the captured program's ops once each (the baseline cost) plus autograd's own work, which the replay
skips (:mod:`coop.graph_capture.autograd_cost`). So the prediction is

    schedule cost / (baseline cost + autograd seconds) - 1,

negative for a plan that recomputes less than autograd costs. The node costs alone give the recomputations' overhead
(``(schedule cost - baseline cost) / baseline cost``), what the solver minimises; a plan keeps it as
``predicted_recompute_overhead``, and it is the prediction wherever autograd's term does not apply: inside
``autograd_costs(False)``, for node costs that are not this machine's measured seconds (the nominal model, coop's
default, whose baseline leaves out each op's host cost; an imported graph), and for a step with values on an
accelerator (a GPU step's host work overlaps the kernels it queued, which the calibration does not measure).
"""

from __future__ import annotations

from coop.graph import Graph
from coop.graph_capture.autograd_cost import (
    AutogradRates,
    AutogradWork,
    autograd_costs_enabled,
    autograd_rates,
    eager_autograd_seconds,
)
from coop.simulator import relative_overhead


def priced_in_host_seconds(graph: Graph) -> bool:
    """Whether ``graph``'s node costs are measured seconds of a CPU step, each op's host cost included, so that
    autograd's measured seconds add to them on one scale.

    The nominal model (coop's default costs) prices kernels alone, at nominal rates: its baseline is short of eager's
    host work, and autograd's seconds over it came out about twice the measured share (bench_predict, store-all rows
    in BENCHMARKS.md). Costs measured on this machine are the per-op host-cost calibration
    (``host_costs(True)``, recorded as ``meta["host_cost"]``) and a profiled capture (``profile=True``, whose unit
    says so: its nodes are timed on the real step).

    Parameters
    ----------
    graph : Graph
        A captured step's graph.

    Returns
    -------
    bool
        True for a capture priced either way whose values all live on the CPU.
    """
    meta = graph.meta or {}
    unit = str(meta.get("cost_unit", ""))
    measured = unit.startswith("seconds") and ("host_cost" in meta or unit.startswith("seconds (profiled)"))
    return measured and {node.device for node in graph.nodes} == {"cpu"}


def eager_rates(graph: Graph, threads: int | None) -> AutogradRates | None:
    """The autograd calibration a prediction at ``threads`` uses, or None where the term does not apply (see the
    module docstring).

    Parameters
    ----------
    graph : Graph
        The plan's graph.
    threads : int or None
        torch's CPU thread count the step runs at; None for the current one.

    Returns
    -------
    AutogradRates or None
        :func:`coop.graph_capture.autograd_cost.autograd_rates` at ``threads``, or None.
    """
    if not autograd_costs_enabled() or not priced_in_host_seconds(graph):
        return None
    return autograd_rates(threads)


def overhead_against_eager(cost: float, baseline_cost: float, work: AutogradWork, rates: AutogradRates | None) -> float:
    """The predicted ``replayed step / eager step - 1``.

    Parameters
    ----------
    cost : float
        The schedule's cost (recomputations and page transfers included), in the graph's units.
    baseline_cost : float
        The captured program's cost, each node once.
    work : AutogradWork
        Autograd's work in the eager step.
    rates : AutogradRates or None
        Its cost, in seconds; None: no autograd term (the recomputations' overhead alone).

    Returns
    -------
    float
        ``cost / (baseline_cost + autograd seconds) - 1``; with no term, ``(cost - baseline_cost) / baseline_cost``.
        0.0 for a step that costs nothing.
    """
    eager = baseline_cost + (0.0 if rates is None else eager_autograd_seconds(work, rates))
    return relative_overhead(cost - eager, eager)


__all__ = ["eager_rates", "overhead_against_eager", "priced_in_host_seconds"]
