"""Docstrings say what the signature cannot (issue 44, item 6), read from the source and from the public API.

* every public symbol of ``coop`` (its ``__all__`` and the names its module ``__getattr__`` serves) has a docstring,
  and so does every public module-level function and class of the package;
* a numpydoc ``Parameters`` block, where there is one, names only parameters its function (or class) has: a block
  copied from elsewhere, or left behind by a rename, fails;
* no ``Parameters`` entry merely restates its name and type: its description says something the signature cannot
  (an empty one, or one that adds at most one word to the name, the type and filler words, fails);
* the public API's functions keep their ``Parameters`` blocks (the internal ones may drop theirs).

The CLI's commands are left out of the last three: their docstrings are the command line's help text. The runnable
examples of the public API are ``tests/test_doctests.py``'s.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

import pytest

import coop

PACKAGE = Path(__file__).resolve().parents[1] / "coop"
HELP_TEXT = {PACKAGE / "cli.py", PACKAGE / "cli_app.py", PACKAGE / "cli_commands.py"}  # cli.py and its split (issue 44)
#: Words that say nothing about a parameter on their own.
FILLER = frozenset({
    "a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "is", "are", "be", "by", "as", "at", "its", "it",
    "this", "that", "with", "from", "which", "given", "none", "default", "optional", "one", "any", "each", "every",
    "object", "value", "values", "whether", "if", "true", "false", "list", "sequence", "set", "dict", "tuple",
    "int", "float", "str", "bool", "number"
})


def lazy_public_names() -> list[str]:
    """The names ``coop.__getattr__`` serves, read from its comparisons (``name == "x"``, ``name in ("x", ...)``)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    getattr_def = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__")
    names = []
    for compare in ast.walk(getattr_def):
        if isinstance(compare, ast.Compare):
            for side in compare.comparators:
                constants = side.elts if isinstance(side, ast.Tuple) else [side]
                names += [c.value for c in constants if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return names


PUBLIC = sorted({*coop.__all__, *lazy_public_names()})


@functools.cache
def definitions() -> list[tuple[Path, ast.FunctionDef | ast.ClassDef, ast.ClassDef | None]]:
    """Every module-level function and class of the package and every method, with its class (None at module
    level); functions nested in functions are left out. Parsed when a test first asks (2-3 s of parsing that the
    pytest-xdist worker not running this file paid at collection)."""
    found: list[tuple[Path, ast.FunctionDef | ast.ClassDef, ast.ClassDef | None]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for parent in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
            for node in parent.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    found.append((path, node, parent if isinstance(parent, ast.ClassDef) else None))
    return found



def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"  # type: ignore[attr-defined]


def parameter_entries(docstring: str) -> list[tuple[list[str], str, str]]:
    """The entries of a numpydoc Parameters block: (names, type, description), in order ([] without a block)."""
    lines = docstring.splitlines()
    if "Parameters" not in lines:
        return []
    start = lines.index("Parameters") + 2
    entries: list[tuple[list[str], str, list[str]]] = []
    for index in range(start, len(lines)):
        line = lines[index]
        if line.startswith(">>>") or index + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[index + 1].strip()):
            break  # the next section, or examples
        if line and not line[0].isspace():
            names, _, kind = line.partition(":")
            entries.append(([n.strip().lstrip("*") for n in names.split(",")], kind.strip(), []))
        elif entries:
            entries[-1][2].append(line.strip())
    return [(names, kind, " ".join(text).strip()) for names, kind, text in entries]


@functools.cache
def classes() -> dict[str, ast.ClassDef]:
    """The package's classes by name."""
    return {node.name: node for _, node, _ in definitions() if isinstance(node, ast.ClassDef)}


def fields_of(name: str) -> set[str]:
    """The annotated fields of the package's class ``name`` and of its bases (an options object's keywords)."""
    node = classes().get(name)
    if node is None:
        return set()
    names = {t.target.id for t in node.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)}
    for base in node.bases:
        names |= fields_of(ast.unparse(base).split(".")[-1])
    return names


