"""``coop.plan(..., progress=)`` and ``coop solve --progress`` report as they go (issue 40, item 4).

The oracles are outside the progress code: the rungs and rounds the returned plan lists in ``summary()``, the
ladder :func:`coop.formulations.ladder.auto.formulation_ladder` computes, ``time.perf_counter`` around the call, and
what a stream that is or is not a terminal received.
"""

from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import coop
from coop.cli import main
from coop.formulations.core.progress import Progress, StageProgress, stderr_progress
from coop.formulations.ladder.auto import auto, formulation_ladder
from coop.graph_files import load_graph

REPO = Path(__file__).resolve().parents[1]
VGG16 = REPO / "graphs" / "moccasin" / "VGG16_256_224_224_3_train_nx.json"
#: A progress line: its stamp (seconds, one decimal) and the rest.
LINE = re.compile(r"^\s*(\d+\.\d)s  (.*)$")
#: A rung's milestone: the formulation named first.
RUNG = re.compile(r"^auto rung ([\w-]+): ")
#: The printed stamps have one decimal: a stamp may read up to this much above the true elapsed time.
ROUNDING_S = 0.05


class MLP(nn.Module):
    """Four Linear+ReLU layers of width 64 and a head: 45 nodes, solved by checkmate and moccasin within seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())], nn.Linear(64, 10))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.layers(x), y)


def model_and_batch() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return MLP(), (torch.randn(256, 64), torch.randint(0, 10, (256,)))


def parsed(text: str) -> list[tuple[float, str]]:
    """Every progress line of ``text`` as (stamp, message); a line that is not one fails the test."""
    lines = []
    for line in text.splitlines():
        match = LINE.match(line)
        assert match, f"not a progress line: {line!r}"
        lines.append((float(match.group(1)), match.group(2)))
    return lines


def rung_names(lines: list[tuple[float, str]]) -> list[str]:
    return [match.group(1) for _, message in lines if (match := RUNG.match(message))]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


# ---------------------------------------------------------------------------- coop.plan
def test_plan_reports_each_rung_and_round_with_real_elapsed_stamps(capsys: pytest.CaptureFixture[str]) -> None:
    model, batch = model_and_batch()
    started = time.perf_counter()
    plan = coop.plan(model, 0.85, batch, time_limit=3, progress=True)
    wall = time.perf_counter() - started
    lines = parsed(capsys.readouterr().err)
    summary = plan.summary()
    stamps = [stamp for stamp, _ in lines]
    assert stamps == sorted(stamps), lines  # one clock: no stamp goes back to 0
    assert any(stamp > 0 for stamp in stamps), lines  # not every stamp 0.0 s (the earlier bug)
    assert stamps[-1] <= wall + ROUNDING_S, (stamps[-1], wall)
    assert wall >= 1.0 and stamps[-1] >= 0.5 * wall, (stamps[-1], wall)  # the solve's seconds are in the stamps
    messages = [message for _, message in lines]
    assert any(message.startswith("capturing the step") for message in messages), messages
    solves = [i for i, message in enumerate(messages) if message.startswith("solving with auto")]
    assert len(solves) == len(summary["rounds"]) >= 1, (messages, summary["rounds"])
    assert sum(message.startswith("round ") and "measuring" in message for message in messages) == sum(
        round_["measured"] is not None for round_ in summary["rounds"]), messages
    last_solve = [(0.0, message) for message in messages[solves[-1]:]]
    assert rung_names(last_solve) == [rung["formulation"] for rung in summary["rungs"]], (messages, summary["rungs"])
    assert len(summary["rungs"]) >= 2  # the baseline candidate and at least one solver rung
    for (_, message), rung in zip([line for line in last_solve if RUNG.match(line[1])], summary["rungs"],
                                  strict=True):
        assert rung["status"] in message and "best overhead so far" in message, (message, rung)
    assert messages[-1].startswith(f"plan ready: {summary['formulation']}"), messages


def test_plan_with_progress_false_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    model, batch = model_and_batch()
    coop.plan(model, 0.85, batch, time_limit=1, progress=False)
    assert capsys.readouterr().err == ""


def test_plan_by_default_prints_nothing_where_stderr_is_no_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    model, batch = model_and_batch()
    assert not sys.stderr.isatty()
    coop.plan(model, 0.85, batch, time_limit=1)
    assert capsys.readouterr().err == ""


def test_plan_by_default_reports_where_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    model, batch = model_and_batch()
    plan = coop.plan(model, 1.0, batch, time_limit=2)  # store-all fits: the ladder's one rung
    lines = parsed(terminal.getvalue())
    assert rung_names(lines) == [rung["formulation"] for rung in plan.summary()["rungs"]] == ["store-all"], lines
    assert lines[-1][1].startswith("plan ready: "), lines


# ---------------------------------------------------------------------------- coop.compile
#: A round's measured line: its index and the bytes its step held.
HELD = re.compile(r"^round (\d+): the step held ([\d,]+) B against ([\d,]+) B")


def test_compile_reports_each_round_and_solve_with_real_elapsed_stamps(capsys: pytest.CaptureFixture[str]) -> None:
    """coop.compile with an example batch: a first line with its settings, each round as it starts and what its step
    held (the bytes the returned record measured), each solve and its plan, and the round returned last (one round:
    the rounds' own logic is tests/test_compile_refit*.py's)."""
    torch._dynamo.reset()
    model, batch = model_and_batch()
    started = time.perf_counter()
    compiled = coop.compile(model, 0.85, time_limit=3, example_batch=batch, rounds=1, progress=True)
    wall = time.perf_counter() - started
    # torch may print its own lines to stderr: the progress lines are the stamped ones
    lines = [(float(m.group(1)), m.group(2)) for line in capsys.readouterr().err.splitlines()
             if (m := LINE.match(line))]
    stamps = [stamp for stamp, _ in lines]
    assert stamps == sorted(stamps) and stamps[-1] <= wall + ROUNDING_S, (stamps, wall)
    messages = [message for _, message in lines]
    assert messages[0] == "coop.compile: auto, time limit 3 s per graph, up to 1 measured round", messages
    rounds = compiled.coop_record.rounds
    starts = [m for m in messages if re.match(r"^round \d+: compiling and measuring the step \(", m)]
    assert len(starts) == len(rounds) >= 1 and "(first plan)" in starts[0], messages
    held = [(int(m.group(1)), int(m.group(2).replace(",", ""))) for message in messages if (m := HELD.match(message))]
    assert held == [(i, r.measured_peak) for i, r in enumerate(rounds) if r.measured_peak is not None], messages
    solves = [i for i, m in enumerate(messages) if m.startswith("compiled-0: ") and "solving with auto under" in m]
    assert solves, messages
    assert any(RUNG.match(m) for m in messages[solves[0]:]), messages  # auto's rungs reported under the solve
    plan = compiled.coop_record.plans[-1]
    assert plan.summary() in messages, messages
    assert re.match(rf"^coop.compile ready: round \d of {len(rounds)}, held [\d,]+ B against {plan.requested:,} B$",
                    messages[-1]), messages


def test_compile_and_partitioner_are_silent_by_default_where_stderr_is_no_terminal(monkeypatch: pytest.MonkeyPatch,
                                                                                    capsys: pytest.CaptureFixture[str]
                                                                                    ) -> None:
    """Where stderr is no terminal, coop.compile (lazy: nothing compiled yet) prints nothing and its partitioner holds
    no reporter; where stderr is a terminal, coop.partitioner's default reports there."""
    model, _ = model_and_batch()
    assert not sys.stderr.isatty()
    compiled = coop.compile(model, 0.85, time_limit=2)
    assert compiled.coop_record.partitioner.progress.callback is None
    assert coop.partitioner(0.85).progress.callback is None
    assert capsys.readouterr().err == ""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    coop.partitioner(0.85).progress.stage("a stage")
    assert [message for _, message in parsed(terminal.getvalue())] == ["a stage"]


