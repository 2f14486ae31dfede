"""CUDA replay: measured peak (torch.cuda.max_memory_allocated) against the plan's prediction, step time and gradients against eager.

Run on a machine with a CUDA device: ``python benchmarks/run_all.py --only bench_cuda`` (or
``python benchmarks/bench_cuda.py [--quick]``). Without one, ``run_all`` skips this module and
keeps the section of the last run made on a GPU (``REQUIRES = "cuda"``).

Per model (random weights, nothing downloaded; the sizes of issue 4's captured bars): one
capture on the device with profiled node costs (``coop.capture(..., profile=True)``: measured
seconds per node on the GPU), then plans at 100 % (store-all), 70 % and 50 % of the baseline
peak (``formulation="auto"``), and checkpoint-all, which recomputes every activation and every
dropout draw (the executor replays each draw from the CUDA generator state saved before it). For
each plan:

* ``measured_peak``: ``torch.cuda.max_memory_allocated`` during one ``plan.step`` minus what was
  allocated before it, plus the caller-owned bytes (parameters, buffers, batch) that the Graph
  counts as resident: the same quantity as the simulator's ``predicted_peak``.
  ``measured_vs_predicted`` is their ratio (the bar: <= 1.02).
* ``step_ms``: median of ``STEPS`` CUDA-synchronized steps after warm-up; ``vs_eager`` and
  ``vs_store_all`` are the step-time ratios; ``predicted_overhead`` is the plan's simulated
  extra cost over the baseline order with the profiled costs.
* ``grads_equal``: loss and every gradient ``torch.equal`` to eager PyTorch's under the same seed,
  over ``EQUAL_STEPS`` optimizer steps.

Everything runs under ``torch.use_deterministic_algorithms(True)`` (``CUBLAS_WORKSPACE_CONFIG
=:4096:8``): CUDA's atomic-add kernels (embedding and index backward) otherwise give different
bits on every run, eager against eager, and bit-equality would mean nothing.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import coop
from coop.errors import CoopError
from coop.zoo import _classifier_loss, build

REQUIRES = "cuda"
#: (formulation, budget fraction): store-all, the planner at 70 % and 50 %, and checkpoint-all, which
#: recomputes every activation, dropout masks included (replayed from their saved generator state).
PLANS = (("store-all", 1.0), ("auto", 0.7), ("auto", 0.5), ("checkpoint-all", 1.0))
TIME_LIMIT = 30
STEPS = 20
WARMUP = 3
EQUAL_STEPS = 2


def _resnet50(batch: int, image: int) -> tuple:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_labels=10)).train()
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return model, (images, torch.randint(0, 10, (batch,), generator=generator)), _classifier_loss


CASES: dict[str, tuple[str, Callable[[], tuple]]] = {
    "gpt2": ("gpt2-small 12x768 (b8, s512)",
             lambda: build("gpt2", layers=12, hidden=768, heads=12, vocab=50257, batch=8, seq=512)),
    "resnet50": ("resnet50 (b32, 224px)", lambda: _resnet50(32, 224)),
}
QUICK: dict[str, tuple[str, Callable[[], tuple]]] = {
    "gpt2": ("gpt2 2x64 (b4, s128)", lambda: build("gpt2", layers=2, hidden=64, heads=4, vocab=128, batch=4, seq=128)),
    "resnet50": ("resnet50 (b4, 64px)", lambda: _resnet50(4, 64)),
}


def _loss(model: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> torch.Tensor:
    out = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
    return out if isinstance(out, torch.Tensor) else out.loss


def _eager_step(model: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        loss = _loss(model, batch, loss_fn)
        loss.backward()
        return loss.detach()

    return step


def _caller_owned_bytes(graph: coop.Graph) -> int:
    return sum(graph.node(node_id).mem for node_id in graph.caller_owned_ids)


def _measured_peak(model: torch.nn.Module, step: Callable[[], Any], caller_owned: int) -> int:
    """Device bytes one step reaches above what was allocated before it, plus the caller-owned bytes."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    model.zero_grad(set_to_none=True)
    return peak + caller_owned


def _median_ms(model: torch.nn.Module, step: Callable[[], Any]) -> float:
    for _ in range(WARMUP):
        step()
        model.zero_grad(set_to_none=True)
    times = []
    for _ in range(STEPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return 1000 * statistics.median(times)


def _recomputations(plan: Any) -> tuple[str, int]:
    """The ops a plan recomputes most often ('aten.relu 12, aten.add 9') and how many random ops it
    recomputes (each replayed from its saved generator state)."""
    computes = Counter(step.node for step in plan.schedule.steps if step.op == "compute")
    ops: Counter[str] = Counter()
    for node_id, count in computes.items():
        ops[plan.graph.node(node_id).op.removesuffix(".default")] += count - 1
    top = ", ".join(f"{op} {count}" for op, count in ops.most_common(4) if count)
    return top, sum(computes[v] - 1 for v in plan.graph.random_draws)


def _host_and_kernel_ms(model: torch.nn.Module, step: Callable[[], Any]) -> tuple[float, float]:
    """Milliseconds the host spends issuing one step (before the final sync) and the GPU spends in kernels.

    When the host time is close to the step time the step is launch-bound: recomputing a cheap op
    then costs its Python and dispatch time, not its kernel time.
    """
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    host_ms = 1000 * (time.perf_counter() - start)
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    kernel_us = sum(event.self_device_time_total for event in prof.key_averages())
    return host_ms, kernel_us / 1000


def _equal_to_eager(plan: Any, eager: torch.nn.Module, batch: tuple, loss_fn: Callable | None) -> bool:
    """Loss and every gradient bit-identical to eager's over EQUAL_STEPS SGD steps from the same weights."""
    model = plan.model
    eager.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.01)
    saved = copy.deepcopy(model.state_dict())
    equal = True
    for step in range(EQUAL_STEPS):
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        torch.manual_seed(1000 + step)
        eager_loss = _eager_step(eager, batch, loss_fn)()
        torch.manual_seed(1000 + step)
        loss = plan.step(*batch)
        equal &= torch.equal(loss, eager_loss)
        for param, eager_param in zip(model.parameters(), eager.parameters(), strict=True):
            equal &= param.grad is not None and torch.equal(param.grad, eager_param.grad)
        optimizer.step()
        eager_optimizer.step()
    model.load_state_dict(saved)  # later plans and timings start from the same weights
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    return bool(equal)


