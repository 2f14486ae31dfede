"""coop inside torch.compile against the compiler's own budget and coop's eager replay, on CPU.

Run: ``python benchmarks/run_all.py --only bench_compile`` (or ``python benchmarks/bench_compile.py [--quick]
[--only gpt2]``). Each model runs in its own worker process. Per model:

* ``eager``: the plain step; ``compile``: ``torch.compile`` with its default partitioner. The compiled step's
  held bytes (one meter for every row: the CPU allocator's own reports to ``torch.profiler`` during one forward
  and backward, plus the parameters, buffers and batch that exist before it) is ``ref``.
* per budget share ``b`` of ``ref``: ``compile-amb``: ``torch.compile`` with
  ``torch._functorch.config.activation_memory_budget = b`` (the compiler's own knob, which is not a byte
  bound); ``coop.compile``: coop's partitioner with a budget of ``b x ref`` bytes and one measured step
  (``example_batch``); ``coop.plan``: coop's eager replay with the same budget in bytes.
* ``held`` is each step's held bytes on the one meter; ``ms`` the median of ``STEPS`` rounds after two warm-up
  rounds, each round one step of every variant in turn (alternating, so that a neighbour's load hits all alike);
  ``compile_s`` the first step's wall time (for coop.plan: the plan's); ``recomputed_gflop``: FLOPs of the
  computations coop's schedule runs more than once (coop rows; the compiler does not report its own);
  ``round_held``: per measured round of coop.compile, its plan's predicted peak -> what the step then held.

The bars the issue sets are computed per row: ``within`` (held <= budget), and per model ``monotone`` (a
lower budget never holds more), ``vs_amb`` (coop.compile at least as fast as compile-amb where its held bytes
are not higher) and ``vs_plan`` (coop.compile faster than coop.plan).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._functorch.config
import torch._inductor.config
from torch import nn

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import itertools

import coop
from coop.runtime.meter import cpu_allocation_peak
from coop.zoo import _language_model_loss, build

SHARES = (0.9, 0.7, 0.5, 0.3)
QUICK_SHARES = (0.7, 0.5)
STEPS = 7
TIME_LIMIT = 30
ROW_PREFIX = "BENCH_ROW "
MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512, "batch": 8, "seq": 128},
    "bert": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512, "batch": 8, "seq": 128},
    "llama": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512, "batch": 8, "seq": 128},
    "resnet": {"layers": 1, "hidden": 16, "batch": 8, "image": 64},
    "vit": {"layers": 2, "hidden": 128, "heads": 4, "batch": 32, "image": 64},  # dropout 0.1 (the zoo's ViT)
}
QUICK_MODELS = tuple(MODELS)  # every model, at the two middle shares


class Step(nn.Module):
    """A zoo model and its loss as one module: ``Step(model, loss_fn)(*batch)`` is the loss."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor] | None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is None:
            return self.model(*batch)
        if self.loss_fn is _language_model_loss:
            # the tokens as labels, the loss computed here: Hugging Face's loss_function breaks the graph
            (tokens,) = batch
            logits = self.model(input_ids=tokens).logits
            return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        return self.loss_fn(self.model, *batch)


def _held(step: Callable[[], None], module: nn.Module, batch: tuple) -> int:
    """Bytes one step holds at its peak: what it allocates (CPU allocator) plus the weights and batch."""
    module.zero_grad(set_to_none=True)
    peak = cpu_allocation_peak(step)
    module.zero_grad(set_to_none=True)
    owned = sum(p.numel() * p.element_size() for p in module.parameters())
    owned += sum(b.numel() * b.element_size() for b in module.buffers())
    owned += sum(t.numel() * t.element_size() for t in batch)
    return int(peak or 0) + owned


def _recomputed_flops(graph: Any, schedule: Any) -> int:
    flops = graph.meta.get("node_flops", {})
    computed: dict[int, int] = {}
    for step in schedule.steps:
        if step.op == "compute":
            computed[step.node] = computed.get(step.node, 0) + 1
    return sum(int(flops.get(str(n), 0)) * (count - 1) for n, count in computed.items() if count > 1)


