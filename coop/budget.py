"""Budgets: the one parser, the proven lower bound ``min_budget`` and the one check against it (contract 3).

A budget is ``"6GiB"``, ``"750MB"``, ``"132156"`` (graph units: bytes for captured graphs),
``"90%"`` or a float fraction such as ``0.9`` of the baseline peak (rounded up; at most 1.0, since a
fraction is of the peak: a budget above it is given in bytes). Below :func:`min_budget` no schedule
exists; :func:`below_min_budget` words that verdict once for every caller, in bytes and as a share of
the peak. At or above the baseline peak there is nothing to plan; :func:`store_all_fits` words that
note. :func:`format_memory` prints any amount of a graph's memory in its own unit.
"""

from __future__ import annotations

import math
import re

from coop.errors import BudgetError
from coop.graph import Graph, Impl, Node, derived_from_graph
from coop.limits import MAX_BUDGET
from coop.schedule import Schedule, simulate
from coop.text import format_bytes

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
#: A negative or signed-zero spec ("-5MB", "-0.5"): named as not positive rather than not understood.
_SIGNED = re.compile(r"^\s*-\s*[0-9.]", re.IGNORECASE)


def parse_budget(spec: str | float, graph: Graph, *, check: bool = True, paging: bool = False) -> int:
    """The budget in graph units (bytes for captured graphs).

    ``int`` -> graph units; ``float`` in (0, ...) -> fraction of the baseline peak; strings:
    ``"90%"``, ``"0.9"`` (a fraction when it has a decimal point and no unit), ``"6GiB"``,
    ``"750MB"``, ``"132156"``.

    Parameters
    ----------
    spec : str or float
        The budget as given by the user: a number or a size string in one of the forms above.
    graph : Graph
        The graph the budget is for; fractions are of its :func:`baseline_peak`, and bytes are
        refused on a graph in abstract units.
    check : bool
        Whether to refuse a budget below :func:`min_budget`.
    paging : bool
        Whether the schedule may page (a device profile lets POET page): the bound is then
        ``min_budget(graph, paging=True)``.

    Returns
    -------
    int
        The budget in graph units.

    Raises
    ------
    BudgetError
        When ``spec`` is not understood, not positive, too large (bytes above 2**60, a fraction above 1.0),
        in bytes on a graph in abstract units, or (with ``check``) below :func:`min_budget`, with the message
        of :func:`below_min_budget`.

    Examples
    --------
    >>> from coop import Graph, Node, baseline_peak, parse_budget
    >>> graph = Graph(outputs=(2,), nodes=[Node(id=0, name="x", mem=4, cost=0, kind="input"),
    ...     Node(id=1, name="a", inputs=(0,), mem=8, cost=1), Node(id=2, name="b", inputs=(1,), mem=2, cost=1)])
    >>> baseline_peak(graph)
    14
    >>> parse_budget("50%", graph, check=False), parse_budget(0.9, graph, check=False), parse_budget(14, graph)
    (7, 13, 14)
    >>> parse_budget(13, graph)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    coop.errors.BudgetError: budget 13 B (0.93 of the peak) is below min_budget 14 B ...
    """
    budget = _parse(spec, graph)
    if check and (message := below_min_budget(budget, graph, spec=spec, paging=paging)):
        raise BudgetError(message)
    return budget


def below_min_budget(budget: int, graph: Graph, *, spec: object = None, paging: bool = False) -> str | None:
    """The one-line verdict for a budget below :func:`min_budget`, or None when the budget is not below it.

    Every module that meets such a budget (the parser, the formulations, compare, the fallback)
    reports it with this line, so a user reads the same bound and the same fix everywhere.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    graph : Graph
        The graph whose :func:`min_budget` the budget is compared with.
    spec : object
        The budget as the user gave it (``"60%"``, ``0.4``, ``"50MB"``), when known: a fraction's least budget is
        then named as a fraction too.

    Returns
    -------
    str or None
        The message naming the budget and the min_budget (each in graph units and as a share of the baseline
        peak) and the least budget to use; None when ``budget`` is at least :func:`min_budget` (with ``paging``,
        the bound of schedules that may page).
    """
    least = min_budget(graph, paging=paging)
    if budget >= least:
        return None
    peak = baseline_peak(graph)
    fix = f"use at least {least}"
    if spec is not None and _is_fraction(spec) and peak > 0:
        fraction = least_fraction(least, peak)
        fix = f"use at least {fraction:g} ({100 * fraction:g}%) or {least}"
    return (f"budget {_with_share(budget, peak, graph)} is below min_budget {_with_share(least, peak, graph)} of graph "
            f"{graph.name!r}, the proven lower bound: no schedule can fit it; {fix}")


