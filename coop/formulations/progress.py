"""Progress reports of long solves: incumbent, bound and elapsed time.

A solver calls its progress callback with a :class:`Progress` whenever it learns something
(a new incumbent, a better bound, start and end). :func:`stderr_progress` is the default
reporter: one line to stderr, at most one a second (the final report is always printed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from coop.formulations.deadline import Deadline


@dataclass(frozen=True)
class Progress:
    """One report: seconds since the solve began, best objective found, best proven bound."""

    elapsed_s: float
    incumbent: float | None = None
    bound: float | None = None
    message: str = ""
    final: bool = False

    @property
    def gap(self) -> float | None:
        """(incumbent - bound) / incumbent where both exist."""
        if self.incumbent is None or self.bound is None:
            return None
        if self.incumbent == 0:
            return 0.0
        return max(0.0, (self.incumbent - self.bound) / abs(self.incumbent))

    def line(self) -> str:
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
        The least seconds between two printed lines; a final report is always printed.

    Returns
    -------
    ProgressCallback
        The reporter, printing ``Progress.line()``.
    """
    last_printed = [float("-inf")]

    def report(progress: Progress) -> None:
        now = time.monotonic()
        if progress.final or now - last_printed[0] >= min_interval_s:
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
               final: bool = False) -> None:
        if self.callback is not None:
            self.callback(Progress(self.elapsed_s, incumbent, bound, message, final))


__all__ = ["Progress", "ProgressCallback", "ProgressClock", "stderr_progress"]
