"""Warm starts: the one collector of the schedules a solver starts from.

Every exact formulation is handed the cheapest legal schedule that fits among: the caller's
``hint`` s, Checkmate's LP rounding on small graphs, the solver-free heuristics of
:mod:`coop.formulations.heuristics.fast_schedules` (peak shaving, greedy eviction), the structured "keep the convolution,
rebuild batch norm and ReLU" schedule (:mod:`coop.formulations.heuristics.structured_warm_start`), the baselines, and the
schedules the online eviction policies (DTR, DTE, Coop; :mod:`coop.online`) reach on the same
training step and budget, given the time. The last makes a static plan never worse than online eviction there;
the solver then improves on it. The sources share one deadline (:func:`best_warm_start`). A candidate must also draw random numbers in the captured order, or a replay
would differ from eager PyTorch.

:class:`WarmStarts` is the collector every solver uses: candidates are offered by name, each is
passed through the solver's ``prepare`` hook (MONeT converts computes to in-place ones), kept only
when it is legal, fits, draws in order and passes the solver's ``accept`` hook (MONeT's exactness
and compute-once rules), and ranked by the solver's ``key`` (compute cost by default; POET prices
on its device profile). :func:`best_warm_start` is the collection the exact formulations share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coop.errors import CoopError, ScheduleError
from coop.formulations.checkmate.milp import checkmate_lp
from coop.formulations.core.deadline import Deadline
from coop.formulations.heuristics.baselines import checkpoint_all, chen_greedy, chen_sqrt, store_all
from coop.formulations.heuristics.fast_schedules import (
    REBUILD_SIZE_PENALTIES,
    greedy_eviction_schedule,
    peak_shaving_schedule,
)
from coop.formulations.heuristics.structured_warm_start import cheap_recompute_schedule
from coop.graph import Graph
from coop.online.online_sim import simulate_online
from coop.online.policies import POLICIES
from coop.schedule import Schedule, Simulation, draws_out_of_order, simulate, validate

#: Checkmate's LP rounding (O(n^2) variables) is a warm start only on graphs up to this size.
LP_WARM_START_MAX_NODES = 150

#: The seconds one online policy is expected to take per computed node (49 s for the four on a 4,312-node Llama
#: step); a policy runs to its end once started (DTR took 138 s on random layered n1000 at 0.8, 2 busy cores).
ONLINE_POLICY_S_PER_NODE = 4e-3

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
                    deadline: Deadline | None = None) -> Schedule | None:
    """The cheapest schedule any online policy finds within ``budget`` (validated), or None.

    The policies run with random ops kept (no RNG replay), so their schedule is a legal static one.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    policies : tuple of str or None
        The policy names to run; None: every one of ``POLICIES``.
    deadline : Deadline or None
        No further policy starts with less time left than :data:`ONLINE_POLICY_S_PER_NODE` per computed node
        (None: every policy runs).

    Returns
    -------
    Schedule or None
        The cheapest schedule that validates within ``budget``; None when no policy finds one (a
        policy that raises a CoopError is skipped).
    """
    best: tuple[float, Schedule] | None = None
    for policy in policies or tuple(POLICIES):
        # a policy cannot be stopped once started: none starts without its expected time
        if deadline is not None and deadline.remaining() < ONLINE_POLICY_S_PER_NODE * len(graph.order):
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
                       deadline: Deadline | None = None) -> list[tuple[str, Callable[[], Schedule | None]]]:
    """The warm starts as (name, maker) pairs, quickest to make first: a maker returns its schedule or None.

    The caller's hints; store-all; Checkmate's rounded LP (graphs of at most ``LP_WARM_START_MAX_NODES`` nodes,
    ``lp_time_limit`` seconds); Chen's two (milliseconds); then the walks whose time depends on the graph's shape
    (:data:`WALKS`), each stopping at ``deadline``: peak shaving (0.4 s on random layered n1000 and its best warm
    start there, 34 s on a 4,312-node Llama step), cheap recompute (1.7 s on random layered n1000; it takes no
    deadline), greedy eviction twice (under a second on the Llama step, 36-92 s on random layered n1000), online
    eviction (49 s on the Llama step); checkpoint-all last
    (its schedule recomputes each forward prefix once per backward node: O(n^2) steps to build and to simulate,
    21 s on the Llama step).

    Parameters
    ----------
    budget : int
        The budget in graph units.
    hint : Any
        The caller's hints (:func:`hint_schedules`), first.
    lp_time_limit : float
        Seconds for the rounded LP; 0 or less leaves it out.
    deadline : Deadline or None
        Where the walks stop (None: never). A callable gives each maker its own deadline when called
        (:func:`best_warm_start` slices the time among them).

    Returns
    -------
    list of tuple of (str, callable)
        Each source's name and a maker returning its schedule, or None where it finds none.
    """
    return [(name, lambda make=make: make(deadline)) for name, make in _sources(graph, budget, hint, lp_time_limit)]


#: The sources whose time depends on the graph's shape: :func:`best_warm_start` gives each half of what is left
#: (the last of them all of it), in :func:`warm_start_sources`' order.
WALKS = ("peak-shaving", "greedy-eviction", "greedy-eviction (rebuild-size aware)", "online eviction")

#: A warm-start source: its name and a maker taking the deadline it must stop at (None: none).
Source = tuple[str, Callable[[Deadline | None], Schedule | None]]


def _sources(graph: Graph, budget: int, hint: Any, lp_time_limit: float) -> list[Source]:
    """The sources of :func:`warm_start_sources`, each maker taking its own deadline."""
    sources: list[Source] = [(name, lambda _, schedule=schedule: schedule) for name, schedule in hint_schedules(hint)]
    sources.append(("store_all", lambda _: _baseline(store_all, graph, budget)))
    if len(graph.order) <= LP_WARM_START_MAX_NODES and lp_time_limit > 0:
        sources.append(("checkmate-lp", lambda until: _rounded_lp(graph, budget, lp_time_limit, until)))
    penalty = REBUILD_SIZE_PENALTIES[-1]
    sources += [
        ("chen_sqrt", lambda _: _baseline(chen_sqrt, graph, budget)),
        ("chen_greedy", lambda _: _baseline(chen_greedy, graph, budget)),
        ("peak-shaving", lambda until: peak_shaving_schedule(graph, budget, deadline=until)),
        ("cheap recompute (keep convolutions and products)", lambda _: cheap_recompute_schedule(graph, budget)),
        ("greedy-eviction", lambda until: greedy_eviction_schedule(graph, budget, deadline=until)),
        ("greedy-eviction (rebuild-size aware)",
         lambda until: greedy_eviction_schedule(graph, budget, rebuild_size_penalty=penalty, deadline=until)),
        # training steps only: on random layered n1000 (no backward) no policy fitted 0.8 and DTR took 138 s
        *([("online eviction", lambda until: online_schedule(graph, budget, deadline=until))] if graph.has_backward
          else []),
        ("checkpoint_all", lambda _: _baseline(checkpoint_all, graph, budget)),
    ]
    return sources


def _baseline(baseline: Callable[[Graph, int], Any], graph: Graph, budget: int) -> Schedule | None:
    try:
        result = baseline(graph, budget)
    except CoopError:  # a baseline that cannot meet the budget is one warm start fewer
        return None
    return result.schedule


def _rounded_lp(graph: Graph, budget: int, time_limit: float, until: Deadline | None) -> Schedule | None:
    seconds = time_limit if until is None else min(time_limit, until.remaining())
    if seconds <= 0:
        return None
    try:
        rounded = checkmate_lp(graph, budget, time_limit=seconds, threads=1)
    except CoopError:  # no LP solver: one warm start fewer
        return None
    return rounded.schedule if rounded is not None else None


def best_warm_start(graph: Graph, budget: int, hint: Any = None, lp_time_limit: float = 10.0,
                    time_limit: float | None = None, *, deadline: Deadline | None = None,
                    until: Deadline | None = None) -> Candidate | None:
    """The cheapest candidate warm start that fits the budget and draws in the baseline order.

    Its simulated peak fits, and its random draws follow the baseline order (a replay must draw
    them in eager PyTorch's order).

    The sources (:func:`warm_start_sources`) share the collection's time: each walk (:data:`WALKS`) is given half
    of what is left when it starts (the last walk all of it) and stops at the end of its part. Before 3bc40e8 every source ran to its end; 3bc40e8 stopped the collection at its deadline
    once one candidate fitted, with no part per source, so a slow first source (greedy eviction: 36-92 s and a
    365 % schedule on random layered n1000 at 0.9) used the whole time and peak shaving (0.4 s there, 0.70 %)
    never ran (its deadline had passed). While nothing fits, the collection goes on to ``until`` (the solver's own
    deadline).

    Parameters
    ----------
    budget : int
        The budget in graph units.
    hint : Any
        The caller's hints (:func:`hint_schedules`).
    lp_time_limit : float
        Seconds for Checkmate's rounded LP warm start.
    time_limit : float or None
        Seconds for the whole collection from now (a ``deadline`` made here); None with no ``deadline``: every
        source runs to its end.
    deadline : Deadline or None
        The collection's deadline (instead of ``time_limit``).
    until : Deadline or None
        How long to go on while no candidate fits (None: ``deadline``).

    Returns
    -------
    Candidate or None
        ``(name, schedule, simulation)`` of the cheapest; None when none fits.
    """
    if deadline is None and time_limit is not None:
        deadline = Deadline.after(time_limit, within=until)
    collector = WarmStarts(graph, budget)
    sources = _sources(graph, budget, hint, lp_time_limit)
    walks_left = sum(name in WALKS for name, _ in sources)
    for name, make in sources:
        current = deadline if collector.found or until is None else until
        if current is not None and collector.found and current.expired():
            break
        if current is None or name not in WALKS:
            collector.offer(name, make(current))
            continue
        walks_left -= 1
        collector.offer(name, make(current if walks_left == 0 else current.share(0.5)))
    return collector.best()
