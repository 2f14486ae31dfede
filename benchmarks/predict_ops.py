"""Where a plan's replay spends its time beyond the store-all replay's, per op (issue 42's per-op error).

Run: ``PYTHONPATH=. python benchmarks/predict_ops.py gpt2 0.5 [--threads 1] [--runs 9]`` (models: bench_predict's).

The model is captured with the host costs on (:func:`coop.graph_capture.host_cost.host_costs`), planned at the
budget as bench_predict plans it, and planned at store-all. Both replay programs (the executor's fx programs) run
alternately under a timing ``fx.Interpreter`` (each call node timed alone; the interpreter adds some µs per node on
both sides), ``--runs`` times after 2 untimed runs, and each node's time is its median. A captured fx node the
plan computes more than once has a first instance and recomputed ones. Printed: the plan's recomputed instances by
op (count, measured µs, the same nodes' first instances in the store-all replay and in the plan, and what the cost
model prices them at), the store-all replay's dearest ops measured beside their prices, then the first instances
that differ most between the two replays.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from typing import Any

import torch
from torch import fx

import coop
from coop.graph_capture.batch import read_step_batch
from coop.graph_capture.cost import node_flops, replayed_seconds
from coop.graph_capture.host_cost import host_costs, machine_rates
from coop.runtime.program_builder import SOURCE_NODE

Instance = tuple[str, int]  # (captured fx node's name, which instance: 0 first, 1+ recomputed)


class TimedInterpreter(fx.Interpreter):
    """An ``fx.Interpreter`` that records each call node's seconds."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.times: list[tuple[fx.Node, float]] = []

    def run_node(self, n: fx.Node) -> Any:
        """Run ``n``, timing it where it calls an op."""
        if n.op != "call_function":
            return super().run_node(n)
        start = time.perf_counter()
        result = super().run_node(n)
        self.times.append((n, time.perf_counter() - start))
        return result


def instance_times(plans: list[Any], model: torch.nn.Module, batch: Any, runs: int) -> list[dict[Instance, float]]:
    """Per plan, the median µs of each instance of each captured node, the plans' programs run alternately."""
    samples: list[dict[Instance, list[float]]] = [collections.defaultdict(list) for _ in plans]
    for run in range(runs + 2):
        for plan, per in zip(plans, samples, strict=True):
            interpreter = TimedInterpreter(plan.replay.module)
            with torch.no_grad():
                interpreter.run(*plan.captured.flat_inputs(model, batch.tensors))
            if run < 2:
                continue
            seen: collections.Counter[str] = collections.Counter()
            for node, seconds in interpreter.times:
                source = node.meta.get(SOURCE_NODE, node.name)
                source = getattr(source, "name", source)
                per[(source, seen[source])].append(1e6 * seconds)
                seen[source] += 1
    return [{key: statistics.median(values) for key, values in per.items()} for per in samples]


def report(name: str, budget: float, threads: int, runs: int) -> None:
    """Print the per-op table of ``name`` planned at ``budget`` (see the module docstring)."""
    import bench_predict  # the same models and planning as the bench (benchmarks/ is on sys.path)

    torch.set_num_threads(threads)
    model, example, loss_fn = bench_predict.MODELS[name]()
    with host_costs(True):
        captured = coop.capture(model, example, loss_fn=loss_fn)
    plan = bench_predict._plan(model, example, loss_fn, budget, captured)
    store_all = bench_predict._store_all(model, example, loss_fn, captured)
    batch = read_step_batch((example,), {}, captured.layout)
    planned, stored = instance_times([plan, store_all], model, batch, runs)
    rates = machine_rates(threads)
    fx_nodes = {n.name: n for n in captured.module.graph.nodes}
    by_op: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for (source, index), micros in planned.items():
        node = fx_nodes.get(source)
        if index == 0 or node is None or node.op != "call_function":
            continue
        entry = by_op[str(node.target).removeprefix("aten.")]
        entry[0] += 1
        entry[1] += micros
        entry[2] += stored.get((source, 0), 0.0)
        entry[3] += planned.get((source, 0), 0.0)
        entry[4] += 1e6 * replayed_seconds(node, node_flops(node), rates)
    first = sum(v for (_, i), v in planned.items() if i == 0)
    print(f"{name} at {budget} ({plan.formulation}), {threads} thread(s), load {os.getloadavg()[0]:.2f}: store-all "
          f"{sum(stored.values()):.0f} µs, plan's first instances {first:.0f} µs, recomputed "
          f"{sum(e[1] for e in by_op.values()):.0f} µs (priced {sum(e[4] for e in by_op.values()):.0f} µs)")
    print(f"{'recomputed op':40s} {'n':>3s} {'measured':>9s} {'store-all':>9s} {'plan 1st':>9s} {'priced':>9s}")
    for op, (count, measured, original, own, priced) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
        print(f"{op[:40]:40s} {int(count):3d} {measured:9.0f} {original:9.0f} {own:9.0f} {priced:9.0f}")
    print_store_all(stored, fx_nodes, rates)
    print("first instances, plan against store-all (µs), the 10 largest differences:")
    for key in sorted(stored, key=lambda k: -abs(planned.get(k, 0.0) - stored[k]))[:10]:
        print(f"  {key[0]:40s} store-all {stored[key]:8.0f}  plan {planned.get(key, 0.0):8.0f}")


def print_store_all(stored: dict[Instance, float], fx_nodes: dict[str, fx.Node], rates: Any) -> None:
    """The store-all replay's ops (every node's first instance) by op: count, measured and priced µs, the 12 dearest."""
    by_op: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for (source, _), micros in stored.items():
        node = fx_nodes.get(source)
        if node is None or node.op != "call_function":
            continue
        entry = by_op[str(node.target).removeprefix("aten.")]
        entry[0] += 1
        entry[1] += micros
        entry[2] += 1e6 * replayed_seconds(node, node_flops(node), rates)
    print(f"{'store-all op':40s} {'n':>3s} {'measured':>9s} {'priced':>9s}")
    for op, (count, measured, priced) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"{op[:40]:40s} {int(count):3d} {measured:9.0f} {priced:9.0f}")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("budget", type=float)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    report(args.model, args.budget, args.threads, args.runs)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
