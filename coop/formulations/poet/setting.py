"""POET's setting, shared by its two models: the options, the prices on a device profile, the warm starts.

Patil, Jain, Dutta, Stoica, Gonzalez, "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022. Both of coop's POET models, the T x T stage
MILP (:mod:`coop.formulations.poet.milp`) and the interval model for large graphs
(:mod:`coop.formulations.poet.intervals`), price a schedule the same way (:func:`price_schedule`,
from POET's per-node energy and time model, :func:`node_price`), admit the same schedules
(:meth:`PoetSetting.admits`), start from the same warm starts (:func:`best_fallback`) and report
the same way (:func:`priced_result`, :func:`at_least_baseline`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from coop.device_profiles import DeviceProfile, load_device_profile
from coop.errors import CoopError
from coop.formulations.core.deadline import Deadline
from coop.formulations.core.result import DevicePrice, SolveResult
from coop.formulations.heuristics.paging import paging_schedule
from coop.formulations.heuristics.warm_start import best_warm_start
from coop.formulations.moccasin.intervals import moccasin
from coop.graph import Graph
from coop.schedule import Schedule, ScheduleError, simulate

#: The profile used when none is given: coop's usual target, a data-centre GPU paging over PCIe.
DEFAULT_DEVICE_PROFILE = "h100-sxm-pcie5"
OBJECTIVES = ("energy", "time")

Objective = Literal["energy", "time"]


class PoetError(CoopError):
    """A bad option of the poet formulation (objective, runtime budget)."""


# -------------------------------------------------------------------- prices (the one place)
@dataclass(frozen=True)
class NodePrice:
    """What one compute, page-in and page-out of a node costs on a profile, in seconds and joules."""

    compute_s: float
    compute_j: float
    pagein_s: float
    pagein_j: float
    pageout_s: float
    pageout_j: float

    def compute(self, objective: Objective) -> float:
        return self.compute_j if objective == "energy" else self.compute_s

    def pagein(self, objective: Objective) -> float:
        return self.pagein_j if objective == "energy" else self.pagein_s

    def pageout(self, objective: Objective) -> float:
        return self.pageout_j if objective == "energy" else self.pageout_s


def node_price(runtime_s: float, num_bytes: int, profile: DeviceProfile) -> NodePrice:
    """POET's model: compute_j = runtime x FLOP/s / FLOP-per-J; paging (latency + bytes / throughput) x memory power.

    The graph's cost is read as seconds on the profiled device (POET's graphs: ``runtime_s``) and
    its memory as bytes.

    Parameters
    ----------
    runtime_s : float
        The node's cost, read as seconds on the profiled device.
    num_bytes : int
        The node's output size (what a page-in or page-out moves).

    Returns
    -------
    NodePrice
        Seconds and joules of one compute, one page-in and one page-out.

    References
    ----------
    POET (Patil et al., ICML 2022), section 3 (the cost model of its MILP).
    """
    return NodePrice(runtime_s, profile.compute_j(runtime_s), profile.pagein_s(num_bytes), profile.pagein_j(num_bytes),
                     profile.pageout_s(num_bytes), profile.pageout_j(num_bytes))


@dataclass
class SchedulePrice:
    """A schedule priced on a profile: energy and time, split into compute and paging."""

    compute_j: float = 0.0
    paging_j: float = 0.0
    compute_s: float = 0.0
    paging_s: float = 0.0
    page_ins: int = 0
    page_outs: int = 0
    paged_bytes: int = 0

    @property
    def energy_j(self) -> float:
        return self.compute_j + self.paging_j

    @property
    def time_s(self) -> float:
        return self.compute_s + self.paging_s

    def value(self, objective: Objective) -> float:
        return self.energy_j if objective == "energy" else self.time_s

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "energy_j": self.energy_j, "time_s": self.time_s}


def price_schedule(graph: Graph, schedule: Schedule, profile: DeviceProfile | str) -> SchedulePrice:
    """Energy and time of every step of the schedule on the profile (steps are not checked here).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    schedule : Schedule
        Its computes (with their implementation), page-ins and page-outs are priced; frees cost nothing.
    profile : DeviceProfile or str
        The device, or a shipped profile name or .toml path.

    Returns
    -------
    SchedulePrice
        Compute and paging energy and time, page counts and paged bytes.
    """
    profile = load_device_profile(profile)
    price = SchedulePrice()
    for step in schedule.steps:
        node = graph.node(step.node)
        cost, mem = node.cost, node.mem
        if step.impl is not None:
            impl = next(i for i in node.impls if i.name == step.impl)
            cost, mem = impl.cost, impl.mem
        each = node_price(float(cost), mem, profile)
        if step.op == "compute":
            price.compute_s += each.compute_s
            price.compute_j += each.compute_j
        elif step.op == "page_in":
            price.paging_s += each.pagein_s
            price.paging_j += each.pagein_j
            price.page_ins += 1
            price.paged_bytes += mem
        elif step.op == "page_out":
            price.paging_s += each.pageout_s
            price.paging_j += each.pageout_j
            price.page_outs += 1
            price.paged_bytes += mem
    return price


# -------------------------------------------------------------------- the setting and its warm starts
@dataclass
class PoetSetting:
    """One poet solve's problem: the graph, the budgets, the objective on a device profile, the allowed moves."""

    graph: Graph
    budget: int
    objective: Objective
    profile: DeviceProfile
    runtime_budget: float | None
    remat: bool
    paging: bool

    def price(self, schedule: Schedule) -> SchedulePrice:
        """The schedule priced on the setting's profile (:func:`price_schedule`)."""
        return price_schedule(self.graph, schedule, self.profile)

    def admits(self, schedule: Schedule) -> bool:
        """Legal, within the memory budget, within the runtime budget, and of the allowed kind."""
        try:
            sim = simulate(self.graph, schedule)
        except ScheduleError:
            return False
        price = self.price(schedule)
        if sim.peak > self.budget or (not self.remat and sim.recomputations):
            return False
        if not self.paging and (price.page_ins or price.page_outs):
            return False
        return self.runtime_budget is None or price.time_s <= self.runtime_budget * self.graph.baseline_cost * (1 + 1e-9)


