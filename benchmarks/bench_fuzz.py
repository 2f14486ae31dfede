"""Fuzz every formulation and online policy on thousands of random DAGs; every schedule re-counted independently.

Each graph is drawn from a seed: random layered DAGs (the shape of Gagrani et al.'s graphs in
``graphs/moccasin``) and training-shaped steps (a forward DAG with caller-owned inputs
and parameters, a loss, and a backward part that mirrors it, ``outputs`` = loss + parameter
gradients), with multi-output ops (``Node.output_of``: batch-norm statistics, dropout masks, a
backward op's weight gradient), seeded random ops (dropout/bernoulli, never recomputed), node
implementations (MONeT ``impls``) and workspaces, at most ``--max-nodes`` nodes (sizes skewed
towards small), and a budget between ``coop.min_budget`` and the baseline peak.

On each graph:

* every registered formulation (``coop.formulations.FORMULATIONS``; the exact ones, whose time
  limit dominates, on a seeded subset) and every online policy (``coop.online.policies``) runs;
  every schedule returned is checked by ``coop.validate`` at the budget and by :func:`recount`,
  an independent replay of contract 2 written here (it never calls ``coop.schedule.simulate``),
  whose peak and cost must equal what the formulation and the validator predicted;
* schedule variants that no formulation produces yet (implementations named on computes,
  page_out/page_in pairs priced by ``PagingCosts``, random mutations that are mostly illegal) go
  through ``coop.simulate`` and :func:`recount`: both must agree on legality, peak and cost;
* on a sample, the corruptions of ``tests/corruptions.py`` of the graph file (coop JSON and both
  networkx layouts) and of a schedule file go through ``coop.load_graph`` and the CLI in-process
  (``coop info``, ``coop solve``, ``coop validate``): each must succeed or fail with one line.

Run: ``.venv/bin/python benchmarks/bench_fuzz.py --count 500 [--seed 0] [--workers 2] [--max-nodes 60]
[--time-limit 1] [--exact-fraction F] [--corrupt-fraction F]``; it writes its section of
BENCHMARKS.md and the graphs of any failure (with a reproducing command) under ``out/bench_fuzz/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import math
import multiprocessing
import os
import random
import shlex
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for _folder in (REPO, REPO / "benchmarks", REPO / "tests"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.graph import CALLER_OWNED_KINDS, Graph
from coop.schedule import PagingCosts, Schedule, Step, prompt_order, schedule_to_json, simulate, validate

#: Formulations that stop at a time limit: run on a seeded subset of the graphs (``exact_fraction``).
EXACT = ("checkmate", "checkmate-lp", "moccasin", "monet", "poet", "auto")
#: monet's stage MILP (Checkmate's space with implementation choice) runs up to this many positions; its proofs
#: above it come from the interval model, whose space is not checked here.
MONET_STAGE_POSITIONS = 40
#: Formulations that cannot run on a graph without a captured torch model, and why (counted, not run).
NEEDS_CAPTURE = {"pytorch-mincut": "needs a captured fx joint step; fuzz graphs are imported graphs"}
DEFAULT_COUNT = 10_000
QUICK_COUNT = 200
#: Chosen from the throughput measured on the 2-core machine (2 workers, 2 s limit, --count 500): about 0.12
#: worker-seconds per graph for the baselines, policies and variants, 2.5 more with the four exact formulations
#: and ~3 more for a graph whose files are corrupted; up to twice that while other jobs load the machine.
#: 10,000 graphs: ~10 + ~31 + ~5 min on a quiet machine, about an hour under load.
DEFAULT_EXACT_FRACTION = 0.15
DEFAULT_CORRUPT_FRACTION = 0.02
FAILURES_DIR = REPO / "out" / "bench_fuzz"
RANDOM_OPS = ("aten.native_dropout.default", "aten.bernoulli.p")
#: Relative tolerance for float costs (exact for integer costs).
COST_RTOL = 1e-9


# ============================================================================ configuration and tallies
@dataclass(frozen=True)
class FuzzConfig:
    """What one run does; every graph and budget is a function of (seed, index)."""

    count: int = DEFAULT_COUNT
    seed: int = 0
    workers: int = 2
    max_nodes: int = 60
    time_limit: float = 2.0
    exact_fraction: float = DEFAULT_EXACT_FRACTION
    corrupt_fraction: float = DEFAULT_CORRUPT_FRACTION


@dataclass
class Findings:
    """Counters per table row (row label -> column -> count) and the failures worth a reproducer."""

    rows: dict[str, Counter] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: str, column: str, amount: int = 1) -> None:
        self.rows.setdefault(row, Counter())[column] += amount

    def fail(self, row: str, column: str, index: int, graph: Graph, detail: str, reproduce: list[str],
             files: dict[str, bytes] | None = None) -> None:
        """Count a failure and keep what reproduces it: the graph, the command, and any other file it reads."""
        self.add(row, column)
        self.failures.append({"row": row, "column": column, "index": index, "detail": " ".join(detail.split())[:400],
                              "graph": graph.to_dict(), "reproduce": reproduce, "files": files or {}})

    def merge(self, other: Findings) -> None:
        for row, counts in other.rows.items():
            self.rows.setdefault(row, Counter()).update(counts)
        self.failures.extend(other.failures)


# ============================================================================ random graphs
def make_graph(seed: int, index: int, max_nodes: int) -> Graph:
    """The graph of draw ``index``: random layered or training-shaped, at most ``max_nodes`` nodes."""
    rng = random.Random(f"graph/{seed}/{index}")
    size = 3 + int((max_nodes - 3) * rng.random() ** 2)  # skewed towards small graphs
    if rng.random() < 0.4:
        data = layered_graph(rng, size, decorated=rng.random() < 0.6)
    else:
        data = training_graph(rng, size)
    data["name"] = f"fuzz{index}"
    return Graph.model_validate(data)


def draw_budget(rng: random.Random, graph: Graph) -> int:
    """A budget between min_budget (the proven lower bound) and the baseline peak (either end now and then)."""
    low, high = min_budget(graph), baseline_peak(graph)
    roll = rng.random()
    if roll < 0.1:
        return low
    if roll < 0.15:
        return high
    return low + int((high - low) * math.sqrt(rng.random()))  # towards the baseline peak: more budgets that fit


def layered_graph(rng: random.Random, size: int, decorated: bool) -> dict[str, Any]:
    """Gagrani et al.'s random layered DAG: a source (id 0), layers of nodes reading earlier layers, a sink (id 1).

    Integer memory and durations, no caller-owned values, a random topological ``order``. Plain
    graphs (``decorated`` False) carry nothing else, so that they also travel as networkx files.
    """
    inner = max(1, size - 2)
    widths: list[int] = []
    while sum(widths) < inner:
        widths.append(min(inner - sum(widths), rng.randint(1, max(1, int(math.sqrt(inner)) + 2))))
    nodes = {0: _plain(0, rng.randint(1, 1000), 0), 1: _plain(1, rng.randint(1, 1000), 0)}
    layers: list[list[int]] = [[0]]
    next_id = 2
    for width in widths:
        layer = []
        for _ in range(width):
            earlier = layers[-1] if rng.random() < 0.7 else [v for group in layers for v in group]
            sources = rng.sample(earlier, min(len(earlier), rng.choice((1, 1, 2, 2, 3))))
            nodes[next_id] = _plain(next_id, rng.randint(1, 1000), rng.randint(0, 1000), sources)
            layer.append(next_id)
            next_id += 1
        layers.append(layer)
    read = {s for n in nodes.values() for s in n["inputs"]}
    nodes[1]["inputs"] = [v for v in nodes if v not in read and v != 1]
    if decorated:
        _decorate(rng, nodes, integer=True)
    graph = {"format": "coop.graph", "nodes": list(nodes.values()), "meta": {"mem_unit": "units", "cost_unit": "units"}}
    graph["order"] = _random_topological_order(rng, nodes)
    graph["outputs"] = [1] if decorated and rng.random() < 0.5 else []
    return graph


def training_graph(rng: random.Random, size: int) -> dict[str, Any]:
    """A training step: inputs and parameters, a forward DAG, a loss, and a backward part mirroring it.

    ``outputs`` are the loss and the parameter gradients. Some forward ops are dropout (a seeded
    random op whose mask is an extra output the backward reads), some carry batch-norm-like extra
    outputs, some backward ops produce their parameter's gradient as an extra output.
    """
    forward_count = max(1, (size - 4) // 4)
    while True:
        nodes = _training_nodes(rng, forward_count)
        if len(nodes) <= max(size, 6) or forward_count == 1:
            break
        forward_count -= 1
    _decorate(rng, nodes, integer=False)
    outputs = [v for v, n in nodes.items() if n["name"] == "loss" or n["name"].startswith("grad_w")]
    return {"format": "coop.graph", "nodes": list(nodes.values()), "outputs": outputs,
            "order": _random_topological_order(rng, nodes), "meta": {"mem_unit": "bytes", "cost_unit": "seconds"}}


def _training_nodes(rng: random.Random, forward_count: int) -> dict[int, dict[str, Any]]:
    nodes: dict[int, dict[str, Any]] = {}

    def add(name: str, kind: str, inputs: list[int], op: str = "", **extra: Any) -> int:
        node_id = len(nodes) * 3 + 7  # ids that are neither 0..n-1 nor positions
        mem = 0 if kind == "param" and rng.random() < 0.05 else 512 * rng.randint(1, 64)
        cost = 0.0 if kind in CALLER_OWNED_KINDS else rng.uniform(1e-6, 1e-3)
        nodes[node_id] = {"id": node_id, "name": name, "op": op, "kind": kind, "inputs": inputs, "mem": mem,
                          "cost": cost, **extra}
        return node_id

    batch = add("x", "input", [])
    label = add("y", "input", []) if rng.random() < 0.5 else None
    forward: list[int] = []
    weight: dict[int, int] = {}
    saved_extra: dict[int, int] = {}  # forward op -> its extra output (batch-norm statistics, dropout mask)
    for i in range(forward_count):
        previous = forward[-1] if forward else batch
        if forward and rng.random() < 0.15:  # dropout: random, its mask an extra output
            op = add(f"dropout{i}", "forward", [previous], rng.choice(RANDOM_OPS), recomputable=False, random=True)
            saved_extra[op] = _extra_output(add, nodes, op, f"mask{i}")
            forward.append(op)
            continue
        sources = [previous]
        if len(forward) > 2 and rng.random() < 0.3:
            skip = rng.choice(forward[:-1])
            sources.append(skip)
        if rng.random() < 0.7:
            weight_id = add(f"w{i}", "param", [])
            sources.append(weight_id)
        op = add(f"f{i}", "forward", sources)
        if sources[-1] != previous and nodes[sources[-1]]["kind"] == "param":
            weight[op] = sources[-1]
        if rng.random() < 0.15:
            saved_extra[op] = _extra_output(add, nodes, op, f"stats{i}")
        forward.append(op)
    loss = add("loss", "forward", [forward[-1]] + ([label] if label is not None else []))
    grad_of: dict[int, int] = {loss: add("seed", "backward", [loss])}
    for op in reversed(forward):
        consumers = [v for v in [*forward, loss] if op in nodes[v]["inputs"]]
        reads = [grad_of[c] for c in consumers]
        reads += [s for s in nodes[op]["inputs"] if rng.random() < 0.6 and s not in reads]
        if op in saved_extra:
            reads.append(saved_extra[op])
        if rng.random() < 0.3:
            reads.append(op)
        grad_of[op] = add(f"grad_{nodes[op]['name']}", "backward", list(dict.fromkeys(reads)))
        if op in weight:
            w = nodes[weight[op]]["name"]
            if rng.random() < 0.5:  # a backward op that returns the weight gradient too
                _extra_output(add, nodes, grad_of[op], f"grad_{w}", kind="backward")
            else:
                activation = [s for s in nodes[op]["inputs"] if nodes[s]["kind"] != "param"][:1]
                add(f"grad_{w}", "backward", list(dict.fromkeys([grad_of[op], *activation])))
    return nodes


def _extra_output(add: Any, nodes: dict[int, dict[str, Any]], op: int, name: str, kind: str = "forward") -> int:
    """An extra output of ``op``: reads only it, never recomputed, free to take, in its op's workspace."""
    extra = add(name, kind, [op], recomputable=False, output_of=op)
    nodes[extra]["cost"] = 0.0
    nodes[op]["workspace"] = nodes[op].get("workspace", 0) + nodes[extra]["mem"]
    return extra


