"""Every public function of the package documents itself in the Parameters / Returns form (issue 25),
read from the source: a module-level function whose name has no leading underscore and that takes an
argument has a docstring with a Parameters section. The CLI's commands are left out: their docstrings
are the command line's help text."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "coop"
HELP_TEXT = {PACKAGE / "cli.py", PACKAGE / "cli_app.py", PACKAGE / "cli_commands.py"}  # cli.py and its split (issue 44)


def undocumented() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in HELP_TEXT:
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            if not (node.args.posonlyargs or node.args.args or node.args.kwonlyargs):
                continue
            if "Parameters\n" not in (ast.get_docstring(node) or ""):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    return found


def test_every_public_function_has_a_parameters_section() -> None:
    assert undocumented() == []
