"""The errors coop raises on bad input.

Every error that reaches a user is a :class:`CoopError` whose message is one line naming the
problem and, where there is one, the fix. The CLI prints that line and exits non-zero; it never
shows a traceback for these.
"""

from __future__ import annotations


class CoopError(Exception):
    """Base class of every user-facing coop error (one-line message)."""


class GraphError(CoopError):
    """A malformed graph: the message names the node and the problem."""


class BudgetError(CoopError):
    """A budget that cannot be parsed, or one below the least feasible budget."""


class ScheduleError(CoopError):
    """An illegal schedule: the message names the step index and the reason."""


class CaptureError(CoopError):
    """A model whose training step cannot be captured as a static graph."""


class InfeasibleError(CoopError):
    """A budget above the least feasible one that a method could not meet."""


class SolverError(CoopError):
    """A solver that is not installed or failed to run."""
