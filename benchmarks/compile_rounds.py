"""Diagnostic for issue 41's equal-bytes comparison: every measured round of coop.compile at the bytes the compiler's
own knob held, each timed against that knob and the plain compile, and what each partition saves and recomputes.

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/compile_rounds.py MODEL KNOB [--eager-random]`` (a model of
bench_compile's ``MODELS``; KNOB is ``activation_memory_budget``). It prints, for the plain compile (knob 1.0) and
the knob, the forward's saved values (count, bytes, the ops that made them) and the forward ops the backward computes
again; then coop.compile with the knob's held bytes as its budget (``example_batch``, bench_compile's time limit),
every measured round (predicted and held bytes, pinned, predicted overhead); then the median ms of ``STEPS``
alternating steps of the plain compile, the knob and each round's compiled step, after ``WARMUP`` untimed rounds, with
glibc's heap kept as bench_compile's workers keep it (``--default-malloc``: glibc's own settings).
bench_compile's at-amb rows keep one round per budget and time it beside 16 other variants; this shows whether the
round coop keeps is its fastest and how far each is from the knob on a quiet core.
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._functorch.config
import torch._inductor.config
from torch import fx
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_compile

import coop
from coop.zoo import LossStep, build

STEPS, WARMUP = 21, 4


class _MinCutSpy(CustomPartitionerFn):
    """Inductor's own min-cut partitioner, keeping the forward and backward modules it returned."""

    def __init__(self) -> None:
        self.modules: tuple[fx.GraphModule, fx.GraphModule] | None = None

    def __call__(self, gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        self.modules = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        return self.modules

    def uuid(self) -> str:
        return f"compile_rounds-min-cut-{id(self)}"


def describe(forward: fx.GraphModule, backward: fx.GraphModule) -> str:
    """The forward's saved values (not its inputs) by the op that made them, and the forward ops the backward runs
    again (fx names both modules share)."""
    output = next(n for n in forward.graph.nodes if n.op == "output")
    saved = [a for a in output.args[0] if isinstance(a, fx.Node) and a.op != "placeholder"
             and hasattr(a.meta.get("val"), "numel")]
    nbytes = sum(a.meta["val"].numel() * a.meta["val"].element_size() for a in saved)
    made_by = collections.Counter(str(a.target).removeprefix("aten.") for a in saved)
    forward_names = {n.name for n in forward.graph.nodes if n.op == "call_function"}
    again = collections.Counter(str(n.target).removeprefix("aten.") for n in backward.graph.nodes
                                if n.op == "call_function" and n.name in forward_names)
    return (f"saves {len(saved)} values, {nbytes:,} B: {dict(made_by.most_common(8))}; the backward computes again "
            f"{sum(again.values())} forward ops: {dict(again.most_common(8))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(bench_compile.MODELS))
    parser.add_argument("knob", type=float)
    parser.add_argument("--eager-random", action="store_true", help="every side with eager's random kernels")
    parser.add_argument("--default-malloc", action="store_true",
                        help="glibc's own malloc settings (default: bench_compile.STABLE_HEAP, as its workers run)")
    args = parser.parse_args(argv)
    if not args.default_malloc:
        bench_compile.restart_with_stable_heap()
    options = {"fallback_random": True} if args.eager_random else {}
    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False
    torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    model, batch, loss_fn = build(args.model, **bench_compile.MODELS[args.model])
    base = LossStep(model, loss_fn)
    base.eval()  # Hugging Face's loss sets config.problem_type at its first call (bench_compile._worker)
    with torch.no_grad():
        base(*batch)
    base.train()
    variants: dict[str, tuple[torch.nn.Module, Callable[[], None]]] = {}

    def step_of(callable_: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            callable_(*batch).backward()
        return run

    for knob in (1.0, args.knob):
        spy = _MinCutSpy()
        module = copy.deepcopy(base)
        module.__class__ = type(f"StepKnob{round(1000 * knob)}", (LossStep,), {})  # a compilation of its own
        compiled = torch.compile(module, options={**options, "custom_partitioner_fn": spy})
        with torch._functorch.config.patch(activation_memory_budget=knob):
            step_of(compiled)()
        assert spy.modules is not None
        key = "plain compile" if knob == 1.0 else f"knob {knob}"
        variants[key] = (module, step_of(compiled))
        print(f"{key}: held {bench_compile._held(variants[key][1], module, batch):,} B; {describe(*spy.modules)}",
              flush=True)
    held = bench_compile._held(variants[f"knob {args.knob}"][1], variants[f"knob {args.knob}"][0], batch)
    api = importlib.import_module("coop.compiled.api")
    # each compilation with its own partitioner (the wrappers of one model share its attributes: the record is read
    # as the compilation returns)
    rounds: list[tuple[torch.nn.Module, Any]] = []
    measured = api.fit_measured

    def keep_every_round(compile_with: Callable[..., torch.nn.Module], *rest: Any, **kwargs: Any) -> torch.nn.Module:
        def compile_and_keep(*shave_and_observation: Any) -> torch.nn.Module:
            compiled_round = compile_with(*shave_and_observation)
            rounds.append((compiled_round, compiled_round.coop_record.partitioner))
            return compiled_round
        return measured(compile_and_keep, *rest, **kwargs)

    api.fit_measured = keep_every_round
    module = copy.deepcopy(base)
    started = time.perf_counter()
    try:
        compiled = coop.compile(module, held, example_batch=batch, time_limit=bench_compile.TIME_LIMIT,
                                **({"options": options} if options else {}))
    except coop.OverBudgetError as over:
        print(f"coop.compile refused: {over}")
        compiled = over.compiled
    finally:
        api.fit_measured = measured
    print(f"coop.compile at {held:,} B: {time.perf_counter() - started:.0f} s; kept: "
          f"{compiled.coop_record.plans[-1].summary()}", flush=True)
    ran = [r for r in compiled.coop_record.rounds if r.measured_peak is not None]
    planned = [(compiled_round, part.plans[-1]) for compiled_round, part in rounds if part.plans]
    for number, (record, (module_of_round, plan)) in enumerate(zip(ran, planned, strict=True)):
        print(f"  round {number}: predicted {record.predicted_peak:,} B, held {record.measured_peak:,} B "
              f"({'within' if record.measured_peak <= held else 'over'}), pinned {record.pinned}, layout "
              f"{record.layout_optimization}, predicted overhead {100 * (record.overhead or 0):.2f} %")
        variants[f"coop round {number}"] = (module, step_of(module_of_round))
        print(f"    {describe(plan.partition.forward, plan.partition.backward)}")
    times: dict[str, list[float]] = {key: [] for key in variants}
    for number in range(WARMUP + STEPS):
        for key, (owner, run) in variants.items():
            owner.zero_grad(set_to_none=True)
            started = time.perf_counter()
            run()
            if number >= WARMUP:
                times[key].append(time.perf_counter() - started)
    for key, spent in times.items():
        print(f"{key}: {1000 * statistics.median(spent):.2f} ms (median of {STEPS} alternating steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
