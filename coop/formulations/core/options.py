"""Typed options of the formulations: one common base, one subclass per solver, with the solver's defaults.

A decorated formulation (:func:`coop.formulations.core.entry.formulation`) receives one frozen options object:
its implementation is ``f(graph, budget, options) -> SolveResult`` and reads ``options.time_limit``,
``options.deadline`` and its own fields. Callers (``coop.formulations.solve``, the CLI, ``coop.plan``,
``auto``'s rungs) learn what a solver takes from the type:

* :class:`SolverOptions` holds the options every formulation accepts by the same name
  (``time_limit``, ``threads``, ``progress``, ``hint``, ``captured``, ``deadline``); a subclass names in
  :attr:`SolverOptions.uses` which of them its solver reads (a baseline has no use for a time limit);
* each subclass adds the solver's own options.

A field's default is the solver's default: this is the one place defaults live. A caller derives
options from others with ``dataclasses.replace`` (or :meth:`SolverOptions.from_options` across solvers).
The plain heuristics (the baselines, per-layer, pytorch-mincut) are not decorated: the registry calls them
with :meth:`SolverOptions.keywords`. This module imports no solver, so listing options costs no solver import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from coop.errors import CoopError, OptionError
from coop.formulations.core.deadline import Deadline, check_common_options

#: The options every formulation accepts by these names, keyword-only.
COMMON_OPTIONS = frozenset({"time_limit", "threads", "progress", "hint", "captured", "deadline"})

#: The common options of a solver that keeps a time limit: it reads the one deadline too.
TIMED = frozenset({"time_limit", "threads", "progress", "deadline"})


@dataclass(frozen=True, kw_only=True)
class SolverOptions:
    """The common options.

    A time limit that is not a positive number of seconds, or fewer than one thread, is refused here in one
    line (:class:`~coop.errors.OptionError`), as the CLI refuses it.

    Parameters
    ----------
    time_limit:
        Wall-clock seconds the solver may use (its whole search, warm starts included).
    threads:
        Solver worker threads.
    progress:
        A callback receiving incumbent, bound and elapsed time (``coop.formulations.core.progress``).
    hint:
        A schedule (or a result holding one, or a list of them) to start from.
    captured:
        The captured step (``coop.graph_capture.Captured``), for solvers that read more than the Graph.
    deadline:
        Given by a caller, a :class:`~coop.formulations.core.deadline.Deadline` bounding the solve (a solver running
        another passes its own, with ``time_limit`` as the child's share). The entry replaces it with the solve's
        own deadline, made from ``time_limit`` and never later than the caller's: that is what the solver reads.
    """

    #: Which common options this solver reads; the others are accepted and left unused.
    uses: ClassVar[frozenset[str]] = frozenset()

    time_limit: float = 60.0
    threads: int = 2
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
        """The options the solver reads: its own and the common ones it uses."""
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
        OptionError
            A time limit or thread count out of range: the one check (``__post_init__``), named for ``formulation``.
        """
        given = {name: value for name, value in options.items() if value is not None}
        unknown = sorted(set(given) - cls.accepted())
        if unknown:
            raise CoopError(f"formulation {formulation!r} has no option {unknown[0]!r}: it takes "
                            f"{', '.join(sorted(cls.accepted()))}")
        try:
            return cls(**given)
        except OptionError as error:
            raise OptionError(f"formulation {formulation!r}: {error}") from None

    @classmethod
    def from_options(cls, source: SolverOptions) -> SolverOptions:
        """This type's options taking every field ``source`` shares with it (another solver's options: a rung
        of ``auto`` from auto's); the others keep their defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(source) if f.name in names})

    def keywords(self) -> dict[str, Any]:
        """The keywords a plain (undecorated) heuristic takes: its own options and the common ones it reads,
        where not None."""
        return {name: getattr(self, name) for name in sorted(self.taken()) if getattr(self, name) is not None}


@dataclass(frozen=True, kw_only=True)
class BaselineOptions(SolverOptions):
    """store-all, checkpoint-all and per-layer: no options."""


@dataclass(frozen=True, kw_only=True)
class ChenSqrtOptions(SolverOptions):
    """Chen et al. 2016's sqrt(n) segmentation (``coop.formulations.heuristics.baselines.chen_sqrt``)."""

    use_articulation_points: bool = True


@dataclass(frozen=True, kw_only=True)
class ChenGreedyOptions(ChenSqrtOptions):
    """Chen et al. 2016's greedy segmentation swept over a grid of budgets."""

    grid_size: int = 24


@dataclass(frozen=True, kw_only=True)
class CheckmateOptions(SolverOptions):
    """Checkmate's MILP (Jain et al., MLSys 2020): backend, size limit, memory coarsening, cost cap, solver log
    (:func:`coop.formulations.checkmate.milp.checkmate`)."""

    uses: ClassVar[frozenset[str]] = TIMED
    solver: str = "cbc"
    max_nodes: int = 600  # the largest graph the O(n^2) model is built for
    memory_levels: int | None = None
    cost_limit: float | None = None
    verbose: bool = False


@dataclass(frozen=True, kw_only=True)
class CheckmateLpOptions(SolverOptions):
    """Checkmate's LP relaxation with two-phase rounding (section 5; :func:`coop.formulations.checkmate.milp.checkmate_lp`)."""

    uses: ClassVar[frozenset[str]] = TIMED
    max_nodes: int = 600
    thresholds: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    random_roundings: int = 16
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class MoccasinOptions(SolverOptions):
    """Moccasin's interval model on CP-SAT (Bartan et al., ICML 2023; :func:`coop.formulations.moccasin.intervals.moccasin`)."""

    uses: ClassVar[frozenset[str]] = TIMED | {"hint"}
    max_intervals: int = 2
    keep_order: bool | None = None  # None: kept on a training step
    extra_slots: int | None = None  # None: n // 5 + 2
    seed: int = 0
    prove: bool = True
    lp_warm_start: bool = True
    local_search: float | None = None  # the share of the time limit before CP-SAT (None: by graph size)
    cp_sat_parameters: Mapping[str, Any] | None = None
    order: str = "auto"


@dataclass(frozen=True, kw_only=True)
class MonetOptions(SolverOptions):
    """MONeT's joint checkpointing and operator choice (Shah et al., ICLR 2021; :func:`coop.formulations.monet.milp.monet`)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    exact: bool = False
    solver: str = "highs"
    max_nodes: int = 40  # above this many positions the interval model replaces the stage MILP
    warm_start: bool = True
    verbose: bool = False
    recompute: bool = True
    model: str = "auto"
    max_intervals: int = 2
    order: str = "auto"


@dataclass(frozen=True, kw_only=True)
class MonetIntervalsOptions(SolverOptions):
    """MONeT over the interval model (:func:`coop.formulations.monet.intervals.monet_intervals`; not registered:
    ``monet`` runs it)."""

    uses: ClassVar[frozenset[str]] = TIMED | {"hint"}
    exact: bool = False
    recompute: bool = True
    max_intervals: int = 2
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class MincutOptions(SolverOptions):
    """PyTorch's min-cut partitioner swept over its activation-memory-budget knob."""

    uses: ClassVar[frozenset[str]] = frozenset({"captured"})
    memory_budgets: tuple[float, ...] | None = None  # None: pytorch_mincut.DEFAULT_MEMORY_BUDGETS


@dataclass(frozen=True, kw_only=True)
class BlocksOptions(SolverOptions):
    """Repeated blocks planned once, composed and polished (Rockmate / HiRemate, ICML 2023 / 2025; Moccasin)."""

    uses: ClassVar[frozenset[str]] = TIMED | {"hint"}
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class PoetOptions(SolverOptions):
    """POET's joint rematerialization and paging (Patil et al., ICML 2022; :func:`coop.formulations.poet.milp.poet`)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    objective: str = "energy"
    device_profile: Any = None  # None: poet_setting.DEFAULT_DEVICE_PROFILE
    runtime_budget: float | None = None
    remat: bool = True
    paging: bool = True
    solver: str = "cbc"
    max_nodes: int = 300  # above this many computed nodes the interval model replaces the T x T MILP
    verbose: bool = False


@dataclass(frozen=True, kw_only=True)
class PoetIntervalsOptions(SolverOptions):
    """POET's choices in the interval model (:func:`coop.formulations.poet.intervals.poet_intervals`; not
    registered: ``poet`` runs its model above ``max_nodes``)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    objective: str = "energy"
    device_profile: Any = None
    runtime_budget: float | None = None
    remat: bool = True
    paging: bool = True
    max_intervals: int = 2
    warm_start: bool = True


@dataclass(frozen=True, kw_only=True)
class AutoOptions(SolverOptions):
    """auto's ladder: the device profile lets it try paging (POET)."""

    uses: ClassVar[frozenset[str]] = COMMON_OPTIONS
    device_profile: Any = None
