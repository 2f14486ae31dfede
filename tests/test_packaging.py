"""Packaging metadata, the CI entry point, and the benchmark driver (benchmarks/run_all.py)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_run_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coop_run_all", REPO / "benchmarks" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_pyproject_declares_the_distribution_and_command() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "coop-remat"
    assert project["requires-python"] == ">=3.11"
    assert project["scripts"]["coop"] == "coop.cli:main"
    dependencies = {d.split(">")[0].split("=")[0].split("<")[0].strip(): d for d in project["dependencies"]}
    assert dependencies["ortools"] == "ortools>=9.15,<9.16"
    assert "+cu" not in dependencies["torch"] and "+cpu" not in dependencies["torch"]
    assert {"pytest", "pytest-xdist", "hypothesis"} <= set(project["optional-dependencies"]["test"])
    module_name, function_name = project["scripts"]["coop"].split(":")
    assert callable(getattr(importlib.import_module(module_name), function_name))


# Import names that differ from their distribution's name on PyPI.
DISTRIBUTION_OF = {"sklearn": "scikit-learn", "yaml": "pyyaml"}


#: Modules that import an optional framework (an extra of [project.optional-dependencies]), checked apart.
OPTIONAL_PARTS = ("integrations",)


def third_party_imports(package: Path, parts: tuple[str, ...] | None = None) -> dict[str, str]:
    """Every top-level module that a file of ``package`` imports (lazily too), outside the stdlib: name -> a file.
    ``parts``: only the files under these subpackages; None: every file but those under OPTIONAL_PARTS."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        part = path.relative_to(package).parts[0]
        if (part in OPTIONAL_PARTS) if parts is None else (part not in parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != package.name and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_make_test_oldest_runs_the_floors_pyproject_declares() -> None:
    """`make test-oldest` pins exactly the lowest torch and transformers the package accepts (no drift)."""
    makefile = (REPO / "Makefile").read_text()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in ("torch", "transformers"):
        pinned = re.search(rf"^OLDEST_{name.upper()}_SPEC \?= {name}==([\d.]+)$", makefile, re.MULTILINE)
        floor = next((re.fullmatch(rf"{name}>=([\d.]+)(?:,<([\d.]+))?", d.replace(" ", "")) for d in dependencies
                      if d.replace(" ", "").startswith(f"{name}>=")), None)
        assert pinned and floor, name
        assert pinned.group(1).split(".")[:2] == floor.group(1).split(".")[:2], (name, pinned.group(1), floor.group(1))


def test_the_declared_torch_range_ends_above_the_newest_tested_torch() -> None:
    """pyproject's torch range is the tested one: its ceiling is the release after `make test`'s TORCH_SPEC (a plain
    `pip install .` otherwise resolves an untested torch)."""
    makefile = (REPO / "Makefile").read_text()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    newest = re.search(r"^TORCH_SPEC \?= torch==(\d+)\.(\d+)[\d.]*$", makefile, re.MULTILINE)
    declared = next(d.replace(" ", "") for d in dependencies if d.startswith("torch"))
    ceiling = re.fullmatch(r"torch>=[\d.]+,<(\d+)\.(\d+)", declared)
    assert newest and ceiling, declared
    assert (int(ceiling.group(1)), int(ceiling.group(2))) == (int(newest.group(1)), int(newest.group(2)) + 1), declared


def test_every_module_coop_imports_is_a_declared_dependency() -> None:
    """A plain ``pip install .`` gets only [project].dependencies: a module reaching the tests through a test extra
    (sortedcontainers via hypothesis) passed the suite and failed every user's first plan. Read the imports from
    the source, not from this environment, which holds the test extras too."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    imported = third_party_imports(REPO / "coop")
    assert {"torch", "ortools", "pulp", "sortedcontainers"} <= set(imported)  # the scan sees lazy imports too
    missing = {f"{name} ({where})" for name, where in imported.items()
               if DISTRIBUTION_OF.get(name, name).lower().replace("_", "-") not in declared}
    assert not missing, f"imported by coop but not in [project].dependencies: {sorted(missing)}"


def test_every_framework_an_integration_imports_is_a_declared_extra() -> None:
    """coop.integrations imports the frameworks it integrates (Trainer, Lightning), which a plain install lacks: each
    must be a core dependency or named by an extra of [project.optional-dependencies]."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    declared = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in names}
    imported = third_party_imports(REPO / "coop", OPTIONAL_PARTS)
    assert {"transformers", "pytorch_lightning"} <= set(imported)
    missing = {f"{name} ({where})" for name, where in imported.items()
               if DISTRIBUTION_OF.get(name, name).lower().replace("_", "-") not in declared}
    assert not missing, f"imported by coop.integrations but declared by no extra: {sorted(missing)}"


def test_ci_entry_runs_make_test_strictly() -> None:
    script = REPO / ".ci" / "run"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text and "make test" in text
    assert "make smoke" in text  # what a user installs, without extras
    assert os.access(script, os.X_OK)
    assert "TORCH_SPEC ?= torch==2.13.0" in (REPO / "Makefile").read_text()


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "bench_good.py").write_text(
        '"""A good benchmark."""\n'
        "def run(quick=False):\n"
        "    return {'rows': [{'graph': 'g', 'peak': 123456789, 'overhead': 0.012345, 'ok': True, 'quick': quick},\n"
        "                     {'graph': 'h|x', 'extra': None}], 'notes': 'measured twice'}\n"
    )
    (folder / "bench_broken.py").write_text("def run():\n    raise RuntimeError('solver exploded')\n")
    (folder / "helpers.py").write_text("VALUE = 1\n")
    return folder


def test_driver_runs_modules_and_reports_failures_in_the_file(bench_dir: Path, tmp_path: Path) -> None:
    run_all = load_run_all()
    assert run_all.discover(bench_dir) == ["bench_broken", "bench_good", "helpers"]
    good = run_all.run_module("bench_good", quick=True, bench_dir=bench_dir)
    broken = run_all.run_module("bench_broken", bench_dir=bench_dir)
    assert run_all.run_module("helpers", bench_dir=bench_dir) is None  # no run(): not a benchmark
    assert good.error is None and good.rows[0]["quick"] is True and good.summary == "A good benchmark."
    assert broken.error == "RuntimeError: solver exploded"
    report = tmp_path / "BENCHMARKS.md"
    machine = run_all.machine_description()
    assert "cores" in machine and "ortools" in machine
    run_all.write_report({o.name: run_all.render_section(o, machine, False) for o in (good, broken)}, report)
    text = report.read_text()
    assert "| graph | peak | overhead | ok | quick | extra |" in text
    assert "| g | 123,456,789 | 0.01235 | yes | yes | - |" in text and "h\\|x" in text
    assert "**FAILED**: `RuntimeError: solver exploded`" in text
    assert "`python benchmarks/run_all.py --only bench_good`" in text
    # Re-running one module replaces its section and keeps the other.
    again = run_all.run_module("bench_good", bench_dir=bench_dir)
    run_all.write_report({"bench_good": run_all.render_section(again, machine, False)}, report)
    text = report.read_text()
    assert "solver exploded" in text and text.count("<!-- bench:bench_good -->") == 1
    assert "| g | 123,456,789 | 0.01235 | yes | no | - |" in text
