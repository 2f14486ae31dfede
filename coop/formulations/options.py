"""Typed options of the formulations: one common base, one subclass per solver.

Every formulation is a function ``f(graph, budget, *, options) -> SolveResult``. Its options are
declared here, as the fields of a frozen dataclass, so that callers (``coop.formulations.solve``,
the CLI, ``coop.plan``) learn what a solver takes from a type, not by reading its signature:

* :class:`SolverOptions` holds the options every formulation accepts by the same name
  (``time_limit``, ``threads``, ``progress``, ``hint``, ``captured``, ``deadline``); a subclass names in
  :attr:`SolverOptions.uses` which of them its solver reads (a baseline has no use for a time limit
  and leaves it unused);
* each subclass adds the solver's own options.

A field left ``None`` means "the solver's default": defaults live in one place, the solver's own
signature, and ``tests/test_options_contract.py`` checks every subclass against that signature.
This module imports no solver, so listing options costs no solver import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from coop.errors import CoopError
from coop.formulations.deadline import Deadline, check_common_options

#: The options every formulation accepts by these names, keyword-only.
COMMON_OPTIONS = frozenset({"time_limit", "threads", "progress", "hint", "captured", "deadline"})

#: The common options of a solver that keeps a time limit: it reads the one deadline too.
TIMED = frozenset({"time_limit", "threads", "progress", "deadline"})


@dataclass(frozen=True, kw_only=True)
class SolverOptions:
    """The common options.

    Parameters
    ----------
    time_limit:
        Wall-clock seconds the solver may use (its whole search, warm starts included).
    threads:
        Solver worker threads.
    progress:
        A callback receiving incumbent, bound and elapsed time (``coop.formulations.progress``).
    hint:
        A schedule (or a result holding one) to start from.
    captured:
        The captured step (``coop.graph_capture.Captured``), for solvers that read more than the Graph.
    deadline:
        A caller's :class:`~coop.formulations.deadline.Deadline` bounding the solve (a solver running another
        passes its own, with ``time_limit`` as the child's share): the solve's own deadline, made from
        ``time_limit`` at its entry, is the earlier of the two.

    A time limit that is not a positive number of seconds, or fewer than one thread, is refused here in one
    line (:class:`~coop.errors.OptionError`), as the CLI refuses it.
    """

    #: Which common options this solver reads; the others are accepted and left unused.
    uses: ClassVar[frozenset[str]] = frozenset()

    time_limit: float | None = None
    threads: int | None = None
    progress: Any = None
    hint: Any = None
    captured: Any = None
    deadline: Deadline | None = None

    def __post_init__(self) -> None:
        check_common_options(self.time_limit, self.threads)

    @classmethod
    def own_options(cls) -> frozenset[str]:
        """The solver's own options (the fields beyond the common ones)."""
        return frozenset(f.name for f in dataclasses.fields(cls)) - COMMON_OPTIONS

    @classmethod
    def taken(cls) -> frozenset[str]:
        """Every keyword the solver's function takes: its own options and the common ones it reads."""
        return cls.own_options() | cls.uses

    @classmethod
    def accepted(cls) -> frozenset[str]:
        """Every option a caller may give: the solver's own and all the common ones."""
        return cls.own_options() | COMMON_OPTIONS

    @classmethod
    def from_keywords(cls, formulation: str, options: Mapping[str, Any]) -> SolverOptions:
        """Typed options from keywords, ``None`` values meaning the default.

        Raises
        ------
        CoopError
            One line naming the first unknown option and listing what ``formulation`` takes.
        """
        given = {name: value for name, value in options.items() if value is not None}
        unknown = sorted(set(given) - cls.accepted())
        if unknown:
            raise CoopError(f"formulation {formulation!r} has no option {unknown[0]!r}: it takes "
                            f"{', '.join(sorted(cls.accepted()))}")
        return cls(**given)

    def keywords(self) -> dict[str, Any]:
        """The keywords to call the solver's function with: the options it takes that were given."""
        return {name: getattr(self, name) for name in sorted(self.taken()) if getattr(self, name) is not None}


@dataclass(frozen=True, kw_only=True)
class BaselineOptions(SolverOptions):
    """store-all, checkpoint-all and per-layer: no options."""


@dataclass(frozen=True, kw_only=True)
class ChenSqrtOptions(SolverOptions):
    """Chen et al. 2016's sqrt(n) segmentation (``coop.formulations.baselines.chen_sqrt``)."""

    use_articulation_points: bool | None = None


@dataclass(frozen=True, kw_only=True)
class ChenGreedyOptions(ChenSqrtOptions):
    """Chen et al. 2016's greedy segmentation swept over a grid of budgets."""

    grid_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class CheckmateOptions(SolverOptions):
    """Checkmate's MILP (Jain et al., MLSys 2020): backend, size limit, memory coarsening, cost cap."""

    uses: ClassVar[frozenset[str]] = TIMED
    solver: str | None = None
    max_nodes: int | None = None
    memory_levels: int | None = None
    cost_limit: float | None = None
    verbose: bool | None = None


@dataclass(frozen=True, kw_only=True)
class CheckmateLpOptions(SolverOptions):
    """Checkmate's LP relaxation with two-phase rounding (section 5)."""

    uses: ClassVar[frozenset[str]] = TIMED
    max_nodes: int | None = None
    thresholds: tuple[float, ...] | None = None
    random_roundings: int | None = None
    seed: int | None = None


@dataclass(frozen=True, kw_only=True)
class MoccasinOptions(SolverOptions):
    """Moccasin's interval model on CP-SAT (Bartan et al., ICML 2023)."""

    uses: ClassVar[frozenset[str]] = TIMED | {"hint"}
    max_intervals: int | None = None
    keep_order: bool | None = None
    extra_slots: int | None = None
    seed: int | None = None
    prove: bool | None = None
    lp_warm_start: bool | None = None
    local_search: float | None = None  # the share of the time limit before CP-SAT (moccasin.moccasin)
    cp_sat_parameters: Mapping[str, Any] | None = None
    order: str | None = None


@dataclass(frozen=True, kw_only=True)
class MonetOptions(SolverOptions):
    """MONeT's joint checkpointing and operator choice (Shah et al., ICLR 2021)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    exact: bool | None = None
    solver: str | None = None
    max_nodes: int | None = None
    warm_start: bool | None = None
    verbose: bool | None = None
    recompute: bool | None = None
    model: str | None = None
    max_intervals: int | None = None
    order: str | None = None


@dataclass(frozen=True, kw_only=True)
class MincutOptions(SolverOptions):
    """PyTorch's min-cut partitioner swept over its activation-memory-budget knob."""

    uses: ClassVar[frozenset[str]] = frozenset({"captured"})
    memory_budgets: tuple[float, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class BlocksOptions(SolverOptions):
    """Repeated blocks planned once, composed and polished (Rockmate / HiRemate, ICML 2023 / 2025; Moccasin)."""

    uses: ClassVar[frozenset[str]] = TIMED | {"hint"}
    seed: int | None = None


@dataclass(frozen=True, kw_only=True)
class PoetOptions(SolverOptions):
    """POET's joint rematerialization and paging (Patil et al., ICML 2022)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    objective: str | None = None
    device_profile: Any = None
    runtime_budget: float | None = None
    remat: bool | None = None
    paging: bool | None = None
    solver: str | None = None
    max_nodes: int | None = None
    verbose: bool | None = None


@dataclass(frozen=True, kw_only=True)
class AutoOptions(SolverOptions):
    """auto's ladder: the device profile lets it try paging (POET)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    device_profile: Any = None