def _worker(name: str, shares: tuple[float, ...], time_limit: float) -> list[dict[str, Any]]:
    """Every row of one model (run in its own process)."""
    # every compilation partitions anew: AOTAutograd's cache would answer one budget's split for another
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False
    # every variant compiles the same Step.forward anew (another backend or options, up to three coop rounds per
    # share, one more for Hugging Face's loss setting config.problem_type at its first call): past dynamo's default
    # limit of 8 it would run the later variants eagerly (ViT's rows held eager's bytes on 2026-11-28)
    torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    model, batch, loss_fn = build(name, **MODELS[name])
    base = Step(model, loss_fn)
    variants: dict[str, tuple[nn.Module, Callable[[], None]]] = {}
    info: dict[str, dict[str, Any]] = {}

    def add(key: str, module: nn.Module, run: Callable[[], None], compile_s: float, **extra: Any) -> None:
        variants[key] = (module, run)
        info[key] = {"compile_s": round(compile_s, 1), **extra}

    def loss_step(module: nn.Module, callable_: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            callable_(*batch).backward()
        return run

    eager = copy.deepcopy(base)
    add("eager", eager, loss_step(eager, eager), 0.0)
    compiled_module = copy.deepcopy(base)
    compiled = torch.compile(compiled_module)
    start = time.perf_counter()
    loss_step(compiled_module, compiled)()
    add("compile", compiled_module, loss_step(compiled_module, compiled), time.perf_counter() - start)
    ref = _held(variants["compile"][1], compiled_module, batch)
    for share in shares:
        budget = int(share * ref)
        amb_module = copy.deepcopy(base)
        # a class of its own per share: dynamo's guards check the module's type, so it compiles anew under the
        # patched knob (one compiled graph would otherwise serve every share)
        amb_module.__class__ = type(f"StepAmb{round(100 * share)}", (Step,), {})
        amb = torch.compile(amb_module, options={"max_autotune": False})
        start = time.perf_counter()
        try:
            with torch._functorch.config.patch(activation_memory_budget=share):
                loss_step(amb_module, amb)()
            add(f"compile-amb@{share}", amb_module, loss_step(amb_module, amb), time.perf_counter() - start,
                share=share, budget=budget)
        except Exception as exc:  # noqa: BLE001 - a row that says what failed, not a lost model
            info[f"compile-amb@{share}"] = {"share": share, "budget": budget, "error": str(exc)[:160]}
        coop_module = copy.deepcopy(base)
        start = time.perf_counter()
        try:
            cc = coop.compile(coop_module, budget, time_limit=time_limit, example_batch=batch, **COOP_COMPILE_OPTIONS)
            plan = cc.coop_record.plans[-1]
            add(f"coop.compile@{share}", coop_module, loss_step(coop_module, cc), time.perf_counter() - start,
                share=share, budget=budget, formulation=plan.result.formulation,
                predicted_overhead_pct=round(100 * plan.result.simulation.overhead, 2),
                recomputed_gflop=round(_recomputed_flops(plan.joint.graph, plan.result.schedule) / 1e9, 3),
                rounds=len(cc.coop_record.rounds),
                round_held=" / ".join(f"{r.predicted_peak:,}->{r.measured_peak:,}" for r in cc.coop_record.rounds
                                      if r.measured_peak is not None))
        except Exception as exc:  # noqa: BLE001 - a row that says what failed, not a lost model
            info[f"coop.compile@{share}"] = {"share": share, "budget": budget, "error": str(exc)[:160]}
        plan_module = copy.deepcopy(base)
        start = time.perf_counter()
        try:
            planned = coop.plan(plan_module, budget, batch, time_limit=time_limit)
            planned_graph = planned.graph

            def replay(planned: Any = planned, module: nn.Module = plan_module) -> None:
                planned.step(*batch)

            extra = {}
            if planned_graph is not None and getattr(planned, "schedule", None) is not None:
                extra["recomputed_gflop"] = round(_recomputed_flops(planned_graph, planned.schedule) / 1e9, 3)
            add(f"coop.plan@{share}", plan_module, replay, time.perf_counter() - start, share=share, budget=budget,
                **extra)
        except Exception as exc:  # noqa: BLE001 - a row that says what failed, not a lost model
            info[f"coop.plan@{share}"] = {"share": share, "budget": budget, "error": str(exc)[:160]}
    rows = _time_and_meter(variants, info, batch)
    for row in rows:
        row["model"] = name
        row["ref_held"] = ref
    return rows


def _time_and_meter(variants: dict[str, tuple[nn.Module, Callable[[], None]]], info: dict[str, dict[str, Any]],
                    batch: tuple) -> list[dict[str, Any]]:
    times: dict[str, list[float]] = {key: [] for key in variants}
    for round_number in range(STEPS + 2):
        for key, (module, run) in variants.items():
            module.zero_grad(set_to_none=True)
            start = time.perf_counter()
            run()
            if round_number >= 2:
                times[key].append(time.perf_counter() - start)
    rows = []
    for key, extra in info.items():
        row: dict[str, Any] = {"variant": key.split("@")[0], **extra}
        if key in variants:
            module, run = variants[key]
            row["held"] = _held(run, module, batch)
            row["ms"] = round(1000 * statistics.median(times[key]), 2)
            if "budget" in row:
                row["within"] = row["held"] <= row["budget"]
        rows.append(row)
    eager_ms = next(r["ms"] for r in rows if r["variant"] == "eager")
    for row in rows:
        if "ms" in row:
            row["x_eager"] = round(row["ms"] / eager_ms, 3)
    return rows


def bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's bars over all rows: within budget, monotone, vs the compiler's budget, vs coop.plan."""
    coop_rows = [r for r in rows if r["variant"] == "coop.compile" and "held" in r]
    within = sum(r["within"] for r in coop_rows)
    monotone = True
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in coop_rows:
        by_model.setdefault(r["model"], []).append(r)
    for model_rows in by_model.values():
        ordered = sorted(model_rows, key=lambda r: r["share"])
        monotone &= all(a["held"] <= b["held"] for a, b in itertools.pairwise(ordered))
    faster_amb = compared_amb = faster_plan = compared_plan = 0
    for r in coop_rows:
        same = {x["variant"]: x for x in rows if x["model"] == r["model"] and x.get("share") == r["share"] and "ms" in x}
        amb = same.get("compile-amb")
        if amb is not None and r["held"] <= amb["held"]:
            compared_amb += 1
            faster_amb += r["ms"] <= amb["ms"]
        plan = same.get("coop.plan")
        if plan is not None:
            compared_plan += 1
            faster_plan += r["ms"] < plan["ms"]
    return {"coop_rows": len(coop_rows), "within_budget": within, "monotone": monotone,
            "faster_than_amb_at_equal_or_lower_held": f"{faster_amb}/{compared_amb}",
            "faster_than_coop_plan": f"{faster_plan}/{compared_plan}"}


def run(quick: bool = False) -> dict[str, Any]:
    """All models, each in a worker process; the rows and the bars."""
    names = QUICK_MODELS if quick else tuple(MODELS)
    rows: list[dict[str, Any]] = []
    for name in names:
        command = [sys.executable, __file__, "--worker", name] + (["--quick"] if quick else [])
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        found = [json.loads(line[len(ROW_PREFIX):]) for line in done.stdout.splitlines() if line.startswith(ROW_PREFIX)]
        if not found:
            rows.append({"model": name, "variant": "error", "error": done.stderr.strip().splitlines()[-1:] or "?"})
        rows.extend(found)
    summary = bars([r for r in rows if r.get("variant") != "error"])
    return {"rows": rows, "notes": "bars: " + json.dumps(summary)}


#: coop.compile's options for a --worker run (--pricing, --pin); empty: its defaults
COOP_COMPILE_OPTIONS: dict[str, Any] = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pricing", help="coop.compile's pricing (nominal, draws, measured); default: its own")
    parser.add_argument("--pin", action="store_true", help="coop.compile(pin=True): kernels in coop's order")
    parser.add_argument("--no-reorder-for-peak-memory", action="store_true",
                        help="inductor's reorder_for_peak_memory off for coop.compile")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker")
    parser.add_argument("--only", action="append")
    parser.add_argument("--shares", help="comma-separated budget shares for a --worker run (default: all)")
    args = parser.parse_args()
    if args.pricing:
        COOP_COMPILE_OPTIONS["pricing"] = args.pricing
    if args.pin:
        COOP_COMPILE_OPTIONS["pin"] = True
    if args.no_reorder_for_peak_memory:
        COOP_COMPILE_OPTIONS["options"] = {"reorder_for_peak_memory": False}
    if args.worker:
        shares = QUICK_SHARES if args.quick else SHARES
        if args.shares:
            shares = tuple(float(x) for x in args.shares.split(","))
        for row in _worker(args.worker, shares, TIME_LIMIT):
            print(ROW_PREFIX + json.dumps(row), flush=True)
        return
    result = run(quick=args.quick)
    for row in result["rows"]:
        if args.only is None or row.get("model") in args.only:
            print(json.dumps(row))
    print(result["notes"])


if __name__ == "__main__":
    main()
