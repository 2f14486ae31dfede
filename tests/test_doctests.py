"""The runnable examples in coop's docstrings run, and pass, with the suite.

Every module of the package whose source holds an example (``>>>``) is run here, found by reading the source, so
an example cannot be added where the suite does not run it. The public API's own docstrings (Graph, parse_budget,
min_budget, simulate, validate, load_graph on a shipped graph) hold most of them; each is fast (no solver). Run from
the repository root, where the shipped graphs are.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
from pathlib import Path

import pytest

import coop

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "coop"
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py") if ">>>" in path.read_text()
)
#: The fewest examples (``>>>`` lines) the public API's own docstrings hold together: the floor issue 44 asks for.
LEAST_EXAMPLES = 10


def _run(name: str) -> doctest.TestResults:
    module = importlib.import_module(name)
    return doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)


@pytest.mark.parametrize("name", MODULES)
def test_examples_pass(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    results = _run(name)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples in {name} failed (output above)"
    assert results.attempted > 0, f"{name} holds '>>>' but doctest finds no example in it"


def test_the_public_api_has_enough_examples() -> None:
    """The examples on the public symbols' own docstrings (``coop.__all__``), every one in a module run above."""
    finder = doctest.DocTestFinder(recurse=False)
    counted = 0
    for name in coop.__all__:
        symbol = getattr(coop, name)
        examples = sum(len(test.examples) for test in finder.find(symbol, name, globs={}))
        if examples:
            assert inspect.getmodule(symbol).__name__ in MODULES, f"coop.{name}'s examples are not run"
        counted += examples
    assert counted >= LEAST_EXAMPLES
