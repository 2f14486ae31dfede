"""GPU acceptance: every CUDA path of coop, a process per case: memory, step time and gradients against eager.

The one command a maintainer runs on a lent GPU machine (issue 22, item 5)::

    python benchmarks/bench_cuda.py [--device cuda|cpu] [--quick] [--only CASE ...] [--json OUT] [--jobs N]

It runs every case of :data:`CASES` (``--list`` prints them) in a process of its own, so that a crash
becomes a row (``crashed: SIGSEGV``, with the last phase the case reached and the innermost frame of
its ``faulthandler`` dump) and the run goes on; a case that runs past its timeout becomes ``timed out
after N s`` (with the frame it hung in, dumped just before the kill), a Python exception ``error: <one
line>``. A case runs as ``python bench_cuda.py --case JSON`` (``--isolation exec``, the default on
CUDA: no driver state crosses a fork), or forked from a fork server that imported torch, coop and
transformers once (``--isolation fork``, the default on CPU: seconds of imports saved per case). The
parent prints a table, writes every row as JSON (``--json``), checks the acceptance bars
(:func:`acceptance_failures`) and exits 1 when one fails. ``--device`` defaults to ``cuda`` when torch
sees a CUDA device, else ``cpu``: there the same command runs the CPU-capable cases, and the test
suite runs them at the tiny ``--quick`` sizes (tests/test_bench_cuda.py), so this code is exercised in
CI. ``--only`` takes case names, families, modes or shell patterns (``gpt2``, ``replay``,
``resnet/replay/*``);
``python benchmarks/run_all.py --only bench_cuda`` runs it through :func:`run` (``REQUIRES = "cuda"``:
``make bench`` on a machine without CUDA keeps the section of the last GPU run).

Cases (family / mode / budget; budgets are fractions of the baseline peak, ``store-all`` the
baseline order itself). Full sizes: GPT-2 small b8 s512, ResNet-50 b32 224 px, BERT-base b8 s256,
Llama 16x512 b8 s512, ViT-B (patch 8) b32 128 px, MobileNetV2 x0.25 b64 224 px; ``--quick``: the
smallest sizes at which every budget below can be planned (:data:`MODELS`).

* ``F/capture`` for every zoo family (GPT-2, BERT, Llama, ResNet, ViT, MobileNetV2): ``coop.capture(...,
  profile=True)`` (node costs measured on the device); the row compares eager PyTorch's own step with the
  captured baseline peak.
* ``gpt2|resnet/replay/store-all|0.7|0.5`` and ``bert|llama|vit|mobilenet/replay/0.6``: ordinary replay
  of ``coop.plan(..., formulation="store-all" | "auto")``.
* ``gpt2|resnet/arena/0.8``: ``coop.plan(..., arena=True)`` (one buffer at planned offsets). coop refuses
  it off CPU by design (a plain ``CoopError``): the row then reads ``skipped: coop refuses it: ...``.
* ``gpt2/paging/0.3`` and ``gpt2/paging+copy_stream/0.3``: ``formulation="poet"`` with the
  ``h100-sxm-pcie5`` device profile, at a budget close to ``coop.min_budget`` (0.27 of the baseline peak at
  full size, 0.19 quick), below what recomputation alone reaches, so that it pages (198 page-outs at full
  size, 37 quick, solved on CPU with analytic costs);
  the second with ``copy_stream=True`` (CUDA only: on CPU the row says ``skipped: copy_stream needs CUDA``).
* ``gpt2|resnet/dynamic/store-all|0.7|0.5``: ``formulation="dynamic"`` (online eviction). The first step runs
  the online engine and records its decisions (``first_step_ms``); later steps replay the record with the static
  executor (``step_ms``), timed beside a static plan of the very same schedule (``static_same_ms``;
  ``later_vs_static``: issue 23's bar is <= 1.1 on the H100).
* ``gpt2|resnet/dynamic-delta/0.5``: the same with ``policy="delta"`` on the ``h100-sxm-pcie5`` profile (issue
  26): DELTA swaps to pinned host memory on the copy stream or recomputes, whichever its director prices cheaper;
  its first step records page steps too, replayed from the second step.
* ``gpt2|resnet/cuda-graph/store-all|0.7|0.5``: CUDA-graph replay (``coop.plan(..., cuda_graph=True)``);
  ``skipped: not implemented yet`` where ``coop.plan`` does not take ``cuda_graph=``.
* ``gpt2/meta-plan/0.5``, ``bert/meta-plan/0.6``: issue 27's promise on the device: the model built on the meta
  device (no weights), captured for this device (``coop.capture(..., device=...)``: attention, dropout and batch
  norm traced as the kernels the device runs, :mod:`coop.graph_capture.attention`,
  :mod:`coop.graph_capture.cuda_dispatch`), planned and saved; ``coop.load_plan`` on the
  real model captures it again and must find the same graph (``note`` names the op counts that differ where
  not), then the loaded plan trains like eager. ``nodes`` is the meta capture's node count.
* ``gpt2/fsdp/0.5``: issue 27's FSDP plan on the device: one rank (NCCL on CUDA, gloo on CPU, world size 1),
  every transformer layer and the model ``fully_shard``-ed, captured without profiling (coop refuses to profile a
  sharded step) and planned with ``auto``: the Graph holds the shards, each layer's all-gather and
  reduce-scatter (:mod:`coop.graph_capture.fsdp`). ``grads_equal`` compares loss, sharded gradients and buffers
  with FSDP eager on a second copy built from the same seed. On CPU its ``allocated`` is only an upper bound
  (:data:`GLOO_MODES`: gloo's worker threads free some buffers where the profiler does not see it) and no memory
  bar applies; on CUDA the bars do.
* hidden self-tests (``selftest/crash``, ``selftest/error``, ``selftest/hang``, run with ``--selftest`` or
  ``--only``): a child that kills itself with SIGSEGV, raises, or hangs, to prove the machinery.

Columns (bytes; ``predicted`` and the measures count the caller-owned values, the parameters, buffers
and batch that the Graph holds resident, as the simulator does):

* ``predicted``: the simulator's peak for the plan (``plan.predicted_peak``: live bytes, caller-owned
  included, workspaces as captured: measured per node on CUDA, none on CPU); for an arena plan its whole
  footprint (``plan.summary()["arena_footprint"]``: caller-owned values, arenas, scratch, output slots and
  what a step allocates beside them); for a dynamic plan its budget (``plan.budget``, the bound online
  eviction keeps); for a capture row the captured baseline peak (``coop.baseline_peak``), the prediction for
  eager's own step.
* ``allocated``: on CUDA, ``torch.cuda.max_memory_allocated()`` during a warm step (the second) minus
  ``torch.cuda.memory_allocated()`` right before the plan's first step, plus the caller-owned bytes: the
  warm step's peak and whatever the first step left allocated for later steps (an arena buffer, output
  slots). On CPU the same quantity from an independent meter, torch's profiler (:class:`CpuMeter`:
  every allocation and free the CPU allocator reports over both steps, in order; allocations made under a
  coop function that enters ``host_pool()``, the host tier, are counted apart in ``host``).
* ``allocated_no_scratch`` (CPU only): the same without the blocks an aten op allocates and frees before it
  returns (a CPU convolution's scratch), which coop does not measure on CPU: the quantity a CPU capture
  predicts (``noscr/pred`` in the table).
* ``reserved`` (CUDA only): ``torch.cuda.max_memory_reserved()`` during the warm step, after
  ``torch.cuda.empty_cache()``, minus ``memory_allocated()`` before the first step, plus the caller-owned
  bytes: every byte the caching allocator holds that is not a tensor that existed before the plan ran
  (fragmentation, rounding and the slack of the segments that hold the parameters included).
* ``modelled``, ``mod/res`` (CUDA only): the CUDA allocator model's prediction of the replay's reserve plus the
  caller-owned bytes (what ``coop.plan`` solves below before a step runs), and its ratio to ``reserved``.
* ``alloc/pred``, ``res/pred``, ``noscr/pred``: ratios to ``predicted``. The bars (:func:`acceptance_failures`):
  no crash, error or timeout; ``grads_equal`` on every planned and dynamic row; ``res/pred <= 1.03`` for
  GPT-2 and ResNet-50 at store-all, 0.7 and 0.5 (CUDA); on CPU ``noscr/pred <= 1`` for every replay, paging
  and dynamic row and ``alloc/pred <= 1`` for an arena row (its footprint counts the scratch).
* ``step_ms``, ``eager_ms``, ``vs_eager``: medians of synchronized warm steps of the plan and of eager
  PyTorch (``loss.backward()``) on the same weights, and their ratio; a planned or dynamic row times them
  alternating step by step (``plan.benchmark``, what a user measures). ``pred_ovh%`` beside ``meas_ovh%``
  there: the overhead the plan predicted against eager at the benchmark's thread count, and the measured one.
* ``grads_equal``: loss, every gradient and every buffer ``torch.equal`` to eager's over two AdamW steps from the same
  weights, each step under the same seed (the second checks that the replay reads the updated weights);
  ``note`` names the first difference. A compile row compares one step's gradients with ``torch.compile``'s own
  partitioner (same seed, coop's inductor options); where coop undid inductor's ``addmm`` folds
  (``folds_undone``), within :data:`UNFOLDED_GRADIENT_REL` of each gradient's largest element (``grads_max_rel``).
* ``nodes``, ``capture_s``: the captured graph's nodes and the capture's wall time (with profiling on
  CUDA and in capture rows; replay rows on CPU capture without it). ``pages``: the plan's page-outs;
  ``plan_s``: ``coop.plan``'s wall time; ``wall_s``: the case's, process start included.

Everything runs under ``torch.use_deterministic_algorithms(True)`` with ``CUBLAS_WORKSPACE_CONFIG=
:4096:8`` (set in the environment of every case before torch initialises CUDA): CUDA's atomic-add
kernels (embedding and index backward) otherwise give other bits on every run, eager against eager.
``PYTORCH_CUDA_ALLOC_CONF`` is left as the caller sets it (the notes record it).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before torch initialises CUDA (cuBLAS determinism)

import argparse
import ast
import contextlib
import copy
import dataclasses
import faulthandler
import fnmatch
import inspect
import json
import math
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import coop
from coop.compiled.api import inductor_options
from coop.zoo import LossStep, _classifier_loss, build

REQUIRES = "cuda"
#: the budget of the store-all rows, a fraction of the baseline peak: on CUDA coop keeps one large and one small
#: allocator page free of the budget (22 MiB, coop.runtime.allocator) and room for saved generator states, so at
#: exactly the baseline peak store-all does not fit and auto would recompute (a chen-greedy row, seen on the H200)
STORE_ALL_BUDGET = 1.02
#: the paging rows' budget: their fraction of the baseline peak, or this many times coop.min_budget where that
#: is higher (GPT-2's min_budget is 0.27 of its peak on CPU, 0.39 on CUDA with the measured workspaces)
PAGING_OVER_MIN = 1.05
#: the least solver seconds a paging row's POET gets: on the quick GPT-2 under a load of 4 on 2 cores POET's MILP found
#: no schedule within the quick 2 s (2026-11-29, while it plans in 4.5 s of wall time with 2 s unloaded)
PAGING_MIN_TIME_LIMIT = 3
DEVICE_PROFILE = "h100-sxm-pcie5"
EQUAL_STEPS = 2

# ============================================================================ the cases


@dataclass(frozen=True)
class Case:
    """One row: a zoo family, a mode and a budget (a fraction of the baseline peak, or 'store-all')."""

    family: str
    mode: str
    budget: float | str | None = None
    hidden: bool = False  # a self-test of the machinery: run only when asked for

    @property
    def name(self) -> str:
        return "/".join(str(part) for part in (self.family, self.mode, self.budget) if part is not None)


FAMILIES = ("gpt2", "bert", "llama", "resnet", "vit", "mobilenet")
CASES: tuple[Case, ...] = (
    *(Case(family, "capture") for family in FAMILIES),
    *(Case(family, "replay", budget) for family in ("gpt2", "resnet") for budget in ("store-all", 0.7, 0.5)),
    *(Case(family, "replay", 0.6) for family in ("bert", "llama", "vit", "mobilenet")),
    Case("gpt2", "arena", 0.8),
    Case("resnet", "arena", 0.8),
    Case("gpt2", "paging", 0.3),
    Case("gpt2", "paging+copy_stream", 0.3),
    *(Case(family, "dynamic", budget) for family in ("gpt2", "resnet") for budget in ("store-all", 0.7, 0.5)),
    *(Case(family, "dynamic-delta", 0.5) for family in ("gpt2", "resnet")),
    *(Case(family, "cuda-graph", budget) for family in ("gpt2", "resnet") for budget in ("store-all", 0.7, 0.5)),
    # BERT at 0.6, as its replay row: at 0.5 (0.49 of its peak once the allocator's page rounding is kept, min_budget
    # 0.48) auto found no schedule in 10 s or 30 s, on the H200 and here (best peak 1,228,340,224 B for a
    # 1,210,810,880 B live budget)
    Case("gpt2", "meta-plan", 0.5), Case("bert", "meta-plan", 0.6),
    Case("gpt2", "fsdp", 0.5),
    # coop inside torch.compile (issue 41): reserved <= budget; time against eager and the compiler's own budget
    *(Case(family, mode, 0.5) for mode in ("compile", "compile+reduce-overhead") for family in ("gpt2", "resnet")),
    # with eager's random kernels (fallback_random): on a GPU coop's dropout draws native_dropout whole and rejoins its
    # first product (coop.compiled.first_dropout), a path the CPU rows (mask drawn alone) never run
    Case("gpt2", "compile+eager-random", 0.5),
    Case("selftest", "crash", hidden=True),
    Case("selftest", "error", hidden=True),
    Case("selftest", "hang", hidden=True),
)
#: modes whose rows replay a plan and so must match eager bit for bit and stay within the prediction
PLANNED_MODES = ("replay", "arena", "paging", "paging+copy_stream", "cuda-graph", "meta-plan", "fsdp")
#: modes whose CPU rows run gloo collectives: a storage handed to gloo can be freed on its worker thread, which
#: torch's profiler (the CPU meter) does not see, so the CPU measure is only an upper bound and no bar applies there
#: (on CUDA the caching allocator's counters see every thread's frees, and the CUDA bars apply)
GLOO_MODES = ("fsdp",)
#: what each self-test's row must read (its status starts so)
SELFTEST_STATUS = {"crash": "crashed: SIGSEGV", "error": "error: RuntimeError: selftest error", "hang": "timed out"}
#: a compile row whose addmm folds coop undid (coop.compiled.order) may differ from torch.compile's gradients by this
#: much of a gradient's largest element (a few float32 ulps: two roundings where the fold has one); a dropout mask
#: drawn afresh moved every gradient of the quick GPT-2 by 2.1 % to 74 % of its largest element (torch.compile's own
#: step under seed 12 against seed 11, 2026-11-30)
UNFOLDED_GRADIENT_REL = 1e-6
#: the issue's bar: reserved <= 1.03x predicted for these rows on CUDA
RESERVED_BAR = 1.03
RESERVED_BAR_CASES = tuple(f"{family}/replay/{budget}" for family in ("gpt2", "resnet")
                           for budget in ("store-all", 0.7, 0.5))
#: the hang self-test's timeout per isolation: long enough for its child to start and arm faulthandler
HANG_TIMEOUT_S = {"fork": 4, "exec": 20}
CHILD_RUN_NAME = "__bench_cuda_case__"  # the module's __name__ in a forked child (runpy.run_path)


def _resnet(batch: int, image: int, embedding: int = 64, hidden_sizes: tuple[int, ...] = (256, 512, 1024, 2048),
            depths: tuple[int, ...] = (3, 4, 6, 3)) -> tuple:
    """transformers' ResNet (ResNet-50 by default), random weights; the quick size keeps its 4x bottleneck widths."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(num_labels=10, embedding_size=embedding, hidden_sizes=list(hidden_sizes), depths=list(depths))
    model = ResNetForImageClassification(config).train()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return model, (images, torch.randint(0, 10, (batch,), generator=generator)), _classifier_loss