def poet_setting(graph: Graph, budget: int, *, objective: str, device_profile: str | DeviceProfile | None,
                 runtime_budget: float | None, remat: bool, paging: bool) -> PoetSetting:
    """poet's options checked (one :class:`PoetError` line each) and turned into its setting.

    Parameters
    ----------
    graph, budget:
        The problem (budget in graph units).
    objective, device_profile, runtime_budget, remat, paging:
        As :func:`coop.formulations.poet.milp.poet` takes them; ``device_profile`` None is
        :data:`DEFAULT_DEVICE_PROFILE`.

    Returns
    -------
    PoetSetting
        What both of poet's models (the stage MILP and the interval model) solve.
    """
    if objective not in OBJECTIVES:
        raise PoetError(f"unknown objective {objective!r} for poet: choose energy or time")
    if runtime_budget is not None and (isinstance(runtime_budget, bool) or not math.isfinite(runtime_budget)
                                       or runtime_budget < 1):
        raise PoetError(f"runtime budget {runtime_budget!r} is not a factor >= 1 of the baseline compute time "
                        "(every node is computed at least once); give e.g. 1.5")
    profile = load_device_profile(device_profile or DEFAULT_DEVICE_PROFILE)
    if not remat and not paging:
        raise PoetError("poet with remat=False and paging=False can only run the baseline; use store-all")
    return PoetSetting(graph, budget, objective, profile, runtime_budget, remat, paging)  # type: ignore[arg-type]


def check_poet_options(graph: Graph, budget: int, options: Any) -> None:
    """poet's option checks, run first at every budget by its entry check (:func:`poet_setting`'s errors).

    Parameters
    ----------
    options:
        poet's options (:class:`~coop.formulations.core.options.PoetOptions` or ``PoetIntervalsOptions``): its
        ``objective``, ``device_profile``, ``runtime_budget``, ``remat`` and ``paging`` are checked.

    Raises
    ------
    PoetError
        For a bad objective, runtime budget or pair of moves.
    """
    poet_setting(graph, budget, objective=options.objective, device_profile=options.device_profile,
                 runtime_budget=options.runtime_budget, remat=options.remat, paging=options.paging)


def best_fallback(setting: PoetSetting, hint: Any, time_limit: float) -> tuple[str, Schedule] | None:
    """The cheapest admitted warm start on the objective.

    The candidates: the best remat-only one (:func:`coop.formulations.heuristics.warm_start.best_warm_start`) and
    Moccasin's remat-only schedule, where paging is allowed the paging-only heuristic
    (:func:`coop.formulations.heuristics.paging.paging_schedule`), which fits in milliseconds below the
    least budget recomputation alone reaches, and every hint.

    Parameters
    ----------
    setting : PoetSetting
        The problem; a candidate must pass :meth:`PoetSetting.admits`.
    hint : Any
        A schedule, a result with a schedule, a list of them, or None.
    time_limit : float
        The seconds left of poet's time limit; the warm starts get shares of it.

    Returns
    -------
    tuple of (str, Schedule) or None
        The winner's name and schedule; None when no candidate is admitted.
    """
    until = Deadline.after(time_limit)
    candidates: list[tuple[str, Schedule]] = []
    if setting.remat:
        found = best_warm_start(setting.graph, setting.budget, hint, lp_time_limit=min(10.0, time_limit / 6),
                                time_limit=time_limit / 6)
        if found is not None:
            candidates.append((found[0], found[1]))
        remat_only = _moccasin_remat_only(setting, MOCCASIN_SHARE * time_limit, found)
        if remat_only is not None:
            candidates.append(("moccasin (remat only)", remat_only))
    if setting.paging:
        # the only candidate where recomputation alone cannot fit: then it may take all the time left
        paged = paging_schedule(setting.graph, setting.budget, deadline=until.share(PAGING_SHARE) if candidates else until)
        if paged is not None:
            candidates.append(("paging heuristic", paged))
    # Every hint competes on the objective too (best_warm_start ranks by compute cost, which a paging
    # schedule's energy does not follow).
    for given in hint if isinstance(hint, list | tuple) else [hint]:
        schedule = getattr(given, "schedule", given)
        if isinstance(schedule, Schedule):
            candidates.append(("hint", schedule))
    admitted = [(setting.price(s).value(setting.objective), name, s) for name, s in candidates if setting.admits(s)]
    if not admitted:
        return None
    _, name, schedule = min(admitted, key=lambda item: item[0])
    return name, schedule


