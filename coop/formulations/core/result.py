"""The common result of every formulation: a schedule with its solver status, bound and gap."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from coop.schedule import Schedule, Simulation

#: optimal: proven optimal; feasible: a schedule within budget, optimality not proven (time limit);
#: heuristic: a baseline/heuristic schedule (no bound); infeasible: proven no schedule fits;
#: unknown: stopped with no schedule and no proof.
SolveStatus = Literal["optimal", "feasible", "heuristic", "infeasible", "unknown"]


@dataclass(frozen=True)
class DevicePrice:
    """A schedule priced on a device profile (POET): energy and time, paging included, and what it pages.

    Parameters
    ----------
    device_profile:
        The profile's name (:mod:`coop.device_profiles`).
    objective:
        What the solver minimised on it: ``"energy"`` or ``"time"``.
    energy_j, time_s:
        Joules and seconds of the whole step, compute and paging.
    page_ins, page_outs, paged_bytes:
        The paging moves and the bytes they copy.
    """

    device_profile: str
    objective: str
    energy_j: float
    time_s: float
    page_ins: int
    page_outs: int
    paged_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Rung:
    """One rung of ``auto``'s ladder: who, for how long, with what outcome.

    Parameters
    ----------
    formulation:
        The formulation's name.
    status:
        Its result's status, or ``"skipped: <why>"``.
    wall_s:
        Seconds it ran (0 when skipped).
    limit_s:
        The seconds it was given.
    overhead:
        Its schedule's relative overhead over the baseline cost, where it found one that fits (else None).
    note:
        Its result's message, or why it was skipped.
    """

    formulation: str
    status: str
    wall_s: float = 0.0
    limit_s: float = 0.0
    overhead: float | None = None
    note: str = ""

    def line(self) -> str:
        """``"blocks: feasible, 12.3 of 20.0 s, 0.06 %"`` (what the summary lists)."""
        if self.status.startswith("skipped"):
            return f"{self.formulation}: {self.status}"
        found = "no schedule within the budget" if self.overhead is None else f"{100 * self.overhead:.2f} %"
        spent = f"{self.wall_s:.1f} of {self.limit_s:.1f} s" if self.limit_s else f"{self.wall_s:.1f} s"
        return f"{self.formulation}: {self.status}, {spent}, {found}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SolveResult:
    """What a formulation returns.

    ``schedule`` is None when nothing was found; ``simulation`` is the one simulator's verdict on
    it (peak, cost); ``objective`` is the solver's own objective, ``bound`` its proven lower bound
    on the cost and ``gap`` = (objective - bound) / objective where both exist. ``price`` is the
    schedule priced on a device profile, by the formulations that price (poet); ``extra`` holds
    further details a formulation reports for people (which model, which warm start), which no
    part of coop reads. ``fallback`` is set on a last-resort result (no solver ran to its end: a warm start or a
    baseline returned as found), saying why and what time would let a solver run; the outermost formulation call
    warns with it. ``rungs``: ``auto``'s ladder, one :class:`Rung` per formulation it tried or skipped.
    """

    formulation: str
    status: SolveStatus
    schedule: Schedule | None = None
    simulation: Simulation | None = None
    objective: float | None = None
    bound: float | None = None
    wall_s: float = 0.0
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    price: DevicePrice | None = None
    fallback: str = ""
    rungs: list[Rung] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        if self.objective == 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / abs(self.objective))

    @property
    def found(self) -> bool:
        return self.schedule is not None

    def solver_json(self) -> dict[str, Any]:
        """The ``solver`` object of contract 2's schedule JSON."""
        return {
            "status": self.status,
            "wall_s": round(self.wall_s, 6),
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
        }
