"""``auto`` climbs its ladder before it gives up (issue 24): a reordering that fits is found, not refused.

The conv net below (56 nodes) has a least budget (min_budget) at 0.697 of its baseline peak. At 0.7 no
recomputation in the captured order fits (Checkmate's space: every baseline and Checkmate's MILP fail),
while storing everything in the deferred order does (Moccasin's space). ``auto`` used to stop after
Checkmate and report the budget infeasible.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import coop
from coop.budget import baseline_peak, min_budget
from coop.errors import InfeasibleError
from coop.formulations import BASELINES, solve
from coop.formulations.core.result import SolveResult
from coop.formulations.ladder.auto import cheapest_fitting_baseline, formulation_ladder
from coop.graph import Graph, Node
from coop.schedule import validate
from coop.zoo import build
from tests.auto_oracle import compare_auto
from tests.eager_oracle import assert_step_equals_eager
from tests.strategies import random_graphs
from tests.test_bruteforce_oracle import _eight_nodes_least_peak_57 as eight_nodes_least_peak_57
from tests.test_options_contract import chain as training_chain

GRAPHS = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"


class ConvNet(nn.Module):
    """Conv 3->32, BatchNorm, ReLU, Conv 32->32, ReLU, Linear 8192->256, GELU, Dropout, Linear 256->10."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8192, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 10))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.features(images)), labels)


def conv_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(64, 3, 16, 16, generator=generator), torch.randint(0, 10, (64,), generator=generator)


def test_auto_plans_the_conv_net_at_0_7_where_only_a_reordering_fits_and_trains_like_eager() -> None:
    torch.manual_seed(0)
    model = ConvNet()
    eager = copy.deepcopy(model)
    batch = conv_batch()
    captured = coop.capture(model, batch)
    graph = captured.graph
    budget = coop.parse_budget(0.7, graph)
    with pytest.raises(InfeasibleError):  # no baseline fits (what auto used to fall back to)
        cheapest_fitting_baseline(graph, budget)
    # 6 s (12 until 2026-11-30): moccasin's plan at the same predicted peak (17.72 % overhead) at 4, 6 and 12 s
    plan = coop.plan(model, 0.7, batch, captured=captured, time_limit=6)
    assert plan.formulation == "moccasin" and plan.predicted_peak <= budget
    assert validate(plan.graph, plan.schedule, budget).ok
    optimizer, eager_optimizer = torch.optim.AdamW(model.parameters()), torch.optim.AdamW(eager.parameters())
    for step in range(3):  # dropout draws: both sides from the same seed
        torch.manual_seed(100 + step)
        loss = plan.step(*batch)
        torch.manual_seed(100 + step)
        eager_loss = eager(*batch)
        eager_loss.backward()
        assert_step_equals_eager(loss, eager_loss, model, eager, step)
        optimizer.step(), eager_optimizer.step()
        optimizer.zero_grad(), eager_optimizer.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager.parameters(), strict=True))


def _skip_chain() -> Graph:
    """v0 -> v1 -> v2 -> v3, and v4 reads v0 and v3: the baseline peak is 12 (v0, v3, v4)."""
    nodes = [Node(id=k, name=f"v{k}", inputs=(k - 1,) if k else (), mem=4, cost=1.0) for k in range(4)]
    nodes.append(Node(id=4, name="v4", inputs=(0, 3), mem=4, cost=1.0))
    return Graph(nodes=tuple(nodes), outputs=(4,))


def test_the_ladder_reaches_moccasin_on_every_size_and_paging_only_with_a_profile() -> None:
    graph = _skip_chain()
    assert formulation_ladder(graph, 100) == ["store-all"]
    # no backward part: Moccasin frees the order there, a space containing Checkmate's (issue 40: a Checkmate rung
    # cost auto 6 points on random layered graphs)
    assert formulation_ladder(graph, 9) == ["moccasin"]
    assert formulation_ladder(graph, 9, device_profile="h100-sxm-pcie5") == ["moccasin", "poet"]
    step = training_chain()
    assert formulation_ladder(step, baseline_peak(step) - 1) == ["checkmate", "moccasin"]