#: The share of poet's time limit that Moccasin's remat-only model gets as a warm start.
MOCCASIN_SHARE = 0.25
#: The share of what is left that the paging heuristic may take (:func:`paging_schedule` stops there) where a
#: remat-only candidate fits (else all of it).
PAGING_SHARE = 0.4


def _moccasin_remat_only(setting: PoetSetting, time_limit: float, found: Any) -> Schedule | None:
    """Moccasin's schedule (Bartan et al. 2023) without paging: a schedule of a subset of POET's space, so POET
    starts no worse than it (issue 24: POET's graphs at POET's budgets ended 0.02 % above Moccasin's remat-only
    schedule). Without recomputation paging costs nothing to compare here: a remat-only schedule's energy and time
    follow its compute cost, Moccasin's objective. None where it finds nothing (or no time is left for it)."""
    if time_limit < 1.0:
        return None
    hints = [found[1]] if found is not None else None
    try:
        # in POET's own order of first computations (its stages keep graph.order): a subset of POET's space
        result = moccasin(setting.graph, setting.budget, time_limit=time_limit, threads=1, hint=hints,
                          keep_order=True, order="captured")
    except CoopError:
        return None
    return result.schedule


def at_least_baseline(setting: PoetSetting, bound: float | None) -> float:
    """A proven lower bound: the solver's, and never below the baseline's price.

    Every legal schedule computes every node at least once (with its cheapest implementation at best)
    and paging costs >= 0, so the baseline's price bounds every schedule: a solve stopped before its
    root LP still states a gap.

    Parameters
    ----------
    bound : float or None
        The solver's bound in the objective's unit, if any.

    Returns
    -------
    float
        The larger of the two.
    """
    cheapest = [min([n.cost, *(i.cost for i in n.impls)]) for n in setting.graph.nodes
                if not n.caller_owned and not n.optional]  # a hint may run a cheaper implementation
    prices = [node_price(float(cost), 0, setting.profile) for cost in cheapest]
    floor = sum(p.compute_j if setting.objective == "energy" else p.compute_s for p in prices)
    return floor if bound is None else max(bound, floor)


def priced_result(setting: PoetSetting, schedule: Schedule, status: Any, bound: float | None, wall: float,
                  message: str, extra: dict[str, Any]) -> SolveResult:
    """poet's result for a schedule: simulated, priced on the profile, its price in ``price``.

    Parameters
    ----------
    status : str
        ``optimal`` or ``feasible``.
    bound : float or None
        The lower bound in the objective's unit.
    wall : float
        Seconds the solve took.
    message : str
        What ran and why.
    extra : dict
        Further details (which model, which warm start).

    Returns
    -------
    SolveResult
        With the objective in the objective's unit, the schedule's price in ``price`` (its split into compute
        and paging in ``extra``).
    """
    sim = simulate(setting.graph, schedule)
    price = setting.price(schedule)
    extra = {**extra, **price.to_dict(), "recomputations": sim.recomputations}
    priced = DevicePrice(setting.profile.name, setting.objective, price.energy_j, price.time_s, price.page_ins,
                         price.page_outs, price.paged_bytes)
    return SolveResult("poet", status, schedule=schedule, simulation=sim, objective=price.value(setting.objective),
                       bound=bound, wall_s=wall, message=message, extra=extra, price=priced)


__all__ = ["DEFAULT_DEVICE_PROFILE", "MOCCASIN_SHARE", "OBJECTIVES", "NodePrice", "Objective", "PoetError", "PoetSetting",
           "SchedulePrice", "at_least_baseline", "best_fallback", "node_price", "price_schedule", "priced_result"]
