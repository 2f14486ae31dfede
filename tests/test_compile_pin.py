"""coop.compiled.pin: the compiled step runs coop's recomputations where the schedule put them.

Oracles: the generated backward code (inductor's own output: the order of its kernel calls and which buffers they
write), the CPU allocator's report of the compiled step (:func:`coop.compiled.measure.held_bytes`), eager PyTorch's
gradients, and hand-built dependency lists ordered by hand.
"""

from __future__ import annotations

import copy
import importlib
import re
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import fx, nn
from torch._inductor.utils import run_and_get_code

import coop
from coop.compiled.measure import held_bytes
from coop.compiled.order import ORDER
from coop.compiled.pin import kernel_ranks, pinned_order
from tests.test_compile_observed import Tied, _caller_owned

partitioner_module = importlib.import_module("coop.compiled.partitioner")


# ---------------------------------------------------------------------------------------------- hand-built kernels
@dataclass(frozen=True)
class _Dep:
    name: str


class _Kernel:
    """What :func:`pinned_order` reads of a scheduler node: its name, buffers, dependencies and origins' ranks."""

    def __init__(self, name: str, rank: int | None, reads: tuple[str, ...] = ()) -> None:
        self.name = name
        self.unmet_dependencies = {_Dep(r) for r in reads}
        origin = fx.Graph().placeholder(name)
        origin.meta["custom"] = {} if rank is None else {ORDER: rank}
        self.node = type("IR", (), {"origins": {origin}})()

    def get_name(self) -> str:
        return self.name

    def get_buffer_names(self) -> set[str]:
        return {self.name}

    def get_nodes(self) -> list[Any]:
        return [self]


def test_kernels_run_in_coops_rank_order_within_their_dependencies() -> None:
    """Inductor's order puts the recomputation ``r`` (ranked 3, reading only inputs) first; the pin runs it after
    ``b`` (ranked 2). A copy inductor added (no rank) runs right before its reader; a kernel ranked below a
    producer it depends on waits for it, and is counted as displaced."""
    a, b = _Kernel("a", 0), _Kernel("b", 2, ("a",))
    r, copy_ = _Kernel("r", 3), _Kernel("copy", None, ("r",))
    c = _Kernel("c", 4, ("b", "copy"))
    nodes = [r, copy_, a, b, c]
    order, displaced = pinned_order(nodes, kernel_ranks(nodes))
    assert [n.name for n in order] == ["a", "b", "r", "copy", "c"] and displaced == 0
    late, early = _Kernel("late", 5), _Kernel("early", 1, ("late",))
    nodes = [late, early, _Kernel("mid", 3)]
    order, displaced = pinned_order(nodes, kernel_ranks(nodes))
    assert [n.name for n in order] == ["mid", "late", "early"] and displaced == 1


# ---------------------------------------------------------------------------------------------- the compiled step
@dataclass
class Step:
    """The tied MLP at 0.5 under measured prices, one schedule compiled with and without the pin."""

    model: nn.Module
    pinned: nn.Module
    pinned_code: str
    loose_code: str
    held_pinned: int
    held_loose: int


def _compile(batch: torch.Tensor, pin: bool) -> tuple[nn.Module, nn.Module, str]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Tied()
    holder: dict[str, nn.Module] = {}

    def build() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                holder["c"] = coop.compile(model, 0.5, time_limit=10, threads=1, example_batch=batch, rounds=1,
                                           pricing="measured", pin=pin)
            except coop.OverBudgetError as over:  # one round, unpinned, misses (the comparison needs its step)
                holder["c"] = over.compiled

    _, codes = run_and_get_code(build)
    code = next(c for c in reversed(codes) if "tangents_1" in c)  # the backward's module
    return model, holder["c"], code[code.index("def call"):]


