"""The import floors of DESIGN.md, read from the source (lazy imports inside functions included):
the torch-free engines import no torch, and the formulations import nothing from the floors above them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "coop"


def modules_in(folder: str) -> list[str]:
    return sorted(f"coop.{folder}.{path.stem}" for path in (PACKAGE / folder).glob("*.py"))


def imported_modules(module: str) -> set[str]:
    """Every absolute module name ``module``'s source imports, at top level or inside functions."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts).with_suffix(".py")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
    return imported


def within(names: set[str], prefix: str) -> set[str]:
    return {name for name in names if name == prefix or name.startswith(prefix + ".")}


@pytest.mark.parametrize("module", modules_in("online"))
def test_the_online_engines_import_no_torch_and_only_the_ground_floor(module: str) -> None:
    imported = imported_modules(module)
    assert not within(imported, "torch"), module
    allowed = {"coop.errors", "coop.graph", "coop.schedule", "coop.budget", "coop.online"}
    assert {m for m in within(imported, "coop") if not any(m == a or m.startswith(a + ".") for a in allowed)} == set()


@pytest.mark.parametrize("module", modules_in("formulations"))
def test_formulations_import_nothing_from_the_floors_above(module: str) -> None:
    imported = imported_modules(module)
    for above in ("coop.runtime", "coop.planner", "coop.compare", "coop.cli"):
        assert not within(imported, above), (module, above)
