"""Fuzzed inputs (issue 11): corrupted graph, schedule and config files either work or fail with one line.

Valid seed documents are random graphs drawn by hypothesis (tests/strategies.py), their store-all
schedules, a valid sweep config and, from graphs/moccasin, two small published
graphs (one per node-link layout). tests/corruptions.py breaks them (dropped fields, wrong types,
random bytes, truncation, dangling and duplicate links, duplicate ids, cycles, NaN, infinity, huge
numbers, negative ids, unknown ops and nodes). The oracle is the CLI's contract, not the code's
own output: exit 0, or exit 2 with exactly one ``coop: error:`` line, or exit 1 only for a verdict
("infeasible", "invalid schedule") which is one line too; never a traceback or exit 3; and the
corruptions in MUST_FAIL are always refused.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.cli import main
from coop.config import ConfigError, load_config, parse_config
from coop.errors import CoopError
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.schedule import Schedule, prompt_order, schedule_to_json
from tests.corruptions import MUST_FAIL, corruptions, encode
from tests.strategies import random_graphs
from tests.tiers import check, examples

FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
SEEDS = st.integers(0, 2**32 - 1)
#: Words that make an exit 1 a verdict on well-formed input rather than a rejected file.
VERDICTS = ("infeasible", "below min_budget", "invalid schedule", "best peak reached")
PUBLISHED = ("VGG16_256_224_224_3_train_nx.json", "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json")


# ---------------------------------------------------------------------------- the oracle
def cli(argv: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the CLI in-process; assert the exit/stderr contract; return (status, the error line or "")."""
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("coop: note:")]
    assert status in (0, 1, 2), f"{argv}: exit {status}: {err}"
    if status == 0:
        assert not lines, err
        return status, ""
    assert len(lines) == 1 and lines[0].startswith("coop: error: "), err
    if status == 1:
        assert any(word in lines[0] for word in VERDICTS), lines[0]
    return status, lines[0]


def load_or_one_line(path: Path) -> Graph | None:
    """load_graph's result, or None after checking that it failed with a one-line CoopError."""
    try:
        return load_graph(path)
    except CoopError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        return None


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="coop-fuzz-") as folder:
        yield Path(folder)


# ---------------------------------------------------------------------------- graphs
#: 15 graphs in the fast tier, 40 in the slow one (tests/tiers.py)
@examples(15, 40)
def test_load_graph_refuses_every_corruption_in_one_line(examples: int, workdir: Path) -> None:
    def refused(graph: Graph, seed: int) -> None:
        _load_graph_refuses_every_corruption_in_one_line(graph, seed, workdir)

    check(refused, examples, FUZZ, graph=random_graphs(max_nodes=8, with_impls=True), seed=SEEDS)


def _load_graph_refuses_every_corruption_in_one_line(graph: Graph, seed: int, workdir: Path) -> None:
    path = workdir / "graph.json"
    for name, data in corruptions(graph.to_dict(), random.Random(seed)):
        path.write_bytes(data)
        loaded = load_or_one_line(path)
        if name in MUST_FAIL:
            assert loaded is None, f"{name}: a broken file was accepted"


