"""Smoke test of coop as a user installs it: ``pip install .`` with no extras, then the first things a user does.

Run by ``make smoke`` (and by ``.ci/run``) with the interpreter of a fresh virtual environment that holds torch and
the package alone, from a directory outside the source tree so that ``import coop`` finds the installed package. It
fails (non-zero exit) on any missing dependency or wrong result:

1. ``coop.plan`` on a small built-in model under 60 % of its baseline peak, three AdamW steps, each compared with eager
   PyTorch doing the same steps (loss and every gradient equal);
2. ``coop simulate`` and ``coop compare`` on a published graph shipped in ``graphs/moccasin`` (the graph of a zoo
   model captured here when the source tree has no ``graphs/``);
3. ``coop capture --alternatives`` of a zoo model, ``coop solve`` with monet on it, and poet on a device profile
   read from the installed package's data (``coop/configs/devices``).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import coop
from coop.zoo import build

SOURCE_TREE = Path(__file__).resolve().parents[1]
PUBLISHED_GRAPH = SOURCE_TREE / "graphs" / "moccasin" / "VGG16_256_224_224_3_train_nx.json"


def check(condition: bool, message: str) -> None:
    if not condition:
        print(f"smoke: FAILED: {message}", file=sys.stderr)
        raise SystemExit(1)


def plan_and_train() -> None:
    """A plan under 60 % of the baseline peak trains like eager PyTorch over three AdamW steps."""
    installed_at = Path(coop.__file__).resolve()
    check("site-packages" in installed_at.parts, f"coop imported from {installed_at}, not from an installed package")
    model, batch, _ = build("transformer", layers=2, hidden=32, batch=4, seq=32)
    eager = copy.deepcopy(model)
    plan = coop.plan(model, 0.6, batch, time_limit=10)
    check(plan.predicted_peak < plan.baseline_peak, "the plan at 60 % recomputes nothing")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    for step in range(3):
        torch.manual_seed(step)
        loss = plan.step(*batch)
        torch.manual_seed(step)
        eager_loss = eager(*batch)
        eager_loss.backward()
        check(torch.equal(loss, eager_loss.detach()), f"step {step}: loss differs from eager")
        for (name, param), eager_param in zip(model.named_parameters(), eager.parameters(), strict=True):
            check(torch.equal(param.grad, eager_param.grad), f"step {step}: gradient of {name} differs from eager")
        optimizer.step()
        eager_optimizer.step()
        optimizer.zero_grad()
        eager_optimizer.zero_grad()
    summary = plan.summary()
    print(f"smoke: plan {summary['formulation']} at 60 %: predicted peak {summary['predicted_peak']} of "
          f"{summary['baseline_peak']} bytes, 3 AdamW steps equal to eager")


def published_or_captured_graph(workdir: Path) -> Path:
    if PUBLISHED_GRAPH.exists():
        return PUBLISHED_GRAPH
    print(f"smoke: {PUBLISHED_GRAPH} absent (no graphs/ in the source tree): using a captured zoo graph")
    model, batch, loss_fn = build("cnn")
    path = workdir / "cnn.json"
    coop.capture(model, batch, loss_fn).graph.save(path)
    return path


def run_cli(*args: str) -> None:
    command = [str(Path(sys.executable).with_name("coop")), *args]  # the console script pip installed
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    check(completed.returncode == 0, f"`coop {' '.join(args)}` exited {completed.returncode}: {completed.stderr}")
    check("Traceback" not in completed.stderr, f"`coop {' '.join(args)}` printed a traceback")
    print(f"smoke: coop {' '.join(args[:1])} ok")


def main() -> None:
    plan_and_train()
    with tempfile.TemporaryDirectory() as tmp:
        graph = published_or_captured_graph(Path(tmp))
        run_cli("simulate", str(graph), "--policy", "coop", "--budget", "90%")
        run_cli("compare", str(graph), "--budgets", "90%,70%", "--time-limit", "5",
                "--csv", str(Path(tmp) / "compare.csv"), "--plot", str(Path(tmp) / "compare.png"))
        captured = str(Path(tmp) / "cnn_alternatives.json")
        run_cli("capture", "--model", "cnn", "--alternatives", "-o", captured)
        run_cli("solve", captured, "--budget", "95%", "--formulation", "monet", "--time-limit", "5")
        run_cli("solve", captured, "--budget", "80%", "--formulation", "poet", "--device-profile", "m4",
                "--time-limit", "5")
    print("smoke: passed")


if __name__ == "__main__":
    main()
