"""min_budget counts a value that cannot be recomputed wherever a later node must still read it (issue 43).

BERT's step captured for CUDA keeps its dropout masks (extra outputs of ``native_dropout``) from the forward to the
dropout backward, across the language-model head's backward: every schedule holds them there. The graph below is
that shape in miniature, counted by hand and by the brute-force oracle (tests/bruteforce.py), and checked against
the formulations that may not page (their verdict is proven) and POET, which may page the mask out (not refused).
"""

from __future__ import annotations

from coop.budget import min_budget, parse_budget
from coop.compare import simulate_report
from coop.device_profiles import profile_from_dict
from coop.errors import BudgetError
from coop.formulations import solve
from coop.graph import Graph
from coop.schedule import validate
from tests.bruteforce import least_peak

HAND = profile_from_dict({"source": "hand", "flops_per_s": 1.0, "flops_per_joule": 1.0, "power_w": 1.0,
                          "memory_power_w": 1.0, "pagein_latency_s": 1.0, "pageout_latency_s": 1.0,
                          "pagein_bytes_per_s": 100.0, "pageout_bytes_per_s": 100.0})


def _head_graph() -> Graph:
    """x (4 B) -> d = dropout(x) (8 B; its mask m, 2 B, an extra output) -> h = head(d) (50 B) -> loss l (1 B)
    -> gh = head backward (reads l and h, 50 B) -> gd = dropout backward (reads gh and m, 8 B), the output."""
    return Graph.model_validate({"name": "head", "outputs": [6], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 4, "cost": 0},
        {"id": 1, "name": "d", "inputs": [0], "mem": 8, "cost": 1, "workspace": 2},
        {"id": 2, "name": "m", "inputs": [1], "mem": 2, "cost": 0, "output_of": 1, "recomputable": False},
        {"id": 3, "name": "h", "inputs": [1], "mem": 50, "cost": 5},
        {"id": 4, "name": "l", "inputs": [3], "mem": 1, "cost": 1},
        {"id": 5, "name": "gh", "inputs": [4, 3], "mem": 50, "cost": 5, "kind": "backward"},
        {"id": 6, "name": "gd", "inputs": [5, 2], "mem": 8, "cost": 1, "kind": "backward"}]})


def test_a_mask_read_after_the_heads_backward_counts_at_it() -> None:
    # gh's step: x 4 + l 1 + h 50 + gh 50 = 105 from its own reads; the mask m (made at d, read by gd after gh) is
    # resident there too in every schedule: 107. The oracle's least peak over every legal schedule agrees.
    graph = _head_graph()
    assert min_budget(graph) == 107 == least_peak(graph, "all")
    assert min_budget(graph, paging=True) < 107  # a schedule that pages may move the mask out


def test_below_it_the_formulations_that_cannot_page_say_infeasible_at_once_and_poet_may_page() -> None:
    graph = _head_graph()
    for name in ("checkmate", "moccasin", "auto"):
        result = solve(graph, 106, name, time_limit=10, threads=1)
        assert result.schedule is None and result.status == "infeasible", name
        assert "use at least 107" in result.message, name
    paged = solve(graph, 105, "poet", device_profile=HAND, time_limit=10, threads=1)
    assert paged.schedule is not None and validate(graph, paged.schedule, 105).ok
    assert any(step.op == "page_out" and step.node == 2 for step in paged.schedule.steps)


def test_the_parser_names_the_bound_of_the_schedules_the_caller_can_run() -> None:
    graph = _head_graph()
    try:
        parse_budget(106, graph)
    except BudgetError as exc:
        assert "use at least 107" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("106 B is below every schedule's peak without paging")
    assert parse_budget(106, graph, paging=True) == 106


def _chain_with_draws() -> Graph:
    """x -> f1 .. f8 (4 B each; f2 and f5 draw random numbers) -> a backward tail b8 .. b1 reading each again."""
    nodes = [{"id": 0, "name": "x", "mem": 1, "cost": 0, "kind": "input"}]
    for i in range(1, 9):
        draw = {"op": "aten.bernoulli.p", "recomputable": False, "random": True} if i in (2, 5) else {}
        nodes.append({"id": i, "name": f"f{i}", "inputs": [i - 1], "mem": 4, "cost": 1, **draw})
    for k, forward in enumerate(range(8, 0, -1)):
        nodes.append({"id": 9 + k, "name": f"b{forward}", "inputs": [forward] + ([8 + k] if k else []), "mem": 4,
                      "cost": 1})
    return Graph.model_validate({"name": "draws", "nodes": nodes, "outputs": [16]})


def test_an_engine_that_replays_draws_is_bounded_on_the_graph_it_runs() -> None:
    # Held until their backward, the two draws pin 8 B at every node between; replayed, they need not be held.
    graph = _chain_with_draws()
    assert min_budget(graph) == min_budget(graph.with_random_replay()) + 8
    budget = min_budget(graph.with_random_replay()) + 4  # below the raw graph's floor, above the replayed one's
    report = simulate_report(graph, "dtr", budget)
    assert report["status"] == "ok" and report["min_budget"] == min_budget(graph.with_random_replay())
    assert report["peak"] <= budget and report["random_replays"] > 0
