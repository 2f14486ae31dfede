"""MONeT (Shah et al., ICLR 2021) on graphs too large for its quadratic MILP: the interval model driven.

:func:`monet_intervals` is what :func:`coop.formulations.monet.milp.monet` runs above its ``max_nodes``
(and always for ``recompute=False``): warm starts (:mod:`coop.formulations.monet.warm`), then
CP-SAT on the interval model of :mod:`coop.formulations.monet.interval_model` hinted with the cheapest.

1. The remat-only schedule: Moccasin (Bartan et al. 2023) on ``graph.remat_only()`` with
   :data:`REMAT_SHARE` of the time limit (:data:`REMAT_SHARE_LARGE` on large graphs) and the caller's hints; on a graph without
   implementations that *is* the problem, and Moccasin gets the whole limit and its result is returned.
2. The lightest-implementation schedules: the graph with each node's lightest implementation fixed,
   greedy eviction on it (with each of ``REBUILD_SIZE_PENALTIES``), and Moccasin (:data:`LIGHTEST_SHARE`
   of the time limit, less where CP-SAT would keep under :data:`CP_SAT_SHARE`) where no remat-only schedule fits or it costs more than :data:`LIGHTEST_RUN_OVERHEAD`.
3. The structured warm start (:mod:`coop.formulations.heuristics.structured_warm_start`: keep the convolutions and
   products, rebuild the cheap rest just in time) on ``graph.remat_only()`` and with the lightest implementations.
4. Greedy eviction that runs computes in place (:mod:`coop.formulations.monet.greedy`), with each penalty:
   the one warm start below the out-of-place floor, which a plain graph cannot express.
5. Each after in-place conversion; the cheapest that fits hints CP-SAT, which gets the rest of the time but a
   last :data:`POLISH_SHARE`, in which the better of its schedule and the warm start loses the recomputations
   that in-place computes and later choices made needless (:mod:`coop.formulations.heuristics.recompute_polish`).
   (Polishing the warm start before CP-SAT instead left CP-SAT without a solution on ResNet-50 at 1/3.)

monet therefore never returns a schedule costlier than the remat-only one it started from. Statuses
are honest: the interval model is restricted (C intervals per node, the warm start's slots plus a
slack), so a schedule is ``feasible`` with ``extra["restricted_bound"]``; ``optimal`` only for
``recompute=False`` when CP-SAT proves its model (every compute-once schedule with first computations
in the baseline order) optimal with integer costs; ``unknown`` when nothing fits in time.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from ortools.sat.python import cp_model

from coop.errors import CoopError
from coop.formulations.core.deadline import Deadline, cp_sat_solver
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import MonetIntervalsOptions
from coop.formulations.core.progress import ProgressCallback, ProgressClock
from coop.formulations.core.result import SolveResult
from coop.formulations.heuristics.fast_schedules import REBUILD_SIZE_PENALTIES, greedy_eviction_schedule
from coop.formulations.heuristics.recompute_polish import drop_needless_recomputations
from coop.formulations.heuristics.structured_warm_start import cheap_recompute_schedule
from coop.formulations.heuristics.warm_start import Candidate, WarmStarts
from coop.formulations.moccasin.intervals import moccasin
from coop.formulations.monet.greedy import in_place_greedy_schedule, in_place_options
from coop.formulations.monet.interval_model import (
    ImplProblem,
    add_hint,
    build_model,
    schedule_spans,
    solution_spans,
    spans_to_schedule,
)
from coop.formulations.monet.warm import apply_in_place, fixed_impl_graph, lightest_choices, with_choices
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, simulate

#: The share of the time limit the remat-only Moccasin warm start may take; REMAT_SHARE_LARGE from LARGE_GRAPH_NODES
#: computed nodes on, where CP-SAT's interval model rarely improves on it within the limit. ResNet-50 b32 (780 nodes)
#: at 1/3 of its peak, 60 s, 2 threads, three runs each (2026-11-26, after the local search became ~4x faster):
#: 0.25 gave 12.55/12.16/11.88 %, 0.35 gave 12.55/11.88/12.18 %, 0.5 gave 11.85/11.91/11.85 % (CP-SAT kept the
#: warm start in two of the three). On VGG-16 (114 nodes) and U-Net (315) CP-SAT is where monet gains.
REMAT_SHARE = 0.35
REMAT_SHARE_LARGE = 0.5
LARGE_GRAPH_NODES = 500
#: The share the lightest-implementation Moccasin run may take (only where the remat-only schedule does not fit or
#: costs more than LIGHTEST_RUN_OVERHEAD), less where CP-SAT would keep under CP_SAT_SHARE of the time limit. At
#: 0.25 (2026-11-26, bench_monet at 30 s) VGG-16 at 0.5 of its peak, below the remat-only floor, got 3.91 % where
#: 0.35 had given 2.44 %.
LIGHTEST_SHARE = 0.35
CP_SAT_SHARE = 0.25
#: Moccasin also runs on the lightest implementations where the remat-only schedule costs more than this overhead.
LIGHTEST_RUN_OVERHEAD = 0.15
#: The share of the time limit kept for the last polish of the result: on ResNet-50 b32 at 1/3 one pass over
#: moccasin's in-place-converted schedule takes about 3 s on 2 cores.
POLISH_SHARE = 0.05
#: The formulation name results carry.
NAME = "monet"



@formulation(NAME, options=MonetIntervalsOptions)
def monet_intervals(graph: Graph, budget: int, options: MonetIntervalsOptions) -> SolveResult:
    """MONeT over the interval model (see the module docstring); ``recompute=False`` computes every node once.

    Parameters
    ----------
    graph : Graph
        The graph to schedule; without implementations (and with ``recompute``) Moccasin solves it.
    budget : int
        The budget in graph units (parsed).
    options : MonetIntervalsOptions
        The options; their fields follow.
    time_limit : float
        Seconds for the warm starts and CP-SAT together.
    progress : ProgressCallback or None
        Called with the best warm start and CP-SAT's progress.
    hint : Any
        A schedule (or result) or a list of them to warm-start from.
    exact : bool
        Only exact implementations.
    recompute : bool
        Allow recomputation; False computes every node once.
    max_intervals : int
        The least intervals per recomputable node in the model (a warm start's own count is kept
        when higher).
    seed : int
        CP-SAT's random seed.
    deadline : Deadline
        The solve's deadline (made from ``time_limit`` by the entry): each stage gets what is left of it.

    Returns
    -------
    SolveResult
        The better of CP-SAT's schedule and the cheapest warm start, with the model, the warm
        starts' costs and the implementation choices in ``extra`` (statuses: see the module
        docstring).

    References
    ----------
    Shah et al., "Memory Optimization for Deep Networks", ICLR 2021; Bartan et al., ICML 2023.
    """
    deadline, threads, progress, hint = options.deadline, options.threads, options.progress, options.hint
    exact, recompute, max_intervals, seed = options.exact, options.recompute, options.max_intervals, options.seed
    clock = ProgressClock(progress, deadline)
    hints = list(hint) if isinstance(hint, list | tuple) else ([] if hint is None else [hint])
    if recompute and not graph.has_impls:
        return _moccasin_only(graph, budget, deadline, threads, progress, hints)
    candidates = monet_warm_starts(graph, budget, hints, exact, recompute, deadline.remaining(), threads)
    best = min(candidates, key=lambda c: c[2].cost, default=None)
    if best is not None:
        clock.report(best[2].cost, None, f"monet: warm start {best[0]}")
    polish_s = POLISH_SHARE * deadline.limit if recompute else 0.0
    until = Deadline.after(max(0.0, deadline.remaining() - polish_s), within=deadline)
    result = _solve_model(graph, budget, best, exact, recompute, max_intervals, seed, threads, until, clock)
    if result.schedule is not None and recompute:
        found = _polished(graph, budget, ("result", result.schedule, result.simulation), deadline.remaining(),
                          exact)
        if found[2].cost < result.simulation.cost:
            clock.report(found[2].cost, None, "monet: recomputations dropped")
            result.schedule, result.simulation, result.objective = found[1], found[2], found[2].cost
            result.message += "; needless recomputations dropped after it"
    result.wall_s = clock.elapsed_s
    result.extra.update({"model": "intervals", "recompute": recompute, "exact": exact,
                         "warm_starts": {name: sim.cost for name, _, sim in candidates}, **_choices(graph, result.schedule)})
    return result


def _moccasin_only(graph: Graph, budget: int, deadline: Deadline, threads: int, progress: ProgressCallback | None,
                   hints: list[Any]) -> SolveResult:
    """No implementations to choose: MONeT is Moccasin's problem, solved with the whole time limit."""
    result = moccasin(graph, budget, time_limit=max(1e-3, deadline.remaining()), deadline=deadline, threads=threads,
                      progress=progress, hint=hints or None)
    result.formulation = NAME
    result.extra.update({"model": "moccasin (the graph has no implementations)", "implementations": [],
                         "inexact_implementations": []})
    return result


