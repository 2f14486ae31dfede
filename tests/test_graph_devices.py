"""Node.device (graph version 4): the Graph records where each value lives, and which values may be paged."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import coop
from coop.errors import GraphError
from coop.graph import Graph, Node


def _mixed() -> Graph:
    """A CUDA step: a parameter and activations on cuda:0, a 0-d CPU scalar and a CPU seed beside them."""
    return Graph(nodes=(
        Node(id=0, name="w", mem=4096, cost=0.0, kind="param", recomputable=False, device="cuda:0"),
        Node(id=1, name="scale", mem=8, cost=0.0, kind="input", recomputable=False, device="cpu"),
        Node(id=2, name="h", inputs=(0, 1), mem=2048, cost=1.0, device="cuda:0"),
        Node(id=3, name="seed", inputs=(2,), mem=8, cost=0.0, device="cpu"),
        Node(id=4, name="out", inputs=(2, 3), mem=2048, cost=1.0, device="cuda:0"),
    ), outputs=(4,))


def test_only_accelerator_values_are_pageable_in_a_step_that_holds_them() -> None:
    graph = _mixed()
    assert graph.devices == ("cpu", "cuda:0") and graph.has_accelerator
    assert [graph.pageable(v) for v in (0, 1, 2, 3, 4)] == [True, False, True, False, True]


def test_a_cpu_only_step_pages_through_the_host_pool_and_an_imported_graph_pages_everything() -> None:
    cpu = Graph(nodes=(Node(id=0, name="a", mem=4, cost=1.0, device="cpu"),
                       Node(id=1, name="b", inputs=(0,), mem=4, cost=1.0, device="cpu")))
    imported = Graph(nodes=(Node(id=0, name="a", mem=4, cost=1.0), Node(id=1, name="b", inputs=(0,), mem=4, cost=1.0)))
    assert not cpu.has_accelerator and cpu.pageable(0) and cpu.pageable(1)
    assert imported.has_accelerator and imported.pageable(0)


def test_devices_survive_json_and_a_version_3_file_reads_as_one_device() -> None:
    graph = _mixed()
    again = Graph.model_validate(json.loads(graph.to_json()))
    assert [n.device for n in again.nodes] == [n.device for n in graph.nodes]
    old = json.loads(graph.to_json())
    old["version"] = 3
    for node in old["nodes"]:
        node.pop("device")
    assert {n.device for n in Graph.model_validate(old).nodes} == {None}


def test_a_malformed_device_names_the_node() -> None:
    data = json.loads(_mixed().to_json())
    data["nodes"][2]["device"] = 0
    with pytest.raises(GraphError, match=r"node 2 \(h\).*device"):
        Graph.model_validate(data)


def test_capture_records_the_device_of_every_value() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.linear(x) * 2).square().mean()

    captured = coop.capture(Scaled(), torch.randn(3, 4))
    assert {node.device for node in captured.graph.nodes if node.mem} == {"cpu"}
