"""Progress reports of long solves: incumbent, bound and elapsed time.

A solver calls its progress callback with a :class:`Progress` whenever it learns something
(a new incumbent, a better bound, start and end). :func:`stderr_progress` is the default
reporter: one line to stderr, at most one a second (a final report and a milestone are always printed).
A call made of stages (``coop.plan``: capture, each solve and ``auto``'s rungs, each measured round) reports
through a :class:`StageProgress`, which stamps every report with the seconds since the call began.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from coop.formulations.core.deadline import Deadline


@dataclass(frozen=True)
class Progress:
    """One report: seconds since the solve began, best objective found, best proven bound.

    A ``milestone`` (a rung of ``auto`` ended, a stage of ``coop.plan``) is never throttled by
    :func:`stderr_progress`, and its line is the stamp and the message alone where it carries no objective.
    """

    elapsed_s: float
    incumbent: float | None = None
    bound: float | None = None
    message: str = ""
    final: bool = False
    milestone: bool = False

    @property
    def gap(self) -> float | None:
        """(incumbent - bound) / incumbent where both exist."""
        if self.incumbent is None or self.bound is None:
            return None
        if self.incumbent == 0:
            return 0.0
        return max(0.0, (self.incumbent - self.bound) / abs(self.incumbent))

    def line(self) -> str:
        """``"     1.2s  incumbent 10  bound 9  gap 10.00%  message"``; a milestone without objective: the stamp and
        the message."""
        if self.milestone and self.incumbent is None and self.bound is None:
            return f"{self.elapsed_s:8.1f}s  {self.message}"
        parts = [f"{self.elapsed_s:8.1f}s"]
        parts.append("incumbent " + ("-" if self.incumbent is None else f"{self.incumbent:.6g}"))
        parts.append("bound " + ("-" if self.bound is None else f"{self.bound:.6g}"))
        if self.gap is not None:
            parts.append(f"gap {100 * self.gap:.2f}%")
        if self.message:
            parts.append(self.message)
        return "  ".join(parts)


#: What solvers accept as ``progress=``: called with each report; its return value is ignored.
ProgressCallback = Callable[[Progress], None]


def stderr_progress(stream: TextIO | None = None, min_interval_s: float = 1.0) -> ProgressCallback:
    """A reporter printing one line per report to ``stream`` (stderr), throttled to one a second.

    Parameters
    ----------
    stream : TextIO or None
        Where to print; None: ``sys.stderr`` at the time of each report.
    min_interval_s : float
        The least seconds between two printed lines; a final report and a milestone are always printed.

    Returns
    -------
    ProgressCallback
        The reporter, printing ``Progress.line()``.
    """
    last_printed = [float("-inf")]

    def report(progress: Progress) -> None:
        now = time.monotonic()
        if progress.final or progress.milestone or now - last_printed[0] >= min_interval_s:
            last_printed[0] = now
            print(progress.line(), file=stream or sys.stderr, flush=True)

    return report


class ProgressClock:
    """Measures elapsed time from construction (or from when ``deadline`` was made, on its clock) and forwards
    reports to an optional callback."""

    def __init__(self, callback: ProgressCallback | None, deadline: Deadline | None = None) -> None:
        self.callback = callback
        self.clock = deadline.clock if deadline is not None else time.perf_counter
        self.start = deadline.started if deadline is not None else self.clock()

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def report(self, incumbent: float | None = None, bound: float | None = None, message: str = "",
               final: bool = False, milestone: bool = False) -> None:
        if self.callback is not None:
            self.callback(Progress(self.elapsed_s, incumbent, bound, message, final, milestone))


class StageProgress:
    """The progress of a call made of stages, on one clock from construction: each stage a milestone line, and
    every report a solver makes (which counts from its own start, a rung of ``auto`` from its own) restamped with
    the real seconds since the call began, so that no stamp goes back to 0. Silent where ``callback`` is None."""

    def __init__(self, callback: ProgressCallback | None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.callback = callback
        self.clock = clock
        self.start = clock()

    @classmethod
    def on_stderr(cls, show: bool | None, min_interval_s: float = 1.0) -> StageProgress:
        """Reports printed by :func:`stderr_progress` (solvers' reports at most one every ``min_interval_s``
        seconds): where ``show`` is True, or None, stderr is a terminal and this process is not a distributed
        rank other than 0 (each rank of a DDP/FSDP job plans; one prints); silent otherwise."""
        if show is None:
            show = sys.stderr.isatty() and _rank() == 0
        return cls(stderr_progress(min_interval_s=min_interval_s) if show else None)

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def stage(self, message: str, final: bool = False) -> None:
        """Report one stage (a milestone, always printed)."""
        if self.callback is not None:
            self.callback(Progress(self.elapsed_s, message=message, final=final, milestone=True))

    def forward(self) -> ProgressCallback | None:
        """The callback to hand a solver: its reports restamped on this clock; None where silent (so that a
        solver does no reporting work)."""
        callback = self.callback
        if callback is None:
            return None

        def report(progress: Progress) -> None:
            callback(dataclasses.replace(progress, elapsed_s=self.elapsed_s))

        return report


__all__ = ["Progress", "ProgressCallback", "ProgressClock", "StageProgress", "stderr_progress"]


def _rank() -> int:
    """This process's rank in the default process group; 0 outside one."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
