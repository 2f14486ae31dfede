"""Native solvers' output kept off stdout (which carries coop's own, ``coop solve --json``): file descriptor 1
redirected while any solver runs, to stderr when ``verbose``, else discarded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator


def _nowhere_or_stderr(verbose: bool) -> int:
    """A new file descriptor: stderr's when ``verbose``, else /dev/null's."""
    return os.dup(2) if verbose else os.open(os.devnull, os.O_WRONLY)


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers, so that what a solver printf'd lands where it was meant to."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to speak to (e.g. Windows): nothing buffered there
        pass


class _StdoutGuard:
    """Descriptor 1 redirected while any solver runs (threads may overlap), restored after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: int | None = None

    def enter(self, verbose: bool) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            try:
                sys.stdout.flush()
                _flush_c_stdio()
                self.saved = os.dup(1)
                target = _nowhere_or_stderr(verbose)
                os.dup2(target, 1)
                os.close(target)
            except (OSError, ValueError, AttributeError):  # no descriptor 1 (a closed or replaced stdout): nothing to guard
                self.saved = None

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.saved is not None:
                _flush_c_stdio()
                os.dup2(self.saved, 1)
                os.close(self.saved)
                self.saved = None


_STDOUT_GUARD = _StdoutGuard()


@contextlib.contextmanager
def solver_output(verbose: bool) -> Iterator[None]:
    """Keep a native solver's output off stdout while it runs: to stderr when ``verbose``, else discarded.

    HiGHS prints its banner through OR-Tools whatever the options say, and SCIP and CP-SAT log to
    file descriptor 1 from C++: only redirecting the descriptor keeps ``coop solve --json``'s
    stdout pure JSON.

    Parameters
    ----------
    verbose : bool
        Send the solver's output to stderr instead of discarding it.

    Yields
    ------
    None
        While the solver runs.
    """
    _STDOUT_GUARD.enter(verbose)
    try:
        yield
    finally:
        _STDOUT_GUARD.leave()