def parameters_of(node: ast.FunctionDef | ast.ClassDef) -> set[str]:
    """The names a block may document: a class's fields and ``__init__`` parameters; a function's parameters, and
    the fields of an options class it takes (a formulation's keywords are typed into its options object)."""
    if isinstance(node, ast.ClassDef):
        names = fields_of(node.name)
        for init in (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            names |= parameters_of(init)
        return names
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a)]
    names = {a.arg for a in every} - {"self", "cls"}
    for arg in every:
        if arg.annotation is not None:
            names |= fields_of(ast.unparse(arg.annotation).split(".")[-1])
    return names


def words(text: str) -> set[str]:
    """Lower-case words of ``text``, split at non-letters and at camel case (``DeltaPolicy``: delta, policy)."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return {w.lower() for w in re.findall(r"[A-Za-z]+", spaced)}


def restates(names: list[str], kind: str, description: str) -> bool:
    """Whether an entry's description adds at most one word to its names, its type and filler words ("The graph
    to schedule.", "Worker threads.": what the signature says already)."""
    return len(words(description) - words(" ".join(names)) - words(kind) - FILLER) <= 1


def documented() -> list[tuple[Path, ast.FunctionDef | ast.ClassDef, list[tuple[list[str], str, str]]]]:
    """Every definition outside the CLI's help text with its Parameters entries."""
    return [(path, node, parameter_entries(ast.get_docstring(node) or "")) for path, node, _ in definitions()
            if path not in HELP_TEXT]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_symbol_has_a_docstring(name: str) -> None:
    symbol = getattr(coop, name)
    assert (inspect.getdoc(symbol) or "").strip(), f"coop.{name} has no docstring"


def test_every_public_function_and_class_of_the_package_has_a_docstring() -> None:
    missing = [where(path, node) for path, node, parent in definitions()
               if parent is None and not node.name.startswith("_") and not ast.get_docstring(node)]
    assert missing == []


def test_a_parameters_block_names_only_real_parameters() -> None:
    stray = [f"{where(path, node)}: {name}" for path, node, entries in documented() for names, _, _ in entries
             for name in names if name not in parameters_of(node)]
    assert stray == []


def test_no_parameter_entry_merely_restates_the_signature() -> None:
    copied = [f"{where(path, node)}: {', '.join(names)}" for path, node, entries in documented()
              for names, kind, description in entries if restates(names, kind, description)]
    assert copied == []


def test_the_public_api_documents_its_parameters() -> None:
    """Each public function that takes arguments keeps a Parameters block, and its entries name real parameters."""
    gaps = []
    for name in PUBLIC:
        function = inspect.unwrap(getattr(coop, name))
        if not inspect.isfunction(function):
            continue
        taken = set(inspect.signature(function).parameters) - {"self", "cls"}
        named = {n for names, _, _ in parameter_entries(inspect.getdoc(function) or "") for n in names}
        if taken and not named or named - taken:
            gaps.append(f"coop.{name}: takes {sorted(taken)}, documents {sorted(named)}")
    assert gaps == []


def test_the_rules_catch_what_they_describe() -> None:
    """The two entry rules on hand-made entries (the oracle: the rule as the module docstring states it)."""
    assert restates(["graph"], "Graph", "The graph.")
    assert restates(["policy"], "DeltaPolicy", "The delta policy.")
    assert restates(["threads"], "int", "Worker threads.") and restates(["graph"], "Graph", "The graph to schedule.")
    assert not restates(["training"], "bool", "Whether dropout is active.")
    assert not restates(["budget"], "int", "The arena size, in graph units (already parsed).")
    assert parameter_entries("Do.\n\nParameters\n----------\nx : int\n    Bytes.\n\nReturns\n-------\nint\n    y") == [
        (["x"], "int", "Bytes.")]
