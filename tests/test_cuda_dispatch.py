"""A weightless capture for CUDA is the program the GPU runs: dropout and batch norm (coop.graph_capture.cuda_dispatch),
and cuDNN's batch norm made functional (coop.graph_capture.batch_norm_ops).

The oracle is the GPU itself: tests/data/h200_capture_ops.json holds the op counts of the real models captured on
an NVIDIA H200 (2026-11-26, torch 2.11, cuDNN 9.19; its command is in the file). Before this module, a plan made
on the meta device was refused there: GPT-2 small had 25 composite dropout chains where the GPU ran
``native_dropout`` (1,080 nodes against 1,030), ResNet-50 ran ``_native_batch_norm_legit_functional`` where the GPU
ran ``cudnn_batch_norm`` (1,102 against 1,049).

cuDNN's batch norm updates the running statistics in place without its schema saying so; that H200 capture kept it
as it was, recomputable, and a moccasin plan for ResNet-50 at half its peak recomputed 5 of its 53 batch norms,
which updated their statistics twice. Every capture (of the real model and on meta) now rewrites it into coop's
functional form: two more outputs (the new statistics) per batch norm, the recorded counts adjusted so below.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

import coop
from coop.graph import Graph
from coop.graph_capture.cuda_dispatch import batch_norm_on_cudnn, dropout_fused_on_cuda

RECORDED = json.loads((Path(__file__).parent / "data" / "h200_capture_ops.json").read_text())
CUDNN_BN = "aten.cudnn_batch_norm.default"
FUNCTIONAL_BN = "coop.cudnn_batch_norm_functional.default"


def _bench_models():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_cuda import MODELS

    return MODELS


@pytest.mark.parametrize("family", ["gpt2", "resnet"])
def test_a_meta_capture_for_cuda_has_the_ops_the_h200_captured(family: str) -> None:
    label, make = _bench_models()[family][0]
    recorded = RECORDED["families"][family]
    assert recorded["model"] == label  # the same model as on the GPU
    with torch.device("meta"):
        model, batch, loss_fn = make()
    graph = coop.capture(model, batch, loss_fn=loss_fn, device="cuda").graph
    expected = Counter(recorded["ops"])
    norms = expected.pop(CUDNN_BN, 0)  # made functional since the recording: its new statistics as two getitems
    if norms:
        expected[FUNCTIONAL_BN] = norms
        expected["<built-in function getitem>"] += 2 * norms
    assert Counter(n.op for n in graph.nodes) == expected
    assert len(graph.nodes) == recorded["nodes"] + 2 * norms


class _Net(nn.Module):
    def __init__(self, dropout_inplace: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.2, inplace=dropout_inplace)
        self.head = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.norm(self.conv(x))) * 2.0  # relu's backward reads its output: dropout takes a copy
        return self.head(self.drop(hidden).flatten(1)).sum()


def _meta_graph(device: str | None, dtype: torch.dtype = torch.float32, **kwargs) -> Graph:
    with torch.device("meta"):
        model = _Net(**kwargs).to(dtype)
        batch = (torch.empty(4, 3, 8, 8, dtype=dtype),)
    return coop.capture(model, batch, device=device).graph


def test_dropout_and_batch_norm_follow_the_device() -> None:
    cuda = Counter(n.op for n in _meta_graph("cuda").nodes)
    cpu = Counter(n.op for n in _meta_graph("cpu").nodes)
    assert cuda["aten.native_dropout.default"] == 1 and cuda["aten.native_dropout_backward.default"] == 1
    assert cuda[FUNCTIONAL_BN] == 1 and cuda["aten.cudnn_batch_norm_backward.default"] == 1 and cuda[CUDNN_BN] == 0
    assert cpu["aten.native_dropout.default"] == 0 and cpu["coop.bernoulli_mask.default"] == 1
    assert cpu[CUDNN_BN] == 0 and cpu["aten._native_batch_norm_legit_functional.default"] == 1


def test_in_place_dropout_and_bfloat16_batch_norm_keep_the_composite_kernels_on_cuda() -> None:
    ops = Counter(n.op for n in _meta_graph("cuda", dropout_inplace=True).nodes)
    assert ops["aten.native_dropout.default"] == 0 and ops["coop.bernoulli_mask.default"] == 1
    ops = Counter(n.op for n in _meta_graph("cuda", dtype=torch.bfloat16).nodes)
    assert ops[CUDNN_BN] == ops[FUNCTIONAL_BN] == 0


def test_the_rules_read_off_atens_dispatch() -> None:
    x = torch.empty(4, 3, 8, 8, device="meta")
    w, b, stat = (torch.empty(3, device="meta") for _ in range(3))
    assert dropout_fused_on_cuda(x, 0.1, True, False)
    assert not dropout_fused_on_cuda(x, 0.0, True, False) and not dropout_fused_on_cuda(x, 1.0, True, False)
    assert not dropout_fused_on_cuda(x, 0.1, False, False) and not dropout_fused_on_cuda(x, 0.1, True, True)
    assert batch_norm_on_cudnn(x, w, b, stat, stat, True)
    assert batch_norm_on_cudnn(x, w, b, None, None, True)  # batch statistics only, in training
    assert not batch_norm_on_cudnn(x, w, b, None, None, False)
    assert not batch_norm_on_cudnn(x, None, b, stat, stat, True)  # affine=False
    assert not batch_norm_on_cudnn(torch.empty(4, 3, device="meta"), w, b, stat, stat, True)  # BatchNorm1d on 2-D
    assert not batch_norm_on_cudnn(x.half(), w.half(), b.half(), stat, stat, True)  # half needs float32 weights
    assert batch_norm_on_cudnn(x.half(), w, b, stat, stat, True)


def test_a_training_cudnn_batch_norm_becomes_functional_and_feeds_the_new_buffers() -> None:
    """The kernel's running statistics come out as values: the step's new buffer values are the functional op's
    outputs (not the buffers it read), and the op, pure now, is recomputable."""
    graph = _meta_graph("cuda")
    norm = next(n for n in graph.nodes if n.op == FUNCTIONAL_BN)
    assert norm.recomputable and not norm.random
    stats = [n for n in graph.nodes if n.op == "<built-in function getitem>" and norm.id in n.inputs
             and n.id in graph.outputs]
    running = [n for n in graph.nodes if n.kind == "buffer" and "running" in n.name]
    assert len(stats) == 2 and len(running) == 2
    assert not {n.id for n in running} & set(graph.outputs)  # the old statistics are no new buffer values


def test_an_eval_mode_cudnn_batch_norm_is_left_as_it_is() -> None:
    with torch.device("meta"):
        model = _Net()
        batch = (torch.empty(4, 3, 8, 8),)
    model.norm.eval()  # running statistics read, not updated
    ops = Counter(n.op for n in coop.capture(model, batch, device="cuda").graph.nodes)
    assert ops[CUDNN_BN] == 1 and ops[FUNCTIONAL_BN] == 0


@pytest.fixture
def cudnn_stand_in():
    """A CPU kernel for ``aten::cudnn_batch_norm`` that behaves as cuDNN's does: batch statistics, running
    statistics updated in place (by ``native_batch_norm``, which updates them so on the CPU), an empty reserve."""
    library = torch.library.Library("aten", "IMPL")

    def kernel(x, weight, bias, running_mean, running_var, training, momentum, eps):
        out, save_mean, save_invstd = torch.ops.aten.native_batch_norm(x, weight, bias, running_mean, running_var,
                                                                      training, momentum, eps)
        return out, save_mean, save_invstd, torch.empty(0, dtype=torch.uint8)

    library.impl("cudnn_batch_norm", kernel, "CPU")
    yield
    library._destroy()


def test_the_functional_form_run_twice_gives_the_same_bits_and_updates_nothing(cudnn_stand_in) -> None:
    """The oracle is the in-place kernel called once: the functional form's new statistics equal what it left in
    the buffers, its outputs equal its outputs, and a second run (a recomputation) repeats them exactly while the
    statistics it read stay as they were."""
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(4, 3, 8, 8, generator=generator), torch.randn(3, generator=generator),
                       torch.randn(3, generator=generator))
    mean, var = torch.randn(3, generator=generator), torch.rand(3, generator=generator) + 0.5
    in_place_mean, in_place_var = mean.clone(), var.clone()
    once = torch.ops.aten.cudnn_batch_norm(x, weight, bias, in_place_mean, in_place_var, True, 0.1, 1e-5)
    assert not torch.equal(in_place_mean, mean)  # the stand-in updates in place, as cuDNN does
    kept_mean, kept_var = mean.clone(), var.clone()
    first = torch.ops.coop.cudnn_batch_norm_functional(x, weight, bias, mean, var, 0.1, 1e-5)
    again = torch.ops.coop.cudnn_batch_norm_functional(x, weight, bias, mean, var, 0.1, 1e-5)
    assert torch.equal(mean, kept_mean) and torch.equal(var, kept_var)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(first[:3], once[:3], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(first[4], in_place_mean) and torch.equal(first[5], in_place_var)


def test_the_structure_digest_ignores_the_device_index() -> None:
    graph = _meta_graph("cuda")
    data = graph.model_dump()
    on_index = {index: Graph.model_validate({**data, "nodes": [
        {**n, "device": f"cuda:{index}" if n.get("device") == "cuda" else n.get("device")} for n in data["nodes"]]})
        for index in (0, 1)}
    assert on_index[0].structure_sha256 == on_index[1].structure_sha256 == graph.structure_sha256
    assert on_index[0].sha256 != on_index[1].sha256  # the exact digest still tells them apart