def test_auto_says_no_schedule_found_with_what_to_try_and_never_infeasible_without_a_proof() -> None:
    """Between min_budget (53) and the least peak of every schedule (57, brute force): nothing fits, and
    Checkmate's proof covers the captured order only, so auto does not claim infeasibility."""
    graph = eight_nodes_least_peak_57()
    result = solve(graph, 56, "auto", time_limit=10)
    assert result.schedule is None and result.status == "unknown"
    assert result.message.startswith("no schedule found within 10 s (checkmate: infeasible")
    assert "min_budget is 53" in result.message and "try a longer time_limit, a larger budget" in result.message


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_nodes=8), fraction=st.sampled_from([0.9, 0.7, 0.5, 0.0]))
def test_auto_never_loses_to_a_formulation_it_could_have_chosen(graph: Graph, fraction: float) -> None:
    """At 0.9 / 0.7 / 0.5 of the baseline peak and at min_budget (fraction 0): auto finds a schedule where any
    single formulation does, at no higher cost (benchmarks/bench_auto.py runs 500 of these)."""
    budget = max(min_budget(graph), int(fraction * baseline_peak(graph)))
    comparison = compare_auto(graph, budget, time_limit=10.0)
    assert comparison.ok, comparison


def test_auto_keeps_checkpoint_all_as_a_candidate_but_hands_no_rung_its_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zoo's conv net at 0.5 of its peak: of the baselines only checkpoint-all fits. auto keeps it as a candidate
    (it never returns more) but warm-starts no rung with it: a hint that fits ends a solver's warm-start collection
    at its share of the time, and on DenseNet-121 at 0.6 (2,556 nodes, 30 s) Moccasin hinted with checkpoint-all's
    schedule returned 4,441 % where Moccasin alone found 7.83 % (issue 40, BENCHMARKS.md bench_auto.unseen)."""
    import coop.formulations.ladder.auto as auto_module

    model, batch, loss_fn = build("cnn")
    graph = coop.capture(model, batch, loss_fn).graph
    budget = math.ceil(0.5 * baseline_peak(graph))
    fallback = cheapest_fitting_baseline(graph, budget)
    assert fallback.formulation == "checkpoint-all"
    hints: dict[str, list] = {}
    real_run_solver = auto_module.run_solver

    def spy(graph: Graph, budget: int, name: str, options: Any = None, **keywords: Any) -> Any:
        hints[name] = list(options.hint or []) if options is not None else []
        return real_run_solver(graph, budget, name, options, **keywords)

    monkeypatch.setattr(auto_module, "run_solver", spy)
    # 4 s (6 until 2026-11-30): checkmate and moccasin both ran and moccasin's schedule came back at 2, 3 and 6 s
    result = solve(graph, budget, "auto", time_limit=4, threads=1)
    assert {"checkmate", "moccasin"} & set(hints), result.message
    assert all(hint != fallback.schedule for given in hints.values() for hint in given), hints.keys()
    check = validate(graph, result.schedule, budget)
    assert check.ok and check.cost <= fallback.simulation.cost


def test_auto_builds_checkpoint_all_after_its_ladder_on_a_large_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zoo's transformer (165 computed nodes, above EXACT_MAX_NODES) at 0.735 of its peak: of the baselines only
    checkpoint-all fits. Its schedule (O(n^2) steps) is built after the ladder, and only where no rung found one: on
    DenseNet-121 (2,556 nodes) building and checking it first took 10-24 s of a 30 s limit (issue 40)."""
    import coop.formulations.ladder.auto as auto_module

    model, batch, loss_fn = build("transformer")
    graph = coop.capture(model, batch, loss_fn).graph
    budget = math.ceil(0.735 * baseline_peak(graph))
    assert len(graph.order) > auto_module.EXACT_MAX_NODES
    fallback = cheapest_fitting_baseline(graph, budget)
    assert fallback.formulation == "checkpoint-all"
    # 4 s (6 until 2026-11-30): a rung's schedule within the budget at 2, 3 and 6 s (blocks', or moccasin's at 6 s)
    result = solve(graph, budget, "auto", time_limit=4, threads=1)
    assert "checkpoint-all" not in [rung.formulation for rung in result.rungs], result.message
    check = validate(graph, result.schedule, budget)
    assert check.ok and check.cost <= fallback.simulation.cost

    real_run_solver = auto_module.run_solver

    def nothing(graph: Graph, budget: int, name: str, options: Any = None, **keywords: Any) -> Any:
        """Solver rungs find nothing (a stub); the baselines run."""
        if name in (*BASELINES, "per-layer"):
            return real_run_solver(graph, budget, name, options, **keywords)
        ends.append(options.deadline.elapsed() + options.time_limit)
        return SolveResult(formulation=name, status="unknown", message="found nothing (stub)")

    ends: list[float] = []
    monkeypatch.setattr(auto_module, "run_solver", nothing)
    last_resort = solve(graph, budget, "auto", time_limit=6, threads=1)
    assert last_resort.formulation == "checkpoint-all" and last_resort.rungs[-1].formulation == "checkpoint-all"
    assert validate(graph, last_resort.schedule, budget).ok
    # the rungs were given at most the limit less checkpoint-all's reserve (EfficientNet-B0 at 0.5: 37.1 s of 30 s)
    assert ends and max(ends) <= 6 * (1 - auto_module.COSTLY_RESERVE) + 0.01, (ends, last_resort.rungs)


