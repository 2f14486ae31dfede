"""Warm starts: the one collector of the schedules a solver starts from.

Every exact formulation is handed the cheapest legal schedule that fits among: the caller's
``hint`` s, Checkmate's LP rounding on small graphs, the solver-free heuristics of
:mod:`coop.formulations.heuristics` (peak shaving, greedy eviction), the structured "keep the convolution,
rebuild batch norm and ReLU" schedule (:mod:`coop.formulations.structured_warm_start`), the baselines, and the
schedules the online eviction policies (DTR, DTE, Coop; :mod:`coop.online`) reach on the same
graph and budget. The last makes a static plan never worse than online eviction there; the solver
then improves on it. A candidate must also draw random numbers in the captured order, or a replay
would differ from eager PyTorch.

:class:`WarmStarts` is the collector every solver uses: candidates are offered by name, each is
passed through the solver's ``prepare`` hook (MONeT converts computes to in-place ones), kept only
when it is legal, fits, draws in order and passes the solver's ``accept`` hook (MONeT's exactness
and compute-once rules), and ranked by the solver's ``key`` (compute cost by default; POET prices
on its device profile). :func:`best_warm_start` is the collection the exact formulations share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coop.errors import CoopError, ScheduleError
from coop.formulations.baselines import checkpoint_all, chen_greedy, chen_sqrt, store_all
from coop.formulations.checkmate import checkmate_lp
from coop.formulations.heuristics import REBUILD_SIZE_PENALTIES, greedy_eviction_schedule, peak_shaving_schedule
from coop.formulations.structured_warm_start import cheap_recompute_schedule
from coop.graph import Graph
from coop.online.online_sim import simulate_online
from coop.online.policies import POLICIES
from coop.schedule import Schedule, Simulation, draws_out_of_order, simulate, validate

#: Checkmate's LP rounding (O(n^2) variables) is a warm start only on graphs up to this size.
LP_WARM_START_MAX_NODES = 150

#: A warm start that passed the checks: (its source's name, the schedule, the one simulator's verdict).
Candidate = tuple[str, Schedule, Simulation]


@dataclass
class WarmStarts:
    """Collects candidate schedules for one graph and budget and keeps those a solver may start from.

    Parameters
    ----------
    graph, budget:
        The problem (budget in graph units).
    prepare:
        Applied to each offered schedule before the checks (identity by default); may raise
        :class:`~coop.errors.CoopError` or :class:`~coop.errors.ScheduleError` to drop it.
    accept:
        A solver's own rule on a legal, fitting, in-order candidate (all pass by default).
    key:
        The ranking of :meth:`best` (compute cost by default).
    """

    graph: Graph
    budget: int
    prepare: Callable[[Schedule], Schedule] = lambda schedule: schedule
    accept: Callable[[Schedule, Simulation], bool] = lambda schedule, sim: True
    key: Callable[[Candidate], Any] = lambda candidate: candidate[2].cost
    found: list[Candidate] = field(default_factory=list)

    def offer(self, name: str, schedule: Any) -> Candidate | None:
        """Check one candidate (anything not a Schedule, e.g. a failed heuristic's None, is dropped);
        the candidate when kept."""
        schedule = getattr(schedule, "schedule", schedule)
        if not isinstance(schedule, Schedule):
            return None
        try:
            schedule = self.prepare(schedule)
            sim = simulate(self.graph, schedule)
        except (ScheduleError, CoopError, KeyError):  # an illegal candidate (e.g. a caller's hint) is skipped
            return None
        if sim.peak > self.budget or draws_out_of_order(self.graph, schedule) is not None:
            return None
        if not self.accept(schedule, sim):
            return None
        candidate = (name, schedule, sim)
        self.found.append(candidate)
        return candidate

    def offer_all(self, candidates: list[tuple[str, Any]]) -> None:
        """Offer each (name, schedule) in turn."""
        for name, schedule in candidates:
            self.offer(name, schedule)

    def best(self) -> Candidate | None:
        """The candidate kept with the least :attr:`key` (of equals, the first offered)."""
        return min(self.found, key=self.key, default=None)


def online_schedule(graph: Graph, budget: int, policies: tuple[str, ...] | None = None,
                    deadline: float | None = None) -> Schedule | None:
    """The cheapest schedule any online policy finds within ``budget`` (validated), or None.

    The policies run with random ops kept (no RNG replay), so their schedule is a legal static one.

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    policies : tuple of str or None
        The policy names to run; None: every one of ``POLICIES``.
    deadline : float or None
        A ``time.perf_counter()`` reading after which no further policy starts (None: none).

    Returns
    -------
    Schedule or None
        The cheapest schedule that validates within ``budget``; None when no policy finds one (a
        policy that raises a CoopError is skipped).
    """
    best: tuple[float, Schedule] | None = None
    for policy in policies or tuple(POLICIES):
        if deadline is not None and time.perf_counter() > deadline:
            break
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


def hint_schedules(hint: Any) -> list[tuple[str, Any]]:
    """The caller's hints (a schedule, a result holding one, or a list of either), named for messages.

    Parameters
    ----------
    hint : Any
        A schedule, a result with a ``schedule``, a list or tuple of either, or None.

    Returns
    -------
    list of tuple of (str, Schedule)
        Each hint's schedule named ``"hint"`` or ``"hint (<formulation>)"``; what holds no schedule is
        left out.
    """
    named: list[tuple[str, Any]] = []
    for given in hint if isinstance(hint, list | tuple) else [hint]:
        schedule = getattr(given, "schedule", given)
        if isinstance(schedule, Schedule):
            named.append((f"hint ({given.formulation})" if hasattr(given, "formulation") else "hint", schedule))
    return named


def candidate_warm_starts(graph: Graph, budget: int, hint: Any = None,
                          lp_time_limit: float = 10.0) -> list[tuple[str, Schedule]]:
    """Every schedule to start from, named by its source (not yet checked against the budget).

    The caller's hints, Checkmate's rounded LP on graphs of at most ``LP_WARM_START_MAX_NODES`` nodes,
    the heuristics and the baselines (:func:`warm_start_sources`, all of them, however long they take).

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    hint : Any
        The caller's hints (:func:`hint_schedules`).
    lp_time_limit : float
        Seconds for the rounded LP; 0 or less leaves it out.

    Returns
    -------
    list of tuple of (str, Schedule)
        The named schedules; a source that finds none or raises a CoopError is left out.
    """
    candidates: list[tuple[str, Schedule]] = []
    for name, make in warm_start_sources(graph, budget, hint, lp_time_limit):
        schedule = make()
        if schedule is not None:
            candidates.append((name, schedule))
    return candidates


def warm_start_sources(graph: Graph, budget: int, hint: Any = None, lp_time_limit: float = 10.0,
                       deadline: float | None = None) -> list[tuple[str, Callable[[], Schedule | None]]]:
    """The warm starts as (name, maker) pairs, quickest to make first: a maker returns its schedule or None.

    The caller's hints; store-all; Checkmate's rounded LP (graphs of at most ``LP_WARM_START_MAX_NODES`` nodes,
    ``lp_time_limit`` seconds); the heuristics and baselines that take under a second on a 4,312-node graph
    (greedy eviction, cheap recompute, Chen's two); then peak shaving and online eviction (34 s and 49 s there:
    each simulates the whole step per move or per policy, and stops at ``deadline``, a ``time.perf_counter()``
    reading); checkpoint-all last (its schedule recomputes each forward prefix once per backward node: O(n^2)
    steps to build and to simulate, 21 s there).

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    hint : Any
        The caller's hints (:func:`hint_schedules`), first.
    lp_time_limit : float
        Seconds for the rounded LP; 0 or less leaves it out.
    deadline : float or None
        The ``time.perf_counter()`` reading at which peak shaving and online eviction stop (None: never).

    Returns
    -------
    list of tuple of (str, callable)
        Each source's name and a maker returning its schedule, or None where it finds none.
    """
    sources: list[tuple[str, Callable[[], Schedule | None]]] = [
        (name, lambda schedule=schedule: schedule) for name, schedule in hint_schedules(hint)]
    sources.append(("store_all", lambda: _baseline(store_all, graph, budget)))
    if len(graph.order) <= LP_WARM_START_MAX_NODES and lp_time_limit > 0:
        sources.append(("checkmate-lp", lambda: _rounded_lp(graph, budget, lp_time_limit)))
    sources += [
        ("greedy-eviction", lambda: greedy_eviction_schedule(graph, budget)),
        ("greedy-eviction (rebuild-size aware)",
         lambda: greedy_eviction_schedule(graph, budget, rebuild_size_penalty=REBUILD_SIZE_PENALTIES[-1])),
        ("cheap recompute (keep convolutions and products)", lambda: cheap_recompute_schedule(graph, budget)),
        ("chen_sqrt", lambda: _baseline(chen_sqrt, graph, budget)),
        ("chen_greedy", lambda: _baseline(chen_greedy, graph, budget)),
        ("peak-shaving", lambda: peak_shaving_schedule(graph, budget, deadline=deadline)),
        ("online eviction", lambda: online_schedule(graph, budget, deadline=deadline)),
        ("checkpoint_all", lambda: _baseline(checkpoint_all, graph, budget)),
    ]
    return sources


def _baseline(baseline: Callable[[Graph, int], Any], graph: Graph, budget: int) -> Schedule | None:
    try:
        result = baseline(graph, budget)
    except CoopError:  # a baseline that cannot meet the budget is one warm start fewer
        return None
    return result.schedule


def _rounded_lp(graph: Graph, budget: int, time_limit: float) -> Schedule | None:
    try:
        rounded = checkmate_lp(graph, budget, time_limit=time_limit, threads=1)
    except CoopError:  # no LP solver: one warm start fewer
        return None
    return rounded.schedule if rounded is not None else None


def best_warm_start(graph: Graph, budget: int, hint: Any = None,
                    lp_time_limit: float = 10.0, time_limit: float | None = None) -> Candidate | None:
    """The cheapest candidate warm start that fits the budget and draws in the baseline order.

    Its simulated peak fits, and its random draws follow the baseline order (a replay must draw
    them in eager PyTorch's order).

    Parameters
    ----------
    graph : Graph
        The graph to schedule.
    budget : int
        The budget in graph units.
    hint : Any
        The caller's hints (:func:`hint_schedules`).
    lp_time_limit : float
        Seconds for Checkmate's rounded LP warm start.
    time_limit : float or None
        Seconds for the whole collection: once spent and a candidate fits, the sources not yet tried
        (:func:`warm_start_sources`, cheapest first) are skipped, so that a solver's time limit holds on
        large graphs. None: every source.

    Returns
    -------
    Candidate or None
        ``(name, schedule, simulation)`` of the cheapest; None when none fits.
    """
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    collector = WarmStarts(graph, budget)
    for name, make in warm_start_sources(graph, budget, hint, lp_time_limit, deadline):
        if deadline is not None and collector.found and time.perf_counter() >= deadline:
            break
        collector.offer(name, make())
    return collector.best()
