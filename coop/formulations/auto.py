"""``auto``: pick a formulation per graph and fall back to the best fitting baseline.

The choice: the baseline order when it already fits (no solve needed); otherwise Checkmate's MILP
(Jain et al. 2020, exact and fast on small graphs) up to ``exact_max_nodes`` computed nodes and
Moccasin's CP-SAT model (Bartan et al. 2023, O(n) variables) above that. When the chosen solver
returns no schedule within the budget, the cheapest baseline schedule that fits is returned
instead, and the result's message says so.
"""

from __future__ import annotations

import time
from typing import Any

from coop.errors import CoopError
from coop.formulations.result import SolveResult
from coop.graph import Graph

#: Above this many computed nodes the O(n^2) MILP gets slow; Moccasin's O(n) model takes over.
EXACT_MAX_NODES = 120


def choose_formulation(graph: Graph, budget: int, *, captured: Any = None) -> str:
    """The formulation ``auto`` runs first for this graph and budget."""
    from coop.budget import baseline_peak

    if budget >= baseline_peak(graph):
        return "store-all"
    return "checkmate" if len(graph.order) <= EXACT_MAX_NODES else "moccasin"


def auto(graph: Graph, budget: int, *, time_limit: float = 60.0, threads: int = 2, progress: Any = None,
         captured: Any = None, hint: Any = None) -> SolveResult:
    """Solve with the formulation chosen for this graph; fall back to the best fitting baseline."""
    from coop.formulations import BASELINES, solve, solve_accepting

    started = time.perf_counter()
    chosen = choose_formulation(graph, budget)
    notes: list[str] = []
    try:
        result = solve_accepting(graph, budget, chosen, time_limit=time_limit, threads=threads, progress=progress,
                                 captured=captured, hint=hint)
    except CoopError as exc:
        result = SolveResult(formulation=chosen, status="unknown", message=str(exc))
    if _fits(result, budget):
        result.extra["auto"] = chosen
        return result
    notes.append(f"{chosen}: {result.message or result.status}")
    fallback: SolveResult | None = None
    for name in BASELINES:
        try:
            candidate = solve(graph, budget, name)
        except CoopError as exc:
            notes.append(f"{name}: {exc}")
            continue
        if _fits(candidate, budget) and (fallback is None or candidate.simulation.cost < fallback.simulation.cost):
            fallback = candidate
    if fallback is None:
        return SolveResult(
            formulation="auto",
            status="unknown",
            wall_s=time.perf_counter() - started,
            message="no schedule fits: " + "; ".join(notes),
        )
    fallback.message = f"{chosen} found no schedule within the budget; fell back to the {fallback.formulation} baseline"
    fallback.extra["auto"] = fallback.formulation
    fallback.wall_s = time.perf_counter() - started
    return fallback


def _fits(result: SolveResult, budget: int) -> bool:
    return result.schedule is not None and result.simulation is not None and result.simulation.peak <= budget