def store_all_fits(budget: int, graph: Graph) -> str | None:
    """The one-line note for a budget at or above the baseline peak (nothing to plan), or None below it.

    Not an error: the baseline order (store-all, nothing recomputed) already fits, so every formulation returns it
    or an equal schedule. The CLI prints it on stderr; callers of the API may warn with it.

    Parameters
    ----------
    budget : int
        The budget in graph units (parsed).
    graph : Graph
        The graph whose :func:`baseline_peak` the budget is compared with.

    Returns
    -------
    str or None
        ``"nothing to plan: store-all fits ..."`` naming the budget and the peak; None when ``budget`` is below the
        baseline peak.
    """
    peak = baseline_peak(graph)
    if budget < peak:
        return None
    return (f"nothing to plan: store-all fits: budget {_with_share(budget, peak, graph)} is at or above the "
            f"baseline peak {format_memory(peak, graph)} of graph {graph.name!r} (its own order, nothing recomputed)")


def least_fraction(least: int, peak: int) -> float:
    """The smallest fraction of ``peak`` with 3 decimals that parses to at least ``least`` (rounded up as
    :func:`parse_budget` rounds a fraction).

    Parameters
    ----------
    least : int
        The budget to reach, in graph units (at most ``peak``).
    peak : int
        The baseline peak, positive.

    Returns
    -------
    float
        That fraction, at most 1.0.
    """
    thousandths = max(1, math.ceil(1000 * least / peak))
    while thousandths < 1000 and math.ceil(thousandths / 1000 * peak - 1e-9) < least:
        thousandths += 1
    return min(thousandths, 1000) / 1000


def _with_share(value: int, peak: int, graph: Graph) -> str:
    """``"89,395,292 B (85.3MiB; 0.58 of the peak)"``: an amount in graph units and as a share of the baseline
    peak."""
    share = _share(value / peak) if peak > 0 else None
    text = format_memory(value, graph)
    if share is None:
        return text
    of = " the peak" if share.endswith("x") else " of the peak"
    if text.endswith(")"):  # "89,395,292 B (85.3MiB)"
        return f"{text[:-1]}; {share}{of})"
    return f"{text} ({share}{of})"


def _share(fraction: float) -> str:
    if fraction > 1:
        return f"{fraction:.2f}x"
    return f"{fraction:.2f}" if fraction >= 0.01 or fraction == 0 else f"{fraction:.2g}"


def _is_fraction(spec: object) -> bool:
    """Whether ``spec`` is read as a fraction of the baseline peak (a float, ``"90%"``, ``"0.9"``)."""
    try:
        return _parse_spec(spec)[1] == "fraction"
    except BudgetError:
        return False


_SIZE_HELP = "give bytes ('6GiB', '750MB'), graph units ('132156') or a fraction of the baseline peak ('90%', 0.9)"


