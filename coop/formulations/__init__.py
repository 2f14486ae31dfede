"""Formulations: Graph + budget -> SolveResult, one module per paper.

Every formulation is a plain function ``f(graph, budget, *, options) -> SolveResult`` where
``budget`` is already parsed to graph units (coop.budget.parse_budget); callers run it through
:func:`solve`, the one options contract. :data:`FORMULATIONS`
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
    "monet": "coop.formulations.monet:monet",
    "pytorch-mincut": "coop.formulations.pytorch_mincut:pytorch_mincut",
    "poet": "coop.formulations.poet:poet",
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


#: Options every formulation takes by these names, keyword-only: callers offer them to any formulation
#: and one that has no use for an option (a baseline and a time limit) leaves it unused.
COMMON_OPTIONS = frozenset({"time_limit", "threads", "progress", "hint", "captured"})


def formulation_options(formulation: str) -> frozenset[str]:
    """The keyword options the formulation's function names (its own and the common ones it uses)."""
    parameters = inspect.signature(get_formulation(formulation)).parameters
    return frozenset(name for name, parameter in parameters.items() if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def solve(graph: Graph, budget: int, formulation: str, **options: Any) -> SolveResult:
    """Run one formulation on a graph under a budget in graph units: the one options contract.

    Every formulation is ``function(graph, budget, *, ...)`` with keyword-only options. The
    :data:`COMMON_OPTIONS` may be given to any formulation (``None`` means the default); any other
    option the formulation does not name is refused with one line that lists what it takes.
    """
    takes = formulation_options(formulation)
    options = {name: value for name, value in options.items() if value is not None}  # None: the default
    unknown = sorted(set(options) - takes - COMMON_OPTIONS)
    if unknown:
        raise CoopError(f"formulation {formulation!r} has no option {unknown[0]!r}: it takes "
                        f"{', '.join(sorted(takes | COMMON_OPTIONS))}")
    return get_formulation(formulation)(graph, budget, **{name: options[name] for name in takes & set(options)})


__all__ = ["BASELINES", "COMMON_OPTIONS", "FORMULATIONS", "SolveResult", "formulation_options", "get_formulation", "solve"]
