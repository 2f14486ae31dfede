"""The registry of formulations: name -> function and options type (the one solver table), and :func:`solve`.

Modules are imported on first use (``importlib``, from the registered ``"module:function"``), so
that listing formulations or their options imports no solver. :meth:`Formulation.run` hands a solver its
typed options (:mod:`coop.formulations.core.options`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coop.errors import CoopError
from coop.formulations.core.options import (
    AutoOptions,
    BaselineOptions,
    BlocksOptions,
    CheckmateLpOptions,
    CheckmateOptions,
    ChenGreedyOptions,
    ChenSqrtOptions,
    MincutOptions,
    MoccasinOptions,
    MonetOptions,
    PoetOptions,
    SolverOptions,
)
from coop.formulations.core.result import SolveResult
from coop.graph import Graph


@dataclass(frozen=True)
class Formulation:
    """A registered formulation: where its function lives and the type of its options.

    Parameters
    ----------
    target:
        ``"module:function"``, imported on first use so that a missing optional solver only
        matters when it is asked for.
    options:
        The :class:`~coop.formulations.core.options.SolverOptions` subclass declaring what it takes.
    """

    target: str
    options: type[SolverOptions]

    def function(self) -> Callable[..., SolveResult]:
        """The solve function (its module imported now)."""
        module_name, function_name = self.target.split(":")
        return getattr(importlib.import_module(module_name), function_name)

    def run(self, graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
        """Run the formulation with typed options.

        Parameters
        ----------
        graph, budget:
            The problem (budget in graph units).
        options:
            Of :attr:`options`' type: a solver (decorated by :func:`coop.formulations.core.entry.formulation`) receives
            the object; a plain heuristic (the baselines, per-layer, pytorch-mincut) the keywords it takes
            (:meth:`~coop.formulations.core.options.SolverOptions.keywords`).

        Returns
        -------
        SolveResult
            The formulation's result.
        """
        function = self.function()
        if hasattr(function, "options_type"):
            return function(graph, budget, options=options)
        return function(graph, budget, **options.keywords())


#: name -> registered formulation (lazy so that importing coop stays light).
FORMULATIONS: dict[str, Formulation] = {
    "store-all": Formulation("coop.formulations.heuristics.baselines:store_all", BaselineOptions),
    "checkpoint-all": Formulation("coop.formulations.heuristics.baselines:checkpoint_all", BaselineOptions),
    "chen-sqrt": Formulation("coop.formulations.heuristics.baselines:chen_sqrt", ChenSqrtOptions),
    "chen-greedy": Formulation("coop.formulations.heuristics.baselines:chen_greedy", ChenGreedyOptions),
    "per-layer": Formulation("coop.formulations.blocks.per_layer:per_layer_checkpoint", BaselineOptions),
    "checkmate": Formulation("coop.formulations.checkmate.milp:checkmate", CheckmateOptions),
    "checkmate-lp": Formulation("coop.formulations.checkmate.milp:checkmate_lp", CheckmateLpOptions),
    "moccasin": Formulation("coop.formulations.moccasin.intervals:moccasin", MoccasinOptions),
    "blocks": Formulation("coop.formulations.blocks.formulation:blocks", BlocksOptions),
    "monet": Formulation("coop.formulations.monet.milp:monet", MonetOptions),
    "pytorch-mincut": Formulation("coop.formulations.heuristics.pytorch_mincut:pytorch_mincut", MincutOptions),
    "poet": Formulation("coop.formulations.poet.milp:poet", PoetOptions),
    "auto": Formulation("coop.formulations.ladder.auto:auto", AutoOptions),
}

#: The baselines that schedule any training step (auto's fallback, the tests over every graph); per-layer is a
#: baseline too but refuses a step without repeated layers.
BASELINES = ("store-all", "checkpoint-all", "chen-sqrt", "chen-greedy")


def registered(name: str) -> Formulation:
    """The formulation registered under ``name`` (one-line CoopError naming the choices otherwise).

    Parameters
    ----------
    name : str
        A key of ``FORMULATIONS``.

    Returns
    -------
    Formulation
        The registry's entry.

    Raises
    ------
    CoopError
        When no formulation is registered under ``name``.
    """
    found = FORMULATIONS.get(name)
    if found is None:
        raise CoopError(f"unknown formulation {name!r}: choose one of {', '.join(FORMULATIONS)}")
    return found


def get_formulation(name: str) -> Callable[..., SolveResult]:
    """The solve function registered under ``name`` (CoopError naming the choices otherwise).

    Parameters
    ----------
    name : str
        A key of ``FORMULATIONS``.

    Returns
    -------
    callable
        The formulation's function, returning a SolveResult.

    Raises
    ------
    CoopError
        When no formulation is registered under ``name``.
    """
    return registered(name).function()


def formulation_options(formulation: str) -> frozenset[str]:
    """The options the formulation reads (its own and the common ones it uses).

    Parameters
    ----------
    formulation : str
        A key of ``FORMULATIONS``.

    Returns
    -------
    frozenset of str
        The option names.

    Raises
    ------
    CoopError
        When no formulation is registered under ``formulation``.
    """
    return registered(formulation).options.taken()


def solve(graph: Graph, budget: int, formulation: str, **options: Any) -> SolveResult:
    """Run one formulation on a graph under a budget in graph units: the one options contract.

    Parameters
    ----------
    graph, budget:
        The problem; ``budget`` already parsed to graph units (``coop.budget.parse_budget``).
    formulation:
        A name of :data:`FORMULATIONS`.
    options:
        Its options by name (:mod:`coop.formulations.core.options`): any of :data:`COMMON_OPTIONS`, or one of
        the formulation's own; ``None`` means the default.

    Returns
    -------
    SolveResult
        The formulation's result.

    Raises
    ------
    CoopError
        One line naming an unknown option and listing what the formulation takes.
    """
    spec = registered(formulation)
    return spec.run(graph, budget, spec.options.from_keywords(formulation, options))