def monet_warm_starts(graph: Graph, budget: int, hints: list[Any], exact: bool, recompute: bool, time_limit: float,
                 threads: int) -> list[Candidate]:
    """MONeT's warm starts that fit (after in-place conversion), for the interval model and the stage MILP.

    Moccasin's remat-only schedule, the lightest-implementation schedules, the structured ones,
    in-place greedy eviction, store-all, the caller's hints (see the module docstring).

    Parameters
    ----------
    budget : int
        The budget in graph units.
    hints : list of Any
        The caller's schedules (or results with a ``schedule``).
    exact : bool
        Only exact implementations, in the schedules and the ones accepted.
    recompute : bool
        Build the recomputing warm starts; without it only compute-once schedules are accepted.
    time_limit : float
        The formulation's time limit; the Moccasin runs take :data:`REMAT_SHARE` (:data:`REMAT_SHARE_LARGE`) and
        :data:`LIGHTEST_SHARE` of it (see there).

    Returns
    -------
    list of Candidate
        The ``(name, schedule, simulation)`` of each warm start that fits and MONeT may start from.
    """
    started = time.perf_counter()
    raw: list[tuple[str, Schedule | None]] = []
    choices = lightest_choices(graph, exact)
    fixed = fixed_impl_graph(graph, choices)
    if recompute:
        share = REMAT_SHARE_LARGE if len(graph.order) >= LARGE_GRAPH_NODES else REMAT_SHARE
        remat = _moccasin(graph.remat_only(), budget, share * time_limit, threads, hints)
        raw.append(("moccasin (remat only)", remat))
        for penalty in REBUILD_SIZE_PENALTIES:
            raw.append((f"greedy eviction (lightest implementations{_penalised(penalty)})",
                        _with(greedy_eviction_schedule(fixed, budget, penalty), choices)))
        # Moccasin on the lightest implementations only where remat alone does not fit or costs more than
        # LIGHTEST_RUN_OVERHEAD: at low overheads a second Moccasin run never won on bench_monet's models at 30 s and
        # left CP-SAT a third less time (U-Net 0.5 then kept moccasin's 6.41 %; with that time CP-SAT found 5.17 %);
        # at U-Net 1/3 (remat-only 30.5 %) it is the start from which CP-SAT reached 15.8 % (22.6 % without it).
        remat_sim = None if remat is None else simulate(graph, remat)
        costly = remat_sim is None or remat_sim.peak > budget or remat_sim.overhead > LIGHTEST_RUN_OVERHEAD
        left = (1 - CP_SAT_SHARE) * time_limit - (time.perf_counter() - started)
        if costly and any(c is not None for c in choices.values()):
            raw.append(("moccasin (lightest implementations)",
                        _with(_moccasin(fixed, budget, min(LIGHTEST_SHARE * time_limit, left), threads, []),
                              choices)))
        # keep the convolutions, rebuild the cheap rest just in time (coop.formulations.heuristics.structured_warm_start), on the
        # remat-only graph and with the lightest implementations
        raw.append(("structured (remat only)", cheap_recompute_schedule(graph.remat_only())))
        raw.append(("structured (lightest implementations)", _with(cheap_recompute_schedule(fixed), choices)))
        options = in_place_options(graph, fixed, choices, exact)
        for penalty in REBUILD_SIZE_PENALTIES if options else ():
            # the only warm start below the out-of-place floor (coop.formulations.monet.greedy)
            raw.append((f"greedy eviction in place (lightest implementations{_penalised(penalty)})",
                        in_place_greedy_schedule(fixed, budget, choices, options, penalty)))
    raw.append(("store-all", Schedule.from_order(graph.order)))
    raw.append(("store-all (lightest implementations)", with_choices(Schedule.from_order(fixed.order), choices)))
    raw.extend(("hint", getattr(h, "schedule", h)) for h in hints)
    collector = WarmStarts(graph, budget, prepare=lambda schedule: apply_in_place(graph, schedule, exact),
                           accept=lambda schedule, sim: _monet_may_start_from(graph, schedule, sim, exact, recompute))
    collector.offer_all(raw)
    return collector.found


