"""Replay benchmark: store-all replay vs eager step time, and measured vs predicted overhead at 50 %.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_replay.py [--quick] [--only gpt2|resnet50]``
(CPU; GPT-2 small and ResNet-50 with random weights, nothing downloaded). The sizes are chosen so
that activations, not parameters and gradients, dominate the baseline peak, so that 50 % of it is
above ``min_budget``.

Protocol. Each model runs in two fresh worker processes, one per allocator setting:

* ``warm`` (the numbers the issue's checks use): glibc malloc told to keep the pages it has
  (``MALLOC_MMAP_MAX_=0``: no per-allocation mmap; ``MALLOC_TRIM_THRESHOLD_`` huge: no trimming),
  so after the warm-up no step page-faults, as on CUDA with PyTorch's caching allocator. Step time
  is then compute, which is what the plan's cost model predicts. This worker plans (node costs
  profiled with ``coop.plan(..., profile=True)`` in the same allocator setting) and times.
* ``default``: glibc as shipped. Freed large blocks go back to the kernel, so every step that
  reaches a new high-water mark page-faults its fresh memory again; a plan with a lower peak
  avoids part of that. This worker replays the warm worker's schedules and counts minor page
  faults per step and measures what one fault costs, which explains why the 50 % plan can run
  *faster* than store-all there (GPT-2 small: eager and store-all fault about 1.2-1.5 GB per
  step, the 50 % plan almost none).

Each round times one eager step, one store-all replay and one 50 % step back to back (a
neighbour's load hits all three alike). The CPU time other processes used during each round is
read from /proc/stat; medians are over the rounds in which others used under
``QUIET_CORES`` cores, when at least ``ROUNDS`` such rounds exist within ``ROUNDS + EXTRA_ROUNDS``
rounds (``quiet_rounds`` says how many were used), else over all rounds.

* ``replay_vs_eager`` = store-all replay time / eager time (the issue asks for <= 1.05);
* ``predicted_overhead`` = the 50 % plan's simulated cost / baseline cost - 1 (profiled costs);
* ``measured_overhead`` = 50 % plan time / eager time - 1 (the issue's definition), and
  ``measured_vs_store_all`` = 50 % plan time / store-all replay time - 1 (replay overheads cancel);
* "within 10 %" both ways, on ``measured_vs_store_all`` (the prediction counts extra compute over
  the captured program, which the store-all replay runs; eager PyTorch runs a different program
  whose time the ``replay_vs_eager`` check covers): ``within_10pct_of_predicted``
  (``|measured - predicted| <= 0.1 x predicted``, relative to the predicted value) and
  ``within_10pp`` (``|measured - predicted| <= 0.10``, percentage points of the step);
  ``gap_pp`` = measured - predicted in points; ``within_10pp_vs_eager`` the same on
  ``measured_overhead``;
* ``faults_mb_*``: minor page faults per step x page size (MB of memory faulted in);
  ``default_*_wo_faults``: the default-allocator overheads with the fault time (faults x the
  measured cost of one fault) taken out of each step, the measured explanation of the gap.
"""

from __future__ import annotations

import copy
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import coop
from coop.budget import min_budget
from coop.errors import CoopError
from coop.graph_capture import capture
from coop.planner.plan import Plan
from coop.runtime.meter import MemoryMeter
from coop.schedule import load_schedule, schedule_to_json
from coop.zoo import _classifier_loss, build

ROUNDS = 5  # rounds whose medians are reported (warm allocator)
EXTRA_ROUNDS = 3  # further rounds allowed when neighbours' load spoiled some
DEFAULT_ROUNDS = 2  # rounds under the default allocator (the explanation, not the check)
QUIET_CORES = 0.25  # a round is quiet when other processes used less CPU than this
TIME_LIMIT = 60
QUICK_TIME_LIMIT = 10
WARM_ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 46)}
ROW_PREFIX = "BENCH_ROW "
VARIANTS = ("eager", "store_all", "half")


def _resnet50(batch: int, image: int) -> tuple:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_labels=10)).train()  # the default config is ResNet-50
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return model, (images, torch.randint(0, 10, (batch,), generator=generator)), _classifier_loss


def _gpt2_small(batch: int, seq: int) -> tuple:
    return build("gpt2", layers=12, hidden=768, heads=12, vocab=50257, batch=batch, seq=seq)


