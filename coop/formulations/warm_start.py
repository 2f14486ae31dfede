"""Warm starts: the one place that collects the schedules a solver starts from.

Every exact formulation is handed the cheapest legal schedule that fits among: the caller's
``hint`` s, Checkmate's LP rounding on small graphs, the solver-free heuristics of
:mod:`coop.formulations.heuristics` (peak shaving, greedy eviction), the structured "keep the convolution,
rebuild batch norm and ReLU" schedule (:mod:`coop.formulations.structured_warm_start`), the baselines, and the
schedules the online eviction policies (DTR, DTE, Coop; :mod:`coop.online`) reach on the same
graph and budget. The last makes a static plan never worse than online eviction there; the solver
then improves on it. A candidate must also draw random numbers in the captured order, or a replay
would differ from eager PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coop.errors import CoopError, ScheduleError
from coop.formulations.heuristics import REBUILD_SIZE_PENALTIES, greedy_eviction_schedule, peak_shaving_schedule
from coop.formulations.structured_warm_start import cheap_recompute_schedule
from coop.graph import Graph
from coop.online.online_sim import simulate_online
from coop.online.policies import POLICIES
from coop.schedule import Schedule, Simulation, draws_out_of_order, simulate, validate

#: Checkmate's LP rounding (O(n^2) variables) is a warm start only on graphs up to this size.
LP_WARM_START_MAX_NODES = 150

#: The baselines tried as warm starts (functions of :mod:`coop.formulations.baselines`).
BASELINE_WARM_STARTS = ("store_all", "checkpoint_all", "chen_sqrt", "chen_greedy")


def online_schedule(graph: Graph, budget: int, policies: tuple[str, ...] | None = None) -> Schedule | None:
    """The cheapest schedule any online policy finds within ``budget`` (validated), or None.

    The policies run with random ops kept (no RNG replay), so their schedule is a legal static one.
    """
    best: tuple[float, Schedule] | None = None
    for policy in policies or tuple(POLICIES):
        try:
            result = simulate_online(graph, budget, policy, replay_random=False)
        except CoopError:
            continue
        if result.schedule is None:
            continue
        check = validate(graph, result.schedule, budget)
        if check.ok and check.cost is not None and (best is None or check.cost < best[0]):
            best = (check.cost, result.schedule)
    return best[1] if best else None


def candidate_warm_starts(graph: Graph, budget: int, hint: Any = None,
                          lp_time_limit: float = 10.0) -> list[tuple[str, Schedule]]:
    """Every schedule to start from, named by its source (not yet checked against the budget)."""
    candidates: list[tuple[str, Schedule]] = []
    for given in hint if isinstance(hint, list | tuple) else [hint]:
        schedule = getattr(given, "schedule", given)
        if isinstance(schedule, Schedule):
            candidates.append((f"hint ({given.formulation})" if hasattr(given, "formulation") else "hint", schedule))
    if len(graph.order) <= LP_WARM_START_MAX_NODES and lp_time_limit > 0:
        from coop.formulations.checkmate import checkmate_lp

        try:
            rounded = checkmate_lp(graph, budget, time_limit=lp_time_limit, threads=1)
        except CoopError:  # no LP solver: one warm start fewer
            rounded = None
        if rounded is not None and rounded.schedule is not None:
            candidates.append(("checkmate-lp", rounded.schedule))
    heuristics: list[tuple[str, Callable[[Graph, int], Schedule | None]]] = [
        ("peak-shaving", peak_shaving_schedule), ("greedy-eviction", greedy_eviction_schedule),
        ("greedy-eviction (rebuild-size aware)",
         lambda g, b: greedy_eviction_schedule(g, b, rebuild_size_penalty=REBUILD_SIZE_PENALTIES[-1])),
        ("online eviction", online_schedule), ("cheap recompute (keep convolutions and products)", cheap_recompute_schedule)]
    for name, heuristic in heuristics:
        schedule = heuristic(graph, budget)
        if schedule is not None:
            candidates.append((name, schedule))
    from coop.formulations import baselines

    for name in BASELINE_WARM_STARTS:
        try:
            result = getattr(baselines, name)(graph, budget)
        except CoopError:  # a baseline that cannot meet the budget is one warm start fewer
            continue
        if result.schedule is not None:
            candidates.append((name, result.schedule))
    return candidates


def best_warm_start(graph: Graph, budget: int, hint: Any = None,
                    lp_time_limit: float = 10.0) -> tuple[str, Schedule, Simulation] | None:
    """The cheapest candidate warm start whose simulated peak fits the budget and whose random
    draws follow the baseline order (a replay must draw them in eager PyTorch's order)."""
    best = None
    for name, schedule in candidate_warm_starts(graph, budget, hint, lp_time_limit):
        try:
            sim = simulate(graph, schedule)
        except ScheduleError:  # an illegal candidate (e.g. a caller's hint) is skipped
            continue
        if draws_out_of_order(graph, schedule) is not None:
            continue
        if sim.peak <= budget and (best is None or sim.cost < best[2].cost):
            best = (name, schedule, sim)
    return best