def _polished(graph: Graph, budget: int, candidate: Candidate, seconds: float, exact: bool) -> Candidate:
    """``candidate`` with its needless recomputations dropped, and the computes this frees to run in place run so,
    repeated while that lowers the cost and time remains (itself where nothing does)."""
    name, schedule, sim = candidate
    ends_at = time.perf_counter() + seconds
    improved = False
    while sim.recomputations and time.perf_counter() < ends_at:
        dropped, dropped_sim = drop_needless_recomputations(graph, budget, schedule, ends_at - time.perf_counter())
        if dropped_sim.cost >= sim.cost:
            break
        schedule = apply_in_place(graph, dropped, exact)  # never raises the peak or the cost
        sim = dropped_sim if schedule is dropped else simulate(graph, schedule)
        improved = True
    return (f"{name}, needless recomputations dropped", schedule, sim) if improved else candidate


def _penalised(penalty: float) -> str:
    return f", rebuild-size penalty {penalty:g}" if penalty else ""


def _moccasin(graph: Graph, budget: int, time_limit: float, threads: int, hints: list[Any]) -> Schedule | None:
    try:
        result = moccasin(graph, budget, time_limit=max(time_limit, 1.0), threads=threads, hint=hints or None)
    except CoopError:
        return None
    return result.schedule