def _plain(node_id: int, mem: int, cost: int, inputs: list[int] | None = None) -> dict[str, Any]:
    return {"id": node_id, "name": str(node_id), "inputs": list(inputs or []), "mem": mem, "cost": float(cost)}


def _decorate(rng: random.Random, nodes: dict[int, dict[str, Any]], integer: bool) -> None:
    """Workspaces, MONeT implementations, random ops and (layered graphs) extra outputs on random nodes."""
    computed = [v for v, n in nodes.items() if n.get("kind", "forward") not in CALLER_OWNED_KINDS
                and n.get("output_of") is None]
    for v in computed:
        node = nodes[v]
        if rng.random() < 0.15:
            node["workspace"] = node.get("workspace", 0) + rng.randint(1, max(1, node["mem"] // 2))
        if rng.random() < 0.15 and node.get("recomputable", True):
            node["impls"] = [_impl(rng, node, name, integer) for name in rng.sample(["inplace", "fast", "lean"],
                                                                                    rng.randint(1, 2))]
    if integer:
        _random_ops_and_extras(rng, nodes, computed)
    _cover_extras(nodes)


def _cover_extras(nodes: dict[int, dict[str, Any]]) -> None:
    """Every implementation's workspace holds its op's extra outputs (contract 1: they exist while it runs)."""
    extras: Counter = Counter()
    for node in nodes.values():
        if node.get("output_of") is not None:
            extras[node["output_of"]] += node["mem"]
    for v, node in nodes.items():
        for impl in node.get("impls", []):
            impl["workspace"] = max(impl["workspace"], extras[v])


def _random_ops_and_extras(rng: random.Random, nodes: dict[int, dict[str, Any]], computed: list[int]) -> None:
    for v in rng.sample(computed, min(len(computed), rng.randint(0, 2))):
        if "impls" not in nodes[v]:
            nodes[v].update(op=rng.choice(RANDOM_OPS), recomputable=False, random=True)
    next_id = max(nodes) + 1
    for v in rng.sample(computed, min(len(computed), rng.randint(0, 2))):
        readers = [r for r, n in nodes.items() if v in n["inputs"]]
        mem = rng.randint(1, 300)
        nodes[next_id] = {"id": next_id, "name": f"{v}.extra", "inputs": [v], "mem": mem, "cost": 0.0,
                          "recomputable": False, "output_of": v}
        nodes[v]["workspace"] = nodes[v].get("workspace", 0) + mem
        for reader in rng.sample(readers, min(len(readers), 1)):
            nodes[reader]["inputs"].append(next_id)
        next_id += 1


def _impl(rng: random.Random, node: dict[str, Any], name: str, integer: bool) -> dict[str, Any]:
    cost = node["cost"] * rng.uniform(0.5, 2.0)
    return {"name": name, "cost": float(round(cost)) if integer else cost, "mem": rng.randint(0, node["mem"] * 2),
            "workspace": rng.choice((0, 0, rng.randint(0, max(1, node["mem"]))))}


def _random_topological_order(rng: random.Random, nodes: dict[int, dict[str, Any]]) -> list[int]:
    """Kahn's algorithm with random ties, over the computed nodes (a baseline order other than node order)."""
    waiting = {v: set(n["inputs"]) for v, n in nodes.items()}
    done: set[int] = set()
    order: list[int] = []
    while waiting:
        ready = [v for v, sources in waiting.items() if sources <= done]
        v = rng.choice(ready)
        del waiting[v]
        done.add(v)
        if nodes[v].get("kind", "forward") not in CALLER_OWNED_KINDS:
            order.append(v)
    return order


# ============================================================================ the independent re-count
class IllegalSchedule(Exception):
    """A step that contract 2 forbids (the re-count's verdict; its wording is not compared)."""


@dataclass
class _Copy:
    """One device copy of a computed value: counted from ``counts_from``, read last at ``last_read``."""

    node: int
    mem: int
    computed_at: int
    counts_from: int
    last_read: int
    freed_at: int | None = None
    host: list[list[int]] = field(default_factory=list)  # [page_out step, page_in step (exclusive)]


@dataclass(frozen=True)
class Recount:
    peak: int
    cost: float


def recount(graph: Graph, steps: tuple[Step, ...], paging: PagingCosts | None = None) -> Recount:
    """Replay ``steps`` under contract 2 (coop.schedule's docstring), independently of ``coop.schedule.simulate``.

    Caller-owned values are resident from the start and never computed or freed; a compute needs
    its inputs on the device (an extra output needs only that its op ran) and makes a new copy
    (the previous one is dropped unless a step after it still reads it); a copy without an explicit
    free lives through its last read (an output's last copy to the end); an extra output counts
    from the step after its op's first run. Memory at a step = owned values on the device + live
    device copies + the step's workspace; page steps cost ``latency + mem / bandwidth``.
    """
    nodes = {n.id: n for n in graph.nodes}
    owned = {v for v, n in nodes.items() if n.caller_owned}
    owned_host: dict[int, list[list[int]]] = {v: [] for v in owned}
    on_host: set[int] = set()
    current: dict[int, _Copy] = {}
    copies: list[_Copy] = []
    first_run: dict[int, int] = {}
    workspace = [0] * len(steps)
    cost = 0.0
    for j, step in enumerate(steps):
        node = nodes.get(step.node)
        if node is None:
            raise IllegalSchedule(f"step {j}: unknown node {step.node}")
        v = node.id
        if step.op == "compute":
            if v in owned:
                raise IllegalSchedule(f"step {j}: computes caller-owned {v}")
            if node.output_of is not None:
                if node.output_of not in first_run:
                    raise IllegalSchedule(f"step {j}: extra output {v} before its op ran")
            else:
                for source in node.inputs:
                    if source in on_host or (source not in owned and source not in current):
                        raise IllegalSchedule(f"step {j}: input {source} not on the device")
                    if source in current:
                        current[source].last_read = j
            if v in first_run and not node.recomputable:
                raise IllegalSchedule(f"step {j}: recomputes non-recomputable {v}")
            mem, step_cost, workspace[j] = _chosen_implementation(node, step.impl, j)
            previous = current.pop(v, None)
            if previous is not None and v in on_host:
                previous.host[-1][1] = j
                on_host.discard(v)
            counts_from = j if node.output_of is None else first_run[node.output_of] + 1
            copy = _Copy(v, mem, j, counts_from, last_read=j)
            current[v] = copy
            copies.append(copy)
            first_run.setdefault(v, j)
            cost += step_cost
        elif step.op == "free":
            if v not in current:
                raise IllegalSchedule(f"step {j}: frees {v}, which is not resident")
            copy = current.pop(v)
            copy.freed_at = j
            if v in on_host:
                copy.host[-1][1] = j
                on_host.discard(v)
        elif step.op in ("page_out", "page_in"):
            if v not in owned and v not in current:
                raise IllegalSchedule(f"step {j}: pages {v}, which is not resident")
            if (step.op == "page_out") == (v in on_host):
                raise IllegalSchedule(f"step {j}: {step.op} of {v} in the wrong place")
            intervals = owned_host[v] if v in owned else current[v].host
            if step.op == "page_out":
                intervals.append([j, len(steps)])
                on_host.add(v)
            else:
                intervals[-1][1] = j
                on_host.discard(v)
            size = node.mem if v in owned else current[v].mem
            cost += (paging or PagingCosts()).cost(size)
        else:
            raise IllegalSchedule(f"step {j}: unknown op {step.op!r}")
    _check_end(graph, owned, current, on_host, first_run)
    return Recount(_peak(graph, owned, owned_host, copies, current, workspace), cost)


def _chosen_implementation(node: Any, impl: str | None, j: int) -> tuple[int, float, int]:
    if impl is None:
        return node.mem, node.cost, node.workspace
    for candidate in node.impls:
        if candidate.name == impl:
            return candidate.mem, candidate.cost, candidate.workspace
    raise IllegalSchedule(f"step {j}: node {node.id} has no implementation {impl!r}")


def _check_end(graph: Graph, owned: set[int], current: dict[int, _Copy], on_host: set[int],
               first_run: dict[int, int]) -> None:
    for node in graph.nodes:
        if node.id not in owned and node.id not in first_run:
            raise IllegalSchedule(f"node {node.id} never computed")
    for v in graph.outputs:
        if v in on_host or (v not in owned and v not in current):
            raise IllegalSchedule(f"output {v} not on the device at the end")


def _peak(graph: Graph, owned: set[int], owned_host: dict[int, list[list[int]]], copies: list[_Copy],
          current: dict[int, _Copy], workspace: list[int]) -> int:
    """Sum, step by step, what is on the device (a plain loop over each copy's lifetime)."""
    total = len(workspace)
    memory = list(workspace)
    final = {id(copy) for v, copy in current.items() if v in set(graph.outputs)}
    for v in owned:
        for j in range(total):
            if not _on_host_at(owned_host[v], j):
                memory[j] += graph.node(v).mem
    for copy in copies:
        if copy.freed_at is not None:
            end = copy.freed_at - 1
        elif id(copy) in final:
            end = total - 1
        else:
            end = copy.last_read
        for j in range(copy.counts_from, max(end, copy.computed_at) + 1):
            if not _on_host_at(copy.host, j):
                memory[j] += copy.mem
    return max(memory) if memory else sum(graph.node(v).mem for v in owned)


def _on_host_at(intervals: list[list[int]], j: int) -> bool:
    return any(start <= j < stop for start, stop in intervals)


# ============================================================================ schedule variants
def with_implementations(rng: random.Random, graph: Graph, schedule: Schedule) -> Schedule:
    """The schedule with a random implementation named on about half the computes of nodes that have some."""
    steps = []
    for step in schedule.steps:
        impls = graph.node(step.node).impls if step.op == "compute" else ()
        if impls and rng.random() < 0.5:
            step = Step(op="compute", node=step.node, impl=rng.choice(impls).name)
        steps.append(step)
    return Schedule(steps=tuple(steps))


def with_paging(rng: random.Random, graph: Graph, schedule: Schedule) -> Schedule:
    """Page a few values out while no step touches them (built to be legal; the checkers decide)."""
    steps = list(schedule.steps)
    inserts: dict[int, list[Step]] = {}  # position -> steps inserted before steps[position]
    candidates = list(graph.caller_owned_ids) + sorted({s.node for s in steps if s.op == "compute"})
    for v in rng.sample(candidates, min(len(candidates), rng.randint(1, 3))):
        touches = [j for j, s in enumerate(steps) if s.node == v or (s.op == "compute" and v in _reads(graph, s.node))]
        owned = graph.node(v).caller_owned
        starts = [-1, *touches] if owned else [j for j in touches if steps[j].node == v and steps[j].op == "compute"]
        if not starts:
            continue
        after = rng.choice(starts)
        following = [j for j in touches if j > after]
        if not owned and following and steps[following[0]].node == v:
            continue  # freed or recomputed right away: nothing to page
        inserts.setdefault(after + 1, []).append(Step(op="page_out", node=v))
        back = following[0] if following else (len(steps) if v in graph.outputs or rng.random() < 0.5 else None)
        if back is not None:
            inserts.setdefault(back, []).append(Step(op="page_in", node=v))
    result: list[Step] = []
    for j in range(len(steps) + 1):
        result.extend(inserts.get(j, ()))
        if j < len(steps):
            result.append(steps[j])
    return Schedule(steps=tuple(result))


def _reads(graph: Graph, node_id: int) -> tuple[int, ...]:
    node = graph.node(node_id)
    return () if node.output_of is not None else node.inputs


def mutated(rng: random.Random, graph: Graph, schedule: Schedule) -> Schedule:
    """One random edit (drop, repeat, swap, stray free or page step, unknown node or impl): mostly illegal."""
    steps = list(schedule.steps)
    j = rng.randrange(len(steps))
    kind = rng.randrange(7)
    if kind == 0:
        del steps[j]
    elif kind == 1:
        steps.insert(rng.randrange(len(steps) + 1), steps[j])
    elif kind == 2 and j + 1 < len(steps):
        steps[j], steps[j + 1] = steps[j + 1], steps[j]
    elif kind == 3:
        steps.insert(j, Step(op="free", node=rng.choice(graph.nodes).id))
    elif kind == 4:
        steps.insert(j, Step(op=rng.choice(("page_out", "page_in")), node=rng.choice(graph.nodes).id))
    elif kind == 5:
        steps[j] = Step(op=steps[j].op, node=max(n.id for n in graph.nodes) + 1)
    else:
        steps[j] = Step(op="compute", node=steps[j].node, impl=rng.choice(("inplace", "fast", "nonexistent")))
    return Schedule(steps=tuple(steps))


# ============================================================================ checks
@dataclass
class GraphCase:
    """One fuzz case: the graph, its budget, where it came from and a folder for its files."""

    index: int
    graph: Graph
    budget: int
    rng: random.Random
    config: FuzzConfig
    workdir: Path


def _costs_equal(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= COST_RTOL * max(abs(a), abs(b))


def _one_line(exc: BaseException) -> bool:
    return isinstance(exc, CoopError) and "\n" not in str(exc).strip()


def _reproduce_solve(case: GraphCase, name: str) -> list[str]:
    command = ["coop", "solve", "GRAPH.json", "--budget", str(case.budget), "--formulation", name,
               "--time-limit", str(case.config.time_limit), "--threads", "1"]
    if name == "poet":
        setting = poet_setting(case)
        command += ["--device-profile", setting["device_profile"], "--objective", setting["objective"]]
    return command


@dataclass
class Solved:
    """A formulation's answer on one case, and the re-counted cost of its schedule when that fits the budget."""

    name: str
    result: Any  # SolveResult
    fitting_cost: float | None = None


def check_formulation(case: GraphCase, name: str, findings: Findings) -> Solved | None:
    """Run one formulation; check its schedule with the validator and the re-count. None when it raised."""
    from coop.formulations import get_formulation

    row = f"formulation {name}"
    findings.add(row, "graphs")
    options: dict[str, Any] = {"time_limit": case.config.time_limit, "threads": 1} if name in EXACT else {}
    if name == "poet":
        options.update(poet_setting(case))
    started = time.perf_counter()
    try:
        result = get_formulation(name)(case.graph, case.budget, **options)
    except Exception as exc:  # noqa: BLE001 - the benchmark counts what escapes
        if _one_line(exc):
            findings.add(row, "refused (CoopError)")
        else:
            findings.fail(row, "escaped", case.index, case.graph, _describe(exc), _reproduce_solve(case, name))
        return None
    finally:
        findings.add(row, "wall ms", round(1000 * (time.perf_counter() - started)))
    solved = Solved(name, result)
    if result.schedule is None:
        if result.status in ("optimal", "feasible"):
            findings.fail(row, "invalid", case.index, case.graph, f"status {result.status} with no schedule",
                          _reproduce_solve(case, name))
        else:
            findings.add(row, "infeasible/timeout")
        return solved
    findings.add(row, "returned")
    solved.fitting_cost = _check_returned(case, name, result, findings)
    return solved


def poet_setting(case: GraphCase) -> dict[str, Any]:
    """The device profile and objective poet runs with on this case (drawn from the case's seed)."""
    from coop.device_profiles import known_profiles

    rng = random.Random(f"poet/{case.config.seed}/{case.index}")
    return {"device_profile": rng.choice(sorted(known_profiles())), "objective": rng.choice(("energy", "time"))}


def priced_independently(graph: Graph, steps: tuple[Step, ...], setting: dict[str, Any]) -> float:
    """Energy (J) or time (s) of a legal schedule on a device profile, summed here step by step: a compute
    costs its implementation's graph cost read as seconds on the device, a page step the bytes of the copy it
    moves (the most recent compute's size), at the profile's latency, bandwidth and memory power."""
    from coop.device_profiles import load_device_profile

    profile = load_device_profile(setting["device_profile"])
    nodes = {n.id: n for n in graph.nodes}
    size = {v: n.mem for v, n in nodes.items()}
    seconds = joules = 0.0
    for j, step in enumerate(steps):
        if step.op == "compute":
            mem, cost, _ = _chosen_implementation(nodes[step.node], step.impl, j)
            size[step.node] = mem
            seconds += float(cost)
            joules += float(cost) * profile.flops_per_s / profile.flops_per_joule
        elif step.op in ("page_in", "page_out"):
            latency, rate = ((profile.pagein_latency_s, profile.pagein_bytes_per_s) if step.op == "page_in"
                             else (profile.pageout_latency_s, profile.pageout_bytes_per_s))
            moved = latency + size[step.node] / rate
            seconds += moved
            joules += moved * profile.memory_power_w
    return joules if setting["objective"] == "energy" else seconds


def _check_returned(case: GraphCase, name: str, result: Any, findings: Findings) -> float | None:
    """Count the schedule valid, over budget or failing; its re-counted cost when it is legal and fits."""
    row = f"formulation {name}"
    reproduce = _reproduce_solve(case, name)
    claims_fit = result.status in ("optimal", "feasible") or result.extra.get("fits") is True
    verdict = validate(case.graph, result.schedule, case.budget)
    try:
        counted = recount(case.graph, result.schedule.steps)
    except IllegalSchedule as exc:
        column = "invalid" if verdict.peak is None else "recount mismatch"
        findings.fail(row, column, case.index, case.graph, f"re-count: illegal ({exc}); validator: {verdict.reason}",
                      reproduce)
        return None
    if verdict.peak is None:
        findings.fail(row, "invalid", case.index, case.graph, f"validator: {verdict.reason}", reproduce)
        return None
    predicted = result.simulation
    claims = [("validator", verdict.peak, verdict.cost)]
    if predicted is not None:
        claims.append(("formulation", predicted.peak, predicted.cost))
    if name == "poet" and result.objective is not None:
        priced = priced_independently(case.graph, result.schedule.steps, poet_setting(case))
        if not _costs_equal(priced, result.objective):
            findings.fail(row, "recount mismatch", case.index, case.graph,
                          f"objective {result.objective!r}, priced here {priced!r}", reproduce)
            return None
    elif result.objective is not None:
        claims.append(("objective", counted.peak, result.objective))
    for source, peak, cost in claims:
        if peak != counted.peak or not _costs_equal(cost, counted.cost):
            findings.fail(row, "recount mismatch", case.index, case.graph,
                          f"{source} says peak {peak} cost {cost!r}, re-count peak {counted.peak} cost {counted.cost!r}",
                          reproduce)
            return None
    own = priced if name == "poet" and result.objective is not None else counted.cost
    if result.bound is not None and result.bound > own + 1e-6 * max(1e-12, abs(own)):
        findings.fail(row, "claim contradicted", case.index, case.graph,
                      f"lower bound {result.bound!r} above the cost {own!r} of its own schedule", reproduce)
    if counted.peak <= case.budget:
        findings.add(row, "valid")
        if result.extra.get("fits") is False:
            findings.fail(row, "recount mismatch", case.index, case.graph,
                          f"says it does not fit, re-count peak {counted.peak} <= budget {case.budget}", reproduce)
        return counted.cost
    if claims_fit:
        findings.fail(row, "invalid", case.index, case.graph,
                      f"status {result.status} claims the budget {case.budget}; re-count peak {counted.peak}", reproduce)
    else:
        findings.add(row, "over budget (said so)")
    return None


def first_computes_follow_order(graph: Graph, schedule: Schedule) -> bool:
    """Whether the schedule's first computations (extra outputs aside) come in ``graph.order``: the space of
    Moccasin's proofs on training graphs (``keep_order``)."""
    extras = {n.id for n in graph.nodes if n.output_of is not None}
    seen: set[int] = set()
    firsts = []
    for step in schedule.steps:
        if step.op == "compute" and step.node not in seen:
            seen.add(step.node)
            if step.node not in extras:
                firsts.append(step.node)
    return firsts == [v for v in graph.order if v not in extras]


def in_checkmate_space(graph: Graph, schedule: Schedule) -> bool:
    """Whether the schedule lies in Checkmate's space: frontier-advancing over ``prompt_order(graph)`` (stage t
    recomputes earlier nodes, each at most once and in order, then computes node t for the first time, so
    nothing is computed after the last node's first computation), where the stage of an extra output holds
    nothing else and its op is still resident (coop.formulations.checkmate.milp takes extra outputs promptly)."""
    position = {v: p for p, v in enumerate(prompt_order(graph))}
    frontier, last = -1, -1
    freed_since_frontier: set[int] = set()
    for step in schedule.steps:
        if step.op == "free":
            freed_since_frontier.add(step.node)
        if step.op != "compute":
            continue
        p = position[step.node]
        op = graph.node(step.node).output_of
        if p > frontier:
            if p != frontier + 1 or (op is not None and (last != -1 or op in freed_since_frontier)):
                return False
            frontier, last = p, -1
            freed_since_frontier = set()
        elif p <= last or frontier == len(position) - 1:
            return False
        else:
            last = p
    return frontier == len(position) - 1


def proof_space(name: str, graph: Graph) -> Any:
    """The schedules that formulation ``name``'s proofs (infeasible, bound, optimal) speak about; None when not
    checked here (monet's interval model above its stage MILP's size)."""
    if name == "moccasin":
        return first_computes_follow_order if graph.has_backward else (lambda _graph, _schedule: True)
    if name == "monet" and len(prompt_order(graph)) > MONET_STAGE_POSITIONS:
        return None
    # checkmate, checkmate-lp, auto (which proves with checkmate), monet's stage MILP (Checkmate's space where
    # each compute also chooses an implementation: the default is one choice) and poet (Checkmate's space plus
    # paging; only its "infeasible" claims are checked, its bound is in joules or seconds)
    return in_checkmate_space


def cross_check(case: GraphCase, answers: list[Solved], findings: Findings) -> None:
    """Proofs against schedules: "infeasible" and lower bounds must hold for every schedule within the budget that
    any formulation found in the space the proof covers."""
    fitting = [a for a in answers if a.fitting_cost is not None]
    for answer in answers:
        result, row = answer.result, f"formulation {answer.name}"
        bound = result.bound if result.bound is not None else (result.objective if result.status == "optimal" else None)
        if answer.name == "poet":
            bound = None  # joules or seconds, not the graph's cost
        if result.status != "infeasible" and bound is None:
            continue
        space = proof_space(answer.name, case.graph)
        if space is None:
            continue
        witnesses = [w for w in fitting if space(case.graph, w.result.schedule)
                     and _within_kind(w.result.schedule, implementations=answer.name == "monet")]
        if not witnesses:
            continue
        cheapest = min(witnesses, key=lambda w: w.fitting_cost)
        if result.status == "infeasible":
            detail = f"says infeasible ({result.message}); {cheapest.name} found a schedule within the budget"
        elif cheapest.fitting_cost < bound - 1e-6 * max(1e-12, abs(bound)):
            detail = (f"status {result.status}, bound {bound!r}; {cheapest.name} found cost {cheapest.fitting_cost!r} "
                      "within the budget")
        else:
            continue
        findings.fail(row, "claim contradicted", case.index, case.graph, detail, _reproduce_solve(case, answer.name))


def _within_kind(schedule: Schedule, implementations: bool) -> bool:
    """Whether a witness is a schedule the proof speaks about: no paging (no proof covers it), and no
    implementation choice unless the proof is monet's."""
    return all(step.op not in ("page_in", "page_out") and (implementations or step.impl is None)
               for step in schedule.steps)


def check_policy(case: GraphCase, policy: str, findings: Findings) -> list[Schedule]:
    """Run one online policy; when it claims to have run, its schedule must be legal and within budget."""
    from coop.online.online_sim import simulate_online

    row = f"online {policy}"
    reproduce = ["coop", "simulate", "GRAPH.json", "--policy", policy, "--budget", str(case.budget)]
    findings.add(row, "graphs")
    started = time.perf_counter()
    try:
        result = simulate_online(case.graph, case.budget, policy)
    except Exception as exc:  # noqa: BLE001 - the benchmark counts what escapes
        if _one_line(exc):
            findings.add(row, "refused (CoopError)")
        else:
            findings.fail(row, "escaped", case.index, case.graph, _describe(exc), reproduce)
        return []
    finally:
        findings.add(row, "wall ms", round(1000 * (time.perf_counter() - started)))
    findings.add(row, f"status {result.status}")
    if result.schedule is None:
        findings.add(row, "infeasible/timeout")
        return []
    findings.add(row, "returned")
    replayed = case.graph.with_random_replay()  # online engines replay random ops from their saved RNG state
    verdict = validate(replayed, result.schedule, case.budget)
    try:
        counted = recount(replayed, result.schedule.steps)
    except IllegalSchedule as exc:
        findings.fail(row, "invalid", case.index, case.graph, f"re-count: illegal ({exc}); validator: {verdict.reason}",
                      reproduce)
        return []
    if not verdict.ok or counted.peak > case.budget or result.peak > case.budget:
        findings.fail(row, "invalid", case.index, case.graph,
                      f"status {result.status}: arena peak {result.peak}, re-count peak {counted.peak}, budget "
                      f"{case.budget}; validator: {verdict.reason or 'ok'}", reproduce)
        return []
    if verdict.peak != counted.peak or not _costs_equal(result.cost, counted.cost):
        findings.fail(row, "recount mismatch", case.index, case.graph,
                      f"validator peak {verdict.peak}, policy cost {result.cost!r}; re-count peak {counted.peak} cost "
                      f"{counted.cost!r}", reproduce)
        return []
    findings.add(row, "valid")
    return []  # online schedules are checked on the replay graph; variants use the static ones


def check_variants(case: GraphCase, schedules: list[Schedule], findings: Findings) -> None:
    """Differential test of the simulator against the re-count on schedules no formulation writes yet."""
    if not schedules:
        return
    rng = case.rng
    paging = PagingCosts(latency=rng.choice((0.0, 1e-6, 3.0)), bandwidth=rng.choice((float("inf"), 1e9, 250.0)))
    base = rng.choice(schedules)
    variants = {"implementations": with_implementations(rng, case.graph, base),
                "paging": with_paging(rng, case.graph, base)}
    variants["implementations + paging"] = with_paging(rng, case.graph, variants["implementations"])
    for k in range(3):
        variants[f"mutation {k}"] = mutated(rng, case.graph, base)
    for label, schedule in variants.items():
        row = f"variants: {label.split(' ')[0] if label.startswith('mutation') else label}"
        findings.add(row, "tried")
        _compare_with_simulator(case, row, schedule, paging, findings)


def _compare_with_simulator(case: GraphCase, row: str, schedule: Schedule, paging: PagingCosts,
                            findings: Findings) -> None:
    reproduce = ["coop", "validate", "GRAPH.json", "SCHEDULE.json"]
    try:
        simulated = simulate(case.graph, schedule, paging)
    except CoopError as exc:
        simulated = exc
    except Exception as exc:  # noqa: BLE001
        findings.fail(row, "escaped", case.index, case.graph, _describe(exc), reproduce)
        return
    try:
        counted: Recount | IllegalSchedule = recount(case.graph, schedule.steps, paging)
    except IllegalSchedule as exc:
        counted = exc
    if isinstance(simulated, CoopError) and isinstance(counted, IllegalSchedule):
        findings.add(row, "both illegal")
        return
    if isinstance(simulated, CoopError) or isinstance(counted, IllegalSchedule):
        findings.fail(row, "disagree", case.index, case.graph,
                      f"simulator: {simulated}; re-count: {counted}; schedule: {schedule.model_dump_json()}", reproduce)
        return
    if simulated.peak != counted.peak or not _costs_equal(simulated.cost, counted.cost):
        findings.fail(row, "disagree", case.index, case.graph,
                      f"simulator peak {simulated.peak} cost {simulated.cost!r}, re-count peak {counted.peak} cost "
                      f"{counted.cost!r} ({paging}); schedule: {schedule.model_dump_json()}", reproduce)
        return
    findings.add(row, "both legal, equal")


# ============================================================================ corrupted files
def networkx_documents(graph: Graph) -> dict[str, dict[str, Any]]:
    """The graph in both networkx node-link layouts, when it has nothing those layouts cannot carry."""
    plain = all(n.kind in ("forward", "backward") and not n.impls and n.output_of is None and n.workspace == 0
                and n.recomputable for n in graph.nodes) and not graph.outputs
    if not plain:
        return {}
    links = [(s, n.id) for n in graph.nodes for s in n.inputs]
    return {
        "random layered": {"directed": True, "multigraph": False, "graph": {"name": graph.name, "order": list(graph.order)},
                           "nodes": [{"name": n.id, "out_cost": n.mem, "param_cost": 0, "duration": n.cost}
                                     for n in graph.nodes],
                           "links": [{"0": s, "1": t} for s, t in links]},
        "checkmate": {"directed": True, "multigraph": False, "graph": {"name": graph.name},
                      "nodes": [{"id": n.id, "name": n.name, "backward": n.kind == "backward", "cost_cpu": n.cost,
                                 "cost_ram": n.mem} for n in graph.nodes],
                      "links": [{"source": s, "target": t} for s, t in links]},
    }


def check_corruptions(case: GraphCase, findings: Findings) -> None:
    """Corrupt the graph file (every layout it has) and a schedule file; each must succeed or fail in one line."""
    from coop.graph_files import load_graph

    corruptions, must_fail = load_corruptions()
    graph_path = case.workdir / "graph.json"
    schedule_path = case.workdir / "schedule.json"
    bad_path = case.workdir / "corrupted.json"
    graph_path.write_text(case.graph.to_json())
    schedule = Schedule.from_order(case.graph.order)
    schedule_doc = schedule_to_json(case.graph, schedule, budget=baseline_peak(case.graph), formulation="store-all")
    schedule_path.write_text(json.dumps(schedule_doc))
    documents = {"coop": case.graph.to_dict(), **networkx_documents(case.graph)}
    for layout, document in documents.items():
        for corruption, payload in corruptions(document, case.rng):
            bad_path.write_bytes(payload)
            refuse = corruption in must_fail
            _try_load(case, f"corrupt graph ({layout}): load_graph", lambda: load_graph(bad_path), corruption, refuse,
                      findings)
            for label, argv in (
                ("coop info", ["info", str(bad_path)]),
                ("coop solve", ["solve", str(bad_path), "--budget", "90%", "--formulation", "store-all",
                                "-o", str(case.workdir / "out.json")]),
                ("coop validate", ["validate", str(bad_path), str(schedule_path)]),
            ):
                _try_cli(case, f"corrupt graph ({layout}): {label}", argv, corruption, refuse, findings)
    for corruption, payload in corruptions(schedule_doc, case.rng):
        bad_path.write_bytes(payload)
        _try_cli(case, "corrupt schedule: coop validate", ["validate", str(graph_path), str(bad_path)], corruption,
                 corruption in must_fail, findings)


def _try_load(case: GraphCase, row: str, load: Any, corruption: str, must_fail: bool, findings: Findings) -> None:
    findings.add(row, "tried")
    try:
        load()
    except Exception as exc:  # noqa: BLE001 - the benchmark counts what escapes
        if _one_line(exc):
            findings.add(row, "handled (one-line error)")
        else:
            findings.fail(row, "escaped", case.index, case.graph, f"{corruption}: {_describe(exc)}",
                          *_load_reproducer(case))
        return
    _succeeded(case, row, corruption, must_fail, findings, *_load_reproducer(case))


def _load_reproducer(case: GraphCase) -> tuple[list[str], dict[str, bytes]]:
    return (["python", "-c", "import coop; coop.load_graph('corrupted.json')"],
            {"corrupted.json": (case.workdir / "corrupted.json").read_bytes()})


def _succeeded(case: GraphCase, row: str, corruption: str, must_fail: bool, findings: Findings,
               reproduce: list[str], files: dict[str, bytes] | None = None) -> None:
    """A corrupted file accepted: fine unless tests/corruptions.py says this corruption always breaks it."""
    if must_fail:
        findings.fail(row, "accepted (must fail)", case.index, case.graph, f"{corruption}: accepted", reproduce, files)
    else:
        findings.add(row, "succeeded")


def _try_cli(case: GraphCase, row: str, argv: list[str], corruption: str, must_fail: bool, findings: Findings) -> None:
    from coop.cli import main as cli_main

    findings.add(row, "tried")
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: main must return, not raise
        findings.fail(row, "escaped", case.index, case.graph, f"{corruption}: coop {' '.join(argv)} raised "
                      f"{_describe(exc)}", *_cli_reproducer(case, argv))
        return
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if code not in (0, 1, 2) or len(lines) > 1 or "Traceback" in err.getvalue():
        findings.fail(row, "escaped", case.index, case.graph,
                      f"{corruption}: exit {code}, stderr {err.getvalue()[-300:]!r}", *_cli_reproducer(case, argv))
        return
    if code == 0:
        _succeeded(case, row, corruption, must_fail, findings, *_cli_reproducer(case, argv))
    else:
        findings.add(row, {1: "verdict (exit 1)", 2: "handled (one-line error)"}[code])


def _cli_reproducer(case: GraphCase, argv: list[str]) -> tuple[list[str], dict[str, bytes]]:
    """The command with the case's files named by their own names, and those files' bytes."""
    files = {path.name: path.read_bytes() for path in case.workdir.iterdir() if path.suffix == ".json"}
    command = ["coop", *(Path(a).name if a.startswith(str(case.workdir)) else a for a in argv)]
    return command, files


def load_corruptions() -> tuple[Any, frozenset[str]]:
    """``corruptions(valid_doc, rng)`` and the names that must always be refused, from tests/corruptions.py."""
    from corruptions import MUST_FAIL, corruptions

    return corruptions, MUST_FAIL


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


# ============================================================================ one graph, many graphs
def fuzz_one(task: tuple[FuzzConfig, int, str]) -> Findings:
    """Everything the benchmark does to graph ``index`` (runs in a worker process)."""
    config, index, scratch = task
    workdir = Path(scratch) / f"worker{os.getpid()}"  # one folder per process: its files are rewritten per case
    workdir.mkdir(exist_ok=True)
    findings = Findings()
    try:
        graph = make_graph(config.seed, index, config.max_nodes)
    except Exception as exc:  # noqa: BLE001 - a generator bug must not stop the run
        findings.add("generator", "failed")
        findings.failures.append({"row": "generator", "column": "failed", "index": index, "detail": _describe(exc),
                                  "graph": None, "reproduce": []})
        return findings
    rng = random.Random(f"case/{config.seed}/{index}")
    case = GraphCase(index, graph, draw_budget(rng, graph), rng, config, workdir)
    findings.add("graphs", "layered" if graph.meta.get("mem_unit") == "units" else "training-shaped")
    findings.add("graphs", "nodes", len(graph.nodes))
    findings.add("graphs", "with extra outputs", int(bool(graph.extra_outputs)))
    findings.add("graphs", "with random ops", int(bool(graph.random_draws)))
    findings.add("graphs", "with impls", int(any(n.impls for n in graph.nodes)))
    exact = rng.random() < config.exact_fraction
    answers: list[Solved] = []
    for name in _formulations():
        if name in NEEDS_CAPTURE:
            findings.add(f"formulation {name}", f"skipped: {NEEDS_CAPTURE[name]}")
        elif name not in EXACT or exact:
            answer = check_formulation(case, name, findings)
            answers += [answer] if answer is not None else []
    cross_check(case, answers, findings)
    for policy in _policies():
        check_policy(case, policy, findings)
    check_variants(case, [a.result.schedule for a in answers if a.result.schedule is not None], findings)
    if rng.random() < config.corrupt_fraction:
        check_corruptions(case, findings)
    return findings


def _formulations() -> list[str]:
    from coop.formulations import FORMULATIONS

    return list(FORMULATIONS)


def _policies() -> list[str]:
    from coop.online.policies import POLICIES

    return list(POLICIES)


def fuzz(config: FuzzConfig, progress: bool = True) -> tuple[Findings, float]:
    """Run ``config.count`` graphs over ``config.workers`` processes; returns the findings and the wall time."""
    findings = Findings()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_fuzz_") as scratch:
        tasks = [(config, index, scratch) for index in range(config.count)]
        if config.workers <= 1:
            results: Iterator[Findings] = map(fuzz_one, tasks)
            _run_all(results, findings, config, started, progress)
        else:
            # fork: the workers inherit the imported modules (run_all loads this file under its own name)
            context = multiprocessing.get_context("fork")
            with context.Pool(config.workers, maxtasksperchild=500) as pool:
                _run_all(pool.imap(fuzz_one, tasks, chunksize=1), findings, config, started, progress)
    return findings, time.perf_counter() - started


def _run_all(results: Iterator[Findings], findings: Findings, config: FuzzConfig, started: float,
             progress: bool) -> None:
    last = started
    for done, result in enumerate(results, start=1):
        findings.merge(result)
        now = time.perf_counter()
        if progress and (now - last > 15 or done == config.count):
            last = now
            rate = done / (now - started)
            print(f"bench_fuzz: {done}/{config.count} graphs, {rate:.2f} graphs/s, eta "
                  f"{(config.count - done) / rate / 60:.1f} min, failures {failure_count(findings)}", file=sys.stderr,
                  flush=True)


# ============================================================================ the report
#: Columns of the main table (formulations and online policies) and of the two tables in the notes.
RUN_COLUMNS = ("graphs", "returned", "valid", "over budget (said so)", "invalid", "recount mismatch",
               "claim contradicted", "infeasible/timeout", "refused (CoopError)", "escaped")
VARIANT_COLUMNS = ("tried", "both legal, equal", "both illegal", "disagree", "escaped")
CORRUPTION_COLUMNS = ("tried", "handled (one-line error)", "verdict (exit 1)", "succeeded", "accepted (must fail)",
                      "escaped")
FAILURE_COLUMNS = ("invalid", "recount mismatch", "claim contradicted", "disagree", "accepted (must fail)", "escaped")


def table_rows(findings: Findings, prefix: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per tallied label that starts with ``prefix``, with these columns (0 where none was counted)."""
    rows: list[dict[str, Any]] = []
    for label in sorted(k for k in findings.rows if k.startswith(prefix)):
        counts = findings.rows[label]
        row: dict[str, Any] = {"checked": label.removeprefix(prefix).strip(": ") or label}
        row.update({column: counts.get(column, 0) for column in columns})
        if "wall ms" in counts and counts.get("graphs"):
            row["mean wall ms"] = round(counts["wall ms"] / counts["graphs"], 1)
        statuses = sorted(k for k in counts if k.startswith("status "))
        notes = [f"{k.removeprefix('status ')} {counts[k]}" for k in statuses]
        notes += [f"{k} ({counts[k]} graphs)" for k in counts if k.startswith("skipped")]
        if notes:
            row["note"] = ", ".join(notes)
        rows.append(row)
    return rows


def failure_count(findings: Findings) -> int:
    return sum(counts.get(column, 0) for counts in findings.rows.values() for column in FAILURE_COLUMNS)


def report_notes(findings: Findings, config: FuzzConfig, wall_s: float) -> str:
    """What ran, how fast, what the columns mean, the variant and corruption tables, and the first failures."""
    from run_all import markdown_table

    graphs = findings.rows.get("graphs", Counter())
    count = graphs.get("layered", 0) + graphs.get("training-shaped", 0)
    rate = count / wall_s if wall_s else 0.0
    lines = [
        (f"{count} graphs ({graphs.get('layered', 0)} random layered, {graphs.get('training-shaped', 0)} "
        f"training-shaped; mean {graphs.get('nodes', 0) / max(1, count):.1f} nodes, at most {config.max_nodes}; "
        f"{graphs.get('with extra outputs', 0)} with multi-output ops, {graphs.get('with random ops', 0)} with "
        f"random ops, {graphs.get('with impls', 0)} with implementations), seed {config.seed}, {config.workers} "
        f"workers: {wall_s:.0f} s, **{rate:.2f} graphs/s**. The exact formulations ({', '.join(EXACT)}; time limit "
        f"{config.time_limit:g} s, 1 thread) ran on a seeded {config.exact_fraction:.0%} of the graphs, the others "
        f"on all; corruptions on a seeded {config.corrupt_fraction:.0%}."),
        "",
        ("valid: the validator accepts the schedule and the independent re-count's peak is within the budget; "
        "invalid: illegal, or over the budget while its status claims the budget (online: status ok or thrashed "
        "with a schedule); recount mismatch: peak or cost differs from what the formulation, its objective, the "
        "validator or the policy said; claim contradicted: a proof (infeasible, a lower bound, optimal) that a "
        "schedule within the budget refutes (its own, or any formulation's schedule in the space the proof covers: "
        "Checkmate's frontier-advancing schedules; for Moccasin on training graphs first computations in "
        "graph.order, else every schedule; monet's stage MILP (up to 40 positions) the same space with "
        "implementation choice; poet's infeasible claims only, its bound being joules or seconds; witnesses that "
        "page, or choose implementations for a proof other than monet's, refute nothing), at 1e-6 relative; poet's "
        "objective is re-priced here on its device profile (drawn per graph; energy or time); over budget (said "
        "so): a baseline's schedule returned with extra['fits'] False; infeasible/timeout: no schedule "
        "(infeasible, unknown, oom, thrashed and stopped). Online schedules are checked on "
        "graph.with_random_replay(), the graph the online engines plan on."),
        "",
        ("Schedule variants, through coop.simulate and the re-count, which must agree on legality, peak and "
        "cost: implementations (MONeT impls) named on computes at random, page_out/page_in pairs priced by "
        "PagingCosts, and one random edit (mostly illegal)."),
        "",
        markdown_table(table_rows(findings, "variants", VARIANT_COLUMNS)),
        ("Corrupted files (tests/corruptions.py) through coop.load_graph and the CLI in-process: handled = a "
        "one-line CoopError (CLI: exit 2, one stderr line); verdict = exit 1 with one line (e.g. no schedule fits); "
        "accepted (must fail) = loaded or exit 0 although tests/corruptions.py lists the corruption in MUST_FAIL; "
        "escaped = any other exception, exit 3, a traceback or more than one stderr line."),
        "",
        markdown_table(table_rows(findings, "corrupt", CORRUPTION_COLUMNS)),
        f"**{failure_count(findings)} failures** ({' + '.join(FAILURE_COLUMNS)}).",
    ]
    for failure in findings.failures[:8]:
        lines.append(f"- {failure['row']} / {failure['column']} on graph {failure['index']}: {failure['detail'][:300]}")
    return "\n".join(lines)


def save_failures(findings: Findings, folder: Path = FAILURES_DIR, limit: int = 50) -> list[Path]:
    """Write each failure's graph, the other files it reads and the command that reproduces it (at most ``limit``)."""
    written: list[Path] = []
    if not findings.failures:
        return written
    folder.mkdir(parents=True, exist_ok=True)
    for k, failure in enumerate(findings.failures[:limit]):
        if failure["graph"] is None:
            continue
        prefix = folder / f"failure{k}_graph{failure['index']}"
        graph_file = Path(f"{prefix}.json")
        graph_file.write_text(json.dumps(failure["graph"], indent=1) + "\n")
        renamed = {"GRAPH.json": str(graph_file)}
        for name, payload in failure.get("files", {}).items():
            Path(f"{prefix}_{name}").write_bytes(payload)
            renamed[name] = f"{prefix}_{name}"
        command = [renamed.get(part, part) for part in failure["reproduce"]]
        if command[:2] == ["python", "-c"]:
            command[2] = command[2].replace("'corrupted.json'", repr(renamed.get("corrupted.json", "corrupted.json")))
        Path(f"{prefix}.txt").write_text(f"{failure['row']} / {failure['column']}\n{failure['detail']}\n"
                                         f"{shlex.join(command)}\n")
        written.append(graph_file)
    return written


def run(quick: bool = False, config: FuzzConfig | None = None, progress: bool = True) -> dict[str, Any]:
    """Rows and notes for BENCHMARKS.md (``quick``: 200 graphs)."""
    config = config or FuzzConfig(count=QUICK_COUNT if quick else DEFAULT_COUNT)
    findings, wall_s = fuzz(config, progress)
    save_failures(findings)
    rows = table_rows(findings, "formulation", RUN_COLUMNS) + table_rows(findings, "online", RUN_COLUMNS)
    return {"rows": rows, "notes": report_notes(findings, config, wall_s)}


def main(argv: list[str] | None = None) -> int:
    """Command line: run, print the table, write the section of BENCHMARKS.md with this command."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help="graphs to draw (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default %(default)s)")
    parser.add_argument("--max-nodes", type=int, default=60, help="largest graph (default %(default)s)")
    parser.add_argument("--time-limit", type=float, default=2.0, help="seconds per exact solve (default %(default)s)")
    parser.add_argument("--exact-fraction", type=float, default=DEFAULT_EXACT_FRACTION,
                        help="share of the graphs the exact formulations run on (default %(default)s)")
    parser.add_argument("--corrupt-fraction", type=float, default=DEFAULT_CORRUPT_FRACTION,
                        help="share of the graphs whose files are corrupted (default %(default)s)")
    parser.add_argument("--no-report", action="store_true", help="do not write BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.count < 1 or args.workers < 1 or args.max_nodes < 3 or args.time_limit <= 0:
        parser.error("--count and --workers must be at least 1, --max-nodes at least 3, --time-limit positive")
    config = FuzzConfig(args.count, args.seed, args.workers, args.max_nodes, args.time_limit, args.exact_fraction,
                        args.corrupt_fraction)
    import run_all

    outcome = run_all.Outcome(name="bench_fuzz", summary=__doc__.splitlines()[0], started=dt.datetime.now().astimezone())
    clock = time.perf_counter()
    produced = run(config=config)
    outcome.rows, outcome.notes = produced["rows"], produced["notes"]
    outcome.wall_s = time.perf_counter() - clock
    outcome.command = "python benchmarks/bench_fuzz.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(run_all.markdown_table(outcome.rows))
    print(outcome.notes)
    if not args.no_report:
        run_all.write_report({"bench_fuzz": run_all.render_section(outcome, run_all.machine_description(), False)},
                             run_all.DEFAULT_OUTPUT)
    return 1 if "**0 failures**" not in outcome.notes else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