#: 10 graphs in the fast tier, 30 in the slow one (tests/tiers.py)
@examples(10, 30)
def test_cli_on_a_corrupted_graph(examples: int, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def corrupted(graph: Graph, seed: int, pick: int) -> None:
        _cli_on_a_corrupted_graph(graph, seed, pick, workdir, capsys)

    check(corrupted, examples, FUZZ, graph=random_graphs(max_nodes=6), seed=SEEDS, pick=st.integers(0, 10**6))


def _cli_on_a_corrupted_graph(graph: Graph, seed: int, pick: int, workdir: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    cases = list(corruptions(graph.to_dict(), random.Random(seed)))
    name, data = cases[pick % len(cases)]
    path = workdir / "graph.json"
    path.write_bytes(data)
    statuses = [
        cli(["info", path, "--json"], capsys)[0],
        cli(["solve", path, "-b", "100%", "-f", "store-all"], capsys)[0],
        cli(["solve", path, "-b", "80%", "-f", "chen-greedy", "--time-limit", "1"], capsys)[0],
    ]
    if name in MUST_FAIL:
        assert statuses == [2, 2, 2], name
    if load_or_one_line(path) is None:  # a file load_graph refuses is bad input for every command
        assert statuses == [2, 2, 2], name
    else:
        assert statuses[0] == 0 and statuses[1] == 0, f"{name}: a loadable graph must get its facts and store-all"


#: 2 seeds per file in the fast tier, 6 in the slow one (tests/tiers.py)
@examples(2, 6)
@pytest.mark.parametrize("file_name", PUBLISHED)
def test_published_graph_corruptions(file_name: str, examples: int, moccasin_dir: Path, workdir: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads((moccasin_dir / file_name).read_text())

    def corrupted(seed: int) -> None:
        path = workdir / file_name
        for name, data in corruptions(document, random.Random(seed)):
            path.write_bytes(data)
            loaded = load_or_one_line(path)
            if name in MUST_FAIL:
                assert loaded is None, f"{name}: a broken file was accepted"
            if name in ("dangling_link", "duplicate_link", "flipped_byte", "drop_field", "wrong_type"):
                status, _ = cli(["solve", path, "-b", "100%", "-f", "store-all"], capsys)
                assert status == (0 if loaded is not None else 2), name

    check(corrupted, examples, FUZZ, seed=SEEDS)


# ---------------------------------------------------------------------------- schedules
#: 12 graphs in the slow tier, 2 in the fast one (tests/tiers.py)
@examples(2, 12)
def test_validate_on_corrupted_schedules(examples: int, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def corrupted(graph: Graph, seed: int) -> None:
        _validate_on_corrupted_schedules(graph, seed, workdir, capsys)

    check(corrupted, examples, FUZZ, graph=random_graphs(max_nodes=6, with_impls=True), seed=SEEDS)


def _validate_on_corrupted_schedules(graph: Graph, seed: int, workdir: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    graph_path = workdir / "graph.json"
    graph.save(graph_path)
    schedule = Schedule.from_order(prompt_order(graph))
    valid = schedule_to_json(graph, schedule, budget=10**9, formulation="store-all")
    schedule_path = workdir / "schedule.json"
    schedule_path.write_bytes(encode(valid))
    assert cli(["validate", graph_path, schedule_path], capsys)[0] == 0  # the seed itself is valid
    for name, data in corruptions(valid, random.Random(seed)):
        schedule_path.write_bytes(data)
        status, line = cli(["validate", graph_path, schedule_path], capsys)
        if name in MUST_FAIL:
            assert status == 2, f"{name}: {line or 'accepted'}"


# ---------------------------------------------------------------------------- configs
VALID_CONFIG = {"name": "fuzz", "budgets": ["90%", 0.7, 1000], "formulations": ["store-all"], "policies": ["dtr"],
                "time_limit": 5, "graphs": [{"path": "g.json"}, {"zoo": "mlp", "size": {"layers": 2}}]}
VALID_TOML = """name = "fuzz"
budgets = ["90%", 0.7, 1000]
formulations = ["store-all"]
policies = ["dtr"]
time_limit = 5

[[graphs]]
path = "g.json"

[[graphs]]
zoo = "mlp"
size = { layers = 2 }
"""


@settings(FUZZ, max_examples=60)
@given(seed=SEEDS)
def test_corrupted_config_documents(seed: int) -> None:
    """Configs as dicts (what TOML gives): every corruption validates or is one ConfigError line."""
    assert parse_config(VALID_CONFIG).budgets == ["90%", 0.7, 1000]
    for name, data in corruptions(VALID_CONFIG, random.Random(seed)):
        try:
            document = json.loads(data)
        except (ValueError, RecursionError):
            continue  # byte-level corruptions are for the TOML text below
        if not isinstance(document, dict):
            continue  # TOML's top level is always a table
        try:
            parse_config(document)
        except ConfigError as exc:
            assert "\n" not in str(exc), name


@settings(FUZZ, max_examples=40)
@given(seed=SEEDS, cut=st.integers(0, len(VALID_TOML)), noise=st.binary(max_size=8), at=st.integers(0, len(VALID_TOML)))
def test_corrupted_config_text(seed: int, cut: int, noise: bytes, at: int, workdir: Path) -> None:
    """Truncated TOML and random bytes spliced into it: a valid config or one ConfigError line."""
    (workdir / "g.json").write_text("{}")
    raw = VALID_TOML.encode()
    path = workdir / "sweep.toml"
    for data in (raw[:cut], raw[:at] + noise + raw[at:], random.Random(seed).randbytes(16)):
        path.write_bytes(data)
        try:
            load_config(path)
        except ConfigError as exc:
            assert "\n" not in str(exc)
