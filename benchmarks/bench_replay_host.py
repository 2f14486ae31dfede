"""Host cost of a replayed step on CPU: interpreted vs generated vs bound replay vs arena replay vs eager.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/run_all.py --only bench_replay_host [--quick]``.

Per zoo model (small configs with tiny tensors, so that a step's time is mostly the host's: Python
and the dispatcher, not kernels), the store-all schedule of the captured step replayed five ways:

* ``interpreted``: ``torch.fx.Interpreter`` over the executor's program (one Python call per node);
* ``fx_code``: the program as fx generates it (``GraphModule.forward``: ``torch.ops.aten.X.Y(...)``);
* ``bound``: the replay the executor runs (:func:`coop.runtime.executor.bind_ops`: fx's code with
  each op bound once as a global to its C++ callable);
* ``arena``: the bound replay inside one arena at the planned offsets (:mod:`coop.runtime.arena_replay`);
* ``eager``: ``loss.backward()`` on the model (autograd's own engine; no program, for reference);
* ``plan_step``: a whole ``Plan.step`` of the same schedule (the training-context check, the flat inputs, the
  bound replay, the write-back of gradients and buffers), so that ``step_host_us`` (``plan_step`` minus
  ``bound``) is the host work a step does besides running its program (issue 23, item 2: what to lower).

Times are medians over ``ROUNDS`` interleaved rounds of the best of 3 calls (ms per step, µs per node of
the ordinary program; the arena program has more nodes: its views).
``allocs_*`` count the device storages one step allocates, by :class:`coop.runtime.meter.MemoryMeter`
(the arena replay: ``allocs_arena_first`` its first step, which allocates its one persistent buffer, and
``allocs_arena`` a later step, which reuses it; both plus the workspaces it reports); ``transients`` is how
many ops are computed outside the arena and copied in, ``kernel_copies`` how many outputs a kernel that
allocates its own outputs put outside its view (first calls only, while the replay learns which allocation
is which).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from coop import Plan, capture
from coop.budget import baseline_peak
from coop.runtime.executor import Executor, recorded_program
from coop.runtime.meter import MemoryMeter
from coop.runtime.placement import execution_placement
from coop.schedule import Schedule
from coop.zoo import build

ROUNDS = 30
QUICK_ROUNDS = 5
MODELS: dict[str, dict[str, int]] = {
    "mlp": {},
    "cnn": {},
    "transformer": {},
    "gpt2": {},
    "resnet": {},
}
QUICK_MODELS = ("mlp", "gpt2")


def _best_ms(fn: Callable[[], Any], calls: int = 3) -> float:
    """The least of ``calls`` back-to-back calls (after one warm-up), in ms: the host's own cost, least disturbed."""
    fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times) * 1e3


def _allocations(fn: Callable[[], Any], tracked: list[torch.Tensor]) -> int:
    with MemoryMeter(use_cuda=False) as meter:
        meter.track(*tracked)
        fn()
    return len(meter.allocations)


def measure(name: str, rounds: int) -> dict[str, Any]:
    """One row: host time per step and per node of each replay form, and allocations per step."""
    model, batch, loss_fn = build(name, **MODELS[name])
    captured = capture(model, batch, loss_fn=loss_fn)
    ordinary = Executor(captured, Schedule.from_order(captured.graph.order))
    arena = Executor(captured, ordinary.schedule, placement=execution_placement(ordinary.graph, ordinary.schedule))
    flat = captured.flat_inputs(model, batch)
    nodes = sum(1 for n in ordinary.module.graph.nodes if n.op == "call_function")

    def eager() -> None:
        loss = loss_fn(model, *batch) if loss_fn is not None else model(*batch)
        loss.backward()
        model.zero_grad(set_to_none=True)

    def in_program(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad(), recorded_program():
                return fn()
        return run

    plan = Plan(model, captured, ordinary.schedule, baseline_peak(captured.graph), "store-all", loss_fn=loss_fn)

    def plan_step() -> None:
        plan.step(*batch)
        model.zero_grad(set_to_none=True)

    forms = {
        "interpreted": in_program(lambda: fx.Interpreter(ordinary.module).run(*flat)),
        "fx_code": in_program(lambda: ordinary.module(*flat)),
        "bound": lambda: ordinary.run_flat(flat),
        "arena": lambda: arena.run_flat(flat),
        "eager": eager,
        "plan_step": plan_step,
    }
    row: dict[str, Any] = {"model": name, "nodes": nodes}
    totals: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(rounds):  # interleaved: a neighbour's load hits every form alike
        for form, fn in forms.items():
            totals[form].append(_best_ms(fn))
    for form in forms:
        ms = statistics.median(totals[form])
        row[f"{form}_ms"] = round(ms, 3)
        if form not in ("eager", "plan_step"):
            row[f"{form}_us_per_node"] = round(ms * 1e3 / nodes, 2)
    row["bound_vs_interpreted"] = round(row["bound_ms"] / row["interpreted_ms"], 3)
    row["bound_vs_fx_code"] = round(row["bound_ms"] / row["fx_code_ms"], 3)
    row["arena_vs_bound"] = round(row["arena_ms"] / row["bound_ms"], 3)
    row["step_host_us"] = round((row["plan_step_ms"] - row["bound_ms"]) * 1e3, 1)
    tracked = [*flat, *captured.constants()]
    row["allocs_eager"] = _allocations(eager, tracked)
    row["allocs_replay"] = _allocations(lambda: ordinary.run_flat(flat), tracked)
    fresh = Executor(captured, ordinary.schedule, placement=execution_placement(ordinary.graph, ordinary.schedule))
    row["allocs_arena_first"] = _allocations(lambda: fresh.run_flat(flat), tracked)
    row["allocs_arena"] = _allocations(lambda: arena.run_flat(flat), [*tracked, *arena.arena_program.buffers.values()])
    row["transients"] = len(arena.arena_program.transients)
    row["kernel_copies"] = len(arena.arena_program.kernel_copies)
    row["arena_bytes"] = arena.arena_program.arena_bytes
    return row


def run(quick: bool = False) -> dict[str, Any]:
    names = QUICK_MODELS if quick else tuple(MODELS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # host cost, not intra-op parallelism (and no thread-pool waits on a shared machine)
    try:
        rows = [measure(name, QUICK_ROUNDS if quick else ROUNDS) for name in names]
    finally:
        torch.set_num_threads(threads)
    notes = ("CPU, torch.set_num_threads(1); medians of interleaved rounds. Per-node times divide a "
             "step's time by the program's call nodes (views included), so they include the kernels; the models are "
             "tiny so that host work dominates.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
