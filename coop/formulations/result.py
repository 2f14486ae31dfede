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


@dataclass
class SolveResult:
    """What a formulation returns.

    ``schedule`` is None when nothing was found; ``simulation`` is the one simulator's verdict on
    it (peak, cost); ``objective`` is the solver's own objective, ``bound`` its proven lower bound
    on the cost and ``gap`` = (objective - bound) / objective where both exist. ``price`` is the
    schedule priced on a device profile, by the formulations that price (poet); ``extra`` holds
    further details a formulation reports for people (which model, which warm start), which no
    part of coop reads.
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
