"""coop: plan and replay memory-bounded PyTorch training steps.

The public API: :func:`load_graph`, :class:`Graph`, :class:`Schedule`, :func:`simulate`,
:func:`validate`, :func:`parse_budget`, :func:`min_budget`, :func:`capture`, :func:`plan` (which
returns a :class:`Plan` or a :class:`DynamicPlan`, both with the face of :class:`BasePlan`), :func:`compile`
and :func:`partitioner` (coop's plan inside ``torch.compile``), and
:class:`ContextError` (plan.step in a training context its plan cannot serve), :class:`OverBudgetError`
(a compiled step that held more than its budget in every measured round) and :class:`NeedsCudaError` (a CUDA-only
feature asked without CUDA).
"""

from coop.budget import baseline_peak, min_budget, parse_budget
from coop.errors import (
    BudgetError,
    CaptureError,
    ContextError,
    CoopError,
    GraphError,
    InfeasibleError,
    NeedsCudaError,
    OverBudgetError,
    ScheduleError,
)
from coop.graph import Graph, Node
from coop.graph_files import load_graph
from coop.schedule import Schedule, Step, simulate, validate


def _installed_version() -> str:
    """The version of the installed distribution ``coop-remat`` (its metadata: pyproject.toml's version)."""
    from importlib import metadata

    try:
        return metadata.version("coop-remat")
    except metadata.PackageNotFoundError:  # a source tree imported without `pip install`
        return "0+unknown"


__version__ = _installed_version()

__all__ = [
    "BudgetError",
    "CaptureError",
    "ContextError",
    "CoopError",
    "Graph",
    "GraphError",
    "InfeasibleError",
    "NeedsCudaError",
    "Node",
    "OverBudgetError",
    "Schedule",
    "ScheduleError",
    "Step",
    "baseline_peak",
    "load_graph",
    "min_budget",
    "parse_budget",
    "simulate",
    "validate",
]


def __getattr__(name: str):  # lazy: importing coop must not import torch
    if name == "capture":
        from coop.graph_capture import capture  # lazy: see above

        return capture
    if name in ("plan", "Plan", "DynamicPlan", "BasePlan", "load_plan"):
        from coop import planner  # lazy: see above

        return getattr(planner, name)
    if name == "fake_cluster":
        from coop.planner.ranks import fake_cluster  # lazy: see above

        return fake_cluster
    if name in ("compile", "partitioner"):
        from coop import compiled  # lazy: see above

        return getattr(compiled, name)
    if name == "TrainingContext":
        from coop.graph_capture.context import TrainingContext  # lazy: see above

        return TrainingContext
    raise AttributeError(f"module 'coop' has no attribute {name!r}")
