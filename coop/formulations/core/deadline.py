"""One deadline per solve: made once from ``time_limit`` at a formulation's entry, handed down to everything it runs.

A :class:`Deadline` is a point on a clock (``time.perf_counter`` unless a test injects another). The
formulation entry (:func:`coop.formulations.core.entry.formulation`) makes it from ``time_limit`` when the call
begins, so that checking the options, building models and collecting warm starts all count; a solver asks
:meth:`Deadline.remaining` whenever it starts a stage and gives the stage only what is left. A solver that
runs another (``auto``'s rungs, ``blocks`` polishing with Moccasin, MONeT's and POET's warm starts) passes its
own deadline down with the call's ``time_limit`` as the child's share: the child's deadline is the earlier of
the two (:meth:`Deadline.after` with ``within``), so no nested call can outlive its parent.

:func:`cp_sat_with_limit` is the one place where a CP-SAT solver gets its time limit and workers;
:func:`cp_sat_solver` gives it what is left before a deadline.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coop.errors import CoopError, OptionError

#: A clock: seconds as a float, monotonic (``time.perf_counter`` by default).
Clock = Callable[[], float]

#: CP-SAT stops a little after its limit, then the solution is read back and simulated: a solve gets what is
#: left less this reserve (seconds) and :data:`CP_SAT_RESERVE_SHARE` of what is left.
CP_SAT_RESERVE_S = 0.5
#: See :data:`CP_SAT_RESERVE_S`.
CP_SAT_RESERVE_SHARE = 0.03
#: CP-SAT parameters every formulation's solver starts from (a caller's ``parameters`` override them). The
#: feasibility pump's one task ran 16.7 s past its share of an 18 s limit on Moccasin's ResNet-50 (2 workers, one
#: other busy core): with it off, the solve keeps its limit.
CP_SAT_DEFAULTS: dict[str, Any] = {"use_feasibility_pump": False}


@dataclass(frozen=True)
class Deadline:
    """The instant a solve must have returned by, on ``clock``.

    Parameters
    ----------
    at:
        The clock reading of the deadline.
    limit:
        The seconds it was made from (the caller's ``time_limit``), for messages.
    clock:
        The clock (``time.perf_counter``; tests inject a fake one).
    started:
        The clock reading when it was made.

    Examples
    --------
    >>> now = [100.0]
    >>> deadline = Deadline.after(10.0, clock=lambda: now[0])
    >>> now[0] = 104.0
    >>> deadline.remaining(), deadline.elapsed()
    (6.0, 4.0)
    >>> Deadline.after(30.0, within=deadline).remaining()  # a child never outlives its parent
    6.0
    """

    at: float
    limit: float
    clock: Clock = field(default=time.perf_counter, compare=False, repr=False)
    started: float = 0.0

    @classmethod
    def after(cls, seconds: float, *, within: Deadline | None = None, clock: Clock | None = None) -> Deadline:
        """A deadline ``seconds`` from now, or ``within``'s when that comes first (on ``within``'s clock)."""
        clock = within.clock if within is not None else clock or time.perf_counter
        now = clock()
        at = now + seconds
        if within is not None:
            at = min(at, within.at)
        return cls(at, seconds, clock, now)

    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - self.clock())

    def elapsed(self) -> float:
        """Seconds since it was made."""
        return self.clock() - self.started

    def expired(self) -> bool:
        """Whether it has passed."""
        return self.clock() >= self.at

    def share(self, fraction: float) -> Deadline:
        """A deadline ``fraction`` of what is left from now (a stage's share; never past this one)."""
        return Deadline.after(fraction * self.remaining(), within=self)

    def check(self, doing: str) -> None:
        """Raise :class:`DeadlinePassed` (one line: what was being done, after how long) once it has passed."""
        if self.expired():
            raise DeadlinePassed(f"{doing} was stopped at the time limit ({self.limit:g} s)")


class DeadlinePassed(CoopError):
    """A stage that cannot return anything useful once the deadline passes (building a model) stopped there."""


def check_common_options(time_limit: Any, threads: Any) -> None:
    """Refuse a time limit that is not a positive finite number of seconds, or fewer than one thread (one line).

    Parameters
    ----------
    time_limit : Any
        Seconds, or None (nothing to check).
    threads : Any
        Worker threads, or None (nothing to check).

    Raises
    ------
    OptionError
        Naming the option, the value and an example of a good one.
    """
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, int | float)
                                   or not 0 < time_limit < math.inf):
        raise OptionError(f"time_limit={time_limit!r} is not a positive number of seconds: give e.g. "
                          "time_limit=60")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads={threads!r} is not a positive whole number: give e.g. threads=2")