#: family -> (label, builder) at full size (a GPU) and at the quick size (the CPU test: about the smallest sizes
#: at which every budget of the case list is above coop.min_budget and is planned, resnet's online eviction at 0.6
#: included). Full-size min_budget fractions: gpt2 0.27, resnet 0.15, bert 0.34, llama 0.35, vit 0.07, mobilenet
#: 0.28; quick: 0.19, 0.29, 0.28, 0.42, 0.33, 0.30.
MODELS: dict[str, tuple[tuple[str, Callable[[], tuple]], tuple[str, Callable[[], tuple]]]] = {
    "gpt2": (("gpt2-small 12x768 b8 s512",
              lambda: build("gpt2", layers=12, hidden=768, heads=12, vocab=50257, batch=8, seq=512)),
             ("gpt2 2x64 b4 s64", lambda: build("gpt2", layers=2, hidden=64, heads=4, vocab=128, batch=4, seq=64))),
    "bert": (("bert-base 12x768 b8 s256",
              lambda: build("bert", layers=12, hidden=768, heads=12, vocab=30522, batch=8, seq=256)),
             ("bert 2x32 b4 s64", lambda: build("bert", layers=2, hidden=32, heads=4, vocab=64, batch=4, seq=64))),
    "llama": (("llama 16x512 b8 s512",
               lambda: build("llama", layers=16, hidden=512, heads=8, vocab=32000, batch=8, seq=512)),
              ("llama 2x32 b4 s64", lambda: build("llama", layers=2, hidden=32, heads=4, vocab=64, batch=4, seq=64))),
    "resnet": (("resnet50 b32 224px", lambda: _resnet(32, 224)),
               ("resnet 4-16..128 [3,3,3,3] b8 64px",
                lambda: _resnet(8, 64, embedding=4, hidden_sizes=(16, 32, 64, 128), depths=(3, 3, 3, 3)))),
    "vit": (("vit-base 12x768 b32 128px", lambda: build("vit", layers=12, hidden=768, heads=12, batch=32, image=128)),
            ("vit 2x32 b8 64px", lambda: build("vit", layers=2, hidden=32, heads=4, batch=8, image=64))),
    "mobilenet": (("mobilenetv2 x0.25 b64 224px", lambda: build("mobilenet", batch=64, image=224)),
                  ("mobilenetv2 x0.25 b8 64px", lambda: build("mobilenet", batch=8, image=64))),
}


