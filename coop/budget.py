"""Budgets: the one parser and the least feasible budget (DESIGN.md, contract 3).

A budget is ``"6GiB"``, ``"750MB"``, ``"132156"`` (graph units: bytes for captured graphs),
``"90%"`` or a float fraction such as ``0.9`` of the baseline peak (rounded up). Below the least
feasible budget no schedule exists; such a budget is an error that names the minimum.
"""

from __future__ import annotations

import math
import re

from coop.errors import BudgetError
from coop.graph import Graph, Node, format_bytes

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)


def parse_budget(spec: str | float, graph: Graph, *, check: bool = True) -> int:
    """The budget in graph units (bytes for captured graphs).

    ``int`` -> graph units; ``float`` in (0, ...) -> fraction of the baseline peak; strings:
    ``"90%"``, ``"0.9"`` (a fraction when it has a decimal point and no unit), ``"6GiB"``,
    ``"750MB"``, ``"132156"``. With ``check`` a budget below :func:`min_budget` raises a
    BudgetError that names the minimum.
    """
    budget = _parse(spec, graph)
    if check:
        least = min_budget(graph)
        if budget < least:
            raise BudgetError(
                f"budget {_show(budget, graph)} is below the least feasible budget {_show(least, graph)} "
                f"of graph {graph.name!r}; no schedule can fit it: use at least {least}"
            )
    return budget


def _parse(spec: str | float, graph: Graph) -> int:
    if isinstance(spec, bool):
        raise BudgetError(f"budget {spec!r} is not a size: give bytes ('6GiB'), graph units ('132156') or a fraction ('90%', 0.9)")
    if isinstance(spec, int):
        if spec <= 0:
            raise BudgetError(f"budget {spec} must be positive")
        return spec
    if isinstance(spec, float):
        return _fraction(spec, graph, str(spec))
    if not isinstance(spec, str):
        raise BudgetError(f"budget {spec!r} is not a size: give bytes ('6GiB'), graph units ('132156') or a fraction ('90%', 0.9)")
    match = _PATTERN.match(spec)
    if not match:
        raise BudgetError(f"budget {spec!r} is not understood: give bytes ('6GiB', '750MB'), graph units ('132156') or a fraction ('90%', '0.9')")
    number, unit = match.group(1), match.group(2).lower()
    value = float(number)
    if unit == "%":
        return _fraction(value / 100.0, graph, spec)
    if unit == "" and ("." in number or "e" in number.lower()):
        return _fraction(value, graph, spec)
    if unit not in _UNITS:
        raise BudgetError(f"budget {spec!r} has an unknown unit {match.group(2)!r}: use B, KB, MB, GB, KiB, MiB, GiB or %")
    if unit not in ("", "b") and graph.meta.get("mem_unit") == "units":
        raise BudgetError(f"budget {spec!r} is in bytes but graph {graph.name!r} counts memory in abstract units: give units or a fraction")
    budget = math.ceil(value * _UNITS[unit])
    if budget <= 0:
        raise BudgetError(f"budget {spec!r} must be positive")
    return budget


def _fraction(fraction: float, graph: Graph, spec: str) -> int:
    if not (fraction > 0) or math.isinf(fraction):
        raise BudgetError(f"budget {spec!r} must be a positive fraction of the baseline peak")
    return math.ceil(fraction * baseline_peak(graph) - 1e-9)


def baseline_peak(graph: Graph) -> int:
    """Peak of the graph's baseline order with no recomputation (contract 1)."""
    from coop.schedule import Schedule, simulate

    return graph.memo("baseline_peak", lambda: simulate(graph, Schedule.from_order(graph.order)).peak)


def min_budget(graph: Graph, *, paging: bool = False) -> int:
    """A lower bound on the peak of every legal schedule.

    The larger of (a) the biggest single compute step: the node's distinct inputs, its output and
    workspace, and (b) every graph output at the end; both plus the caller-owned values. Values
    count at their smallest implementation (MONeT impls). With ``paging`` (schedules that may
    page caller-owned values out, POET) only the caller-owned values a step reads count there.
    """
    return graph.memo(f"min_budget/{paging}", lambda: _min_budget(graph, paging))


def _smallest_value(node: Node) -> int:
    return min([node.mem, *(impl.mem for impl in node.impls)])


def _min_budget(graph: Graph, paging: bool) -> int:
    always = 0 if paging else graph.caller_owned_bytes
    largest_step = always
    for node in graph.nodes:
        if node.caller_owned:
            continue
        inputs = 0
        for source in node.inputs:
            value = graph.node(source)
            if not value.caller_owned:
                inputs += _smallest_value(value)
            elif paging:
                inputs += value.mem
        own = min([node.mem + node.workspace, *(impl.mem + impl.workspace for impl in node.impls)])
        largest_step = max(largest_step, always + inputs + own)
    at_end = always
    for output in set(graph.outputs):
        value = graph.node(output)
        if not value.caller_owned:
            at_end += _smallest_value(value)
        elif paging:
            at_end += value.mem
    return max(largest_step, at_end)


def _show(value: int, graph: Graph) -> str:
    if graph.meta.get("mem_unit") == "units":
        return f"{value} units"
    return f"{value} B ({format_bytes(value)})" if value >= 1024 else f"{value} B"
