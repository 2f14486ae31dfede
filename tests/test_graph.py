"""The Graph IR: malformed input, JSON and networkx round trips, hashing, the published graphs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from coop.budget import baseline_peak
from coop.errors import GraphError
from coop.graph import Graph, graph_from_dict, load_graph
from coop.schedule import Schedule, simulate
from tests.strategies import MALFORMATIONS, malformed_graph_dict, malformed_graphs, random_graphs

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------------- malformed graphs
def _names_one_of(message: str, node_ids: frozenset[int]) -> bool:
    return any(f"node {i} " in message or f"node {i}:" in message for i in node_ids)


@PROPERTY
@given(malformed_graphs())
def test_malformed_graphs_raise_one_line_errors_naming_the_node(case: tuple[dict, str, frozenset[int]]) -> None:
    data, malformation, node_ids = case
    with pytest.raises(GraphError) as caught:
        graph_from_dict(data)
    message = str(caught.value)
    assert "\n" not in message
    if malformation == "empty":
        assert "empty" in message
    else:
        assert _names_one_of(message, node_ids), f"{malformation}: {message!r} names none of {sorted(node_ids)}"


@pytest.mark.parametrize("malformation", MALFORMATIONS)
def test_each_malformation_has_its_own_message(malformation: str) -> None:
    graph = Graph.model_validate(
        {"name": "chain", "nodes": [
            {"id": 5, "name": "x", "mem": 1, "cost": 0, "kind": "input"},
            {"id": 7, "name": "a", "mem": 1, "cost": 1, "inputs": [5]},
            {"id": 9, "name": "b", "mem": 1, "cost": 1, "inputs": [7]},
        ]}
    )
    data, node_ids = malformed_graph_dict(graph, malformation, pick=1)
    with pytest.raises(GraphError) as caught:
        graph_from_dict(data)
    expected = {
        "cycle": "cycle", "unknown_input": "unknown input id 10", "duplicate_id": "duplicate node id",
        "negative_mem": "'mem'", "negative_cost": "'cost'", "missing_field": "field 'mem' is missing",
        "empty": "is empty",
    }[malformation]
    assert expected in str(caught.value)
    if node_ids:
        assert _names_one_of(str(caught.value), node_ids)


def test_cycle_message_names_a_node_on_the_cycle_not_one_downstream() -> None:
    # Node 3 only reads the cycle 1 <-> 2; naming it would send the user to the wrong place.
    data = {"format": "coop.graph", "name": "g", "nodes": [
        {"id": 3, "name": "after", "mem": 0, "cost": 0, "inputs": [2]},
        {"id": 2, "name": "b", "mem": 0, "cost": 0, "inputs": [1]},
        {"id": 1, "name": "a", "mem": 0, "cost": 0, "inputs": [2]},
    ]}
    with pytest.raises(GraphError) as caught:
        graph_from_dict(data)
    assert _names_one_of(str(caught.value), frozenset({1, 2})), str(caught.value)


def test_unreadable_and_foreign_files_are_graph_errors(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="cannot read"):
        load_graph(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GraphError, match="not JSON"):
        load_graph(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "onnx"}))
    with pytest.raises(GraphError, match="unknown graph format"):
        load_graph(tmp_path / "other.json")


# -------------------------------------------------------------------- round trips and hashing
@PROPERTY
@given(random_graphs(with_impls=True))
def test_json_round_trip(graph: Graph) -> None:
    again = graph_from_dict(json.loads(graph.to_json()))
    assert again == graph
    assert again.sha256 == graph.sha256


@PROPERTY
@given(random_graphs(with_impls=True))
def test_networkx_round_trip(graph: Graph) -> None:
    again = Graph.from_networkx(graph.to_networkx())
    assert again == graph
    assert again.sha256 == graph.sha256


@PROPERTY
@given(random_graphs())
def test_sha256_is_stable_and_sees_costs(graph: Graph) -> None:
    assert Graph.model_validate(graph.to_dict()).sha256 == graph.sha256
    node = next(n for n in graph.nodes if not n.caller_owned)
    bumped = graph.to_dict()
    for raw in bumped["nodes"]:
        if raw["id"] == node.id:
            raw["cost"] = raw["cost"] + 1.0
    changed = Graph.model_validate(bumped)
    assert changed.sha256 != graph.sha256
    assert changed.structure_sha256 == graph.structure_sha256


SHA256_SOURCE = """
from coop.graph import Graph
print(Graph.model_validate({"name": "g", "nodes": [{"id": 0, "name": "a", "mem": 1, "cost": 1}]}).sha256)
"""


def test_sha256_does_not_depend_on_the_process() -> None:
    graph = Graph.model_validate({"name": "g", "nodes": [{"id": 0, "name": "a", "mem": 1, "cost": 1}]})
    # The digest of the sorted-key compact JSON of nodes, order and outputs, written out by hand.
    payload = b'{"nodes":[{"cost":1.0,"id":0,"mem":1,"name":"a"}],"order":[0],"outputs":[]}'
    assert graph.sha256 == hashlib.sha256(payload).hexdigest()
    # Another interpreter with another string-hash seed computes the same digest.
    other = subprocess.run([sys.executable, "-c", SHA256_SOURCE], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout.strip() == graph.sha256


# -------------------------------------------------------------------- published graphs
PUBLISHED_PEAKS = {
    "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json": 146_840,
    "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json": 608_619,
    "ResNet50_256_224_224_3_train_nx.json": 38_059_356_160,
    "fcn_8_vgg_32_416_608_3_train_nx.json": 13_484_795_520,
}


@pytest.mark.parametrize("filename", sorted(PUBLISHED_PEAKS))
def test_published_baseline_peaks(moccasin_dir: Path, filename: str) -> None:
    graph = load_graph(moccasin_dir / filename)
    assert baseline_peak(graph) == PUBLISHED_PEAKS[filename]


def test_published_random_layered_n250_cost_and_order(moccasin_dir: Path) -> None:
    graph = load_graph(moccasin_dir / "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json")
    raw = json.loads((moccasin_dir / "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json").read_text())
    assert list(graph.order) == raw["graph"]["order"]
    assert len(graph) == 250 and graph.num_edges == 944
    sim = simulate(graph, Schedule.from_order(graph.order))
    # The baseline cost is the sum of the file's node durations (README), recounted from the raw JSON.
    assert sum(node["duration"] for node in raw["nodes"]) == 125_569
    assert sim.cost == graph.baseline_cost == 125_569


@pytest.mark.parametrize("filename", ["ResNet50_256_224_224_3_train_nx.json", "VGG16_256_224_224_3_train_nx.json"])
def test_checkmate_graphs_keep_sizes_and_backward_flags(moccasin_dir: Path, filename: str) -> None:
    raw = json.loads((moccasin_dir / filename).read_text())
    graph = load_graph(moccasin_dir / filename)
    assert len(graph) == len(raw["nodes"]) and graph.num_edges == len(raw["links"])
    backward = {n["id"] for n in raw["nodes"] if n.get("backward")}
    assert {n.id for n in graph.nodes if n.kind == "backward"} == backward
    assert graph.has_backward
