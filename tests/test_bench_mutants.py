"""benchmarks/bench_mutants.py stays applicable: every mutant's source piece occurs exactly once in the code as it is
now (a refactoring that moves the code makes this fail here, in the suite, not only when the benchmark is run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.benchmark_module import load_benchmark

bench = load_benchmark("bench_mutants")


@pytest.mark.parametrize("mutant", bench.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_to_the_code_as_it_is(mutant: Any, tmp_path: Path) -> None:
    for relative, old, new in mutant.edits:
        source = (bench.REPO / relative).read_text()
        assert source.count(old) == 1, (mutant.name, relative, old)
        assert old != new
    for relative in {relative for relative, _, _ in mutant.edits}:  # the benchmark's own edit, on a copy
        copy = tmp_path / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text((bench.REPO / relative).read_text())
    bench._apply(tmp_path, mutant)
    for relative, old, new in mutant.edits:
        assert new in (tmp_path / relative).read_text()


def test_a_setup_error_is_never_counted_as_a_catch() -> None:
    """pytest exits 1 for an error in a fixture too (a benchmark module the mutant's copy lacked): six mutants once
    read as caught that way, with no failing test named."""
    error_only = "E   FileNotFoundError: bench_fuzz.py\nERROR tests/test_fuzz_regressions.py::test_x[fast]\n1 error in 3s\n"
    outcome, caught_by = bench.outcome_of(1, error_only)
    assert outcome.startswith("error (pytest exit 1: tests/test_fuzz_regressions.py::test_x[fast]") and caught_by == ""
    failing = "FAILED tests/test_budget.py::test_y - AssertionError: 3 != 4\n1 failed in 2s\n"
    assert bench.outcome_of(1, failing) == ("caught", "tests/test_budget.py::test_y")
    assert bench.outcome_of(0, "5 passed\n") == ("NOT caught", "")