def parsed_budget(budget: object, taker: str) -> int:
    """``budget`` itself when it is already parsed to graph units (a positive int up to MAX_BUDGET).

    Engines below the API and CLI take parsed budgets only, so that a budget is parsed once, at
    the edge; this refuses anything else in one line naming :func:`parse_budget`.

    Parameters
    ----------
    budget : object
        The budget an engine was given.
    taker : str
        The name of the engine, for the message.

    Returns
    -------
    int
        ``budget`` unchanged.

    Raises
    ------
    BudgetError
        When ``budget`` is not an int (a bool counts as not), or not in (0, MAX_BUDGET].
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget <= MAX_BUDGET:
        raise BudgetError(f"{taker} takes a budget in graph units (a positive int), not {budget!r}: parse a spec "
                          "such as '90%' or '6GiB' first with coop.budget.parse_budget(spec, graph)")
    return budget


def check_budget_syntax(spec: object) -> None:
    """Raise the one-line BudgetError that :func:`parse_budget` would for ``spec`` on any graph.

    For inputs read before a graph exists (sweep configs): a spec that passes may still be refused
    later for a graph (bytes on a graph in abstract units, or below its min_budget).

    Parameters
    ----------
    spec : object
        The budget spec to check (an int, a float or a size string).

    Returns
    -------
    None

    Raises
    ------
    BudgetError
        When ``spec`` is not a size, not understood, not positive, has an unknown unit or is too
        large.
    """
    _parse_spec(spec)


def _parse(spec: str | float, graph: Graph) -> int:
    amount, unit, text = _parse_spec(spec)
    if unit == "fraction":
        # Rounded up (the 1e-9 forgives float noise such as 0.9 * 1000), and never to 0.
        return max(1, math.ceil(amount * baseline_peak(graph) - 1e-9))
    if unit == "bytes" and graph.meta.get("mem_unit") == "units":
        raise BudgetError(f"budget {text!r} is in bytes but graph {graph.name!r} counts memory in abstract units: "
                          "give units or a fraction")
    return int(amount)


def _parse_spec(spec: object) -> tuple[float, str, str]:
    """(amount, "fraction" | "bytes" | "units", the spec as text), every malformed spec refused here."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise BudgetError(f"budget {spec!r} is not a size: {_SIZE_HELP}")
    if isinstance(spec, int):
        return _whole(spec, str(spec)), "units", str(spec)
    if isinstance(spec, float):
        return _fraction(spec, str(spec)), "fraction", str(spec)
    match = _PATTERN.match(spec)
    if not match:
        if _SIGNED.match(spec):
            raise BudgetError(f"budget {spec!r} must be positive: {_SIZE_HELP}")
        raise BudgetError(f"budget {spec!r} is not understood: {_SIZE_HELP}")
    number, unit = match.group(1), match.group(2).lower()
    value = float(number)
    if unit == "%":
        return _fraction(value / 100.0, spec), "fraction", spec
    if unit == "" and ("." in number or "e" in number.lower()):
        return _fraction(value, spec), "fraction", spec
    if unit not in _UNITS:
        raise BudgetError(f"budget {spec!r} has an unknown unit {match.group(2)!r}: use B, KB, MB, GB, KiB, MiB, GiB or %")
    scaled = value * _UNITS[unit] if math.isfinite(value) else math.inf
    return _whole(math.ceil(scaled) if math.isfinite(scaled) else scaled, spec), "units" if unit == "" else "bytes", spec


def _whole(budget: float, spec: str) -> int:
    """A budget in bytes or graph units: positive and at most MAX_BUDGET."""
    if not budget > 0:
        raise BudgetError(f"budget {spec!r} must be positive: {_SIZE_HELP}")
    if budget > MAX_BUDGET:
        raise BudgetError(f"budget {spec!r} is larger than coop accepts (2**60 = 1 EiB): check its unit")
    return int(budget)


def _fraction(fraction: float, spec: str) -> float:
    if math.isnan(fraction) or fraction <= 0:
        raise BudgetError(f"budget {spec!r} must be a positive fraction of the baseline peak (e.g. '90%' or 0.9)")
    if fraction > MAX_FRACTION:
        raise BudgetError(f"budget {spec!r} is a fraction above 1: fractions are of the baseline peak, at most 1.0 "
                          "(100%), where store-all already fits; give e.g. 0.9 or '90%', or bytes ('6GiB')")
    return fraction


#: The largest fraction of the baseline peak accepted: a fraction is of the peak, and at the peak store-all fits
#: (nothing to plan); a budget above the peak is given in bytes. Catches "2.0" meant as GiB and typos such as "1e5".
MAX_FRACTION = 1.0


