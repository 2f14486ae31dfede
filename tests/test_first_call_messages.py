"""What a new user meets on the first call (issue 40): each message one line, the right error type and exit status,
nothing changed on refusal.

Budgets (a fraction above 1 refused; at or above the peak "nothing to plan"; the floor named as a share of the peak
and the fix in the unit given), ``coop --version`` and ``coop.__version__``, capture errors without torch's tracing
logs and with the input and dtypes named, no profiler lines, progress stamped with real elapsed times, and the
published graphs read from the repository itself.
"""

from __future__ import annotations

import importlib.metadata
import io
import logging
import math
import random
import re
import sys
import time
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import coop
from coop.budget import baseline_peak, least_fraction, min_budget, parse_budget, store_all_fits
from coop.cli import _solve_progress, main
from coop.errors import BudgetError, CaptureError
from coop.formulations.core.progress import Progress
from coop.graph_files import load_graph
from coop.runtime.meter import cpu_allocation_peak

REPO = Path(__file__).resolve().parents[1]
VGG16 = REPO / "graphs" / "moccasin" / "VGG16_256_224_224_3_train_nx.json"
PROFILER_NOISE = ("USDT", "profiler_start", "profiler_stop", "STAGE:", "SyncActivityProfilerHandler")


def run(argv: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return status, captured.out, captured.err


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def one_line(message: str) -> str:
    assert "\n" not in message, message
    return message


class Net(nn.Module):
    """A small regression model: ``forward(x, y)`` returns the loss."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(width, 32)
        self.b = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.b(torch.relu(self.a(x))).squeeze(-1) - y) ** 2).mean()


class CastingNet(Net):
    """Casts its input itself: a float64 batch is legal here, as in eager."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float(), y.float())


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------- budgets
@pytest.mark.parametrize("spec", [2.0, "2.0", "150%", 1.5, "1e5"])
def test_a_fraction_above_one_is_refused_in_one_line(spec: object) -> None:
    graph = load_graph(VGG16)
    with pytest.raises(BudgetError) as refused:
        parse_budget(spec, graph, check=False)
    message = one_line(str(refused.value))
    assert "fraction above 1: fractions are of the baseline peak, at most 1.0 (100%)" in message, message
    assert "bytes" in message  # the way to a budget above the peak
    assert parse_budget("100%", graph) == parse_budget(1.0, graph) == baseline_peak(graph)


def test_the_cli_refuses_a_fraction_above_one_with_exit_2_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "never.json"
    status, out, err = run(["solve", VGG16, "--budget", "2.0", "-f", "store-all", "-o", out_file], capsys)
    assert status == 2 and out == ""
    assert len(lines_of(err)) == 1 and err.startswith("coop: error: budget '2.0' is a fraction above 1")
    assert not out_file.exists()


def test_a_plan_refused_for_a_fraction_above_one_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = Net()
    before = state(model)
    with pytest.raises(BudgetError, match="fraction above 1") as refused:
        coop.plan(model, 2.0, (torch.randn(8, 16), torch.randn(8)))
    one_line(str(refused.value))
    assert_unchanged(model, before)


def test_bytes_at_or_above_the_peak_say_nothing_to_plan() -> None:
    graph = load_graph(VGG16)
    peak = baseline_peak(graph)
    assert store_all_fits(peak - 1, graph) is None
    for budget in (peak, parse_budget("1TB", graph)):
        note = one_line(store_all_fits(budget, graph) or "")
        assert note.startswith("nothing to plan: store-all fits: budget "), note
        assert f"baseline peak {peak:,} B" in note, note
    assert "63.19x the peak" in (store_all_fits(parse_budget("1TB", graph), graph) or "")


def test_the_cli_says_nothing_to_plan_in_one_note_line_and_solves(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import json

    out_file = tmp_path / "store_all.json"
    status, out, err = run(["solve", VGG16, "--budget", "1TB", "-f", "store-all", "-o", out_file, "--json"], capsys)
    assert status == 0, err
    assert len(lines_of(err)) == 1 and err.startswith("coop: note: nothing to plan: store-all fits: budget "), err
    report = json.loads(out)
    assert report["ok"] and report["note"].startswith("nothing to plan: store-all fits")
    assert out_file.exists()


def test_a_budget_below_the_floor_is_named_as_a_share_of_the_peak_and_the_fix_in_the_unit_given() -> None:
    graph = load_graph(VGG16)
    least, peak = min_budget(graph), baseline_peak(graph)
    with pytest.raises(BudgetError) as refused:
        parse_budget("30%", graph)
    message = one_line(str(refused.value))
    assert "budget 4,747,532,698 B (4.4GiB; 0.30 of the peak) is below min_budget " in message, message
    assert f"min_budget {least:,} B (12.2GiB; {least / peak:.2f} of the peak)" in message, message
    fraction = least_fraction(least, peak)
    assert fraction == 0.832 and f"use at least 0.832 (83.2%) or {least}" in message, message
    assert parse_budget(fraction, graph) >= least and parse_budget(f"{100 * fraction:g}%", graph) >= least
    with pytest.raises(BudgetError, match="below min_budget"):
        parse_budget(fraction - 0.001, graph)
    with pytest.raises(BudgetError) as in_bytes:  # given in bytes: the fix in bytes
        parse_budget("1GB", graph)
    assert one_line(str(in_bytes.value)).endswith(f"use at least {least}")
    assert "(953.7MiB; 0.06 of the peak)" in str(in_bytes.value)


def test_the_least_fraction_is_the_least_three_decimal_fraction_that_fits() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        peak = rng.randint(1, 10**12)
        least = rng.randint(1, peak)
        fraction = least_fraction(least, peak)
        assert 0.001 <= fraction <= 1.0 and round(fraction * 1000) == fraction * 1000
        assert math.ceil(fraction * peak - 1e-9) >= least, (least, peak, fraction)
        smaller = fraction - 0.001
        assert smaller < 0.001 - 1e-12 or math.ceil(smaller * peak - 1e-9) < least, (least, peak, fraction)


def test_the_cli_names_the_floor_in_one_line_with_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "never.json"
    status, _, err = run(["solve", VGG16, "--budget", "50%", "-f", "store-all", "-o", out_file], capsys)
    assert status == 1 and len(lines_of(err)) == 1, err
    assert "(7.4GiB; 0.50 of the peak) is below min_budget" in err and "use at least 0.832 (83.2%)" in err, err
    assert not out_file.exists()


def test_a_warning_inside_a_command_is_one_note_line(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import coop.cli

    real = coop.cli.load_graph

    def warned(path: Path) -> object:
        warnings.warn("a fallback,\n said over two lines", UserWarning, stacklevel=1)
        return real(path)

    monkeypatch.setattr(coop.cli, "load_graph", warned)
    status, _, err = run(["info", VGG16, "--json"], capsys)
    assert status == 0 and lines_of(err) == ["coop: note: a fallback, said over two lines"], err


# ---------------------------------------------------------------------------- version
def test_the_version_is_the_installed_distributions() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert declared["name"] == "coop-remat"
    assert coop.__version__ == importlib.metadata.version("coop-remat") == declared["version"]


def test_coop_version_prints_it_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["--version"], capsys)
    assert (status, out, err) == (0, f"coop {coop.__version__}\n", "")


# ---------------------------------------------------------------------------- capture errors
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_batch_of_the_wrong_width_is_one_line_with_no_tracing_logs(capfd: pytest.CaptureFixture[str]) -> None:
    watched = [logging.getLogger(name) for name in ("torch", "torch._subclasses.fake_tensor")]
    levels = [logger.level for logger in watched]
    handler = _Records()
    for logger in watched:
        logger.addHandler(handler)
    try:
        with pytest.raises(CaptureError) as refused:
            coop.capture(Net(), (torch.randn(8, 17), torch.randn(8)))
    finally:
        for logger in watched:
            logger.removeHandler(handler)
    message = one_line(str(refused.value))
    assert message.startswith("cannot trace the training step of Net: ") and "[8, 17] X [16, 32]" in message, message
    assert handler.records == [], [r.getMessage() for r in handler.records]
    assert [logger.level for logger in watched] == levels  # the loggers are as they were
    err = capfd.readouterr().err
    assert "Traceback" not in err and "failed while attempting to run meta" not in err, err


def test_the_cli_reports_a_failed_capture_in_one_line_with_exit_2(tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    factory = tmp_path / "wrong_width.py"
    factory.write_text("import torch\nfrom tests.test_first_call_messages import Net\n\n\n"
                       "def make():\n    return Net(), (torch.randn(8, 17), torch.randn(8))\n")
    out_file = tmp_path / "never.json"
    status = main(["capture", f"{factory}:make", "-o", str(out_file)])
    err = capfd.readouterr().err
    assert status == 2 and len(lines_of(err)) == 1, err
    assert err.startswith("coop: error: cannot trace the training step of Net: "), err
    assert not out_file.exists()


def test_a_float64_batch_into_a_float32_model_names_the_input_and_both_dtypes() -> None:
    torch.manual_seed(0)
    model = Net()
    before = state(model)
    batch = (torch.randn(8, 16, dtype=torch.float64), torch.randn(8, dtype=torch.float64))
    with pytest.raises(CaptureError) as refused:
        coop.plan(model, 0.9, batch)
    message = one_line(str(refused.value))
    assert "batch[0] is float64 but the model's parameters are float32" in message, message
    assert "batch[1]" not in message  # the target meets the output in the loss, which promotes: not the culprit
    assert ".to(torch.float32)" in message and "model.to(torch.float64)" in message, message
    assert "mat1 and mat2" not in message
    assert_unchanged(model, before)


def test_a_float64_image_into_a_float32_convolution_names_the_input_too() -> None:
    """Here the convolution's meta function refuses the trace itself: its line is kept and the input named."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 1))
    batch = (torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.randn(2))
    with pytest.raises(CaptureError) as refused:
        coop.capture(model, batch, lambda m, x, y: ((m(x).squeeze(-1) - y) ** 2).mean())
    message = one_line(str(refused.value))
    assert "batch[0] is float64 but the model's parameters are float32" in message, message


def test_a_model_that_casts_its_batch_itself_is_captured() -> None:
    batch = (torch.randn(8, 16, dtype=torch.float64), torch.randn(8, dtype=torch.float64))
    assert len(coop.capture(CastingNet(), batch).graph.nodes) > 0


# ---------------------------------------------------------------------------- profiler noise
def test_the_cpu_meter_prints_nothing_but_what_the_step_prints(capfd: pytest.CaptureFixture[str]) -> None:
    def step() -> None:
        torch.randn(64, 64) @ torch.randn(64, 64)
        print("the step's own line", file=sys.stderr)

    for _ in range(2):  # kineto prints on every start and stop
        assert cpu_allocation_peak(step)
    err = capfd.readouterr().err
    assert lines_of(err) == ["the step's own line"] * 2, err


def test_a_profiled_capture_prints_no_profiler_lines(capfd: pytest.CaptureFixture[str]) -> None:
    coop.capture(Net(), (torch.randn(8, 16), torch.randn(8)), profile=True)
    err = capfd.readouterr().err
    assert not any(noise in err for noise in PROFILER_NOISE), err


# ---------------------------------------------------------------------------- progress
STAMP = re.compile(r"^\s*(\d+\.\d)s  ")


def stamps(text: str) -> list[float]:
    return [float(match.group(1)) for line in text.splitlines() if (match := STAMP.match(line))]


def test_progress_lines_are_stamped_with_the_seconds_since_the_solve_began() -> None:
    stream = io.StringIO()
    with _solve_progress("auto", 5.0, stream=stream, heartbeat_s=100.0) as report:
        time.sleep(0.3)
        report(Progress(0.0, 10.0, None, "a rung that counts from 0"))
        time.sleep(1.1)  # past the one-line-a-second throttle
        report(Progress(0.0, 9.0, 8.0, "the next rung, from 0 again", final=True))
    lines = stream.getvalue().splitlines()
    assert lines[0] == "     0.0s  auto: solving (time limit 5 s)", lines
    times = stamps(stream.getvalue())
    assert len(times) == 3 and times[1] >= 0.3 and times[2] >= 1.4 and times == sorted(times), lines


def test_progress_says_still_solving_when_no_report_comes() -> None:
    stream = io.StringIO()
    with _solve_progress("moccasin", None, stream=stream, heartbeat_s=0.2):
        time.sleep(1.0)
    text = stream.getvalue()
    assert "moccasin: solving (no time limit given)" in text
    assert "moccasin: still solving" in text, text
    time.sleep(0.5)
    assert stream.getvalue() == text  # the heartbeat stopped with the solve


def test_cli_progress_for_auto_starts_at_once_and_stamps_real_times(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["solve", VGG16, "--budget", "90%", "-f", "auto", "--progress", "--time-limit", "3",
                          "--json"], capsys)
    assert status in (0, 1), err
    assert lines_of(err)[0] == "     0.0s  auto: solving (time limit 3 s)", err
    times = stamps(err)
    assert times == sorted(times), err  # one clock for every rung: no stamp goes back to 0


# ---------------------------------------------------------------------------- the published graphs, in the repository
READERS = ["README.md", "Makefile", ".ci/smoke.py", *(str(p.relative_to(REPO)) for folder in ("tests", "benchmarks",
                                                                                              "examples", "coop")
                                                  for p in sorted((REPO / folder).rglob("*.py")))]


def test_nothing_reads_or_links_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|[\"']shared[\"']\s*/|\]\(\.\./")
    found = []
    for relative in READERS:
        if relative == "tests/test_first_call_messages.py":
            continue
        for number, line in enumerate((REPO / relative).read_text().splitlines(), 1):
            if outside.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, found


def test_the_shipped_graphs_are_there_with_their_source_named() -> None:
    for folder, source in (("moccasin", "haoming-codes/moccasin"), ("poet", "ShishirPatil/poet")):
        readme = (REPO / "graphs" / folder / "README.md").read_text()
        assert source in readme and "Licence" in readme, folder
        files = sorted((REPO / "graphs" / folder).glob("*.json"))
        assert files and all(f.stat().st_size < 1_000_000 for f in files), folder
    readme = (REPO / "README.md").read_text()
    named = set(re.findall(r"graphs/(?:moccasin|poet)/[\w.\-]+\.json", readme))
    assert named and all((REPO / path).is_file() for path in named), named
    from tests.conftest import MOCCASIN_DIR

    assert MOCCASIN_DIR.is_relative_to(REPO) and MOCCASIN_DIR.is_dir()


def test_the_readme_installs_from_the_clone_with_the_real_extras() -> None:
    readme = (REPO / "README.md").read_text()
    assert "coop-remat[" not in readme and "pip install coop-remat" not in readme.replace(
        "`pip install coop-remat` finds nothing", "")
    assert "download.pytorch.org/whl/cpu" in readme and 'pip install ".[transformers]"' in readme
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in re.findall(r'pip install "\.\[(\w[\w-]*)\]"', readme):
        assert extra in extras, extra
    torch_range = next(d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
                       if d.startswith("torch"))
    assert torch_range == "torch>=2.10,<2.14" and f"`{torch_range}`" in readme