@dataclass(frozen=True)
class Sizes:
    """What differs between the full run (a GPU) and --quick (the CPU test)."""

    time_limit: float  # solver seconds per plan
    steps: int  # timed steps
    warmup: int
    case_timeout: float  # seconds per case (its subprocess)


FULL = Sizes(time_limit=30, steps=20, warmup=3, case_timeout=1800)
QUICK = Sizes(time_limit=2, steps=2, warmup=0, case_timeout=240)  # the two measured steps have warmed it up


def _sizes(quick: bool, time_limit: float | None = None, case_timeout: float | None = None) -> Sizes:
    """The sizes of a run (``--quick`` or full), with the solver's seconds and the case timeout overridden if given."""
    sizes = QUICK if quick else FULL
    return dataclasses.replace(sizes, time_limit=time_limit or sizes.time_limit,
                               case_timeout=case_timeout or sizes.case_timeout)


def select(only: Iterable[str] | None = None, selftest: bool = False) -> list[Case]:
    """The cases to run: all visible ones (and the self-tests with ``selftest``), or those ``only`` names.

    A name matches a case by its full name, its family, its mode or a shell pattern over its name; hidden
    cases are selected by ``only`` too. An unknown name is a ValueError naming the cases.
    """
    if not only:
        return [case for case in CASES if selftest or not case.hidden]
    chosen: list[Case] = []
    for pattern in only:
        matched = [case for case in CASES if pattern in (case.name, case.family, case.mode)
                   or fnmatch.fnmatchcase(case.name, pattern)]
        if not matched:
            raise ValueError(f"no case matches {pattern!r}: choose from {', '.join(case.name for case in CASES)}")
        chosen += [case for case in matched if case not in chosen]
    if selftest:
        chosen += [case for case in CASES if case.hidden and case not in chosen]
    return [case for case in CASES if case in chosen]  # the list's order


# ============================================================================ the parent: one process per case
#: modules a forked child needs, imported once by the fork server (``--isolation fork``); ``torch._inductor`` too:
#: ``torch.use_deterministic_algorithms`` imports it (with dynamo), 1.8-3.6 s in each child otherwise
PRELOAD = ("torch", "torch._inductor", "coop", "coop.zoo", "coop.planner", "coop.graph_capture", "coop.formulations",
           "transformers",
           "transformers.models.gpt2.modeling_gpt2", "transformers.models.bert.modeling_bert",
           "transformers.models.llama.modeling_llama", "transformers.models.resnet.modeling_resnet",
           "transformers.models.vit.modeling_vit", "transformers.models.mobilenet_v2.modeling_mobilenet_v2")


def run_cases(cases: list[Case], device: str, quick: bool, jobs: int = 1, isolation: str | None = None,
              report: Callable[[dict[str, Any]], None] | None = None,
              time_limit: float | None = None, case_timeout: float | None = None,
              save_graphs: Path | None = None) -> list[dict[str, Any]]:
    """One row per case, in order; each case runs in a process of its own, ``jobs`` at a time.

    ``isolation="exec"`` starts each case as ``python bench_cuda.py --case JSON`` (a fresh interpreter: the
    default on CUDA, where no driver state may cross a fork); ``"fork"`` forks it from a fork server that has
    imported torch, coop and transformers once, which saves each case those seconds of imports (the default on
    CPU, and what the test runs). Either way a crash, a hang or an exception kills or ends only that process.
    ``time_limit`` and ``case_timeout`` override the size's solver seconds per plan and seconds per case;
    ``save_graphs``: a folder where each capture case writes its Graph (``FAMILY.json``), so that a machine
    without the device can run the simulators on the device's graph.
    """
    sizes = _sizes(quick, time_limit, case_timeout)
    isolation = isolation or ("exec" if device == "cuda" else "fork")
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))

    def one(case: Case) -> dict[str, Any]:  # in a thread of the pool: waits for the case's process
        started = time.perf_counter()
        skipped = _skip_reason(case, device)
        if skipped:
            row = _blank_row(case, device) | {"status": f"skipped: {skipped}"}
        else:
            timeout = (HANG_TIMEOUT_S[isolation] if case.name == "selftest/hang" else sizes.case_timeout)
            row = _run_isolated(case, device, quick, threads, timeout, isolation, sizes.time_limit,
                                str(save_graphs) if save_graphs else None)
        row["wall_s"] = round(time.perf_counter() - started, 1)
        if report is not None:
            report(row)
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # the longest cases start first (a short tail), the rows come back in the list's order
        futures = {case: pool.submit(one, case) for case in sorted(cases, key=_expected_length)}
        return [futures[case].result() for case in cases]


def _expected_length(case: Case) -> int:
    """A rank for starting order: the hang self-test waits out its timeout, arenas and online eviction run longest."""
    order = ("hang", "arena", "dynamic", "dynamic-delta", "paging", "replay", "capture")
    return order.index(case.mode) if case.mode in order else len(order)


def _skip_reason(case: Case, device: str) -> str:
    """Why a case cannot run here ('' when it can): listed as a row all the same, never silently dropped."""
    if case.mode == "cuda-graph":
        if "cuda_graph" not in inspect.signature(coop.plan).parameters:
            return "not implemented yet"
        if device != "cuda":
            return "CUDA graphs need CUDA"
    if case.mode == "paging+copy_stream" and device != "cuda":
        return "copy_stream needs CUDA"
    return ""


def _run_isolated(case: Case, device: str, quick: bool, threads: int, timeout: float,
                  isolation: str, time_limit: float, save_graphs: str | None = None) -> dict[str, Any]:
    """Run one case in a process of its own; a crash, a timeout or an exception becomes its row."""
    with tempfile.TemporaryDirectory(prefix="bench_cuda_") as name:
        workdir = Path(name)
        spec = {"family": case.family, "mode": case.mode, "budget": case.budget, "device": device, "quick": quick,
                "threads": threads, "workdir": name, "timeout": timeout, "time_limit": time_limit,
                "save_graphs": save_graphs}
        returncode = _run_forked(spec, timeout) if isolation == "fork" else _run_executed(spec, timeout)
        if returncode is None:
            return _blank_row(case, device) | {"status": f"timed out after {timeout:g} s", **_last_reached(workdir)}
        row_file = workdir / "row.json"
        row = json.loads(row_file.read_text()) if row_file.is_file() else None
        if returncode < 0:
            return (row or _blank_row(case, device)) | {"status": f"crashed: {_signal_name(-returncode)}",
                                                        **_last_reached(workdir)}
        if row is None:  # the child ended before it could report (an import error, sys.exit)
            why = _last_line(workdir / "output.txt") or f"exit status {returncode}, no output"
            return _blank_row(case, device) | {"status": f"error: {why.strip()}", **_last_reached(workdir)}
        return row


def _run_executed(spec: dict[str, Any], timeout: float) -> int | None:
    """``python bench_cuda.py --case JSON``: its return code, None when it ran past ``timeout`` (then killed)."""
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")}
    command = [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(spec)]
    with open(Path(spec["workdir"]) / "output.txt", "ab") as output:
        try:
            done = subprocess.run(command, stdout=output, stderr=output, timeout=timeout, env=env, cwd=REPO,
                                  check=False)
            return done.returncode
        except subprocess.TimeoutExpired:  # subprocess.run has killed the child
            return None


def _run_forked(spec: dict[str, Any], timeout: float) -> int | None:
    """The case in a child of the fork server: its exit code (-N for signal N), None after a timeout (killed)."""
    import multiprocessing
    import runpy

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    process = context.Process(target=runpy.run_path, args=(str(Path(__file__).resolve()),),
                              kwargs={"run_name": CHILD_RUN_NAME, "init_globals": {"BENCH_CASE": spec}}, daemon=True)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        return None
    return process.exitcode


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_reached(workdir: Path) -> dict[str, str | None]:
    """The last phase the child wrote and the innermost frame of its faulthandler dump ('file:line function')."""
    progress = workdir / "progress.txt"
    phases = progress.read_text().splitlines() if progress.is_file() else []
    dump = workdir / "faulthandler.txt"
    return {"last_phase": phases[-1] if phases else None,
            "last_frame": last_frame(dump.read_text(errors="replace")) if dump.is_file() else None}


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>\S+)')


def last_frame(dump: str) -> str | None:
    """The innermost frame of a faulthandler dump: of the crashing thread ('Current thread'), else of the last
    thread listed (the main thread, in a dump_traceback_later of all threads)."""
    blocks: list[tuple[bool, list[str]]] = []
    for line in dump.splitlines():
        if "(most recent call first)" in line:
            blocks.append((line.lstrip().startswith("Current thread"), []))
        elif blocks and (match := _FRAME.match(line)):
            blocks[-1][1].append(f"{_relative(match['file'])}:{match['line']} {match['function']}")
    current = [frames for is_current, frames in blocks if is_current and frames]
    chosen = current[-1] if current else next((frames for _, frames in reversed(blocks) if frames), None)
    return chosen[0] if chosen else None


def _relative(file: str) -> str:
    try:
        return str(Path(file).resolve().relative_to(REPO))
    except (ValueError, OSError):
        return file


