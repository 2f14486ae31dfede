"""The Graph IR: malformed input, JSON and networkx round trips, hashing, the published graphs."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from coop.budget import baseline_peak, min_budget
from coop.errors import GraphError
from coop.graph import GRAPH_VERSION, Graph, derived_from_graph
from coop.graph_files import graph_from_dict, load_graph
from coop.schedule import Schedule, simulate
from tests.strategies import MALFORMATIONS, malformed_graph_dict, malformed_graphs, random_graphs
from tests.test_layering import imported_modules
from tests.tiers import check, examples

#: The properties draw 25 examples in the fast tier, 100 in the slow one (tests/tiers.py).
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------------- malformed graphs
def _names_one_of(message: str, node_ids: frozenset[int]) -> bool:
    return any(f"node {i} " in message or f"node {i}:" in message for i in node_ids)


@examples(25, 100)
def test_malformed_graphs_raise_one_line_errors_naming_the_node(examples: int) -> None:
    check(_malformed_graphs_raise_one_line_errors_naming_the_node, examples, PROPERTY, case=malformed_graphs())


def _malformed_graphs_raise_one_line_errors_naming_the_node(case: tuple[dict, str, frozenset[int]]) -> None:
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
@examples(25, 100)
def test_json_round_trip(examples: int) -> None:
    check(_json_round_trip, examples, PROPERTY, graph=random_graphs(with_impls=True))


def _json_round_trip(graph: Graph) -> None:
    again = graph_from_dict(json.loads(graph.to_json()))
    assert again == graph
    assert again.sha256 == graph.sha256


@examples(25, 100)
def test_networkx_round_trip(examples: int) -> None:
    check(_networkx_round_trip, examples, PROPERTY, graph=random_graphs(with_impls=True))


def _networkx_round_trip(graph: Graph) -> None:
    again = Graph.from_networkx(graph.to_networkx())
    assert again == graph
    assert again.sha256 == graph.sha256


@examples(25, 100)
def test_sha256_is_stable_and_sees_costs(examples: int) -> None:
    check(_sha256_is_stable_and_sees_costs, examples, PROPERTY, graph=random_graphs())


def _sha256_is_stable_and_sees_costs(graph: Graph) -> None:
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


# -------------------------------------------------------------------- format versions and random ops
#: A version-1 file as coop wrote it before nodes carried ``random``: a dropout's bool mask drawn by
#: coop's own op, its recomputable cast, a native_dropout with its mask as an extra output, a matmul,
#: and an imported graph's free-text "dropout" (not a torch op).
V1_NODES = [
    {"id": 0, "name": "batch[0]", "mem": 64, "cost": 0.0, "op": "input", "kind": "input", "recomputable": False},
    {"id": 1, "name": "mask", "mem": 16, "cost": 1.0, "op": "coop.bernoulli_mask.default", "recomputable": False},
    {"id": 2, "name": "noise", "mem": 64, "cost": 1.0, "op": "aten._to_copy.default", "inputs": [1]},
    {"id": 3, "name": "drop", "mem": 64, "cost": 1.0, "op": "aten.native_dropout.default", "inputs": [0, 2],
     "workspace": 16, "recomputable": False},
    {"id": 4, "name": "keep", "mem": 16, "cost": 0.0, "op": "<built-in function getitem>", "inputs": [3],
     "recomputable": False, "output_of": 3},
    {"id": 5, "name": "mm", "mem": 64, "cost": 1.0, "op": "aten.mm.default", "inputs": [3, 4]},
    {"id": 6, "name": "imported", "mem": 8, "cost": 1.0, "op": "dropout", "inputs": [5], "recomputable": False},
]


def _v1_document() -> dict:
    return {"format": "coop.graph", "version": 1, "name": "v1", "nodes": [dict(n) for n in V1_NODES],
            "outputs": [6], "order": [1, 2, 3, 4, 5, 6], "meta": {"mem_unit": "bytes"}}


def test_a_version_1_file_still_loads_with_the_same_random_draws(tmp_path: Path) -> None:
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(_v1_document()))
    graph = load_graph(path)
    # Version 1 read a node as random when torch tags its op nondeterministic_seeded: the mask and
    # native_dropout; neither the getitem that takes native_dropout's mask nor free text.
    assert graph.random_draws == {1, 3}
    assert {n.id for n in graph.nodes if n.random} == {1, 3}
    assert graph.version == GRAPH_VERSION  # upgraded on reading; saved again it is a current-version file
    graph.save(tmp_path / "v2.json")
    saved = json.loads((tmp_path / "v2.json").read_text())
    assert saved["version"] == GRAPH_VERSION and [n["id"] for n in saved["nodes"] if n.get("random")] == [1, 3]
    assert load_graph(tmp_path / "v2.json") == graph
    # The digest is the one version 1 gave (``random`` is not part of it), so schedules and plans
    # saved for the file still name it.
    payload = {"nodes": V1_NODES, "order": [1, 2, 3, 4, 5, 6], "outputs": [6]}
    assert graph.sha256 == hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_in_version_2_the_node_flag_alone_makes_a_random_op() -> None:
    data = _v1_document()
    data["version"] = 2
    data["nodes"][5]["random"] = True  # any op the capture marked, whatever its name
    graph = graph_from_dict(data)
    assert graph.random_draws == {5}  # the unmarked mask and native_dropout are not random in version 2
    replay = graph.with_random_replay()
    assert replay.random_draws == {5} and replay.node(5).recomputable


def test_unknown_graph_versions_and_flags_are_refused() -> None:
    data = _v1_document()
    data["version"] = GRAPH_VERSION + 1
    with pytest.raises(GraphError, match=f"graph version {GRAPH_VERSION + 1} is not supported"):
        graph_from_dict(data)
    data["version"] = 2
    data["nodes"][1]["random"] = "yes"
    with pytest.raises(GraphError, match=r"node 1 \(mask\): field 'random' is 'yes'; it must be true or false"):
        graph_from_dict(data)


#: The ground floor of the package (tests/test_layering.py orders the whole package): it imports neither torch nor anything above it.
GROUND_FLOOR = ("coop.errors", "coop.text", "coop.graph", "coop.graph_nodes", "coop.graph_checks", "coop.graph_upgrades", "coop.graph_files", "coop.schedule", "coop.schedule_steps", "coop.simulator", "coop.schedule_files", "coop.budget", "coop.limits")


@pytest.mark.parametrize("module", GROUND_FLOOR)
def test_the_ground_floor_imports_no_torch_and_nothing_above_it(module: str) -> None:
    imported = imported_modules(module)
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}
    assert {m for m in imported if m == "coop" or m.startswith("coop.")} <= set(GROUND_FLOOR) - {module}


def test_graph_reads_only_errors_and_its_version_1_table_from_coop() -> None:
    assert {m for m in imported_modules("coop.graph") if m.startswith("coop")} == {
        "coop.errors", "coop.graph_upgrades", "coop.text", "coop.graph_nodes", "coop.graph_checks"}
    assert not {m for m in imported_modules("coop.graph_nodes") if m.startswith("coop")}
    assert {m for m in imported_modules("coop.graph_checks") if m.startswith("coop")} == {
        "coop.errors", "coop.text", "coop.graph_nodes"}
    assert not {m for m in imported_modules("coop.graph_upgrades") if m.startswith("coop")}


# -------------------------------------------------------------------- release of values that are never recomputed
def test_a_kept_value_is_released_after_the_last_compute_that_can_read_it() -> None:
    """Hand-worked (positions in ``order`` from 0): K is kept (never recomputed); V, computed once from K at 1 (also
    kept), is read at the end. With R (recomputable, read from K, itself read by U at 5) a rebuild of R may read K
    until 5. Without R, V is K's only reader and is never recomputed: nothing reads K after V's compute at 1."""
    node = {"mem": 4, "cost": 1.0, "kind": "forward"}
    graph = Graph.model_validate({"name": "kept", "nodes": [
        {"id": 0, "name": "x", "mem": 4, "cost": 0.0, "kind": "input"},
        {"id": 1, "name": "K", "inputs": [0], "recomputable": False, **node},
        {"id": 2, "name": "V", "inputs": [1], "recomputable": False, **node},
        {"id": 3, "name": "R", "inputs": [1], **node},
        {"id": 4, "name": "M", "inputs": [0], **node},
        {"id": 5, "name": "W", "inputs": [2, 4], **node},
        {"id": 6, "name": "U", "inputs": [3, 5], **node},
    ], "outputs": [6]})
    order = (1, 2, 3, 4, 5, 6)
    assert graph.release_positions(order, {1, 2}) == {1: 5, 2: 5}
    without_r = Graph.model_validate({"name": "kept", "nodes": [n.model_dump() for n in graph.nodes if n.id not in (3, 6)],
                                      "outputs": [5]})
    assert without_r.release_positions((1, 2, 4, 5), {1, 2}) == {1: 1, 2: 3}


def test_a_value_derived_from_a_graph_is_computed_once_however_its_arguments_are_spelled() -> None:
    calls: list[tuple[str, int]] = []

    @derived_from_graph
    def counted(graph: Graph, label: str = "x", *, times: int = 1) -> str:
        calls.append((label, times))
        return label * times

    graph = Graph.model_validate({"name": "g", "nodes": [{"id": 0, "name": "a", "mem": 1, "cost": 1}]})
    assert counted(graph) == counted(graph, "x") == counted(graph, label="x", times=1) == "x"
    assert counted(graph, "y", times=2) == "yy"
    assert calls == [("x", 1), ("y", 2)]
    other = Graph.model_validate({"name": "h", "nodes": [{"id": 0, "name": "a", "mem": 1, "cost": 1}]})
    assert counted(other) == "x" and len(calls) == 3  # each graph has its own values


def test_a_graph_holding_derived_values_still_pickles() -> None:
    graph = Graph.model_validate({"name": "g", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0, "recomputable": False},
        {"id": 1, "name": "f", "inputs": [0], "mem": 10, "cost": 1}], "outputs": [1]})
    peak, least = baseline_peak(graph), min_budget(graph)
    again = pickle.loads(pickle.dumps(graph))
    assert again == graph and (baseline_peak(again), min_budget(again)) == (peak, least) == (20, 20)
