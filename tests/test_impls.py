"""Implementations (MONeT): what the Graph accepts and what the one simulator counts.

Every expected peak and cost below is counted by hand from contract 2 (each comment shows the
sum); none comes from running coop first. Graphs are a few nodes, in graph units.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coop.errors import GraphError, ScheduleError
from coop.formulations import BASELINES, solve
from coop.graph import GRAPH_VERSION, Graph
from coop.graph_files import load_graph
from coop.schedule import Schedule, Step, simulate, validate


def _graph(nodes: list[dict[str, Any]], outputs: tuple[int, ...] = (), **extra: Any) -> Graph:
    return Graph.model_validate({"name": "hand", "nodes": nodes, "outputs": list(outputs), **extra})


def _steps(*pairs: tuple[Any, ...]) -> Schedule:
    return Schedule(steps=tuple(Step(op=p[0], node=p[1], impl=p[2] if len(p) > 2 else None) for p in pairs))


def mask_graph() -> Graph:
    """x -> relu -> head -> relu_bwd(head, relu); relu_bwd may read a 1-unit mask of relu instead."""
    return _graph([
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 1, "name": "relu", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "mask", "inputs": [1], "mem": 1, "cost": 1, "optional": True},
        {"id": 3, "name": "head", "inputs": [1], "mem": 1, "cost": 1},
        {"id": 4, "name": "relu_bwd", "kind": "backward", "inputs": [3, 1], "mem": 10, "cost": 1,
         "impls": [{"name": "from_mask", "cost": 2, "mem": 10, "inputs": [3, 2]}]},
    ], outputs=(4,))


def inplace_graph() -> Graph:
    """x -> a -> b -> c; b may run in place over a."""
    return _graph([
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "b", "inputs": [1], "mem": 10, "cost": 1,
         "impls": [{"name": "inplace", "cost": 1, "mem": 10, "inplace_of": 1, "workspace": 2}]},
        {"id": 3, "name": "c", "inputs": [2], "mem": 1, "cost": 1},
    ], outputs=(3,))


# -------------------------------------------------------------------- the simulator, by hand
def test_a_backward_that_reads_the_mask_needs_the_mask_not_the_activation() -> None:
    graph = mask_graph()
    assert graph.order == (1, 3, 4)  # the optional mask is not in the order nor in the baseline
    assert graph.baseline_cost == 3.0
    default = simulate(graph, _steps(("compute", 1), ("compute", 3), ("compute", 4)))
    # relu: x10 + relu10 = 20; head: 10 + 10 + 1 = 21; relu_bwd: 10 + relu10 + head1 + out10 = 31
    assert default.memory == [20, 21, 31] and default.cost == 3.0
    masked = simulate(graph, _steps(("compute", 1), ("compute", 2), ("compute", 3), ("compute", 4, "from_mask")))
    # relu 20; mask 10+10+1 = 21; head (relu's last read) 10+10+1+1 = 22; relu_bwd 10+mask1+head1+out10 = 22
    assert masked.memory == [20, 21, 22, 22] and masked.peak == 22
    assert masked.cost == 1 + 1 + 1 + 2 and masked.overhead == pytest.approx(2 / 3)


def test_an_implementation_reads_only_its_own_inputs() -> None:
    graph = mask_graph()
    # The mask implementation without the mask: its input 2 was never computed.
    with pytest.raises(ScheduleError, match=r"step 2 \(compute %4 \[from_mask\]\): input 2 is not resident"):
        simulate(graph, _steps(("compute", 1), ("compute", 3), ("compute", 4, "from_mask")))
    # The default implementation after relu was freed: it reads relu, which is gone.
    with pytest.raises(ScheduleError, match="step 4 .*input 1 is not resident"):
        simulate(graph, _steps(("compute", 1), ("compute", 2), ("compute", 3), ("free", 1), ("compute", 4)))
    # With the mask implementation relu may go right after head: 10 + mask1 + head1 + out10 = 22 at the end.
    sim = simulate(graph, _steps(("compute", 1), ("compute", 2), ("compute", 3), ("free", 1),
                                 ("compute", 4, "from_mask")))
    assert sim.memory == [20, 21, 22, 12, 22]


def test_in_place_moves_the_bytes_to_the_new_value() -> None:
    graph = inplace_graph()
    out_of_place = simulate(graph, _steps(("compute", 1), ("compute", 2), ("compute", 3)))
    # a: 10+10 = 20; b: 10+a10+b10 = 30; c: 10+b10+c1 = 21
    assert out_of_place.memory == [20, 30, 21]
    in_place = simulate(graph, _steps(("compute", 1), ("compute", 2, "inplace"), ("compute", 3)))
    # b in place: x10 + the storage a had, now b's (10) + workspace 2 = 22; c: 10 + 10 + 1 = 21
    assert in_place.memory == [20, 22, 21] and in_place.peak == 22
    instances = {i.node: (i.start, i.end, i.mem) for i in in_place.instances}
    assert instances == {1: (0, 0, 10), 2: (1, 2, 10), 3: (2, 2, 1)}


def test_the_consumed_instance_can_no_longer_be_read_freed_or_paged() -> None:
    graph = inplace_graph()
    start = (("compute", 1), ("compute", 2, "inplace"))
    for late, message in [(("compute", 2), "input 1 is not resident"), (("free", 1), "node 1 is not resident"),
                          (("page_out", 1), "node 1 is not resident on the device")]:
        with pytest.raises(ScheduleError, match=f"step 2 .*{message}"):
            simulate(graph, _steps(*start, late, ("compute", 3)))
    # Recomputing a brings a fresh instance back: legal, 10 + a10 + b10 = 30 at that step.
    sim = simulate(graph, _steps(*start, ("compute", 1), ("compute", 3)))
    assert sim.memory == [20, 22, 30, 21] and sim.recomputations == 1


def test_in_place_over_an_output_leaves_the_output_missing() -> None:
    graph = _graph(inplace_graph().model_dump()["nodes"], outputs=(1, 3))
    with pytest.raises(ScheduleError, match=r"output 1 \(a\) is not resident at the end"):
        simulate(graph, _steps(("compute", 1), ("compute", 2, "inplace"), ("compute", 3)))


def test_in_place_after_paging_the_input_back_takes_its_storage() -> None:
    graph = inplace_graph()
    sim = simulate(graph, _steps(("compute", 1), ("page_out", 1), ("page_in", 1), ("compute", 2, "inplace"),
                                 ("compute", 3)))
    # a on the host during step 1 (page_out) only: 10 | 10 | 10+10 | 10+10+2 | 10+10+1
    assert sim.memory == [20, 10, 20, 22, 21]


def test_the_validator_gives_the_same_verdict() -> None:
    graph = mask_graph()
    schedule = _steps(("compute", 1), ("compute", 2), ("compute", 3), ("free", 1), ("compute", 4, "from_mask"))
    assert validate(graph, schedule, budget=22).ok
    over = validate(graph, schedule, budget=21)
    assert not over.ok and over.peak == 22
    bad = validate(graph, _steps(("compute", 1), ("compute", 3), ("compute", 4, "from_mask")))
    assert not bad.ok and bad.step == 2


# -------------------------------------------------------------------- the Graph
def _mask_nodes() -> list[dict[str, Any]]:
    return mask_graph().model_dump()["nodes"]


def _changed(node_id: int, **fields: Any) -> list[dict[str, Any]]:
    nodes = _mask_nodes()
    nodes[node_id].update(fields)
    return nodes


def _impl(**fields: Any) -> list[dict[str, Any]]:
    return [{"name": "alt", "cost": 1, "mem": 10} | fields]


@pytest.mark.parametrize(("nodes", "outputs", "message"), [
    (_changed(4, impls=_impl(inputs=[9])), (4,), r"node 4 \(relu_bwd\), implementation 'alt': unknown input id 9"),
    (_changed(4, impls=_impl(inputs=[4])), (4,), "implementation 'alt': reads its own output"),
    (_changed(4, impls=_impl(inputs=[3, 3])), (4,), "implementation 'alt': an input id is listed twice"),
    (_changed(1, impls=_impl(inputs=[0, 4])), (4,), "lies on a cycle"),
    (_changed(4, impls=_impl(inplace_of=1, inputs=[3, 2])), (4,), "runs in place of node 1, which it does not read"),
    (_changed(1, impls=_impl(inplace_of=0)), (4,), r"node 1 \(relu\).*cannot overwrite node 0, a input"),
    (_changed(4, impls=_impl(inplace_of=3)), (4,), "runs in place of node 3 .1 bytes. but declares mem 10"),
    (_changed(4, impls=_impl() + _impl()), (4,), r"node 4 \(relu_bwd\): two implementations share a name"),
    (_changed(0, impls=_impl()), (4,), r"node 0 \(x\): a input has no implementations"),
    (_mask_nodes(), (2, 4), r"node 2 \(mask\): an optional node cannot be a graph output"),
    (_changed(3, inputs=[1, 2]), (4,), r"node 3 \(head\): its inputs name optional node 2"),
    (_changed(0, optional=True), (4,), r"node 0 \(x\): a input cannot be optional"),
    (_changed(2, optional="yes"), (4,), r"node 2 \(mask\): field 'optional' is 'yes'"),
    (_changed(4, impls=_impl(exact=1)), (4,), r"node 4 \(relu_bwd\): field 'impls\[0\].exact'"),
])
def test_malformed_implementations_are_one_line_errors_naming_the_node(nodes: list[dict[str, Any]],
                                                                       outputs: tuple[int, ...], message: str) -> None:
    with pytest.raises(GraphError, match=message) as error:
        _graph(nodes, outputs)
    assert "\n" not in str(error.value)


def test_the_order_leaves_optional_values_out_and_follows_implementation_inputs() -> None:
    with pytest.raises(GraphError, match="order lists node 2, an optional value"):
        _graph(_mask_nodes(), (4,), order=[1, 2, 3, 4])
    nodes = _mask_nodes()
    nodes[3]["impls"] = [{"name": "late", "cost": 1, "mem": 1, "inputs": [0, 4]}]  # head's impl reads relu_bwd
    with pytest.raises(GraphError, match="lies on a cycle"):
        _graph(nodes, (4,))
    nodes = [
        {"id": 0, "name": "p", "mem": 1, "cost": 1},
        {"id": 1, "name": "q", "mem": 1, "cost": 1, "impls": [{"name": "after_r", "cost": 1, "mem": 1, "inputs": [2]}]},
        {"id": 2, "name": "r", "mem": 1, "cost": 1},
    ]
    assert _graph(nodes).order == (0, 2, 1)  # q after r, which one of q's implementations reads
    with pytest.raises(GraphError, match="order puts node 1 .q. before its input 2"):
        _graph(nodes, order=[0, 1, 2])


def test_version_2_files_load_as_the_current_version_with_the_same_digest(tmp_path: Path) -> None:
    v2 = {"format": "coop.graph", "version": 2, "name": "old", "outputs": [2], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 4, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 4, "cost": 1, "impls": [{"name": "fast", "cost": 0.5, "mem": 4}]},
        {"id": 2, "name": "b", "inputs": [1], "mem": 4, "cost": 1}]}
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(v2))
    graph = load_graph(path)
    assert graph.version == GRAPH_VERSION
    assert graph.node(1).impls[0].inputs is None and graph.node(1).impls[0].exact
    # New fields at their defaults are left out of the file and the digest: schedules keep naming it.
    v3 = json.loads(graph.to_json())
    assert v3["nodes"][1]["impls"] == v2["nodes"][1]["impls"]
    assert Graph.model_validate(v2 | {"version": 3}).sha256 == graph.sha256  # version 3 upgrades the same way
    assert load_graph(path).sha256 == Graph.model_validate(v3).sha256


# -------------------------------------------------------------------- remat-only formulations
def combined_graph() -> Graph:
    """x -> a -> relu (may run in place over a) -> head -> relu_bwd (may read relu's optional mask)."""
    return _graph([
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "relu", "inputs": [1], "mem": 10, "cost": 1,
         "impls": [{"name": "inplace", "cost": 1, "mem": 10, "inplace_of": 1}]},
        {"id": 3, "name": "mask", "inputs": [2], "mem": 1, "cost": 1, "optional": True},
        {"id": 4, "name": "head", "inputs": [2], "mem": 1, "cost": 1},
        {"id": 5, "name": "relu_bwd", "kind": "backward", "inputs": [4, 2], "mem": 10, "cost": 1,
         "impls": [{"name": "from_mask", "cost": 2, "mem": 10, "inputs": [4, 3]}]},
    ], outputs=(5,))


@pytest.mark.parametrize("formulation", [*BASELINES, "checkmate", "moccasin"])
def test_remat_formulations_use_default_implementations_and_skip_optional_values(formulation: str) -> None:
    """On graphs with implementations and optional values, the remat-only formulations schedule the
    default implementations; their schedules validate and never compute what no one needs."""
    graph = combined_graph()
    # Baseline: a 10+10 = 20; relu 10+10+10 = 30; head 10+10+1 = 21; relu_bwd 10+10+1+10 = 31.
    budget = 31
    options = {"time_limit": 20.0, "threads": 1} if formulation in ("checkmate", "moccasin") else {}
    result = solve(graph, budget, formulation, **options)
    assert result.schedule is not None
    verdict = validate(graph, result.schedule, budget)
    assert verdict.ok, verdict.reason
    computes = [s for s in result.schedule.steps if s.op == "compute"]
    assert all(s.impl is None for s in computes) and 3 not in {s.node for s in computes}
    assert verdict.peak <= 31
    if formulation in ("store-all", "checkmate", "moccasin"):  # the others recompute by design
        assert verdict.cost == 4.0 and verdict.peak == 31