def cp_sat_seconds(deadline: Deadline, *, reserve: bool = True, least: float = 0.01) -> float:
    """The seconds a CP-SAT solve started now may run: what is left, less the reserve (at least ``least``).

    Parameters
    ----------
    deadline : Deadline
        The solve's deadline.
    reserve : bool
        Keep :data:`CP_SAT_RESERVE_S` and :data:`CP_SAT_RESERVE_SHARE` of what is left.
    least : float
        The least seconds returned.

    Returns
    -------
    float
        The seconds.
    """
    left = deadline.remaining()
    if reserve:
        left -= CP_SAT_RESERVE_S + CP_SAT_RESERVE_SHARE * left
    return max(least, left)


def cp_sat_solver(deadline: Deadline, threads: int, *, seed: int | None = None, reserve: bool = True,
                  least: float = 0.01, parameters: Mapping[str, Any] | None = None,
                  cap: float | None = None) -> Any:
    """A CP-SAT solver given the time left before ``deadline`` (less a reserve) and ``threads`` workers.

    Parameters
    ----------
    deadline:
        The solve's deadline; the limit is :func:`cp_sat_seconds`, capped at ``cap`` seconds when given.
    threads:
        CP-SAT's workers (at least 1).
    seed:
        CP-SAT's random seed (None: its default).
    reserve:
        Keep :data:`CP_SAT_RESERVE_S` and :data:`CP_SAT_RESERVE_SHARE` of the time for reading the solution back.
    least:
        The least limit given (CP-SAT needs a positive one).
    parameters:
        Further CP-SAT parameters by name, set last.
    cap:
        The most seconds this solve may take (a stage's share), or None.
    """
    seconds = cp_sat_seconds(deadline, reserve=reserve, least=least)
    return cp_sat_with_limit(min(seconds, cap) if cap is not None else seconds, threads, seed=seed,
                             parameters=parameters)


def cp_sat_with_limit(seconds: float, threads: int, *, seed: int | None = None,
                      parameters: Mapping[str, Any] | None = None) -> Any:
    """A CP-SAT solver (``cp_model.CpSolver``) limited to ``seconds`` with ``threads`` workers: the one place that
    sets CP-SAT's ``max_time_in_seconds`` and ``num_workers`` in the formulations (coop.online, a layer below, sets
    its own for the arena placement).

    Parameters
    ----------
    seconds:
        CP-SAT's time limit (given as is: a caller that may pass 0 keeps a least one itself).
    threads:
        CP-SAT's workers (at least 1).
    seed:
        CP-SAT's random seed (None: its default).
    parameters:
        Further CP-SAT parameters by name, set last.

    Returns
    -------
    Any
        The ``CpSolver``.
    """
    solver = _cp_sat_stopped_at_its_limit()
    solver.parameters.max_time_in_seconds = float(seconds)
    solver.parameters.num_workers = max(1, threads)
    for key, value in CP_SAT_DEFAULTS.items():
        setattr(solver.parameters, key, value)
    if seed is not None:
        solver.parameters.random_seed = seed
    for key, value in (parameters or {}).items():
        setattr(solver.parameters, key, value)
    return solver


def _cp_sat_stopped_at_its_limit() -> Any:
    """A new :func:`_stopped_solver_class` solver."""
    return _stopped_solver_class()()


@functools.cache
def _stopped_solver_class() -> type:
    """A ``CpSolver`` whose ``solve`` is also stopped from a timer thread when ``max_time_in_seconds`` has passed.

    CP-SAT checks its own limit between steps, and some steps run long without checking it: on Moccasin's
    ResNet-50 at 0.9 with one other busy core, a solve given 18 s ran 24-29 s (a 7-10 s presolve, then a search
    that still ran about its whole limit). ``stop_search`` from a timer interrupts the search where the limit
    alone did not; together with :data:`CP_SAT_DEFAULTS` that solve, at a 40 s limit, returned in 42.6 s
    instead of 50-58 s.
    """
    import threading

    from ortools.sat.python import cp_model

    class StoppedAtItsLimit(cp_model.CpSolver):
        def solve(self, model: Any, solution_callback: Any = None) -> Any:
            timer = threading.Timer(self.parameters.max_time_in_seconds, self.stop_search)
            timer.daemon = True
            timer.start()
            try:
                return super().solve(model, solution_callback)
            finally:
                timer.cancel()

    return StoppedAtItsLimit


__all__ = ["CP_SAT_DEFAULTS", "CP_SAT_RESERVE_S", "CP_SAT_RESERVE_SHARE", "Clock", "Deadline", "DeadlinePassed", "check_common_options", "cp_sat_seconds",
           "cp_sat_solver", "cp_sat_with_limit"]