@derived_from_graph
def baseline_peak(graph: Graph) -> int:
    """Peak of the graph's baseline order with no recomputation (contract 1).

    Parameters
    ----------
    graph : Graph
        The graph, simulated in its baseline order ``graph.order``.

    Returns
    -------
    int
        The peak memory of that schedule, in graph units.
    """
    return simulate(graph, Schedule.from_order(graph.order)).peak


@derived_from_graph
def min_budget(graph: Graph, *, paging: bool = False) -> int:
    """A lower bound on the peak of every legal schedule.

    The larger of (a) the biggest single compute step: the node's distinct inputs, its output and
    workspace, and (b) every graph output at the end; both plus the caller-owned values. Values
    count at their smallest implementation (MONeT impls); an implementation that reads optional
    values counts their compute steps too (they must then be computed). Without paging, (a) also counts
    every value that cannot be recomputed (an extra output, such as a convolution backward's weight gradient or a
    dropout's mask, or a random op's output) whose op every implementation of the node depends on and that is
    still needed after the node: a graph output (it must be resident at the end) or a value some node that depends
    on this one must read (:func:`pinned_values`). It exists from its op's first compute, before any compute of
    the node, and cannot come back once freed. On ResNet's compiled training step (issue 41) the outputs raised the
    bound from 2,115,432 to 2,240,168 B, and on its eager step from 2,115,560 to 2,249,640 B: the weight gradients
    of the layers the backward passes first are resident at the stem's backward. On BERT-base's step captured for
    CUDA (b8 s256, issue 43) the dropout masks read in the backward raised it from 1,187,400,192 to 1,228,339,712 B:
    they are all resident at the language-model head's backward.

    Parameters
    ----------
    paging : bool
        For schedules that may page (POET, DELTA): then only the caller-owned values a step reads
        count in that step, and no value is pinned (one that cannot be recomputed may be paged out
        and back). Without it the bound holds for schedules that do not page.

    Returns
    -------
    int
        The lower bound, in graph units.

    Examples
    --------
    On a chain every value meets its reader at one step, so the bound is the store-all peak:

    >>> from coop import Graph, Node, min_budget
    >>> graph = Graph(outputs=(2,), nodes=[Node(id=0, name="x", mem=4, cost=0, kind="input"),
    ...     Node(id=1, name="a", inputs=(0,), mem=8, cost=1), Node(id=2, name="b", inputs=(1,), mem=2, cost=1)])
    >>> min_budget(graph)
    14
    """
    return _min_budget(graph, paging)


def _smallest_value(node: Node) -> int:
    return min([node.mem, *(impl.mem for impl in node.impls)])


def _step_footprint(graph: Graph, node: Node, impl: Impl | None, paging: bool) -> int:
    """What one compute of ``node`` under ``impl`` holds at least: what it reads, its workspace and,
    unless it runs in place (its output then takes over an input's storage), its output. An extra output's step
    reads nothing (contract 2: its op may be gone by then)."""
    reads = () if node.output_of is not None else node.inputs if impl is None else node.reads(impl)
    held = 0
    for source in reads:
        value = graph.node(source)
        if not value.caller_owned:
            held += _smallest_value(value)
        elif paging:
            held += value.mem
    if impl is None:
        return held + node.mem + node.workspace
    return held + impl.workspace + (0 if impl.inplace_of is not None else impl.mem)


def _implementation_footprint(graph: Graph, node: Node, impl: Impl | None, paging: bool) -> int:
    """What choosing ``impl`` for ``node`` holds at least at one step: its own compute's footprint, or that of
    an optional value it reads (transitively), which must then be computed too (a compute step of its own)."""
    footprint = _step_footprint(graph, node, impl, paging)
    seen: set[int] = set()
    stack = [i for i in node.reads(impl) if graph.node(i).optional]
    while stack:
        value = graph.node(stack.pop())
        if value.id in seen:
            continue
        seen.add(value.id)
        footprint = max(footprint, min(_step_footprint(graph, value, i, paging) for i in (None, *value.impls)))
        stack.extend(i for i in value.inputs if graph.node(i).optional)
    return footprint