@pytest.fixture(scope="module")
def step() -> Step:
    """Both compilations (the solver's first schedule reused for the second, so the pin is the only difference)."""
    solve, solved = partitioner_module.solve, {}

    def same_schedule(graph: Any, budget: int, formulation: str, **kwargs: Any) -> Any:
        key = (len(graph.nodes), budget)
        if key not in solved:
            solved[key] = solve(graph, budget, formulation, **kwargs)
        return solved[key]

    batch = torch.randn(1024, 64)
    partitioner_module.solve = same_schedule
    try:
        model, pinned, pinned_code = _compile(batch, pin=True)
        held_pinned = held_bytes(pinned, batch, None) + _caller_owned(pinned)
        _, loose, loose_code = _compile(batch, pin=False)
        held_loose = held_bytes(loose, batch, None) + _caller_owned(loose)
    finally:
        partitioner_module.solve = solve
    return Step(model, pinned, pinned_code, loose_code, held_pinned, held_loose)


def _order_breaks(code: str, emitted: fx.Graph) -> list[str]:
    """Each matmul of the generated backward whose operand's buffer was written before a matmul coop ranked before
    that operand's computation (the operand was computed earlier than coop's schedule put it)."""
    rank = {n.name: (n.meta.get("custom") or {}).get(ORDER) for n in emitted.nodes}
    lines = code.splitlines()
    matmuls = []  # (line, fx name, its rank, the rank of its latest ranked operand, operand buffers)
    for i, line in enumerate(lines):
        if "extern_kernels." not in line or "Source Nodes" in line:
            continue
        names = re.search(r"Source Nodes: \[([^]]*)\]", lines[i - 1])
        name = names.group(1).split(", ")[-1] if names else None
        if name not in rank or rank[name] is None:
            continue
        node = next(n for n in emitted.nodes if n.name == name)
        operand_ranks = [rank[_base(a).name] for a in node.all_input_nodes if rank.get(_base(a).name) is not None]
        buffers = set(re.findall(r"\b(buf\d+)\b", line.split("out=")[0]))
        matmuls.append((i, name, rank[name], max(operand_ranks, default=-1), buffers))
    breaks = []
    for line, name, _, operand_rank, buffers in matmuls:
        for buffer in buffers:
            written = next((j for j in range(line) if re.match(rf"\s*{buffer} = ", lines[j])), None)
            if written is None:
                continue
            between = [m for m in matmuls if written < m[0] < line and m[2] < operand_rank]
            breaks += [f"{name} reads {buffer} (operand rank {operand_rank}) written before {m[1]} (rank {m[2]})"
                       for m in between]
    return breaks


def _base(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and getattr(node.target, "is_view", False):
        node = node.all_input_nodes[0]
    return node


@pytest.mark.slow
def test_the_generated_backward_computes_each_matmul_operand_after_the_matmuls_coop_ranked_before_it(
        step: Step) -> None:
    """In inductor's generated backward, no matmul's operand buffer is written before a matmul coop ran before
    that operand's computation; the pin refused at least one fusion that would have done so, and broke no rank.
    Gradients are eager's."""
    record = step.pinned.coop_record
    emitted = record.plans[0].partition.emitted_backward
    assert _order_breaks(step.pinned_code, emitted) == [], step.pinned_code
    assert record.pin is not None and record.pin.guard is not None
    assert sum(map(len, record.pin.guard.refused)) >= 1 and sum(record.pin.displaced) == 0
    eager = copy.deepcopy(step.model)
    for p in (*step.model.parameters(), *eager.parameters()):
        p.grad = None
    batch = torch.randn(1024, 64)
    step.pinned(batch).backward()
    eager(batch).backward()
    for mine, theirs in zip(step.model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_pinned_step_holds_what_the_plan_allows(step: Step) -> None:
    """The CPU allocator's peak of the pinned step (weights and batch added) is within the plan's budget; where the
    same schedule without the pin computed an operand early, it held more (2,770,184 against 2,262,536 B, plan
    2,258,436 B, budget 2,277,892 B when written)."""
    plan = step.pinned.coop_record.plans[0]
    assert step.held_pinned <= plan.requested, (step.held_pinned, plan.peak, plan.requested)
    emitted = plan.partition.emitted_backward
    if _order_breaks(step.loose_code, emitted):
        assert step.held_pinned < step.held_loose, (step.held_pinned, step.held_loose)
