"""Schedule files: contract 2's schedule JSON written (:func:`schedule_to_json`) and read
(:func:`load_schedule`, :func:`schedule_from_document`), each malformed field refused in one
:class:`~coop.errors.ScheduleError` line; :func:`check_schedule_nodes` tells a schedule of another graph.

Everything here is importable from :mod:`coop.schedule` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coop.errors import ScheduleError
from coop.graph import Graph
from coop.graph_files import read_json_file
from coop.limits import MAX_BUDGET
from coop.schedule_steps import SCHEDULE_FORMAT, Schedule, Step, StepOp
from coop.simulator import simulate
from coop.text import json_type_name, short_repr


def schedule_to_json(
    graph: Graph,
    schedule: Schedule,
    *,
    budget: int,
    formulation: str,
    solver: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Contract 2's schedule JSON (node ids of the input graph, unchanged).

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs; its name and sha256 go into the document.
    budget : int
        The budget it was solved for, in graph units.
    formulation : str
        The name of the formulation that made it.
    solver : dict or None
        The solver's report; None: a heuristic's (status ``"heuristic"``, the simulated cost as
        objective).

    Returns
    -------
    dict
        The document, with the steps and the predicted peak, cost, baseline cost and overhead.

    Raises
    ------
    ScheduleError
        When the schedule is illegal (from :func:`simulate`).
    """
    sim = simulate(graph, schedule)
    return {
        "format": SCHEDULE_FORMAT,
        "graph": {"name": graph.name, "sha256": graph.sha256},
        "budget": budget,
        "formulation": formulation,
        "steps": [s.model_dump(exclude_none=True) for s in schedule.steps],
        "predicted": {
            "peak": sim.peak,
            "cost": sim.cost,
            "baseline_cost": sim.baseline_cost,
            "overhead": sim.overhead,
        },
        "solver": solver or {"status": "heuristic", "wall_s": 0.0, "objective": sim.cost, "bound": None, "gap": None},
    }


def load_schedule(path: str | Path) -> tuple[Schedule, dict[str, Any]]:
    """Read schedule JSON; returns the Schedule and the whole document.

    Anything malformed (unreadable, not JSON, another format, a step with an unknown op, a missing
    or mistyped field) raises one-line ScheduleError naming the file, the step index and the fix.

    Parameters
    ----------
    path : str or Path
        The schedule file.

    Returns
    -------
    tuple of (Schedule, dict)
        The schedule and the parsed document.

    Raises
    ------
    ScheduleError
        When the file is malformed as above.
    """
    path = Path(path)
    data = read_json_file(path, "schedule", ScheduleError)
    return schedule_from_document(data, origin=str(path)), data


def schedule_from_document(data: Any, origin: str = "schedule") -> Schedule:
    """The Schedule of a parsed schedule document, every field checked (contract 2's JSON).

    Parameters
    ----------
    data : Any
        The parsed JSON document.
    origin : str
        What the document came from (a file's path), for messages.

    Returns
    -------
    Schedule
        The document's steps.

    Raises
    ------
    ScheduleError
        When ``data`` is not an object, has another format, or a field or step is missing or
        malformed.
    """
    if not isinstance(data, dict):
        raise ScheduleError(f"{origin} is not a coop schedule: it holds {json_type_name(data)}, not an object "
                            f"with \"format\": {SCHEDULE_FORMAT!r}")
    if data.get("format") != SCHEDULE_FORMAT:
        found = "has no 'format'" if "format" not in data else f"has format {short_repr(data['format'])}"
        raise ScheduleError(f"{origin} is not a coop schedule: it {found}, expected {SCHEDULE_FORMAT!r} "
                            "(write it with coop solve -o)")
    _check_document_fields(data, origin)
    steps = data["steps"]
    return Schedule(steps=tuple(_parse_step(raw, index, origin) for index, raw in enumerate(steps)))


#: The optional top-level fields of a schedule document and the JSON types they must hold.
_DOCUMENT_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "graph": ((dict,), "an object {name, sha256}"),
    "formulation": ((str,), "a string"),
    "predicted": ((dict,), "an object {peak, cost, baseline_cost, overhead}"),
    "solver": ((dict,), "an object {status, wall_s, objective, bound, gap}"),
}