def _blank_row(case: Case, device: str) -> dict[str, Any]:
    """Every column, in the table's order; a case fills what it measures."""
    return {"case": case.name, "device": device, "family": case.family, "mode": case.mode,
            "budget": case.budget, "status": "", "model": None, "formulation": None, "predicted": None,
            "allocated": None, "reserved": None, "allocated_no_scratch": None, "host": None,
            "allocated_vs_predicted": None, "reserved_vs_predicted": None, "no_scratch_vs_predicted": None,
            "step_ms": None, "eager_ms": None, "vs_eager": None, "predicted_overhead_pct": None,
            "measured_overhead_pct": None, "first_step_ms": None, "static_same_ms": None,
            "later_vs_static": None, "grads_equal": None, "nodes": None,
            "capture_s": None, "plan_s": None, "pages": None, "recomputations": None, "note": None,
            "last_phase": None, "last_frame": None, "budget_bytes": None, "reserved_vs_budget": None,
            "allocator": None}


# ============================================================================ the verdict
def acceptance_failures(rows: list[dict[str, Any]]) -> list[str]:
    """The acceptance bars a run misses (empty: it passes).

    No case crashed, errored or timed out; every planned and dynamic row bit-identical to eager; on CUDA
    reserved <= 1.03x predicted for GPT-2 and ResNet at store-all, 0.7 and 0.5; on CPU, for every replay,
    paging and dynamic row (not the gloo rows, :data:`GLOO_MODES`), allocated without the ops' scratch <= predicted (coop predicts no CPU workspace;
    a dynamic plan's prediction is its budget), and for an arena row everything allocated <= its footprint
    (which counts the scratch); a paging row pages; a self-test row reads as its machinery promises.
    """
    failures = []
    for row in rows:
        name, status = row["case"], row["status"]
        if row["family"] == "selftest":
            if not status.startswith(SELFTEST_STATUS[row["mode"]]):
                failures.append(f"{name}: expected '{SELFTEST_STATUS[row['mode']]}...', got '{status}'")
            continue
        if status != "ok":
            if not status.startswith("skipped"):
                failures.append(f"{name}: {status}")
            continue
        if (row["mode"] in PLANNED_MODES or row["mode"].startswith("dynamic")) and row["grads_equal"] is not True:
            failures.append(f"{name}: gradients differ from eager ({row['note'] or 'grads_equal false'})")
        reserved = row["reserved_vs_predicted"] or 0
        if row["device"] == "cuda" and name in RESERVED_BAR_CASES and reserved > RESERVED_BAR:
            failures.append(f"{name}: reserved {row['reserved_vs_predicted']}x the prediction > {RESERVED_BAR}")
        if row["device"] == "cuda" and (row["reserved_vs_budget"] or 0) > 1:  # contract 3: the budget bounds the process
            failures.append(f"{name}: reserved {row['reserved_vs_budget']}x the budget > 1")
        if row["device"] == "cpu" and row["mode"] in GLOO_MODES:
            pass  # the profiler cannot see what gloo's worker threads free: the CPU measure is an upper bound
        elif row["device"] == "cpu" and (row["mode"] in PLANNED_MODES or row["mode"].startswith("dynamic")):
            key = "allocated_vs_predicted" if row["mode"] == "arena" else "no_scratch_vs_predicted"
            if (row[key] or 0) > 1:
                failures.append(f"{name}: {key} {row[key]} > 1")
        if row["mode"].startswith("compile") and row["grads_equal"] is not True and not (
                row.get("folds_undone") and (row.get("grads_max_rel") or 1.0) <= UNFOLDED_GRADIENT_REL):
            failures.append(f"{name}: gradients differ from torch.compile's own partitioner (by "
                            f"{row.get('grads_max_rel')} of a gradient's largest element; "
                            f"{row.get('folds_undone')} addmm folds undone)")
        if row["mode"].startswith("compile") and row.get("graphs", 1) != 1:
            failures.append(f"{name}: {row['graphs']} compiled graphs (a graph break): the budget is each graph's")
        if row["mode"].startswith("compile") and row["device"] == "cpu" and (row["allocated"] or 0) > row["budget_bytes"]:
            failures.append(f"{name}: allocated {row['allocated']} > the budget {row['budget_bytes']}")
        if row["mode"].startswith("paging") and not row["pages"]:
            failures.append(f"{name}: the plan pages nothing (lower the case's budget)")
    return failures


# ============================================================================ the table
TABLE = (("case", 28), ("status", 16), ("predicted", 9), ("allocated", 9), ("reserved", 9), ("alloc/pred", 10),
         ("res/pred", 8), ("res/budget", 10), ("mod/res", 7), ("noscr/pred", 10), ("step_ms", 8), ("eager_ms", 8), ("vs_eager", 8),
         ("pred_ovh%", 9), ("meas_ovh%", 9), ("grads_equal", 11), ("nodes", 5), ("capture_s", 9))