CASES: dict[str, tuple[str, Callable[[], tuple]]] = {
    "gpt2": ("gpt2-small (b4, s256)", lambda: _gpt2_small(4, 256)),
    "resnet50": ("resnet50 (b32, 128px)", lambda: _resnet50(32, 128)),
}
QUICK: dict[str, tuple[str, Callable[[], tuple]]] = {
    "gpt2": ("gpt2 2x64 (b4, s128)", lambda: build("gpt2", layers=2, hidden=64, heads=4, vocab=128, batch=4, seq=128)),
    "resnet50": ("resnet50 (b8, 64px)", lambda: _resnet50(8, 64)),
}


# ============================================================================ steps and clocks
def _eager_step(model: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> Callable[[], None]:
    def step() -> None:
        out = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
        (out if isinstance(out, torch.Tensor) else out.loss).backward()
        model.zero_grad(set_to_none=True)

    return step


def _plan_step(plan: Plan, batch: tuple) -> Callable[[], None]:
    def step() -> None:
        plan.step(*batch)
        plan.model.zero_grad(set_to_none=True)

    return step


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _system_busy_s() -> float | None:
    """CPU seconds all processes have used (busy jiffies of /proc/stat); None off Linux."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _timed_round(steps: dict[str, Callable[[], None]]) -> dict[str, Any]:
    """One eager, store-all and 50 % step back to back: seconds, faults, and others' CPU load."""
    busy, own, start = _system_busy_s(), _own_cpu_s(), time.perf_counter()
    record: dict[str, Any] = {"seconds": {}, "faults": {}}
    for name, step in steps.items():
        faults, clock = _minor_faults(), time.perf_counter()
        step()
        record["seconds"][name] = time.perf_counter() - clock
        record["faults"][name] = _minor_faults() - faults
    wall = time.perf_counter() - start
    after = _system_busy_s()
    others = None if busy is None or after is None else max(0.0, (after - busy) - (_own_cpu_s() - own)) / wall
    record["others_cores"] = others
    return record


def _time_rounds(steps: dict[str, Callable[[], None]], rounds: int, extra: int) -> tuple[list[dict], list[dict]]:
    """All rounds, and the ones the medians use (the quiet ones when there are ``rounds`` of them)."""
    for step in steps.values():  # warm-up: caches, allocator, lazy initialisation
        step()
    records: list[dict] = []
    while True:
        records.append(_timed_round(steps))
        quiet = [r for r in records if r["others_cores"] is not None and r["others_cores"] < QUIET_CORES]
        if len(records) >= rounds and (len(quiet) >= rounds or len(records) >= rounds + extra):
            return records, (quiet if len(quiet) >= rounds else records)


def _medians(records: list[dict], key: str) -> dict[str, float]:
    return {name: statistics.median(r[key][name] for r in records) for name in VARIANTS}


def _metered_peak(plan: Plan, batch: tuple) -> int:
    flat = plan.captured.flat_inputs(plan.model, batch)
    with torch.random.fork_rng(), MemoryMeter() as meter:
        meter.track(*flat, *plan.captured.constants())
        plan.step(*batch)
    plan.model.zero_grad(set_to_none=True)
    return meter.peak_bytes


def fault_seconds(megabytes: int = 256, repeats: int = 5) -> float:
    """Measured seconds one minor page fault costs: writing a fresh anonymous mapping vs rewriting it.

    The block comes from ``mmap`` directly, not from malloc, so that it is fresh whatever the
    allocator has kept: the first write faults every page in, a second write faults none.
    """
    size = megabytes * 2**20
    pages = size / resource.getpagesize()
    fresh, rewrite = [], []
    for _ in range(repeats):
        with mmap.mmap(-1, size) as block:
            tensor = torch.frombuffer(block, dtype=torch.uint8)
            start = time.perf_counter()
            tensor.fill_(1)
            fresh.append(time.perf_counter() - start)
            start = time.perf_counter()
            tensor.fill_(2)
            rewrite.append(time.perf_counter() - start)
            del tensor  # release the buffer export before the mapping closes
    return max(0.0, min(fresh) - min(rewrite)) / pages


# ============================================================================ the two workers
def _rounded(values: dict[str, float], digits: int = 3) -> dict[str, float]:
    return {name: round(v, digits) for name, v in values.items()}


def warm_worker(key: str, quick: bool, folder: Path) -> dict[str, Any]:
    """Plan (profiled) and time under the warm allocator; saves the schedules for the default worker."""
    label, make = (QUICK if quick else CASES)[key]
    model, batch, loss_fn = make()
    eager_model = copy.deepcopy(model)
    start = time.perf_counter()
    store_all = coop.plan(model, 1.0, batch, loss_fn=loss_fn, formulation="store-all")
    half = coop.plan(model, 0.5, batch, loss_fn=loss_fn, formulation="auto",
                     time_limit=QUICK_TIME_LIMIT if quick else TIME_LIMIT, profile=True)
    planning_s = time.perf_counter() - start
    for name, plan in (("store_all", store_all), ("half", half)):
        document = schedule_to_json(plan.graph, plan.schedule, budget=plan.budget, formulation=plan.formulation)
        document["structure_sha256"] = plan.captured.graph.structure_sha256
        (folder / f"{name}.json").write_text(json.dumps(document))
    steps = {"eager": _eager_step(eager_model, batch, loss_fn), "store_all": _plan_step(store_all, batch),
             "half": _plan_step(half, batch)}
    records, used = _time_rounds(steps, ROUNDS, EXTRA_ROUNDS)
    seconds, faults = _medians(used, "seconds"), _medians(used, "faults")
    summary = half.summary()
    return {
        "model": label, "nodes": len(half.graph.nodes), "threads": torch.get_num_threads(),
        "baseline_peak": half.baseline_peak,
        "min_budget_fraction": round(min_budget(half.graph) / half.baseline_peak, 3),
        "half_formulation": half.formulation, "half_status": summary["status"], "half_note": summary["note"],
        "half_budget_fraction": round(half.budget / half.baseline_peak, 3),
        "half_predicted_peak_fraction": round(half.predicted_peak / half.baseline_peak, 3),
        "half_metered_peak_fraction": round(_metered_peak(half, batch) / half.baseline_peak, 3),
        "predicted_overhead": half.predicted_overhead,
        "seconds": seconds, "faults": faults, "rounds": len(records), "rounds_used": len(used),
        "quiet_rounds": sum(1 for r in records if r["others_cores"] is not None and r["others_cores"] < QUIET_CORES),
        "others_cores": [None if r["others_cores"] is None else round(r["others_cores"], 2) for r in records],
        "times_s": {name: [round(r["seconds"][name], 3) for r in records] for name in VARIANTS},
        "planning_s": planning_s,
    }


def default_worker(key: str, quick: bool, folder: Path) -> dict[str, Any]:
    """Replay the warm worker's schedules under glibc's default allocator: times, faults, fault cost."""
    _, make = (QUICK if quick else CASES)[key]
    model, batch, loss_fn = make()
    eager_model = copy.deepcopy(model)
    captured = capture(model, batch, loss_fn=loss_fn)
    plans = {}
    for name in ("store_all", "half"):
        schedule, document = load_schedule(folder / f"{name}.json")
        if document["structure_sha256"] != captured.graph.structure_sha256:
            raise CoopError(f"the {name} schedule was planned for another graph; rerun the benchmark")
        plans[name] = Plan(model, captured, schedule, document["budget"], document["formulation"])
    steps = {"eager": _eager_step(eager_model, batch, loss_fn), "store_all": _plan_step(plans["store_all"], batch),
             "half": _plan_step(plans["half"], batch)}
    records, used = _time_rounds(steps, DEFAULT_ROUNDS, 0)
    return {"seconds": _medians(used, "seconds"), "faults": _medians(used, "faults"), "fault_s": fault_seconds(),
            "times_s": {name: [round(r["seconds"][name], 3) for r in records] for name in VARIANTS}}


# ============================================================================ the parent
def _spawn(mode: str, key: str, quick: bool, folder: Path, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--only", key, "--dir", str(folder)]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    rows = [line[len(ROW_PREFIX):] for line in done.stdout.splitlines() if line.startswith(ROW_PREFIX)]
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"bench_replay {mode} worker for {key} failed (rc {done.returncode}): "
                           f"{done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}")
    return json.loads(rows[-1])


def _overheads(seconds: dict[str, float]) -> tuple[float, float, float]:
    """(replay_vs_eager, overhead vs eager, overhead vs store-all) from median step times."""
    return (seconds["store_all"] / seconds["eager"], seconds["half"] / seconds["eager"] - 1,
            seconds["half"] / seconds["store_all"] - 1)


def merge(warm: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """One table row: the warm-allocator check and the default-allocator explanation."""
    page_mb = resource.getpagesize() / 1e6
    predicted = warm["predicted_overhead"]
    replay, measured, vs_store_all = _overheads(warm["seconds"])
    d_replay, d_measured, d_vs_store_all = _overheads(default["seconds"])
    # Take each step's fault time (faults x the measured cost of one) out of its default-allocator time.
    without = {n: default["seconds"][n] - default["faults"][n] * default["fault_s"] for n in VARIANTS}
    _, wo_measured, wo_vs_store_all = _overheads(without)
    row = {key: warm[key] for key in ("model", "nodes", "threads", "baseline_peak", "min_budget_fraction",
                                      "half_formulation", "half_status", "half_note", "half_budget_fraction",
                                      "half_predicted_peak_fraction", "half_metered_peak_fraction")}
    row.update({
        "eager_s": round(warm["seconds"]["eager"], 3), "store_all_s": round(warm["seconds"]["store_all"], 3),
        "half_s": round(warm["seconds"]["half"], 3), "replay_vs_eager": round(replay, 3),
        "predicted_overhead": round(predicted, 3), "measured_overhead": round(measured, 3),
        "measured_vs_store_all": round(vs_store_all, 3), "gap_pp": round(100 * (vs_store_all - predicted), 1),
        # The prediction is extra compute over the captured program's, so store-all replay is its like-for-like base.
        "within_10pct_of_predicted": abs(vs_store_all - predicted) <= 0.1 * abs(predicted),
        "within_10pp": abs(vs_store_all - predicted) <= 0.10,
        "within_10pp_vs_eager": abs(measured - predicted) <= 0.10,
        "faults_mb": {n: round(warm["faults"][n] * page_mb) for n in VARIANTS},
        "quiet_rounds": f"{warm['quiet_rounds']}/{warm['rounds']} (medians of {warm['rounds_used']})",
        "default_replay_vs_eager": round(d_replay, 3), "default_measured_overhead": round(d_measured, 3),
        "default_vs_store_all": round(d_vs_store_all, 3),
        "default_faults_mb": {n: round(default["faults"][n] * page_mb) for n in VARIANTS},
        "fault_us": round(default["fault_s"] * 1e6, 2),
        "default_overhead_wo_faults": round(wo_measured, 3), "default_vs_store_all_wo_faults": round(wo_vs_store_all, 3),
        "planning_s": round(warm["planning_s"], 1),
        "others_cores": warm["others_cores"], "times_s": warm["times_s"], "default_times_s": default["times_s"],
    })
    return row


NOTES = ("Warm allocator (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ huge: no step page-faults after the warm-up) "
         "for replay_vs_eager and the 50 % check. The check compares the predicted overhead (extra compute over the "
         "captured program) with measured_vs_store_all (50 % plan time / store-all replay time - 1): 'within 10 %' "
         "is shown relative to the predicted value (within_10pct_of_predicted) and in percentage points "
         "(within_10pp; within_10pp_vs_eager uses half / eager - 1 instead). The default_* "
         "columns replay the same schedules under glibc's default allocator, which returns freed large blocks to "
         "the kernel, so a step page-faults the memory it reaches above what malloc kept (faults_mb per step); "
         "a lower peak faults less, which the compute-only cost model does not count. default_*_wo_faults take "
         "each step's faults x fault_us out of its time.")


def run(quick: bool = False, only: str | None = None) -> dict[str, Any]:
    """Rows for GPT-2 small and ResNet-50 (``quick``: tiny sizes, to check the script runs)."""
    rows = []
    for key, (label, _) in (QUICK if quick else CASES).items():
        if only not in (None, key):
            continue
        with tempfile.TemporaryDirectory(prefix="bench_replay_") as folder:
            warm = _spawn("warm", key, quick, Path(folder), WARM_ALLOCATOR)
            if "error" in warm:  # e.g. 50 % below min_budget: report it, go on with the next model
                rows.append({"model": label, "error": warm["error"]})
                continue
            rows.append(merge(warm, _spawn("default", key, quick, Path(folder), {})))
    return {"rows": rows, "notes": NOTES}


def _worker_main(mode: str, key: str, quick: bool, folder: Path) -> None:
    try:
        result = (warm_worker if mode == "warm" else default_worker)(key, quick, folder)
    except CoopError as exc:
        result = {"error": str(exc)}
    print(ROW_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    chosen = arguments[arguments.index("--only") + 1] if "--only" in arguments else None
    if "--worker" in arguments:
        _worker_main(arguments[arguments.index("--worker") + 1], str(chosen), "--quick" in arguments,
                     Path(arguments[arguments.index("--dir") + 1]))
    else:
        for result in run(quick="--quick" in arguments, only=chosen)["rows"]:
            print(json.dumps(result), flush=True)