def _rows_for(label: str, make: Callable[[], tuple], time_limit: float) -> list[dict[str, Any]]:
    model, batch, loss_fn = make()
    model = model.cuda()
    batch = tuple(t.cuda() for t in batch)
    eager = copy.deepcopy(model)
    start = time.perf_counter()
    captured = coop.capture(model, batch, loss_fn=loss_fn, profile=True)
    capture_s = time.perf_counter() - start
    graph = captured.graph
    caller_owned = _caller_owned_bytes(graph)
    baseline = coop.baseline_peak(graph)
    eager_step = _eager_step(eager, batch, loss_fn)
    eager_peak = _measured_peak(eager, eager_step, caller_owned)
    eager_ms = _median_ms(eager, eager_step)
    rows: list[dict[str, Any]] = []
    store_all_ms = None
    for formulation, fraction in PLANS:
        row: dict[str, Any] = {"model": label, "nodes": len(graph.nodes), "budget": fraction}
        start = time.perf_counter()
        try:
            plan = coop.plan(model, fraction, batch, loss_fn=loss_fn, captured=captured, time_limit=time_limit,
                             formulation=formulation)
        except CoopError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        summary = plan.summary()
        recomputed_ops, random_replays = _recomputations(plan)
        step = lambda plan=plan: plan.step(*batch)
        measured = _measured_peak(model, step, caller_owned)
        step_ms = _median_ms(model, step)
        host_ms, kernel_ms = _host_and_kernel_ms(model, step)
        store_all_ms = step_ms if formulation == "store-all" else store_all_ms
        row.update({
            "formulation": plan.formulation, "status": summary["status"], "solve_s": round(time.perf_counter() - start, 1),
            "baseline_peak": baseline, "predicted_peak": plan.predicted_peak, "measured_peak": measured,
            "measured_vs_predicted": round(measured / plan.predicted_peak, 4),
            "eager_peak_vs_baseline": round(eager_peak / baseline, 4),
            "predicted_overhead": round(plan.predicted_overhead, 4),
            "eager_ms": round(eager_ms, 2), "step_ms": round(step_ms, 2), "vs_eager": round(step_ms / eager_ms, 3),
            "vs_store_all": round(step_ms / store_all_ms, 3) if store_all_ms else None,
            "host_ms": round(host_ms, 2), "kernel_ms": round(kernel_ms, 2),
            "recomputations": plan.simulation.recomputations, "recomputed_ops": recomputed_ops,
            "random_replays": random_replays,
            "profiled_baseline_ms": round(1000 * plan.simulation.baseline_cost, 2),
            "grads_equal": _equal_to_eager(plan, eager, batch, loss_fn),
            "capture_s": round(capture_s, 1),
        })
        rows.append(row)
        del plan
        torch.cuda.empty_cache()
    return rows


def run(quick: bool = False, only: str | None = None) -> dict[str, Any]:
    """Rows for GPT-2 small and ResNet-50 on the CUDA device (``quick``: tiny sizes)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_cuda needs a CUDA device")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    rows = []
    for key, (label, make) in (QUICK if quick else CASES).items():
        if only not in (None, key):
            continue
        print(f"bench_cuda: {label}", file=sys.stderr, flush=True)
        rows += _rows_for(label, make, 10 if quick else TIME_LIMIT)
    notes = (f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}. Deterministic algorithms on "
             "(eager and replay alike). measured_peak = max_memory_allocated during one step - allocated before + "
             "caller-owned bytes; eager_peak_vs_baseline is the same measure for eager PyTorch's step against the "
             "captured baseline peak. Timings: median of "
             f"{STEPS} synchronized steps after {WARMUP} warm-up steps. host_ms is the time the host takes to issue one "
             "step (the replay is a Python fx program): where it reaches kernel_ms the step is launch-bound, and a "
             "recomputed cheap op costs its dispatch time rather than the synchronized per-op time the profile "
             "measured, so measured and predicted overheads part there.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    import json

    chosen = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    for result in run(quick="--quick" in sys.argv, only=chosen)["rows"]:
        print(json.dumps(result), flush=True)
