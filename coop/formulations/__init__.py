"""Formulations: Graph + budget -> SolveResult, one module per paper.

Every formulation is a plain function ``solve(graph, budget, **options) -> SolveResult`` where
``budget`` is already parsed to graph units (coop.budget.parse_budget). :data:`FORMULATIONS`
maps the names used by the CLI and ``coop.plan`` to those functions; modules are imported lazily
so that a missing optional solver only matters when it is asked for.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from coop.errors import CoopError
from coop.formulations.result import SolveResult
from coop.graph import Graph

#: name -> "module:function" (lazy so that importing coop stays light).
FORMULATIONS: dict[str, str] = {
    "store-all": "coop.formulations.baselines:store_all",
    "checkpoint-all": "coop.formulations.baselines:checkpoint_all",
    "chen-sqrt": "coop.formulations.baselines:chen_sqrt",
    "chen-greedy": "coop.formulations.baselines:chen_greedy",
    "checkmate": "coop.formulations.checkmate:checkmate",
    "checkmate-lp": "coop.formulations.checkmate:checkmate_lp",
    "moccasin": "coop.formulations.moccasin:moccasin",
    "pytorch-mincut": "coop.formulations.pytorch_mincut:pytorch_mincut",
    "auto": "coop.formulations.auto:auto",
}

BASELINES = ("store-all", "checkpoint-all", "chen-sqrt", "chen-greedy")


def get_formulation(name: str) -> Callable[..., SolveResult]:
    """The solve function registered under ``name`` (CoopError naming the choices otherwise)."""
    target = FORMULATIONS.get(name)
    if target is None:
        raise CoopError(f"unknown formulation {name!r}: choose one of {', '.join(FORMULATIONS)}")
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def solve(graph: Graph, budget: int, formulation: str, **options: Any) -> SolveResult:
    """Run one formulation on a graph under a budget in graph units."""
    return get_formulation(formulation)(graph, budget, **options)


def solve_accepting(graph: Graph, budget: int, formulation: str, **options: Any) -> SolveResult:
    """Like :func:`solve`, passing only the options the formulation names in its signature.

    For callers that offer the same options to every formulation (the planner, ``auto``,
    ``coop compare``): a time limit means nothing to a baseline, a captured module nothing to a
    solver over the Graph alone.
    """
    function = get_formulation(formulation)
    named = {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    return function(graph, budget, **{k: v for k, v in options.items() if k in named and v is not None})


__all__ = ["BASELINES", "FORMULATIONS", "SolveResult", "get_formulation", "solve", "solve_accepting"]
