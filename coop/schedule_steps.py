"""A schedule's steps: :class:`Step` (compute, free, page_out, page_in) and :class:`Schedule`, the
sequence of them over a graph's node ids.

What the steps mean (contract 2) is :mod:`coop.schedule`'s docstring; everything here is importable
from there too.
"""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import BaseModel, ConfigDict

SCHEDULE_FORMAT = "coop.schedule/1"

StepOp = Literal["compute", "free", "page_out", "page_in"]


class Step(BaseModel):
    """One schedule step; ``impl`` names a node implementation (MONeT) for a compute."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: StepOp
    node: int
    impl: str | None = None

    def __str__(self) -> str:
        return f"{self.op} %{self.node}" + (f" [{self.impl}]" if self.impl else "")


@functools.lru_cache(maxsize=65536, typed=True)
def _compute_step(node: int) -> Step:
    """``compute node`` (steps are frozen, so one object serves every schedule: the local search builds thousands)."""
    return Step(op="compute", node=node)


class Schedule(BaseModel):
    """An ordered list of steps over a graph's node ids."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: tuple[Step, ...]

    @classmethod
    def from_order(cls, order: list[int] | tuple[int, ...]) -> Schedule:
        """A schedule that computes these nodes in this order and frees each after last use."""
        return cls(steps=tuple(_compute_step(i) for i in order))

    @property
    def compute_count(self) -> int:
        return sum(1 for s in self.steps if s.op == "compute")

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        return "\n".join(f"{i:5d}: {s}" for i, s in enumerate(self.steps))
