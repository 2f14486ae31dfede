"""Formulations: Graph + budget -> SolveResult, one folder per paper family on shared substrates.

Subpackages by role: the contract every formulation shares (``core``: registry, options, deadline, entry, result,
progress), the substrates (``milp``, Checkmate's ``stages``, Moccasin's ``intervals``), one folder per paper family
(``checkmate``, ``moccasin``, ``monet``, ``poet``, ``blocks``), the ``heuristics`` and warm starts, and the
``ladder`` (``auto``). This module is the public entry.

Every formulation is a plain function ``f(graph, budget, *, options) -> SolveResult`` where
``budget`` is already parsed to graph units (coop.budget.parse_budget); callers run it through
:func:`solve`, the one options contract, whose options are typed per solver
(:mod:`coop.formulations.core.options`). :data:`FORMULATIONS` maps the names used by the CLI and
``coop.plan`` to those functions; modules are imported lazily so that a missing optional solver
only matters when it is asked for.
"""

from __future__ import annotations

from coop.formulations.core.options import COMMON_OPTIONS
from coop.formulations.core.registry import (
    BASELINES,
    FORMULATIONS,
    Formulation,
    formulation_options,
    get_formulation,
    registered,
    solve,
)
from coop.formulations.core.result import SolveResult

__all__ = ["BASELINES", "COMMON_OPTIONS", "FORMULATIONS", "Formulation", "SolveResult", "formulation_options",
           "get_formulation", "registered", "solve"]
