"""Mutation check: each deliberate defect in a model, a bound or the simulator must make some test fail.

A test suite that passes whatever the code does proves nothing. Each mutant below is one defect a
maintainer could plausibly introduce (drop a clause, a memory term, loosen a precedence, swap two
steps). For each, the package and the tests are copied into a temporary folder, the defect is applied
there by replacing an exact piece of source (which must occur exactly once, so that a refactoring that
moves the code makes this benchmark fail loudly instead of testing nothing), and the listed test files
run with ``pytest -x``. A mutant is *caught* when pytest reports a failing test (exit code 1 and a
``FAILED`` line); an error in a fixture or setup (exit code 1 with only ``ERROR`` lines: a file the copy
lacks) or in imports and collection (exit code 2 and above) is reported as such, never counted as caught.

    python benchmarks/run_all.py --only bench_mutants
    python benchmarks/bench_mutants.py [--only NAME ...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

#: The tests every mutant runs against: the solver, bound and simulator tests with independent oracles.
TESTS = ("tests/test_budget.py", "tests/test_schedule.py", "tests/test_checkmate.py", "tests/test_bruteforce_oracle.py",
         "tests/test_cross_check.py", "tests/test_moccasin.py", "tests/test_fuzz_regressions.py")
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutant:
    """One defect: (file, exact source, replacement) pieces, each occurring exactly once in its file."""

    name: str
    what: str
    edits: tuple[tuple[str, str, str], ...]


MUTANTS = (
    Mutant("checkmate-outputs", "Checkmate's MILP no longer keeps graph outputs stored into the last stage", (
        ("coop/formulations/stages/model.py", "                row.append(i in outputs)", "                row.append(False)"),
        ("coop/formulations/stages/model.py", "            elif latest_reads[i] >= t or i in outputs:",
         "            elif latest_reads[i] >= t:"),
    )),
    Mutant("checkmate-last-stage-outputs", "Checkmate's last stage no longer has to hold the graph outputs", (
        ("coop/formulations/stages/model.py", "                row.append(i in outputs)", "                row.append(False)"),
    )),
    Mutant("checkmate-retain-outputs", "Checkmate may drop a graph output before the last stage", (
        ("coop/formulations/stages/model.py", "            elif latest_reads[i] >= t or i in outputs:",
         "            elif latest_reads[i] >= t:"),
    )),
    Mutant("checkmate-workspace", "Checkmate's budget row while a node runs forgets its workspace", (
        ("coop/formulations/stages/model.py", "        if problem.workspace[k]:\n            if R[t][k] is True:",
         "        if False:\n            if R[t][k] is True:"),
    )),
    Mutant("min-budget-workspace", "min_budget drops the workspace of a compute step", (
        ("coop/budget.py", "        return held + node.mem + node.workspace", "        return held + node.mem"),
    )),
    Mutant("min-budget-outputs", "min_budget forgets that every graph output is resident at the end", (
        ("coop/budget.py", "    return max(largest_step, at_end)", "    return largest_step"),
    )),
    Mutant("moccasin-workspace", "Moccasin's cumulative memory drops the workspace demand", (
        ("coop/formulations/moccasin/interval_model.py", "                demands.append(problem.workspace[v])",
         "                demands.append(0)"),
    )),
    Mutant("moccasin-precedence", "the interval model (Moccasin's) lets an input's single interval end one slot "
           "before its reader starts", (
        ("coop/formulations/intervals/model.py", "        enforce(model.Add(ends[0] >= s_v), when)",
         "        enforce(model.Add(ends[0] >= s_v - 1), when)"),
    )),
    Mutant("simulator-workspace", "the simulator forgets the workspace of the node computed at a step", (
        ("coop/simulator.py", "        memory.append(running + workspace[j])", "        memory.append(running)"),
    )),
    Mutant("schedule-swap", "Schedule.from_order swaps its first two computes", (
        ("coop/schedule_steps.py", "        return cls(steps=tuple(_compute_step(i) for i in order))",
         ("        steps = tuple(_compute_step(i) for i in order)\n"
          "        return cls(steps=steps[1:2] + steps[:1] + steps[2:])")),
    )),
)


def _apply(root: Path, mutant: Mutant) -> None:
    for relative, old, new in mutant.edits:
        path = root / relative
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise RuntimeError(f"mutant {mutant.name}: {relative} holds its source {count} times, not once; update "
                               "bench_mutants.py to the code as it is now")
        path.write_text(text.replace(old, new))


def run_mutant(mutant: Mutant, tests: tuple[str, ...] = TESTS) -> dict[str, Any]:
    """Copy coop/ and tests/ to a temporary folder, apply the defect, run the tests; the row for the table.

    Tests that read the published graphs skip there with their reason (the copy holds no graphs/)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as folder:
        root = Path(folder)
        for part in ("coop", "tests", "benchmarks", "pyproject.toml"):  # tests load benchmarks' generators
            source = REPO / part
            if source.is_dir():
                shutil.copytree(source, root / part, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, root / part)
        _apply(root, mutant)
        started = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(root)}
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider", "-m", "not slow",
                   *tests]  # the default tier (`make test`): a mutant must be caught without the slow tests
        try:
            done = subprocess.run(command, check=False, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            code, output = -1, f"timed out after {TIMEOUT_S} s"
    outcome, caught_by = outcome_of(code, output)
    return {"mutant": mutant.name, "defect": mutant.what, "outcome": outcome,
            "caught_by": caught_by, "wall_s": round(time.perf_counter() - started, 1)}


def outcome_of(code: int, output: str) -> tuple[str, str]:
    """The outcome of a mutant's pytest run (its exit code, -1 for a time-out) and the first failing test."""
    failed = [line.split(" - ")[0].removeprefix("FAILED ") for line in output.splitlines() if line.startswith("FAILED ")]
    errors = [line.split(" - ")[0].removeprefix("ERROR ") for line in output.splitlines() if line.startswith("ERROR ")]
    if code == 1 and failed:
        return "caught", failed[0]
    if code == 0:
        return "NOT caught", ""
    if code == -1:
        return "timed out", ""
    # exit code 1 with no failed test is a fixture or setup error (e.g. a file the copy lacks), never a catch
    return f"error (pytest exit {code}: {errors[0] if errors else 'no test failed'})", ""


def run(only: list[str] | None = None) -> dict[str, Any]:
    rows = []
    for mutant in MUTANTS:
        if only and mutant.name not in only:
            continue
        print(f"bench_mutants: {mutant.name}", file=sys.stderr, flush=True)
        rows.append(run_mutant(mutant))
    notes = (f"Each mutant runs {len(TESTS)} test files' default tier (`make test`: -m 'not slow') with pytest -x "
             f"({', '.join(Path(t).stem for t in TESTS)}); "
             "caught_by is the first failing test. 'NOT caught' is a hole in the suite.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    chosen = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "--only"]
    for row in run(chosen or None)["rows"]:
        print(row, flush=True)
