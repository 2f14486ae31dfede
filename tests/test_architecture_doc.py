"""ARCHITECTURE.md names every module of ``coop/``, and every file it names exists.

How ARCHITECTURE.md names a module (the one convention this test reads):

* by its path relative to ``coop/`` (``planner/plan.py``, ``budget.py``); a path whose first folder is a folder
  of the repository root (``tests/test_layering.py``) is relative to the root instead;
* inside a fenced block, a line whose first word is a folder (``runtime/``) opens that folder: the bare names
  on the lines indented below it (``executor.py``) are relative to it, nested folders included;
* a top-level module by its bare name in backticks (`` `errors` ``, `` `__init__` ``);
* a package's ``__init__.py`` by its folder (``online/``); a folder of the repository root (``tests/``) is
  relative to the root, and every folder named exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "coop"
DOC = ROOT / "ARCHITECTURE.md"

PY_NAME = re.compile(r"(?<![\w/.])([\w/]+\.py)\b")
FOLDER = re.compile(r"(?<![\w/.])(\w+(?:/\w+)*)/(?![\w])")
BARE = re.compile(r"`(\w+)`")


def _resolve(name: str, prefix: str = "") -> Path:
    first = name.split("/", 1)[0]
    if "/" in name and (ROOT / first).is_dir() and not (PACKAGE / first).is_dir():
        return ROOT / name
    return PACKAGE / prefix / name


def named_paths(text: str) -> tuple[set[Path], set[Path]]:
    """(every ``.py`` file named, every folder named), as absolute paths."""
    files: set[Path] = set()
    folders: set[Path] = set()
    in_block = False
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            stack = []
            continue
        prefix = ""
        if in_block and line.strip():
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            prefix = "/".join(folder for _, folder in stack)
            word = line.split()[0]
            if word.endswith("/") and not word.endswith(".py/"):
                folders.add(PACKAGE / prefix / word.rstrip("/"))
                stack.append((indent, word.rstrip("/")))
                prefix = "/".join(folder for _, folder in stack)
                line = line.replace(word, "", 1)
        for match in PY_NAME.finditer(line):
            files.add(_resolve(match.group(1), prefix))
        for match in FOLDER.finditer(line):
            name = match.group(1)
            root_folder = not prefix and "/" not in name and (ROOT / name).is_dir() and not (PACKAGE / name).is_dir()
            folders.add(ROOT / name if root_folder else _resolve(name, prefix))
        for match in BARE.finditer(line):
            if (PACKAGE / f"{match.group(1)}.py").is_file():
                files.add(PACKAGE / f"{match.group(1)}.py")
    return files, folders


def test_every_module_is_named() -> None:
    files, folders = named_paths(DOC.read_text())
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in files or (path.name == "__init__.py" and path.parent in folders):
            continue
        missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"modules ARCHITECTURE.md does not name: {missing}"


def test_every_named_file_exists() -> None:
    files, _ = named_paths(DOC.read_text())
    absent = sorted(str(path.relative_to(ROOT)) for path in files if not path.is_file())
    assert not absent, f"files ARCHITECTURE.md names that do not exist: {absent}"


def test_every_named_folder_exists() -> None:
    _, folders = named_paths(DOC.read_text())
    absent = sorted(str(path.relative_to(ROOT)) for path in folders if not path.is_dir())
    assert not absent, f"folders ARCHITECTURE.md names that do not exist: {absent}"
