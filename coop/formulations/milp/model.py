"""The 0-1 linear program a formulation builds (:class:`LinearModel`) and what a backend answers
(:class:`MilpSolution`); the backends are :mod:`coop.formulations.milp.backends`, which re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

VarKind = Literal["binary", "integer", "continuous"]
Sense = Literal["<=", ">=", "=="]
Terms = list[tuple[int, float]]

MILP_SOLVERS = ("cbc", "scip", "highs", "cp-sat", "gurobi", "cplex")


@dataclass
class LinearModel:
    """A minimisation problem: ``min c.x`` subject to ``a.x (<=|>=|==) b`` and variable bounds."""

    kinds: list[VarKind] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows: list[tuple[Terms, Sense, float]] = field(default_factory=list)
    objective: Terms = field(default_factory=list)
    objective_constant: float = 0.0
    hint: dict[int, float] = field(default_factory=dict)

    @property
    def num_vars(self) -> int:
        return len(self.kinds)

    def add_var(self, name: str, kind: VarKind = "binary", lower: float = 0.0, upper: float = 1.0) -> int:
        """A new variable; returns its index."""
        self.kinds.append(kind)
        self.lower.append(lower)
        self.upper.append(upper)
        self.names.append(name)
        return len(self.kinds) - 1

    def add_row(self, terms: Terms, sense: Sense, rhs: float) -> None:
        """The constraint ``sum(coef * x[var]) sense rhs`` (terms on one variable are merged)."""
        merged: dict[int, float] = {}
        for var, coef in terms:
            merged[var] = merged.get(var, 0.0) + coef
        self.rows.append(([(v, c) for v, c in merged.items() if c != 0], sense, rhs))

    @property
    def nonzeros(self) -> int:
        """Constraint coefficients: what loading the model into a solver costs time in proportion to."""
        return sum(len(terms) for terms, _, _ in self.rows)


@dataclass
class MilpSolution:
    """A backend's answer: status, variable values (None without a solution), objective and bound."""

    status: str
    values: list[float] | None = None
    objective: float | None = None
    bound: float | None = None
    wall_s: float = 0.0
    message: str = ""


#: A solve is not started with less time left than loading the model takes plus this much (a
#: few milliseconds solve a tiny model; the solver gets what is left, not this).
LEAST_SOLVE_S = 0.005