def _check_document_fields(data: dict[str, Any], origin: str) -> None:
    """Types of the document's fields (its steps are checked one by one by :func:`_parse_step`)."""
    if "steps" not in data:
        raise ScheduleError(f"{origin}: field 'steps' is missing; a schedule lists its steps")
    if not isinstance(data["steps"], list):
        raise ScheduleError(f"{origin}: field 'steps' holds {json_type_name(data['steps'])}; it must be a list of "
                            "{op, node} objects")
    for key, (types, rule) in _DOCUMENT_FIELDS.items():
        if data.get(key) is not None and not isinstance(data[key], types):
            raise ScheduleError(f"{origin}: field {key!r} is {short_repr(data[key])}; it must be {rule} or absent")
    budget = data.get("budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ScheduleError(f"{origin}: field 'budget' is {short_repr(budget)}; it must be a positive integer "
                            "(bytes or graph units) or absent")
    if budget is not None and budget > MAX_BUDGET:
        raise ScheduleError(f"{origin}: field 'budget' is {short_repr(budget)}, larger than coop accepts "
                            "(2**60 = 1 EiB); check its unit, or leave it out and pass --budget")
    made_for = data.get("graph") or {}
    for key in ("name", "sha256"):
        if made_for.get(key) is not None and not isinstance(made_for[key], str):
            raise ScheduleError(f"{origin}: field 'graph.{key}' is {short_repr(made_for[key])}; it must be a string")
    peak = (data.get("predicted") or {}).get("peak")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, int)):
        raise ScheduleError(f"{origin}: field 'predicted.peak' is {short_repr(peak)}; it must be an integer or absent")


def _parse_step(raw: Any, index: int, origin: str) -> Step:
    """One step, strictly typed: ``"node": "3"`` or ``true`` is refused, not converted."""
    where = f"{origin}: step {index}"
    if not isinstance(raw, dict):
        raise ScheduleError(f"{where} holds {json_type_name(raw)}; it must be an object {{op, node}} or {{op, node, impl}}")
    try:
        return Step.model_validate(raw, strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "?"
        rule = _STEP_RULES.get(field, "")
        if error["type"] == "missing":
            problem = f"field {field!r} is missing; add it as {rule}"
        elif error["type"] == "extra_forbidden":
            problem = f"unknown field {field!r}; a step has only op, node and impl"
        else:
            problem = f"field {field!r} is {short_repr(error['input'])}; it must be {rule}"
        raise ScheduleError(f"{where}: {problem}") from None


_STEP_RULES: dict[str, str] = {
    "op": "one of " + ", ".join(repr(op) for op in StepOp.__args__),
    "node": "an integer node id of the graph",
    "impl": "the name of one of the node's implementations (a string) or absent",
}


def check_schedule_nodes(graph: Graph, schedule: Schedule, origin: str = "schedule") -> None:
    """Every step names a node of ``graph`` and, for a compute, one of its implementations.

    These are input errors of a schedule file (it does not belong to this graph), told apart from an
    illegal order of legal steps, which :func:`validate` reports as its verdict.

    Parameters
    ----------
    graph : Graph
        The graph the schedule should belong to.
    schedule : Schedule
        The schedule read from the file.
    origin : str
        What the schedule came from (a file's path), for messages.

    Returns
    -------
    None

    Raises
    ------
    ScheduleError
        When a step names a node not in ``graph``, a step other than a compute names an
        implementation, or a compute names an implementation the node lacks.
    """
    for index, step in enumerate(schedule.steps):
        where = f"{origin}: step {index} ({step})"
        if step.node not in graph:
            raise ScheduleError(f"{where}: node {step.node} is not in graph {graph.name!r}; was the schedule "
                                "solved for another graph?")
        if step.impl is None:
            continue
        node = graph.node(step.node)
        names = [impl.name for impl in node.impls]
        if step.op != "compute":
            raise ScheduleError(f"{where}: only a compute step names an implementation; remove 'impl'")
        if step.impl not in names:
            raise ScheduleError(f"{where}: node {node.id} ({node.name}) has no implementation {step.impl!r}; "
                                f"use one of: {', '.join(names) or 'none (remove impl)'}")
