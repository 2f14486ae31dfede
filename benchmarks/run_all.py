"""The `make bench` driver: run every benchmark module and write BENCHMARKS.md.

A benchmark is a module ``benchmarks/NAME.py`` with a function ``run()`` that returns its rows:
a list of flat dicts (one table row each), or a dict ``{"rows": [...], "notes": "..."}``. A
``run`` that accepts ``quick`` gets ``quick=True`` under ``--quick``. Each module runs with a
progress line on stderr; one that fails gets its error in BENCHMARKS.md instead of stopping the
others. With ``--only NAME`` the other modules' sections already in BENCHMARKS.md are kept. A
module with ``REQUIRES = "cuda"`` is skipped on a machine without a CUDA device, and its section
from the last run on one is kept.

    python benchmarks/run_all.py                 # everything
    python benchmarks/run_all.py --only bench_capture --only paper_table
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import importlib.metadata
import importlib.util
import inspect
import os
import platform
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DEFAULT_OUTPUT = REPO / "BENCHMARKS.md"
SKIPPED_FILES = {"run_all.py"}
SECTION = re.compile(r"<!-- bench:(?P<name>[\w.-]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.DOTALL)


@dataclass
class Outcome:
    """What one benchmark module produced: rows and notes, or the error that stopped it."""

    name: str
    summary: str
    started: dt.datetime
    wall_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: str = ""
    error: str | None = None
    error_detail: str = ""
    #: the command that produced the section, when it is not ``run_all.py --only NAME`` (a module's own CLI)
    command: str | None = None


# ============================================================================ discovery
def discover(bench_dir: Path = BENCH_DIR) -> list[str]:
    """Names of the benchmark modules in ``bench_dir`` (every ``*.py`` but this driver and ``_private``)."""
    return sorted(p.stem for p in bench_dir.glob("*.py") if p.name not in SKIPPED_FILES and not p.name.startswith("_"))


def load_module(name: str, bench_dir: Path = BENCH_DIR) -> ModuleType:
    """Import ``bench_dir/name.py`` by path (the benchmarks folder is not a package)."""
    path = bench_dir / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark module {path}")
    # The checkout first (coop runs from it without an install), then the helpers beside the modules.
    for folder in (REPO, bench_dir):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"coop_bench_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


# ============================================================================ running
def run_module(name: str, quick: bool = False, bench_dir: Path = BENCH_DIR) -> Outcome | None:
    """Import and run one module; None when it has no ``run()`` (a helper, not a benchmark)."""
    started = dt.datetime.now().astimezone()
    clock = time.perf_counter()
    outcome = Outcome(name=name, summary="", started=started)
    try:
        module = load_module(name, bench_dir)
        run = getattr(module, "run", None)
        if not callable(run) or not _requirements_met(module):
            return None
        outcome.summary = _first_line(module.__doc__)
        produced = run(quick=True) if quick and "quick" in inspect.signature(run).parameters else run()
        outcome.rows, outcome.notes = _normalise(produced)
    except Exception as exc:  # noqa: BLE001 - one failing benchmark must not stop the others
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.error_detail = traceback.format_exc(limit=8)
    outcome.wall_s = time.perf_counter() - clock
    return outcome


def _requirements_met(module: ModuleType) -> bool:
    """False for a module that needs a CUDA device on a machine without one."""
    if getattr(module, "REQUIRES", None) != "cuda":
        return True
    import torch

    return torch.cuda.is_available()


def _normalise(produced: Any) -> tuple[list[dict[str, Any]], str]:
    notes = ""
    if isinstance(produced, dict):
        notes = str(produced.get("notes", ""))
        produced = produced.get("rows", [])
    if produced is None:
        return [], notes
    rows = list(produced)
    for row in rows:
        if not isinstance(row, dict):
            raise TypeError(f"run() must return dict rows, got a {type(row).__name__}")
    return rows, notes


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


# ============================================================================ the machine
def machine_description() -> str:
    """CPU model, cores, RAM and the versions that change results (each changes results: ARCHITECTURE.md, facts)."""
    versions = ", ".join(f"{package} {_version(package)}" for package in ("torch", "ortools", "pulp", "networkx"))
    return (f"{_cpu_model()}, {os.cpu_count()} cores, {_ram_gib():.0f} GiB RAM{_gpu()}; "
            f"Python {platform.python_version()} on {platform.system()} {platform.machine()}; {versions}")


def _gpu() -> str:
    """', GPU: <name>' when torch sees a CUDA device (torch is imported only if it is installed)."""
    if importlib.util.find_spec("torch") is None:
        return ""
    import torch

    return f", GPU: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ============================================================================ BENCHMARKS.md
def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table whose columns are the rows' keys in order of first appearance."""
    if not rows:
        return "_(no rows)_\n"
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(column)) for column in columns) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 100_000 else str(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_section(outcome: Outcome, machine: str, quick: bool) -> str:
    command = outcome.command or f"python benchmarks/run_all.py --only {outcome.name}" + (" --quick" if quick else "")
    lines = [
        f"<!-- bench:{outcome.name} -->",
        f"## {outcome.name}",
        "",
    ]
    if outcome.summary:
        lines += [outcome.summary, ""]
    lines += [
        f"- date: {outcome.started:%Y-%m-%d %H:%M %Z}",
        f"- machine: {machine}",
        f"- command: `{command}`",
        f"- wall time: {outcome.wall_s:.1f} s",
        "",
    ]
    if outcome.error is not None:
        lines += [f"**FAILED**: `{outcome.error}`", "", "```", outcome.error_detail.rstrip(), "```", ""]
    else:
        lines.append(markdown_table(outcome.rows))
        if outcome.notes:
            lines += [outcome.notes.strip(), ""]
    lines.append(f"<!-- /bench:{outcome.name} -->")
    return "\n".join(lines) + "\n"


def write_report(sections: dict[str, str], path: Path) -> None:
    """Write BENCHMARKS.md with the given sections, keeping the other sections already there.

    The file is read and rewritten under an exclusive lock, so two runs of different modules at
    once keep each other's sections."""
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept: dict[str, str] = {}
        if path.is_file():
            kept = {match.group("name"): match.group(0) for match in SECTION.finditer(path.read_text())}
        kept.update(sections)
        header = (
            "# Benchmarks\n\n"
            "Written by `make bench` (`python benchmarks/run_all.py`); each section says when, where and with which\n"
            "command its numbers were measured. Re-run one section with `--only NAME`.\n\n"
        )
        path.write_text(header + "\n".join(kept[name] for name in sorted(kept)))


# ============================================================================ command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this module (repeatable)")
    parser.add_argument("--quick", action="store_true", help="pass quick=True to modules that accept it")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="report file (default: BENCHMARKS.md)")
    parser.add_argument("--list", action="store_true", help="list the benchmark modules and exit")
    args = parser.parse_args(argv)

    names = discover()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        unknown = [name.removesuffix(".py") for name in args.only if name.removesuffix(".py") not in names]
        if unknown:
            print(f"run_all: error: no benchmark module {unknown[0]!r}: choose from {', '.join(names)}", file=sys.stderr)
            return 2
        names = [name.removesuffix(".py") for name in args.only]
    machine = machine_description()
    sections: dict[str, str] = {}
    failed = 0
    for index, name in enumerate(names, start=1):
        print(f"[{index}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        outcome = run_module(name, quick=args.quick)
        if outcome is None:
            print(f"[{index}/{len(names)}] {name}: skipped (no run(), or it needs a CUDA device; section kept)",
                  file=sys.stderr)
            continue
        status = f"FAILED ({outcome.error})" if outcome.error else f"{len(outcome.rows)} rows"
        failed += outcome.error is not None
        print(f"[{index}/{len(names)}] {name}: {status} in {outcome.wall_s:.1f} s", file=sys.stderr, flush=True)
        sections[name] = render_section(outcome, machine, args.quick)
        write_report(sections, args.output)  # after every module: a long run stopped midway keeps what it measured
    write_report(sections, args.output)
    print(f"wrote {args.output} ({len(sections)} sections, {failed} failed)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