KEYS = {"alloc/pred": "allocated_vs_predicted", "res/pred": "reserved_vs_predicted", "res/budget": "reserved_vs_budget",
        "mod/res": "modelled_vs_reserved",
        "noscr/pred": "no_scratch_vs_predicted", "pred_ovh%": "predicted_overhead_pct",
        "meas_ovh%": "measured_overhead_pct"}


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per row (bytes in MiB or GiB); under it, indented, what the status column shortens (an error's or
    a skip's reason), a failed case's last phase and frame, and an ok row's note."""
    lines = ["  ".join(title.ljust(width) for title, width in TABLE)]
    for row in rows:
        cells = [_cell(title, row.get(KEYS.get(title, title))) for title, _ in TABLE]
        lines.append("  ".join(cell.ljust(width) for cell, (_, width) in zip(cells, TABLE, strict=True)).rstrip())
        extra = [row["status"]] if row["status"].startswith(("error", "skipped")) else []
        extra += [f"{key}: {row[key]}" for key in ("last_phase", "last_frame") if row.get(key)]
        if row.get("note") and row["status"] == "ok":
            extra.append(str(row["note"]))
        if extra:
            lines.append("    " + "; ".join(extra))
    return "\n".join(lines)


def _cell(title: str, value: Any) -> str:
    if title == "status" and value.startswith(("error", "skipped")):
        return value.split(":")[0]  # the reason goes on the line under the row
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if title in ("predicted", "allocated", "reserved"):
        return f"{value / 2**20:.2f}M" if value < 2**30 else f"{value / 2**30:.2f}G"
    if isinstance(value, float):
        return f"{value:.3g}" if title != "capture_s" else f"{value:.1f}"
    return str(value)


# ============================================================================ the child: one case
class Progress:
    """The child's phases, one line each in ``progress.txt``, written through (a crash loses none)."""

    def __init__(self, workdir: Path) -> None:
        self.fd = os.open(workdir / "progress.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.started = time.perf_counter()

    def __call__(self, phase: str) -> None:
        os.write(self.fd, f"{phase} (at {time.perf_counter() - self.started:.1f} s)\n".encode())


def child_main(spec: dict[str, Any]) -> int:
    """Run one case (``--case JSON``, or a forked child) and write its row to ``row.json`` in its work folder."""
    workdir = Path(spec["workdir"])
    output = os.open(workdir / "output.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(output, 1)  # the libraries' chatter, and a traceback, go to the case's own file
    os.dup2(output, 2)
    dump = open(workdir / "faulthandler.txt", "w")  # noqa: SIM115 - open until the process ends
    faulthandler.enable(file=dump)
    faulthandler.dump_traceback_later(max(1.0, spec["timeout"] - 2), exit=False, file=dump)  # before a kill
    progress = Progress(workdir)
    case = Case(spec["family"], spec["mode"], spec["budget"])
    row = _blank_row(case, spec["device"])
    progress("start")
    try:
        run_case(case, spec, row, progress)
        row["status"] = "ok"
    except Refused as exc:
        row["status"] = f"skipped: coop refuses it: {str(exc).split(':')[0]}"
    except TooSmall as exc:
        row["status"] = f"skipped: {str(exc).splitlines()[0]}"
    except Exception as exc:  # noqa: BLE001 - any failure is the case's row, not the run's end
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        row["status"] = f"error: {text}"
        row["last_phase"] = _last_line(workdir / "progress.txt")
        row["last_frame"] = _raising_frames(exc)
        traceback.print_exc()  # the whole traceback, in the case's output file
    faulthandler.cancel_dump_traceback_later()
    (workdir / "row.json").write_text(json.dumps(row))
    return 0


class Refused(Exception):
    """coop.plan refuses the case by design (a plain CoopError, e.g. arena=True off CPU): a skipped row."""


class TooSmall(Exception):
    """The case cannot run at the ``--quick`` sizes (it must at full size): a skipped row saying why."""


def _raising_frames(exc: BaseException) -> str:
    """Where ``exc`` was raised: the innermost frame in coop (where it differs, the innermost frame too)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}coop{os.sep}" in f.filename]
    shown = [f for f in (ours[-1] if ours else None, frames[-1] if frames else None) if f is not None]
    return " <- ".join(dict.fromkeys(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(shown)))


def _last_line(path: Path) -> str | None:
    lines = path.read_text().splitlines() if path.is_file() else []
    return lines[-1] if lines else None


def _crash() -> None:
    """The crash self-test: SIGSEGV, as a bad kernel would raise it (faulthandler dumps this frame)."""
    os.kill(os.getpid(), signal.SIGSEGV)


def run_case(case: Case, spec: dict[str, Any], row: dict[str, Any], progress: Callable[[str], None]) -> None:
    """Fill ``row`` with the case's measurements (the child's work; exceptions propagate to :func:`child_main`)."""
    if case.family == "selftest":
        progress(f"selftest: about to {case.mode}")
        if case.mode == "crash":
            _crash()
        if case.mode == "error":
            raise RuntimeError("selftest error\nsecond line not reported")
        if case.mode == "hang":
            time.sleep(3600)
        return
    device = torch.device(spec["device"])
    sizes = _sizes(spec["quick"], spec.get("time_limit"))
    torch.set_num_threads(int(spec["threads"]))
    torch.use_deterministic_algorithms(True)
    label, make = MODELS[case.family][1 if spec["quick"] else 0]
    row["model"] = label
    if case.mode == "fsdp":
        _fsdp_plan(row, case, make, device, sizes, progress)
        return
    progress("build model")
    model, batch, loss_fn = make()
    model = model.to(device)
    batch = tuple(t.to(device) for t in batch)
    if case.mode.startswith("compile"):
        _compile_case(row, case, model, batch, loss_fn, device, sizes, progress, quick=spec["quick"])
        return
    profile = device.type == "cuda" or case.mode == "capture"
    progress("capture" + (" with profile" if profile else ""))
    started = time.perf_counter()
    captured = coop.capture(model, batch, loss_fn=loss_fn, profile=profile)
    row["capture_s"] = round(time.perf_counter() - started, 2)
    if spec.get("save_graphs") and case.mode == "capture":
        folder = Path(spec["save_graphs"])
        folder.mkdir(parents=True, exist_ok=True)  # each case makes it: cases run in processes of their own
        captured.graph.save(folder / f"{case.family}.json")
    graph = captured.graph
    row["nodes"] = len(graph.nodes)
    caller_owned = graph.caller_owned_bytes
    meter = CudaMeter() if device.type == "cuda" else CpuMeter()

    if case.mode == "capture":  # eager PyTorch's own step against the captured baseline peak
        eager_step = _step_of(model, lambda: _loss(model, batch, loss_fn))
        progress("eager steps (measured)")
        _measure(row, meter, eager_step, eager_step, caller_owned, coop.baseline_peak(graph))
        progress("eager steps (timed)")
        row["eager_ms"] = round(_median_ms(eager_step, device, sizes), 3)
        return

    if case.mode == "meta-plan":
        _meta_plan(row, case, MODELS[case.family][1 if spec["quick"] else 0][1], model, batch, loss_fn, device, sizes,
                   meter, caller_owned, progress)
        return

    options: dict[str, Any] = {}
    formulation = "store-all" if case.budget == "store-all" else "auto"
    if case.mode == "arena":
        options["arena"] = True
    elif case.mode.startswith("paging"):
        formulation, options["device_profile"] = "poet", DEVICE_PROFILE
        options["copy_stream"] = case.mode == "paging+copy_stream"
    elif case.mode.startswith("dynamic"):
        formulation = "dynamic"
        if case.mode == "dynamic-delta":
            options["policy"], options["device_profile"] = "delta", DEVICE_PROFILE
    elif case.mode == "cuda-graph":
        options["cuda_graph"] = True
    # above the peak a budget is given in bytes (a fraction is at most 1.0 of the peak)
    budget: float | int = (math.ceil(STORE_ALL_BUDGET * coop.baseline_peak(graph)) if case.budget == "store-all"
                           else case.budget)
    if case.mode.startswith("paging"):  # close to the proven minimum, which the device's workspaces raise on CUDA
        budget = max(int(case.budget * coop.baseline_peak(graph)), int(PAGING_OVER_MIN * coop.min_budget(graph)))
    row["budget_bytes"] = int(budget * coop.baseline_peak(graph)) if isinstance(budget, float) else budget
    progress(f"plan ({formulation}, budget {budget})")
    started = time.perf_counter()
    try:
        limit = max(sizes.time_limit, PAGING_MIN_TIME_LIMIT) if case.mode.startswith("paging") else sizes.time_limit
        plan = coop.plan(model, budget, batch, loss_fn=loss_fn, captured=captured, formulation=formulation,
                         time_limit=limit, **options)
    except coop.CoopError as exc:
        if case.mode == "arena" and device.type != "cpu" and type(exc) is coop.CoopError:
            raise Refused(str(exc)) from exc  # by design: coop replays arenas on CPU only (coop.plan's docstring)
        raise
    row["plan_s"] = round(time.perf_counter() - started, 2)
    summary = plan.summary()
    row["formulation"] = plan.formulation
    row["note"] = summary.get("note") or None
    schedule = getattr(plan, "schedule", None)
    if schedule is not None:
        row["pages"] = sum(1 for step in schedule.steps if step.op == "page_out")
        row["recomputations"] = summary.get("recomputations")
    if case.mode == "arena" and summary.get("arena_footprint"):
        predicted = summary["arena_footprint"]
    elif case.mode == "arena" and summary.get("arena_peak"):
        predicted = max(summary["arena_peak"], plan.predicted_peak)
    else:
        predicted = plan.predicted_peak if plan.predicted_peak is not None else plan.budget

    if case.mode.startswith("dynamic"):  # the online step decides and records; later steps replay the record
        progress("dynamic first step (online, timed)")
        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        synchronize()
        started = time.perf_counter()
        try:
            plan.step(*batch)
        except coop.InfeasibleError as exc:
            if spec["quick"]:  # the tiny --quick models fragment more: a skipped row there, an error at full size
                raise TooSmall(f"online eviction cannot run within this budget at the --quick size ({exc})") from exc
            raise
        synchronize()
        row["first_step_ms"] = round(1000 * (time.perf_counter() - started), 3)
        model.zero_grad(set_to_none=True)
    plan_step = _step_of(model, lambda: plan.step(*batch), progress, "replay step")
    meter.record = bool(spec.get("save_graphs")) and schedule is not None
    measured = _measure(row, meter, plan_step, plan_step, caller_owned, predicted)
    _modelled(row, plan)
    if meter.record:
        _save_record(Path(spec["save_graphs"]), case, row, plan.graph, schedule, plan.budget, measured.get("record"))
    progress("replay and eager steps, alternating (timed)")
    _time_against_eager(row, plan, batch, sizes)
    eager = copy.deepcopy(model)
    recorded = getattr(plan, "recorded", None)
    if case.mode.startswith("dynamic") and recorded is not None:  # the bar: later steps within 1.1x of that static replay
        progress("static replay of the recorded schedule (timed)")
        static = coop.Plan(model, captured, recorded.schedule, plan.budget, "recorded",
                           loss_fn=loss_fn)
        row["static_same_ms"] = round(_median_ms(_step_of(model, lambda: static.step(*batch)), device, sizes), 3)
        row["later_vs_static"] = round(row["step_ms"] / row["static_same_ms"], 3)
    row["grads_equal"], difference = _equal_to_eager(plan, model, eager, batch, loss_fn, progress)
    if difference:
        row["note"] = f"{difference}; {row['note']}" if row["note"] else difference
    if case.mode == "cuda-graph":  # captured, or fell back (the probe of saved generator states, a refused op)
        status = f"cuda_graph: {plan.summary()['cuda_graph']}"
        row["note"] = f"{status}; {row['note']}" if row["note"] else status


def _meta_plan(row: dict[str, Any], case: Case, make: Callable[[], tuple], model: torch.nn.Module, batch: tuple,
               loss_fn: Callable | None,
               device: torch.device, sizes: Any, meter: Any, caller_owned: int,
               progress: Callable[[str], None]) -> None:
    """A plan made without weights for ``device``, loaded on the real model (issue 27): same graph, same training."""
    with torch.device("meta"):  # built there: model.to("meta") would untie tied weights (new Parameters)
        weightless, meta_batch, _ = make()
    progress("plan on the meta device")
    started = time.perf_counter()
    plan = coop.plan(weightless, case.budget, meta_batch, loss_fn=loss_fn, device=str(device),
                     time_limit=sizes.time_limit)
    row["plan_s"] = round(time.perf_counter() - started, 2)
    row["nodes"] = len(plan.captured.graph.nodes)
    row["formulation"] = plan.formulation
    row["budget_bytes"] = plan.budget
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "plan.json"
        plan.save(path)
        progress("load the plan on the real model")
        loaded = coop.load_plan(path, model, loss_fn=loss_fn)  # raises where the real capture differs
    predicted = loaded.predicted_peak if loaded.predicted_peak is not None else loaded.budget
    plan_step = _step_of(model, lambda: loaded.step(*batch), progress, "replay step")
    _measure(row, meter, plan_step, plan_step, caller_owned, predicted)
    eager = copy.deepcopy(model)
    row["grads_equal"], difference = _equal_to_eager(loaded, model, eager, batch, loss_fn, progress)
    row["note"] = difference or None


def _compile_case(row: dict[str, Any], case: Case, model: torch.nn.Module, batch: tuple, loss_fn: Callable | None,
                  device: torch.device, sizes: Sizes, progress: Callable[[str], None], quick: bool = False) -> None:
    """``coop.compile`` at the case's share of the compiled step's peak: reserved (allocated on CPU) against its
    budget, gradients against ``torch.compile``'s own partitioner (same seed), and the step's time against eager and
    against ``torch.compile`` with ``activation_memory_budget`` at the same share."""
    kwargs: dict[str, Any] = {"mode": "reduce-overhead"} if case.mode.endswith("reduce-overhead") else {}
    if case.mode.endswith("eager-random"):
        kwargs["options"] = {"fallback_random": True}
    module = LossStep(model, loss_fn)
    eager, reference, own = (copy.deepcopy(module) for _ in range(3))
    progress("coop.compile")
    started = time.perf_counter()
    try:
        compiled = coop.compile(module, case.budget, time_limit=max(sizes.time_limit, 20), example_batch=batch,
                                **kwargs)
    except coop.OverBudgetError as exc:
        if quick and exc.floor is not None:
            # the re-solve below the excess reached the floor of the Graph with what was measured charged (the quick
            # ResNet on CPU at 0.5: oneDNN's convolution scratch, 2026-11-30): a skipped row there, a failure at full size
            raise TooSmall(f"coop.compile held at least {exc.held:,} B against {exc.budget:,} B at the --quick size, "
                           f"and its re-solve below the excess reached the floor of the graph with the measured "
                           f"scratch charged ({exc.floor:,} B)") from exc
        # every measured round held more than the budget: the row measures the step that held least, and fails
        compiled = exc.compiled
        row["refused"] = str(exc)[:200]
    except coop.NeedsCudaError as exc:  # coop.compile refuses mode="reduce-overhead" on a CPU model, by design
        raise Refused("reduce-overhead is CUDA graphs, which need CUDA") from exc
    plan = compiled.coop_record.plans[-1]
    row["graphs"] = len(compiled.coop_record.plans)  # one: the budget is the whole step's (with breaks, each graph's)
    row["budget_bytes"] = plan.requested
    row["nodes"] = len(plan.joint.graph.nodes)
    owned = plan.joint.graph.caller_owned_bytes
    meter = CudaMeter() if device.type == "cuda" else CpuMeter()
    coop_step = _step_of(module, lambda: compiled(*batch).backward(), progress, "coop.compile step")
    _measure(row, meter, coop_step, coop_step, owned, plan.peak)
    row["capture_s"] = round(time.perf_counter() - started, 2)
    row["step_ms"] = round(_median_ms(coop_step, device, sizes), 3)
    row["eager_ms"] = round(_median_ms(_step_of(eager, lambda: eager(*batch).backward()), device, sizes), 3)
    row["vs_eager"] = round(row["step_ms"] / row["eager_ms"], 3)
    progress("torch.compile with activation_memory_budget")
    own_compiled = torch.compile(own, **kwargs)
    with torch._functorch.config.patch(activation_memory_budget=float(case.budget)):
        own_step = _step_of(own, lambda: own_compiled(*batch).backward())
        own_step()
    row["amb_ms"] = round(_median_ms(own_step, device, sizes), 3)
    progress("gradients against torch.compile")
    # the reference with the two inductor options coop.compile sets (coop.compiled.api): with inductor's defaults its
    # kernels group and sum differently and the gradients differ in the last bits whatever the partition (all four CPU
    # compile rows of 2026-11-30); what may differ is the partition alone
    reference_kwargs = dict(kwargs)
    reference_options = inductor_options(reference_kwargs)  # takes the mode out as the options it stands for
    # the layout the kept round ran with (coop.compile's measured rounds start with inductor's channels-last one)
    reference_options["layout_optimization"] = compiled.coop_record.layout_optimization
    reference_compiled = torch.compile(reference, options=reference_options, **reference_kwargs)
    grads = []
    for stepper, params in ((compiled, module), (reference_compiled, reference)):
        params.zero_grad(set_to_none=True)
        torch.manual_seed(11)
        stepper(*batch).backward()
        grads.append([p.grad for p in params.parameters()])
    row["grads_equal"] = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                             for a, b in zip(*grads, strict=True))
    # where coop's post-grad pass undid inductor's addmm fold (coop.compiled.order: the tied weight's two products
    # of GPT-2), the product and the sum run as two kernels instead of one BLAS call accumulating into the addend,
    # and that weight's gradient rounds differently (GPT-2 quick: 8.8e-8 of its largest element, 2026-11-30)
    row["folds_undone"] = sum(compiled.coop_record.order.undone) if compiled.coop_record.order is not None else 0
    row["grads_max_rel"] = max((float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)))
                               for a, b in zip(*grads, strict=True) if a is not None and b is not None)
    row["note"] = compiled.coop_record.summary().splitlines()[0][:200]


def _fsdp_plan(row: dict[str, Any], case: Case, make: Callable[[], tuple], device: torch.device, sizes: Any,
               progress: Callable[[str], None]) -> None:
    """A plan of the model sharded by FSDP2 on one rank (issue 27): it trains like FSDP eager within its budget."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    def sharded() -> tuple:
        torch.manual_seed(0)
        model, batch, loss_fn = make()
        model = model.to(device)
        layers = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1)
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        return model, tuple(t.to(device) for t in batch), loss_fn

    with socket_port() as port:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=0, world_size=1, **({"device_id": torch.device("cuda", torch.cuda.current_device())}
                                                         if device.type == "cuda" else {}))
    try:
        progress("build and shard model")
        model, batch, loss_fn = sharded()
        eager, _, _ = sharded()
        progress("capture (sharded)")
        started = time.perf_counter()
        captured = coop.capture(model, batch, loss_fn=loss_fn)
        row["capture_s"] = round(time.perf_counter() - started, 2)
        graph = captured.graph
        row["nodes"] = len(graph.nodes)
        row["budget_bytes"] = int(case.budget * coop.baseline_peak(graph))
        progress(f"plan (auto, budget {case.budget})")
        started = time.perf_counter()
        plan = coop.plan(model, case.budget, batch, loss_fn=loss_fn, captured=captured, time_limit=sizes.time_limit)
        row["plan_s"] = round(time.perf_counter() - started, 2)
        row["formulation"] = plan.formulation
        row["recomputations"] = plan.summary().get("recomputations")
        meter = CudaMeter() if device.type == "cuda" else CpuMeter()
        plan_step = _step_of(model, lambda: plan.step(*batch), progress, "replay step")
        _measure(row, meter, plan_step, plan_step, graph.caller_owned_bytes, plan.predicted_peak)
        progress("replay steps (timed)")
        row["step_ms"] = round(_median_ms(plan_step, device, sizes), 3)
        eager_step = _step_of(eager, lambda: _loss(eager, batch, loss_fn))
        row["eager_ms"] = round(_median_ms(eager_step, device, sizes), 3)
        row["vs_eager"] = round(row["step_ms"] / row["eager_ms"], 3)
        row["grads_equal"], difference = _equal_to_eager(plan, model, eager, batch, loss_fn, progress)
        unseen = ("CPU: allocated is an upper bound (gloo's worker threads free buffers the profiler does not see); "
                  if device.type == "cpu" else "")
        row["note"] = difference or unseen + plan.note or None
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """A free TCP port on the loopback interface (closed again before the caller binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


def _loss(model: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> torch.Tensor:
    """Eager PyTorch's step: forward, ``backward()``; the loss, detached."""
    out = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    loss.backward()
    return loss.detach()