# ---------------------------------------------------------------------------- auto itself and the helper
def test_auto_reports_one_milestone_per_rung_in_order() -> None:
    model, batch = model_and_batch()
    graph = coop.capture(model, batch).graph
    budget = coop.parse_budget(0.85, graph)
    reports: list[Progress] = []
    result = auto(graph, budget, time_limit=3, progress=reports.append)
    milestones = [report for report in reports if report.milestone and report.message.startswith("auto rung ")]
    assert [RUNG.match(report.message).group(1) for report in milestones] == [rung.formulation
                                                                              for rung in result.rungs]
    elapsed = [report.elapsed_s for report in milestones]
    assert elapsed == sorted(elapsed) and elapsed[-1] <= result.wall_s + 1e-6, (elapsed, result.wall_s)
    found = [rung.overhead for rung in result.rungs if rung.overhead is not None]
    assert f"best overhead so far {100 * min(found):.2f} %" in milestones[-1].message


def test_stage_progress_restamps_solver_reports_and_never_drops_a_milestone() -> None:
    stream = io.StringIO()
    now = [100.0]
    progress = StageProgress(stderr_progress(stream, min_interval_s=3600), clock=lambda: now[0])
    now[0] = 101.5
    progress.forward()(Progress(0.0, 10.0, 9.0, "a rung counting from its own start"))
    now[0] = 102.0
    progress.forward()(Progress(0.0, 9.0, 9.0, "throttled"))
    progress.stage("a milestone within the throttle")
    lines = parsed(stream.getvalue())
    assert [stamp for stamp, _ in lines] == [1.5, 2.0], lines
    assert lines[1][1] == "a milestone within the throttle"
    assert StageProgress(None).forward() is None


# ---------------------------------------------------------------------------- the CLI
def test_cli_progress_prints_a_line_per_rung_of_auto(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["solve", str(VGG16), "--budget", "90%", "-f", "auto", "--progress", "--time-limit", "3", "--json"])
    err = capsys.readouterr().err
    assert status in (0, 1), err
    lines = parsed("\n".join(line for line in err.splitlines() if not line.startswith("coop: ")))  # notes, warnings
    graph = load_graph(VGG16)
    ladder = formulation_ladder(graph, coop.parse_budget("90%", graph))
    names = rung_names(lines)
    assert ladder and set(ladder) <= set(names), (ladder, err)
    stamps = [stamp for stamp, _ in lines]
    assert stamps == sorted(stamps) and stamps[-1] > 0, err
