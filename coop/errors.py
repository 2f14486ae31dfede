"""The errors coop raises on bad input.

Every error that reaches a user is a :class:`CoopError` whose message is one line naming the
problem and, where there is one, the fix. The CLI prints that line and exits non-zero; it never
shows a traceback for these.
"""

from __future__ import annotations


class CoopError(Exception):
    """Base class of every user-facing coop error (one-line message)."""

    def __init__(self, *args: object) -> None:
        # A message quotes user data (a node's name, a file's text) that may hold line breaks: keep it one line.
        if len(args) == 1 and isinstance(args[0], str):
            args = (" ".join(args[0].splitlines()),)
        super().__init__(*args)


class GraphError(CoopError):
    """A malformed graph: the message names the node and the problem."""


class BudgetError(CoopError):
    """A budget that cannot be parsed, or one below min_budget (the proven lower bound)."""


class ScheduleError(CoopError):
    """An illegal schedule: the message names the step index and the reason; ``step`` is that index (None where
    the fault is the schedule as a whole, such as an output not resident at the end, or its file)."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


class CaptureError(CoopError):
    """A model whose training step cannot be captured as a static graph."""


class InfeasibleError(CoopError):
    """A budget at or above min_budget that a method could not meet."""


class SolverError(CoopError):
    """A solver that is not installed or failed to run."""


class ContextError(CoopError):
    """A step run in a training context its plan cannot honour (the message names the difference and the fix)."""


class OptionError(CoopError):
    """A solver option out of its range (a time limit that is not a positive number of seconds, no threads)."""


class SolveTimeoutError(CoopError):
    """No schedule found within the time limit, without a proof that none exists: not an :class:`InfeasibleError`.

    The message says "no schedule found within N s", the best peak reached, the smallest budget known to fit and
    what to try; ``best_peak`` and ``fits_at`` hold those numbers (graph units, None where unknown).
    """

    def __init__(self, message: str, best_peak: int | None = None, fits_at: int | None = None) -> None:
        super().__init__(message)
        self.best_peak = best_peak
        self.fits_at = fits_at


class NeedsCudaError(ContextError):
    """A CUDA-only feature asked where it cannot run: CUDA graphs (``coop.compile``'s ``mode="reduce-overhead"``,
    ``coop.plan(cuda_graph=True)``) or the copy stream on a model or a torch without CUDA. The message names the
    feature and says to drop it there."""


class OverBudgetError(CoopError):
    """A compiled step that held more than its budget in every measured round of ``coop.compile``: ``held`` is the
    least it held, ``budget`` the budget, ``compiled`` that step (what ``torch.compile`` returns, for a user who
    accepts those bytes); ``floor`` the floor of the compiled graph with what was measured charged, where the re-solve
    below the excess reached it and found no schedule there (None otherwise)."""

    def __init__(self, message: str, held: int, budget: int, compiled: object, floor: int | None = None) -> None:
        super().__init__(message)
        self.held = held
        self.budget = budget
        self.compiled = compiled
        self.floor = floor


class LastResortWarning(UserWarning):
    """A result that no solver ran to completion for (a warm start returned because no time was left): valid and
    within its budget, but not searched; the message names the time limit that would let the solver run."""