def _step_of(model: torch.nn.Module, step: Callable[[], Any], progress: Callable[[str], None] | None = None,
             phase: str = "") -> Callable[[], None]:
    """One training step that keeps nothing: the loss dropped, the gradients freed after it."""
    count = 0

    def run() -> None:
        nonlocal count
        count += 1
        if progress is not None and count <= 2:  # the measured steps; later ones are timing
            progress(f"{phase} {count}")
        step()
        model.zero_grad(set_to_none=True)

    return run


def _measure(row: dict[str, Any], meter: Any, first: Callable[[], None], warm: Callable[[], None], caller_owned: int,
             predicted: int) -> dict[str, Any]:
    measured = meter.measure(first, warm)
    row["predicted"] = int(predicted)
    for key in ("allocated", "reserved", "allocated_no_scratch"):
        if key in measured:
            row[key] = measured[key] + caller_owned
    row["host"] = measured.get("host")
    row["allocator"] = measured.get("allocator")
    row["allocated_vs_predicted"] = round(row["allocated"] / predicted, 4)
    if row["reserved"] is not None:
        row["reserved_vs_predicted"] = round(row["reserved"] / predicted, 4)
        if row.get("budget_bytes"):
            row["reserved_vs_budget"] = round(row["reserved"] / row["budget_bytes"], 4)
    if row["allocated_no_scratch"] is not None:
        row["no_scratch_vs_predicted"] = round(row["allocated_no_scratch"] / predicted, 4)
    return measured


def _modelled(row: dict[str, Any], plan: Any) -> None:
    """``modelled``: what the CUDA allocator's CPU model predicts the plan's step reserves with the caller-owned
    bytes (:func:`coop.planner.measure.modelled_ordinary_step`, the number ``coop.plan``'s rounds act on before a
    step runs), and ``mod/res``, its ratio to ``reserved`` (issue 43's bar: within 2 %); absent off CUDA and for a
    plan without a static schedule."""
    from coop.planner.measure import modelled_ordinary_step

    if getattr(plan, "schedule", None) is None or getattr(plan, "allocator", None) is None:
        return
    modelled = modelled_ordinary_step(plan, plan.allocator)
    if modelled is None:
        return
    row["modelled"] = int(modelled)
    if row.get("reserved"):
        row["modelled_vs_reserved"] = round(modelled / row["reserved"], 4)