def _min_budget(graph: Graph, paging: bool) -> int:
    always = 0 if paging else graph.caller_owned_bytes
    pinned = {} if paging else pinned_values(graph)
    largest_step = always
    for node in graph.nodes:
        if node.caller_owned or node.optional:  # an optional value need never be computed
            continue
        step = min(_implementation_footprint(graph, node, impl, paging)
                   + sum(_smallest_value(graph.node(o)) for o in pinned.get(node.id, ()) if o not in node.reads(impl))
                   for impl in (None, *node.impls))
        largest_step = max(largest_step, always + step)
    at_end = always
    for output in set(graph.outputs):
        value = graph.node(output)
        if not value.caller_owned:
            at_end += _smallest_value(value)
        elif paging:
            at_end += value.mem
    return max(largest_step, at_end)


@derived_from_graph
def pinned_values(graph: Graph) -> dict[int, frozenset[int]]:
    """Per node, the values resident at its first compute in every legal schedule (without paging).

    A value that cannot be recomputed (an extra output of a multi-output op, a random op's output) exists from its
    op's first compute on and, once freed, cannot come back. A node X that depends on that op (through the inputs
    every implementation of it reads, transitively; an extra output depends on its op) first runs after the op's
    first compute; where the value must still be resident after X, it is resident at X: when it is a graph output
    (resident at the end), or when a node that depends on X must read it (that node's first compute comes after X's
    first compute and reads the value's only instance). Returns, for each node with any, the ids of those values
    (never the node itself); computed once per graph.
    """
    readers: dict[int, list[int]] = {node.id: [] for node in graph.nodes}
    needed_by: dict[int, list[int]] = {node.id: [] for node in graph.nodes}
    for node in graph.nodes:
        needs = set(node.inputs)
        for impl in node.impls:
            needs &= set(node.reads(impl))
        # an optional value need never be computed; an extra output's own step reads nothing (contract 2)
        for source in needs if not node.optional and node.output_of is None else ():
            needed_by[source].append(node.id)
        if node.output_of is not None:
            needs.add(node.output_of)
        for source in needs:
            readers[source].append(node.id)
    sources: dict[int, list[int]] = {node.id: [] for node in graph.nodes}
    for source, nodes in readers.items():
        for node in nodes:
            sources[node].append(source)
    outputs = set(graph.outputs)
    pinned: dict[int, set[int]] = {}
    for value in graph.nodes:
        if value.caller_owned or value.recomputable or value.optional:
            continue
        if value.id not in outputs and not needed_by[value.id]:
            continue
        op = value.output_of if value.output_of is not None else value.id
        after_op = _closure(readers[op], readers)
        if value.id in outputs:
            holders = after_op
        else:  # the nodes after the op that some reader of the value depends on (or that read it)
            holders = after_op & _closure(needed_by[value.id], sources)
        for holder in holders - {value.id}:
            pinned.setdefault(holder, set()).add(value.id)
    return {node: frozenset(values) for node, values in pinned.items()}


def _closure(start: list[int], edges: dict[int, list[int]]) -> set[int]:
    """The nodes reachable from ``start`` along ``edges`` (``start`` included)."""
    seen: set[int] = set()
    stack = list(start)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(edges[node])
    return seen


def format_memory(value: float | None, graph: Graph) -> str:
    """An amount of ``graph``'s memory as text.

    ``"1,200 units"`` on graphs in abstract units, ``"1,536 B (1.5KiB)"`` on graphs in bytes (the
    binary size only from 1 KiB up), ``"-"`` for None. The one memory formatter of coop: messages,
    the CLI and plans print sizes through it.

    Parameters
    ----------
    value : float or None
        The amount, in graph units; None for none.
    graph : Graph
        The graph whose unit (``meta["mem_unit"]``) decides the form.

    Returns
    -------
    str
        The amount as text.
    """
    if value is None:
        return "-"
    if graph.meta.get("mem_unit") == "units":
        return f"{value:,.0f} units"
    return f"{value:,.0f} B ({format_bytes(value)})" if abs(value) >= 1024 else f"{value:,.0f} B"
