"""Plots: memory timelines of schedules and overhead-vs-budget curves.

matplotlib runs on its Agg backend (files only, no screen), selected before pyplot is imported so
that plotting works on headless machines and in CI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: never ask for a display

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from coop.errors import CoopError
from coop.text import format_bytes


def plot_memory_timeline(
    series: Mapping[str, Sequence[int]],
    budget: int | None,
    path: str | Path,
    *,
    mem_unit: str = "bytes",
    title: str | None = None,
) -> Path:
    """Memory in use at every step, one line per schedule, with the budget as a dashed line.

    Schedules of different lengths share the step axis.

    Parameters
    ----------
    series : Mapping of str to sequence of int
        A label to the per-step memory that :func:`coop.schedule.simulate` reports (``Simulation.memory``),
        in graph units.
    budget : int or None
        The budget, drawn dashed; None draws none.
    path : str or Path
        The file to write (.png, .pdf or .svg); its folder is made if needed.
    mem_unit : str
        The graph's memory unit (``"bytes"`` labels binary sizes).
    title : str or None
        The plot's title.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    CoopError
        When ``series`` is empty, or the file's extension cannot be written.
    """
    if not series:
        raise CoopError("nothing to plot: give at least one schedule")
    figure, axes = plt.subplots(figsize=(9, 4.5))
    try:
        for label, memory in series.items():
            peak = max(memory) if memory else 0
            axes.step(range(len(memory)), memory, where="post", linewidth=1.2,
                      label=f"{label} (peak {_format_value(peak, mem_unit)})")
        if budget is not None:
            axes.axhline(budget, color="black", linestyle="--", linewidth=1,
                         label=f"budget {_format_value(budget, mem_unit)}")
        axes.set_xlabel("schedule step")
        axes.set_ylabel("memory in use" + ("" if mem_unit == "bytes" else f" ({mem_unit})"))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _format_value(value, mem_unit)))
        axes.set_ylim(bottom=0)
        return _finish(figure, axes, path, title)
    finally:
        plt.close(figure)


def plot_overhead_vs_budget(rows: Iterable[Mapping[str, Any]], path: str | Path, *, title: str | None = None,
                            xlabel: str = "budget", dashed: Iterable[str] = ()) -> Path:
    """Compute overhead against budget, one line per method (the curves of the Checkmate/Moccasin papers).

    Parameters
    ----------
    rows : iterable of Mapping
        Each row has ``method``, ``budget`` (a fraction of the baseline peak, or graph units) and ``overhead``
        (a fraction: 0.05 is 5% extra compute; None where the method found no schedule, which leaves a gap in
        its line).
    path : str or Path
        The file to write (.png, .pdf or .svg); its folder is made if needed.
    title : str or None
        The plot's title.
    xlabel : str
        The budget axis's label.
    dashed : iterable of str
        Methods drawn dashed with square markers (e.g. online policies).

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    CoopError
        When a row lacks a key, there is no row, or the file's extension cannot be written.
    """
    dashed = set(dashed)
    by_method: dict[str, list[tuple[float, float | None]]] = {}
    for row in rows:
        for key in ("method", "budget", "overhead"):
            if key not in row:
                raise CoopError(f"overhead plot row {dict(row)!r} lacks {key!r}: each row needs method, budget, overhead")
        by_method.setdefault(str(row["method"]), []).append((float(row["budget"]), row["overhead"]))
    if not by_method:
        raise CoopError("nothing to plot: give at least one row")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    try:
        for method, points in by_method.items():
            points.sort(key=lambda point: point[0])
            budgets = [budget for budget, _ in points]
            overheads = [float("nan") if overhead is None else 100 * overhead for _, overhead in points]
            style = {"linestyle": "--", "marker": "s"} if method in dashed else {"marker": "o"}
            axes.plot(budgets, overheads, linewidth=1.2, markersize=4, label=method, **style)
        axes.set_xlabel(xlabel)
        axes.set_yscale("symlog", linthresh=1.0)  # checkpoint-all sits orders of magnitude above the rest
        axes.set_ylabel("compute overhead (%, log scale above 1%)")
        return _finish(figure, axes, path, title)
    finally:
        plt.close(figure)


def _finish(figure: Any, axes: Any, path: str | Path, title: str | None) -> Path:
    """The common look of every coop plot (light grid, small legend, optional title), then the file."""
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    if title:
        axes.set_title(title)
    return _save(figure, path)


def _format_value(value: float, mem_unit: str) -> str:
    """A compact axis or legend label (binary size for bytes, grouped digits for units); messages and
    tables use :func:`coop.budget.format_memory`, whose exact byte count is too long for a tick."""
    if mem_unit == "bytes":
        return format_bytes(value)
    return f"{value:,.0f}"


def _save(figure: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    except ValueError as exc:  # matplotlib's answer to an unknown file extension
        raise CoopError(f"cannot write plot {path}: {exc}; use .png, .pdf or .svg") from None
    return path


__all__ = ["plot_memory_timeline", "plot_overhead_vs_budget"]