def _save_record(folder: Path, case: Case, row: dict[str, Any], graph: Any, schedule: Any, budget: int,
                 allocator: dict[str, Any] | None) -> None:
    """``folder/records/CASE.json``: the Graph and schedule a planned row replayed, its bytes, and the allocator's
    own record of the warm step (:meth:`CudaMeter.measure`, :meth:`CpuMeter.measure`), so that a machine without
    the device can replay the schedule through coop's allocator model and compare it with what the device did
    (issue 43)."""
    from coop.schedule_files import schedule_to_json

    records = folder / "records"
    records.mkdir(parents=True, exist_ok=True)  # each case makes it: cases run in processes of their own
    document = {"case": case.name, "device": row["device"], "predicted": row["predicted"],
                "allocated": row["allocated"], "reserved": row["reserved"],
                "caller_owned": graph.caller_owned_bytes,
                "graph": json.loads(graph.to_json()),
                "schedule": schedule_to_json(graph, schedule, budget=int(budget), formulation=row["formulation"]),
                "allocator": allocator}
    (records / (case.name.replace("/", "_") + ".json")).write_text(json.dumps(document) + "\n")


#: The caching allocator's counters a CUDA row keeps in ``allocator`` (JSON only), to tell where reserved bytes
#: above the live ones go: ``inactive_split_bytes`` (free pieces of split blocks: fragmentation), the segments,
#: the retries (a cudaMalloc failed and the cache was flushed), and the largest active bytes (live blocks,
#: counted until the allocator takes them back: a block under ``record_stream`` stays active until its stream's
#: work is done).
ALLOCATOR_STATS = ("active_bytes.all.peak", "allocated_bytes.all.peak", "reserved_bytes.all.peak",
                   "inactive_split_bytes.all.peak", "segment.all.peak", "num_alloc_retries", "num_device_alloc")


class CudaMeter:
    """The caching allocator's own counters (see the module docstring: allocated, reserved, and ``allocator``:
    :data:`ALLOCATOR_STATS` of the warm step, from ``torch.cuda.memory_stats``)."""

    #: with ``record`` set, the warm step runs under the allocator's history (``_record_memory_history``) and the
    #: result has ``record``: its trace and segments (:func:`_cuda_record`)
    record = False

    def measure(self, first: Callable[[], None], warm: Callable[[], None]) -> dict[str, Any]:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        first()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        # the record is the row's extra: where the allocator's history fails (never run on a GPU yet), the row keeps
        # its counters and names the failure in the record
        record: dict[str, Any] | None = None
        recording = False
        if self.record:
            try:
                torch.cuda.memory._record_memory_history(max_entries=RECORD_MAX_ENTRIES)
                recording = True
            except Exception as exc:  # noqa: BLE001 - any failure of a private API becomes the record's note
                record = {"kind": "cuda", "error": f"{type(exc).__name__}: {exc}"}
        try:
            warm()
            torch.cuda.synchronize()
            if recording:
                try:
                    record = _cuda_record(torch.cuda.memory._snapshot(), torch.cuda.current_device())
                except Exception as exc:  # noqa: BLE001
                    record = {"kind": "cuda", "error": f"{type(exc).__name__}: {exc}"}
        finally:
            if recording:
                torch.cuda.memory._record_memory_history(enabled=None)
        stats = torch.cuda.memory_stats()
        return {"allocated": torch.cuda.max_memory_allocated() - before,
                "reserved": torch.cuda.max_memory_reserved() - before,
                "allocator": {key: stats.get(key) for key in ALLOCATOR_STATS}, "record": record}


#: the allocator history kept per recorded step (a full-size GPT-2 replay makes a few thousand events)
RECORD_MAX_ENTRIES = 200_000
#: the trace actions a record keeps (``torch.cuda.memory._snapshot()["device_traces"]``)
RECORD_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                  "segment_unmap", "oom")


def _cuda_record(snapshot: dict[str, Any], device: int) -> dict[str, Any]:
    """The parts of ``torch.cuda.memory._snapshot()`` an allocator model is tested on, without stack frames:
    each trace event of ``device`` (an index) as ``[action, size, stream]``, in order, and each of its segments at
    the end with its blocks as ``[size, requested_size, state]``."""
    traces = snapshot.get("device_traces") or []
    trace = [[event["action"], int(event["size"]), int(event.get("stream", 0))]
             for event in (traces[device] if device < len(traces) else []) if event["action"] in RECORD_ACTIONS]
    segments = [{"stream": int(segment.get("stream", 0)), "total_size": int(segment["total_size"]),
                 "is_expandable": bool(segment.get("is_expandable", False)),
                 "segment_type": segment.get("segment_type"), "segment_pool_id": str(segment.get("segment_pool_id")),
                 "blocks": [[int(block["size"]), int(block.get("requested_size", block["size"])), block["state"]]
                            for block in segment["blocks"]]}
                for segment in snapshot.get("segments", []) if segment.get("device", device) == device]
    return {"kind": "cuda", "trace": trace, "segments": segments}


class CpuMeter:
    """Peak CPU bytes by torch's profiler (independent of coop's MemoryMeter), the host tier counted apart.

    The profiler reports every allocation and free of the CPU allocator (address, signed size), nested in
    the ops and Python frames that made them. An allocation made under a coop function that enters
    ``coop.runtime.meter.host_pool()`` (the host tier of paging and saved generator states; found by reading
    coop's source, so a new one is found too) is host memory: on CPU the "device" and the host tier are one
    memory, and the simulator counts only the device. An allocation that an aten op makes and frees before it
    returns is that op's scratch (a CPU convolution's buffers): real memory, counted in ``allocated``, but
    a capture measures workspaces only with ``profile=True`` (which this command uses on CUDA), so
    ``allocated_no_scratch`` leaves it out, the quantity an unprofiled CPU capture predicts. Frees of blocks allocated before the profile are unknown to it and ignored (the count
    can only be high).
    """

    MARK = "bench_cuda: warm step"
    #: with ``record`` set, the result has ``record``: the warm step's allocations and frees in the device tier, in
    #: order, as ``["alloc" | "free", bytes, scratch]`` (the CPU allocator's own events; no segments on CPU), and
    #: ``held_before``, the bytes allocated in the profile and still held when the first of them came
    record = False

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.host_functions = host_tier_functions()
        self._host_by_name: dict[str, bool] = {}
        # the kinds of events in the profiler's own tree (as torch.profiler._memory_profiler reads it)
        self.kinds = SimpleNamespace(**{kind: getattr(torch._C._profiler, f"_ExtraFields_{kind}")
                                        for kind in ("Allocation", "TorchOp", "PyCall", "PyCCall")})

    def measure(self, first: Callable[[], None], warm: Callable[[], None]) -> dict[str, Any]:
        from torch.profiler import ProfilerActivity, profile, record_function

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
            first()
            with record_function(self.MARK):
                warm()
        window = [0, -1]  # the warm step's start and end (the marker's own children are not nested reliably)
        allocations = []
        for event in _events(prof.profiler.kineto_results):
            if isinstance(event.extra_fields, self.kinds.Allocation):
                allocations.append(self._allocation(event))
            elif isinstance(event.extra_fields, self.kinds.TorchOp) and _event_name(event) == self.MARK:
                window[:] = [event.start_time_ns, event.end_time_ns]
        allocations.sort(key=lambda item: item[0])
        # first pass: which allocations are scratch (freed before the aten op that made them returns)
        opened: dict[int, tuple[int, int | None]] = {}  # address -> (index of its allocation, its op's end)
        scratch: set[int] = set()
        for index, (when, address, size, _, op_end) in enumerate(allocations):
            if size > 0:
                opened[address] = (index, op_end)
            elif address in opened:
                allocated_at, end = opened.pop(address)
                if end is not None and when <= end:
                    scratch.update((allocated_at, index))
        live: dict[int, tuple[int, bool, bool]] = {}  # address -> (bytes, host, scratch)
        device = outputs = host_bytes = peak = peak_outputs = host_peak = 0
        trace: list[list[Any]] = []
        held_before = 0  # what the step's own allocations held when the warm step's first event came
        for index, (when, address, size, under_host, _) in enumerate(allocations):
            if size > 0:
                live[address] = (size, under_host, index in scratch)
                is_scratch = index in scratch
            elif address in live:
                size, under_host, is_scratch = live.pop(address)
                size = -size
            else:
                continue  # allocated before the profile started
            if under_host:
                host_bytes += size
                host_peak = max(host_peak, host_bytes)
                continue
            device += size
            outputs += 0 if is_scratch else size
            if window[0] <= when <= window[1]:
                peak, peak_outputs = max(peak, device), max(peak_outputs, outputs)
                if self.record:
                    if not trace:
                        held_before = device - size
                    trace.append(["alloc" if size > 0 else "free", abs(size), is_scratch])
        return {"allocated": peak, "allocated_no_scratch": peak_outputs, "host": host_peak,
                "record": {"kind": "cpu", "held_before": held_before, "trace": trace} if self.record else None}

    def _allocation(self, event: Any) -> tuple[int, int, int, bool, int | None]:
        """(time, address, signed bytes, under a host-tier function, end of the outermost aten op around it) of
        one allocation or free, from its chain of enclosing events."""
        host = False
        op_end = None
        parent = event.parent
        while parent is not None:
            if isinstance(parent.extra_fields, self.kinds.TorchOp):
                if _event_name(parent).startswith("aten::"):
                    op_end = parent.end_time_ns  # the last one up the chain: what the replay or autograd called
            elif not host and isinstance(parent.extra_fields, self.kinds.PyCall):
                host = self._is_host_function(_event_name(parent))
            parent = parent.parent
        if op_end is None and event.parent is not None and isinstance(event.parent.extra_fields, self.kinds.PyCCall):
            # made by a C function called from Python outside any aten op: an op's Python binding turning a Python
            # number into the 0-d tensor its schema takes (8 B, freed when the call returns; the replay calls the
            # ops' bindings directly), so that call's own transient, as an op's scratch is
            op_end = event.parent.end_time_ns
        fields = event.extra_fields
        return event.start_time_ns, fields.ptr, fields.alloc_size, host, op_end

    def _is_host_function(self, name: str) -> bool:
        if name not in self._host_by_name:
            # the Python tracer names a frame 'FILE(LINE): FUNCTION'
            match = re.match(r"^(?P<file>.*)\(\d+\): (?P<function>\S+)$", name)
            self._host_by_name[name] = bool(match) and (
                str(Path(match["file"]).resolve()), match["function"]) in self.host_functions
        return self._host_by_name[name]


