"""Plan files: what ``Plan.save`` writes and ``coop.load_plan`` reads back, and why a load is refused.

A plan file holds the schedule, budget and formulation beside what identifies the step they are legal on: the
graph's structure digest and op counts, the batch's shapes and layout, the training context, whether a
``loss_fn`` made the loss, and the versions of the libraries that decide the traced program. A load captures the
step again (:func:`read_plan`) and refuses, in one line naming the cause, a step that differs.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coop.errors import ContextError, CoopError
from coop.graph import Graph
from coop.graph_capture import Captured, capture
from coop.graph_capture.batch import Batch, layout_from_dict
from coop.graph_capture.context import TrainingContext
from coop.runtime.executor import unwrap_model
from coop.schedule import Schedule, Step

PLAN_FORMAT = "coop.plan/1"

#: The libraries whose versions decide the traced program: torch's dispatch and decompositions, and a model
#: library's Python (transformers 5.17 and 5.24 trace Llama's rotary embedding and causal mask differently).
TRACED_LIBRARIES = ("torch", "transformers")


def plan_document(captured: Captured, schedule: Schedule, budget: int, formulation: str, summary: dict[str, Any],
                  loss_fn: Any = None) -> dict[str, Any]:
    """The JSON document of a plan (``Plan.save``).

    Parameters
    ----------
    captured : Captured
        The plan's capture: graph digest and op counts, batch shapes and layout, training context.
    schedule : Schedule
        The plan's schedule.
    budget : int
        The plan's budget in bytes.
    formulation : str
        The formulation that made the schedule.
    summary : dict
        ``Plan.summary()``, kept for people reading the file.
    loss_fn : callable or None
        The loss function the step was captured with: the file records its name (None: the model's call made the
        loss), for :func:`read_plan` to name ``loss_fn=`` when a load leaves it out.

    Returns
    -------
    dict of str to Any
        The document, JSON-ready.
    """
    document = {
        "format": PLAN_FORMAT,
        "graph": {"name": captured.graph.name, "structure_sha256": captured.graph.structure_sha256,
                  "nodes": len(captured.graph.nodes), "ops": op_counts(captured.graph)},
        "budget": budget,
        "formulation": formulation,
        "batch": [{"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
                  for shape, dtype in captured.batch_shapes],
        "layout": layout_document(captured),
        "loss_fn": None if loss_fn is None else getattr(loss_fn, "__qualname__", type(loss_fn).__name__),
        "steps": [s.model_dump(exclude_none=True) for s in schedule.steps],
        "alternatives": "alternatives" in captured.graph.meta,
        "versions": library_versions(),
        "summary": summary,
    }
    if captured.context is not None:  # what the capture depends on, to name it when a load differs
        document["context"] = {"autocast": [list(a) for a in captured.context.autocast],
                               "eval_modules": list(captured.context.eval_modules)}
    return document


def write_plan(path: str | Path, document: dict[str, Any]) -> None:
    """Write a plan document as indented JSON.

    Parameters
    ----------
    path : str or Path
        The file to write.
    document : dict
        What :func:`plan_document` returned.
    """
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


@dataclass
class SavedPlan:
    """A plan file read back onto a fresh capture of its model: what a ``Plan`` is built from."""

    module: nn.Module
    wrapper: nn.Module | None
    captured: Captured
    schedule: Schedule
    budget: int
    formulation: str


def read_plan(path: str | Path, model: nn.Module, loss_fn: Any = None) -> SavedPlan:
    """Read a plan file and capture ``model``'s step again on a batch of zeros of the saved shapes.

    Tracing runs on fake tensors, so that batch captures the same graph; it is compared with the saved one by its
    structure digest.

    Parameters
    ----------
    path : str or Path
        The plan file (written by ``Plan.save``).
    model : nn.Module
        The model the plan was made for, possibly wrapped in DistributedDataParallel.
    loss_fn : callable or None
        The loss function the plan was made with.

    Returns
    -------
    SavedPlan
        The saved schedule, budget and formulation with the new capture.

    Raises
    ------
    CoopError
        When the file cannot be read, is not a coop plan, was made with a ``loss_fn`` that is not passed, or was
        made for a different model or batch shape.
    ContextError
        When the graph differs because the plan was captured in another training context (autocast, eval modules).
    """
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CoopError(f"cannot read plan file {path}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != PLAN_FORMAT:
        raise CoopError(f"{path} is not a coop plan (expected format {PLAN_FORMAT!r})")
    if document.get("loss_fn") and loss_fn is None:
        raise CoopError(f"plan {path} was made with a loss function ({document['loss_fn']}); pass it as "
                        "coop.load_plan(path, model, loss_fn=...)")
    module, wrapper = unwrap_model(model, strict=False)
    device = next(module.parameters()).device
    batch = tuple(torch.zeros(b["shape"], dtype=getattr(torch, b["dtype"]), device=device) for b in document["batch"])
    layout = layout_from_dict(document["layout"]) if document.get("layout") else None  # None: model(*batch)
    if layout is not None and len(layout.tensor_paths) != len(batch):
        raise CoopError(f"plan file {path} names {len(layout.tensor_paths)} batch tensors in its layout and "
                        f"{len(batch)} shapes; make a new plan with coop.plan")
    example = Batch(layout, batch) if layout is not None else batch
    captured = capture(module, example, loss_fn=loss_fn, alternatives=bool(document.get("alternatives", False)))
    captured.context = TrainingContext.current(module, batch)
    if captured.graph.structure_sha256 != document["graph"]["structure_sha256"]:
        raise _graph_differs(path, document, captured)
    schedule = Schedule(steps=tuple(Step.model_validate(s) for s in document["steps"]))
    return SavedPlan(module, wrapper, captured, schedule, int(document["budget"]), document["formulation"])


def _graph_differs(path: str | Path, document: dict[str, Any], captured: Captured) -> CoopError:
    """Why the captured step's digest differs from the plan file's: another training context, else the ops."""
    saved = document.get("context") or {}
    now = {"autocast": [list(a) for a in captured.context.autocast], "eval_modules": list(captured.context.eval_modules)}
    changed = [f"{key} was {saved[key] or 'off/none'} and is {now[key] or 'off/none'}"
               for key in now if key in saved and saved[key] != now[key]]
    if changed:
        return ContextError(f"plan {path} was captured in another training context ({'; '.join(changed)}); load it "
                            "in the context it was made in, or make a new plan with coop.plan")
    return CoopError(f"plan {path} was made for a different model or batch shape (graph digest differs"
                     f"{op_difference(document['graph'], captured.graph)}"
                     f"{version_difference(document.get('versions'))}); make a new plan with coop.plan")


def layout_document(captured: Captured) -> dict[str, Any] | None:
    """The saved plan's batch layout (None for positional tensors, ``model(*batch)``).

    Parameters
    ----------
    captured : Captured
        The plan's capture; its ``layout`` is read.

    Returns
    -------
    dict or None
        The layout as :func:`coop.graph_capture.batch.layout_from_dict` reads it back.

    Raises
    ------
    CoopError
        When the batch nests a container pytree cannot serialise (a namedtuple, ...).
    """
    layout = captured.layout
    if layout.positional_only:
        return None
    try:
        return layout.to_dict()
    except Exception as exc:  # noqa: BLE001 - pytree refuses containers it cannot serialise (a namedtuple, ...)
        raise CoopError(f"cannot save a plan whose batch nests {type(exc).__name__}: {exc}; pass the batch in dicts, "
                        "tuples and lists") from None
def op_counts(graph: Graph) -> dict[str, int]:
    """How many nodes of each op ``graph`` has (saved with a plan, to say how another capture differs).

    Parameters
    ----------
    graph : Graph
        A captured step.

    Returns
    -------
    dict of str to int
        Op name (``""`` for a node without one) to its count, sorted by name.
    """
    return dict(sorted(Counter(node.op or "" for node in graph.nodes).items()))


def library_versions() -> dict[str, str]:
    """The installed versions of :data:`TRACED_LIBRARIES` (those installed), saved with a plan.

    Returns
    -------
    dict
        Library name -> version string.
    """
    versions = {}
    for name in TRACED_LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def version_difference(saved: dict[str, str] | None) -> str:
    """The traced libraries whose versions differ from a saved plan's, for :func:`load_plan`'s refusal.

    Parameters
    ----------
    saved : dict or None
        The plan file's ``versions`` (None: a plan saved before they were recorded).

    Returns
    -------
    str
        ``"; the plan was saved under transformers 5.24.0 and this process runs 5.17.0 (...)"``, or ``""``.
    """
    if not saved:
        return ""
    now = library_versions()
    differing = [f"{name} {saved[name]} and this process runs {now.get(name, 'none')}" for name in TRACED_LIBRARIES
                 if name in saved and saved[name] != now.get(name)]
    if not differing:
        return ""
    return (f"; the plan was saved under {'; '.join(differing)} (another version may trace another program: plan "
            "and train with the same versions)")


def op_difference(saved: dict[str, Any], graph: Graph) -> str:
    """What differs between a saved plan's graph and a new capture, for :func:`load_plan`'s refusal.

    Parameters
    ----------
    saved : dict
        The plan file's ``graph`` section (``nodes`` and ``ops`` where the plan was saved with them).
    graph : Graph
        The graph captured now.

    Returns
    -------
    str
        ``"; the plan's graph has N nodes and this one M: OP x 12 there, 0 here, ..."`` (the first three ops whose
        counts differ, with a hint where a fused attention kernel is among them), a note that the op counts agree,
        or ``""`` where the plan file holds no op counts.
    """
    if "ops" not in saved:
        return ""
    there, here = Counter(saved["ops"]), Counter(op_counts(graph))
    differing = [op for op in sorted(set(there) | set(here)) if there[op] != here[op]]
    if not differing:
        return f"; both have {len(graph.nodes)} nodes of the same ops, wired or sized differently"
    shown = ", ".join(f"{op} x {there[op]} there, {here[op]} here" for op in differing[:3])
    more = f" (+{len(differing) - 3} more ops)" if len(differing) > 3 else ""
    fused = (" -- a fused attention kernel differs: capture and train under the same "
             "torch.nn.attention.sdpa_kernel([...])" if any("scaled_dot_product" in op for op in differing) else "")
    return f"; the plan's graph has {saved.get('nodes', '?')} nodes and this one {len(graph.nodes)}: {shown}{more}{fused}"
