"""``auto``: pick a formulation per graph and fall back to the cheapest fitting baseline.

The choice: the baseline order when it already fits (no solve needed); MONeT (Shah et al. 2021)
when the graph has implementations and recomputation alone provably cannot reach the budget (or
the remat-only solver found nothing within it); otherwise Checkmate's MILP
(Jain et al. 2020, exact and fast on small graphs) up to ``exact_max_nodes`` computed nodes and
Moccasin's CP-SAT model (Bartan et al. 2023, O(n) variables) above that. When the chosen solver
returns no schedule within the budget, the cheapest baseline schedule that fits is returned
instead (:func:`cheapest_fitting_baseline`, which the planner uses too), and the result's message
says so. Given a ``device_profile`` (a device with a slower memory tier), a budget that recomputation
alone did not reach goes to POET (Patil et al. 2022, :mod:`coop.formulations.poet`), which pages to
that tier as well as recomputing (its warm starts include the baselines).
"""

from __future__ import annotations

import time
from typing import Any

from coop.budget import format_memory
from coop.errors import CoopError, InfeasibleError
from coop.formulations.result import SolveResult
from coop.graph import Graph
from coop.schedule import validate

#: Above this many computed nodes the O(n^2) MILP gets slow; Moccasin's O(n) model takes over.
EXACT_MAX_NODES = 120


def choose_formulation(graph: Graph, budget: int, *, captured: Any = None) -> str:
    """The formulation ``auto`` runs first for this graph and budget."""
    from coop.budget import baseline_peak

    if budget >= baseline_peak(graph):
        return "store-all"
    if needs_implementations(graph, budget):
        return "monet"
    return "checkmate" if len(graph.order) <= EXACT_MAX_NODES else "moccasin"


def needs_implementations(graph: Graph, budget: int) -> bool:
    """Whether the graph has implementations (MONeT) and recomputation alone provably cannot reach
    the budget: it is below min_budget of the graph with default implementations only."""
    from coop.budget import min_budget

    return graph.has_impls and len(graph.order) <= EXACT_MAX_NODES and budget < min_budget(graph.remat_only())


def auto(graph: Graph, budget: int, *, time_limit: float = 60.0, threads: int = 2, progress: Any = None,
         captured: Any = None, hint: Any = None, device_profile: Any = None) -> SolveResult:
    """Solve with the formulation chosen for this graph; fall back to the cheapest fitting baseline."""
    from coop.formulations import solve

    started = time.perf_counter()
    chosen = choose_formulation(graph, budget)
    try:
        result = solve(graph, budget, chosen, time_limit=time_limit, threads=threads, progress=progress,
                                 captured=captured, hint=hint)
    except CoopError as exc:
        result = SolveResult(formulation=chosen, status="unknown", message=str(exc))
    if result.schedule is not None and result.simulation is not None and result.simulation.peak <= budget:
        result.extra["auto"] = chosen
        return result
    if graph.has_impls and chosen != "monet" and len(graph.order) <= EXACT_MAX_NODES:
        # Recomputation alone fell short: let MONeT choose implementations too.
        monet = solve(graph, budget, "monet", time_limit=time_limit, threads=threads, progress=progress, hint=hint)
        if monet.schedule is not None and monet.simulation is not None and monet.simulation.peak <= budget:
            monet.extra["auto"] = "monet"
            return monet
    if device_profile is not None:
        paged = _poet_fallback(graph, budget, device_profile, time_limit, threads, progress, hint, chosen, result)
        if paged is not None:
            return paged
    try:
        fallback = cheapest_fitting_baseline(graph, budget)
    except InfeasibleError as exc:
        return SolveResult(
            formulation="auto",
            status="unknown",
            wall_s=time.perf_counter() - started,
            message=f"no schedule fits: {chosen}: {result.message or result.status}; {exc}",
        )
    fallback.message = f"{chosen} found no schedule within the budget; fell back to the {fallback.formulation} baseline"
    fallback.extra["auto"] = fallback.formulation
    fallback.wall_s = time.perf_counter() - started
    return fallback


def _poet_fallback(graph: Graph, budget: int, device_profile: Any, time_limit: float, threads: int, progress: Any,
                   hint: Any, chosen: str, failed: SolveResult) -> SolveResult | None:
    """POET's schedule when recomputation alone (``chosen``) found none within the budget, else None."""
    from coop.formulations import solve

    paged = solve(graph, budget, "poet", device_profile=device_profile, time_limit=time_limit, threads=threads,
                  progress=progress, hint=hint)
    if paged.schedule is None or paged.simulation is None or paged.simulation.peak > budget:
        return None
    paged.message = (f"{chosen} (recomputation alone) found no schedule within the budget ({failed.status}); "
                     f"poet pages to {paged.extra.get('device_profile')}'s slower tier: {paged.message}")
    paged.extra["auto"] = "poet"
    return paged


def cheapest_fitting_baseline(graph: Graph, budget: int, *, failed: str | None = None) -> SolveResult:
    """The baseline schedule of least cost whose validated peak fits ``budget`` (graph units).

    The one fallback for a formulation that found no schedule within the budget (``auto``, the
    planner) and for a step re-planned inside a training loop: baselines take no solver time.
    Raises InfeasibleError naming ``failed`` (the formulation tried first) and the best peak any
    baseline reached.
    """
    from coop.formulations import BASELINES, solve

    best: SolveResult | None = None
    best_cost = 0.0
    best_peak: int | None = None
    errors: list[str] = []
    for name in BASELINES:
        try:
            result = solve(graph, budget, name)
        except CoopError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if result.schedule is None:
            continue
        check = validate(graph, result.schedule, budget)
        if check.peak is not None:
            best_peak = check.peak if best_peak is None else min(best_peak, check.peak)
        if check.ok and check.cost is not None and (best is None or check.cost < best_cost):
            best, best_cost = result, check.cost
    if best is None:
        what = f"{failed} and the baselines" if failed else "the baselines"
        reached = f"; the best peak reached is {format_memory(best_peak, graph)}" if best_peak else ""
        failures = "".join(f"; {error}" for error in errors)
        raise InfeasibleError(f"budget {format_memory(budget, graph)} is infeasible for {what}{reached}"
                              f"{failures}; raise the budget or choose another formulation")
    return best
