"""The import floors of ARCHITECTURE.md (its layers), read from the source (lazy imports inside functions included):
the torch-free engines import no torch, and the formulations import nothing from the floors above them."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "coop"


def modules_in(folder: str) -> list[str]:
    """Every module under ``coop/<folder>/``, subpackages included (``__init__`` files by their own name)."""
    return sorted("coop." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
                  for path in (PACKAGE / folder).rglob("*.py"))


def imported_modules(module: str) -> set[str]:
    """Every absolute module name ``module``'s source imports, at top level or inside functions."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts).with_suffix(".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
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
    allowed = {"coop.errors", "coop.graph", "coop.schedule", "coop.budget", "coop.device_profiles", "coop.online"}
    assert {m for m in within(imported, "coop") if not any(m == a or m.startswith(a + ".") for a in allowed)} == set()


@pytest.mark.parametrize("module", modules_in("formulations"))
def test_formulations_import_nothing_from_the_floors_above(module: str) -> None:
    imported = imported_modules(module)
    for above in ("coop.runtime", "coop.planner", "coop.compare", "coop.cli"):
        assert not within(imported, above), (module, above)


#: The formulations' shared substrates: the contract (core), the MILP backends, Checkmate's stages and Moccasin's
#: intervals. They import no paper family, heuristic or ladder module, so every family builds on them alone.
SUBSTRATES = ("core", "milp", "stages", "intervals")
ABOVE_SUBSTRATES = ("checkmate", "moccasin", "monet", "poet", "blocks", "heuristics", "ladder")


@pytest.mark.parametrize("module", [m for s in SUBSTRATES for m in modules_in(f"formulations/{s}")])
def test_the_formulation_substrates_import_no_family(module: str) -> None:
    imported = imported_modules(module)
    for above in ABOVE_SUBSTRATES:
        assert not within(imported, f"coop.formulations.{above}"), (module, above)


@pytest.mark.parametrize("module", [m for m in modules_in("formulations") if ".ladder" not in m])
def test_only_the_ladder_imports_the_ladder(module: str) -> None:
    """``auto`` is reached through the registry's table (a name, imported on first use), never imported."""
    assert not within(imported_modules(module), "coop.formulations.ladder"), module


def test_the_formulation_folders_are_the_ones_named() -> None:
    folders = {path.name for path in (PACKAGE / "formulations").iterdir() if (path / "__init__.py").is_file()}
    assert folders == set(SUBSTRATES) | set(ABOVE_SUBSTRATES)


# ------------------------------------------------------------------ the whole package's import graph (issue 25)
#: coop's layers, lowest first: a module imports only from its own layer or a lower one. Names are
#: the first component under ``coop`` (a module or a subpackage).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "text", "limits", "graph_upgrades"}),
    frozenset({"graph", "graph_nodes", "graph_checks"}),
    frozenset({"graph_files", "schedule", "schedule_steps", "simulator", "schedule_files"}),
    frozenset({"budget", "device_profiles"}),
    frozenset({"online"}),
    frozenset({"formulations"}),
    frozenset({"graph_capture"}),
    frozenset({"runtime"}),
    frozenset({"planner", "compiled", "zoo", "viz", "memory_viz"}),
    frozenset({"compare", "config", "integrations"}),
    frozenset({"cli", "cli_app", "cli_commands", "__main__", "__init__"}),
)


def every_module() -> dict[str, Path]:
    """Absolute module name -> source file, for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("coop", *path.relative_to(PACKAGE).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = every_module()


@dataclass(frozen=True)
class Import:
    """One import of a coop module by another: where, what, and whether inside a function."""

    importer: str
    imported: str
    names: tuple[str, ...]
    line: int
    in_function: bool


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer.split(".") if MODULES[importer].name == "__init__.py" else importer.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def coop_imports() -> list[Import]:
    """Every import of a coop module in the package, at top level or inside a function."""
    found: list[Import] = []
    for importer, path in MODULES.items():
        tree = ast.parse(path.read_text())
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                  for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "coop":
                        found.append(Import(importer, alias.name, (), node.lineno, id(node) in inside))
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(importer, node)
                if target.split(".")[0] != "coop":
                    continue
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    if submodule in MODULES:
                        found.append(Import(importer, submodule, (), node.lineno, id(node) in inside))
                    else:
                        found.append(Import(importer, target, (alias.name,), node.lineno, id(node) in inside))
    return found


@functools.cache
def imports() -> tuple[Import, ...]:
    """coop_imports(), parsed once per process on first use (not at collection, which every xdist worker runs)."""
    return tuple(coop_imports())


def layer_of(module: str) -> int:
    parts = module.split(".")
    component = parts[1] if len(parts) > 1 else "__init__"
    for index, layer in enumerate(LAYERS):
        if component in layer:
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS: add it")


def import_circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in imports():
        if imp.imported in MODULES and imp.imported != imp.importer:
            edges[imp.importer].add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    return circles


def test_every_import_of_coop_resolves_to_a_module() -> None:
    assert {imp.imported for imp in imports()} - set(MODULES) == set()


def test_no_import_circles() -> None:
    assert import_circles() == []


def test_no_import_points_up_a_layer() -> None:
    upward = sorted(f"{imp.importer} -> {imp.imported} (line {imp.line})" for imp in imports()
                    if layer_of(imp.imported) > layer_of(imp.importer))
    assert upward == []


def test_no_module_imports_another_modules_private_names() -> None:
    private = sorted(f"{imp.importer} imports {name} from {imp.imported} (line {imp.line})" for imp in imports()
                     for name in imp.names if name.startswith("_") and imp.imported != imp.importer)
    assert private == []


def test_an_import_inside_a_function_says_why() -> None:
    """Only to keep ``import coop`` light (torch and the solvers loaded on first use), and the line says so."""
    unexplained = []
    for imp in imports():
        if not imp.in_function:
            continue
        lines = MODULES[imp.importer].read_text().splitlines()
        said = " ".join(lines[max(0, imp.line - 2): imp.line]).lower()
        if "lazy" not in said:
            unexplained.append(f"{imp.importer} line {imp.line} imports {imp.imported}")
    assert unexplained == []