def _events(results: Any) -> Iterator[Any]:
    """Every event of a profile's event tree, without recursion."""
    stack = list(results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        yield event


def _event_name(event: Any) -> str:
    try:
        return event.name
    except UnicodeDecodeError:  # a Python frame's name the tracer stored in bytes that are not UTF-8
        return ""


def host_tier_functions() -> set[tuple[str, str]]:
    """(file, function) of every coop function whose body enters ``host_pool()``: its allocations are host memory."""
    found: set[tuple[str, str]] = set()
    for path in Path(coop.__file__).resolve().parent.rglob("*.py"):
        source = path.read_text()
        if "host_pool" not in source:  # parsing all of them took 3.2 s against 0.16 s (in each case, under load)
            continue
        tree = ast.parse(source, str(path))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.With) and any(_calls_host_pool(item.context_expr) for item in node.items):
                    found.add((str(path), function.name))
    return found


def _calls_host_pool(expression: ast.expr) -> bool:
    if not isinstance(expression, ast.Call):
        return False
    target = expression.func
    return (isinstance(target, ast.Name) and target.id == "host_pool") or (
        isinstance(target, ast.Attribute) and target.attr == "host_pool")


def _time_against_eager(row: dict[str, Any], plan: Any, batch: tuple, sizes: Sizes) -> None:
    """The plan's step against eager's on the same model, alternating step by step (``plan.benchmark``, the measure a
    user gets), with the overhead the plan predicted beside the one measured (issue 42)."""
    timing = plan.benchmark(batch, steps=sizes.steps, warmup=sizes.warmup)
    row["step_ms"], row["eager_ms"] = round(timing.plan_ms, 3), round(timing.eager_ms, 3)
    row["vs_eager"] = round(timing.plan_ms / timing.eager_ms, 3)
    row["measured_overhead_pct"] = round(100 * timing.measured_overhead, 1)
    if timing.predicted_overhead is not None:
        row["predicted_overhead_pct"] = round(100 * timing.predicted_overhead, 1)


def _median_ms(step: Callable[[], None], device: torch.device, sizes: Sizes) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(sizes.warmup):
        step()
    times = []
    for _ in range(sizes.steps):
        synchronize()
        started = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def _equal_to_eager(plan: Any, model: torch.nn.Module, eager: torch.nn.Module, batch: tuple,
                    loss_fn: Callable | None, progress: Callable[[str], None]) -> tuple[bool, str]:
    """Loss, every gradient and every buffer bit-identical to eager's over EQUAL_STEPS AdamW steps from the same
    weights.

    Returns whether they are and, when not, the first difference ('step 1 grad of wte.weight: max |diff| 3e-09').
    """
    eager.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    first_difference = ""
    for step in range(EQUAL_STEPS):
        progress(f"gradients against eager, step {step + 1}")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        torch.manual_seed(1000 + step)
        eager_loss = _loss(eager, batch, loss_fn)
        torch.manual_seed(1000 + step)
        loss = plan.step(*batch)
        pairs = [("loss", loss, eager_loss)]
        pairs += [(f"grad of {name}", param.grad, eager_param.grad) for (name, param), eager_param
                  in zip(model.named_parameters(), eager.parameters(), strict=True)]
        # buffers too: a batch norm whose running statistics were updated twice (a recomputed cuDNN batch norm)
        # leaves the gradients equal and the buffers not
        pairs += [(f"buffer {name}", buffer, eager_buffer) for (name, buffer), eager_buffer
                  in zip(model.named_buffers(), eager.buffers(), strict=True)]
        for what, mine, theirs in pairs:
            where = f"step {step + 1} {what}"
            if first_difference:
                break
            if mine is None or theirs is None:
                first_difference = "" if mine is theirs else f"{where}: {'missing' if mine is None else 'unexpected'}"
            elif mine.shape != theirs.shape or mine.dtype != theirs.dtype:
                first_difference = f"{where}: {list(mine.shape)} {mine.dtype} vs {list(theirs.shape)} {theirs.dtype}"
            elif not torch.equal(mine, theirs):
                first_difference = f"{where}: max |diff| {(mine.double() - theirs.double()).abs().max().item():.3g}"
        optimizer.step()
        eager_optimizer.step()
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    return not first_difference, first_difference


# ============================================================================ entry points
def run(quick: bool = False, only: str | list[str] | None = None) -> dict[str, Any]:
    """Rows of every case on the CUDA device (``quick``: tiny sizes), for ``benchmarks/run_all.py``."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_cuda needs a CUDA device (python benchmarks/bench_cuda.py --device cpu runs its "
                           "CPU-capable cases)")
    names = [only] if isinstance(only, str) else only
    rows = run_cases(select(names), "cuda", quick, jobs=1, report=_report)
    return {"rows": rows, "notes": notes(rows, "cuda", quick)}


def notes(rows: list[dict[str, Any]], device: str, quick: bool) -> str:
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    failures = acceptance_failures(rows)
    verdict = ("acceptance: PASS" if not failures else "acceptance: FAIL: " + "; ".join(failures))
    return (f"Device: {where}, torch {torch.__version__}, {'quick' if quick else 'full'} sizes, "
            f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset)')}, deterministic "
            "algorithms on, each case in a process of its own. predicted = the simulator's peak (arena: its "
            "footprint; dynamic: its budget; capture: the baseline peak, against eager's own step); allocated = "
            "peak bytes of a warm step above what was allocated before the plan's first step, plus the "
            "caller-owned bytes (CPU: torch's profiler, host tier apart; noscr/pred without the ops' own "
            "scratch); reserved = max_memory_reserved of the warm step after empty_cache, same reference; see "
            f"the module docstring. {verdict}.")


def _report(row: dict[str, Any]) -> None:
    print(f"bench_cuda: {row['case']}: {row['status']} ({row.get('wall_s', 0)} s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny model sizes (what the CPU test runs)")
    parser.add_argument("--only", nargs="+", metavar="CASE", help="case names, families, modes or patterns")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every row as JSON here")
    parser.add_argument("--jobs", type=int, default=None,
                        help="cases at a time (default 1 on CUDA: timings and memory undisturbed; 2 on CPU)")
    parser.add_argument("--isolation", choices=("exec", "fork"), default=None,
                        help="a fresh interpreter per case (default on CUDA) or a fork of a server that has "
                             "imported torch, coop and transformers once (default on CPU)")
    parser.add_argument("--selftest", action="store_true", help="also run the hidden crash/error/hang self-tests")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help=f"solver seconds per plan (default {FULL.time_limit:g}; quick {QUICK.time_limit:g})")
    parser.add_argument("--case-timeout", type=float, default=None, metavar="S",
                        help=f"seconds per case before it is killed (default {FULL.case_timeout:g})")
    parser.add_argument("--save-graphs", type=Path, default=None, metavar="DIR",
                        help="each capture case writes its captured Graph to DIR/FAMILY.json, each planned case "
                             "its Graph, schedule and the allocator's record of its warm step to DIR/records/CASE.json")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the child: one case, as JSON
    args = parser.parse_args(argv)
    if args.case:
        return child_main(json.loads(args.case))
    if args.list:
        print("\n".join(case.name + (" (hidden)" if case.hidden else "") for case in CASES))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    try:
        cases = select(args.only, selftest=args.selftest)
    except ValueError as exc:
        parser.error(str(exc))
    jobs = args.jobs or (1 if args.device == "cuda" else min(2, os.cpu_count() or 1))
    started = time.perf_counter()
    finished: list[dict[str, Any]] = []

    def report(row: dict[str, Any]) -> None:  # every row as it ends, written at once: a killed run keeps its rows
        _report(row)
        finished.append(row)
        if args.json:
            args.json.write_text(json.dumps({"rows": finished, "partial": True}, indent=1) + "\n")

    rows = run_cases(cases, args.device, args.quick, jobs=jobs, isolation=args.isolation, report=report,
                     time_limit=args.time_limit, case_timeout=args.case_timeout, save_graphs=args.save_graphs)
    print(format_table(rows))
    print(notes(rows, args.device, args.quick))
    print(f"{len(rows)} cases in {time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "notes": notes(rows, args.device, args.quick)}, indent=1) + "\n")
    return 1 if acceptance_failures(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
elif __name__ == CHILD_RUN_NAME:  # a forked child: runpy.run_path gave it its case
    child_main(globals()["BENCH_CASE"])