def _with(schedule: Schedule | None, choices: dict[int, str | None]) -> Schedule | None:
    return None if schedule is None else with_choices(schedule, choices)


def _monet_may_start_from(graph: Graph, schedule: Schedule, sim: Simulation, exact: bool, recompute: bool) -> bool:
    """MONeT's own rules on a warm start: only exact implementations under ``exact``, and (without
    ``recompute``) every node computed once."""
    if not recompute and sim.recomputations:
        return False
    return not (exact and any(not graph.node(s.node).implementation(s.impl).exact for s in schedule.steps if s.impl))


def _solve_model(graph: Graph, budget: int, best: Candidate | None, exact: bool, recompute: bool, max_intervals: int,
                 seed: int, threads: int, until: Deadline, clock: ProgressClock) -> SolveResult:
    """CP-SAT on the interval model, hinted with ``best``; the better of its schedule and ``best``."""
    problem = ImplProblem.build(graph, budget, exact)
    spans, slots = schedule_spans(graph, best[1]) if best is not None else ({}, 0)
    if recompute:
        per_node = {v: max(len(spans.get(v, ())), max_intervals if problem.recomputable[v] else 1)
                    for v in problem.nodes}
        horizon = max(slots, len(problem.order)) + len(problem.nodes) // 5 + 2
    else:
        per_node = {v: 1 for v in problem.nodes}
        horizon = len(problem.nodes)
    firsts = [spans[v][0][0] for v in problem.order] if spans else []
    keep_order = graph.has_backward and all(a < b for a, b in itertools.pairwise(firsts))
    extra: dict[str, Any] = {"horizon": horizon, "intervals": sum(per_node.values()), "keep_order": keep_order,
                             "warm_start": None if best is None else best[0]}
    if until.remaining() < 0.5:
        return _from_warm(best, "CP-SAT not run: no time left after the warm starts", extra, budget)
    built = build_model(problem, horizon, per_node, keep_order)
    if spans:
        add_hint(problem, built, spans)
    solver = cp_sat_solver(until, threads, seed=seed, least=0.1)  # building the model counted
    started = time.perf_counter()
    status = solver.Solve(built.model)
    extra |= {"cp_sat_status": solver.StatusName(status), "solver_wall_s": time.perf_counter() - started}
    found: Candidate | None = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = solver.BestObjectiveBound() / problem.cost_scale
        extra["restricted_bound"] = bound
        schedule = spans_to_schedule(problem, solution_spans(solver, problem, built))
        sim = simulate(graph, schedule)
        if sim.peak > budget:  # never hand out a schedule the simulator rejects
            raise AssertionError(f"monet interval schedule peaks at {sim.peak} > budget {budget}")
        found = ("cp-sat", schedule, sim)
    proven = (status == cp_model.OPTIMAL and not recompute and problem.cost_scale == 1.0 and keep_order)
    if found is not None and (best is None or found[2].cost < best[2].cost or proven):
        clock.report(found[2].cost, extra.get("restricted_bound"), "monet: CP-SAT")
        if proven:
            return SolveResult(NAME, "optimal", found[1], found[2], found[2].cost, found[2].cost, extra=extra,
                               message="CP-SAT OPTIMAL over every schedule that computes each node once with first "
                                       "computations in the baseline order")
        return SolveResult(NAME, "feasible", found[1], found[2], found[2].cost, None, extra=extra,
                           message=f"CP-SAT {extra['cp_sat_status']} on the restricted interval model "
                                   f"({extra['intervals']} intervals, {horizon} slots)")
    if best is None and status == cp_model.INFEASIBLE and not recompute and keep_order:
        return SolveResult(NAME, "infeasible", extra=extra, message=f"no schedule that computes each node once with "
                           f"first computations in the baseline order fits budget {budget} (CP-SAT proved it)")
    return _from_warm(best, f"CP-SAT {extra['cp_sat_status']} found nothing cheaper", extra, budget)


def _from_warm(best: Candidate | None, note: str, extra: dict[str, Any], budget: int) -> SolveResult:
    if best is None:
        return SolveResult(NAME, "unknown", extra=extra,
                           message=f"no schedule within budget {budget} found in time ({note}); raise time_limit")
    return SolveResult(NAME, "feasible", best[1], best[2], best[2].cost, None, extra=extra,
                       message=f"kept the warm start {best[0]}: {note}")


def _choices(graph: Graph, schedule: Schedule | None) -> dict[str, Any]:
    """Which implementations the plan uses (a plan says which inexact ones it relies on)."""
    if schedule is None:
        return {"implementations": [], "inexact_implementations": []}
    used = sorted({(s.node, s.impl) for s in schedule.steps if s.op == "compute" and s.impl is not None})
    inexact = [f"{node}:{impl}" for node, impl in used if not graph.node(node).implementation(impl).exact]
    return {"implementations": [f"{node}:{impl}" for node, impl in used], "inexact_implementations": inexact}


__all__ = ["CP_SAT_SHARE", "LARGE_GRAPH_NODES", "LIGHTEST_SHARE", "POLISH_SHARE", "REMAT_SHARE", "REMAT_SHARE_LARGE",
           "monet_intervals"]