def test_auto_whose_ladder_spent_the_limit_skips_checkpoint_all_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the rungs ran to the deadline and found nothing, checkpoint-all is not built past it (issue 40's
    time limits): its rung says it was skipped for time, and no schedule comes back."""
    import coop.formulations.ladder.auto as auto_module

    model, batch, loss_fn = build("transformer")
    graph = coop.capture(model, batch, loss_fn).graph
    budget = math.ceil(0.735 * baseline_peak(graph))
    real_run_solver = auto_module.run_solver

    def slow_nothing(graph: Graph, budget: int, name: str, options: Any = None, **keywords: Any) -> Any:
        """Solver rungs run to auto's deadline and find nothing (a stub); the baselines run."""
        if name in (*BASELINES, "per-layer"):
            return real_run_solver(graph, budget, name, options, **keywords)
        while options.deadline.remaining() > 0:
            time.sleep(0.05)
        return SolveResult(formulation=name, status="unknown", message="found nothing (stub)")

    monkeypatch.setattr(auto_module, "run_solver", slow_nothing)
    result = solve(graph, budget, "auto", time_limit=2, threads=1)
    assert result.schedule is None
    assert result.rungs[-1].formulation == "checkpoint-all"
    assert result.rungs[-1].status.startswith("skipped: time limit reached"), result.rungs


def test_auto_keeps_no_reserve_for_checkpoint_all_where_it_refuses_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The published 250-node random layered graph has no backward part: checkpoint-all refuses it, so auto's first
    solver rung gets the whole limit (a reserve for it left Moccasin 4.4 s of 5 s on the 1,000-node graph, where its
    warm starts found nothing under load and Moccasin alone found a schedule: issue 40)."""
    import coop.formulations.ladder.auto as auto_module
    from coop.graph_files import load_graph

    graph = load_graph(GRAPHS / "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json")
    assert len(graph.order) > auto_module.EXACT_MAX_NODES and not graph.has_backward
    budget = math.ceil(0.8 * baseline_peak(graph))
    with pytest.raises(InfeasibleError):  # no baseline fits: the ladder's rungs are all there is
        cheapest_fitting_baseline(graph, budget)
    given_s: list[float] = []
    real_run_solver = auto_module.run_solver

    def record(graph: Graph, budget: int, name: str, options: Any = None, **keywords: Any) -> Any:
        """Solver rungs record what of auto's time they were not given and find nothing (a stub)."""
        if name in (*BASELINES, "per-layer"):
            return real_run_solver(graph, budget, name, options, **keywords)
        given_s.append(options.deadline.remaining() - options.time_limit)
        return SolveResult(formulation=name, status="unknown", message="found nothing (stub)")

    monkeypatch.setattr(auto_module, "run_solver", record)
    solve(graph, budget, "auto", time_limit=5, threads=1)
    assert given_s and given_s[0] < 0.05 * 5, given_s  # the first rung's limit is what is left of auto's
