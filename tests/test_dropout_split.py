"""Eager's dropout split into its draw and a recomputable product (``split_native_dropouts``).

Oracle: ``aten.native_dropout`` itself, run eagerly under the same seed: the split graph's output, mask and the
generator's next draw must equal it bit for bit; a dtype where the product would round differently is left whole.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coop.graph_capture.random_ops import split_native_dropouts
from coop.graph_capture.trace import is_random


def _dropout_twice(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out, mask = torch.ops.aten.native_dropout(x, 0.3, True)
    again, _ = torch.ops.aten.native_dropout(out.tanh(), 0.1, True)
    return out, mask, again


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_split_graph_draws_and_computes_what_native_dropout_does(dtype: torch.dtype) -> None:
    x = torch.randn(33, 65, dtype=dtype)
    traced = make_fx(_dropout_twice)(x)
    assert split_native_dropouts(traced.graph) == 2
    traced.recompile()
    targets = [node.target for node in traced.graph.nodes if node.op == "call_function"]
    assert torch.ops.aten.native_dropout.default not in targets
    random = [node for node in traced.graph.nodes if node.op == "call_function" and is_random(node)]
    assert [node.target for node in random] == [torch.ops.coop.dropout_mask.default] * 2
    assert all(node.meta["val"].dtype == torch.bool for node in random)
    torch.manual_seed(5)
    ours = traced(x)
    after_ours = torch.rand(3)
    torch.manual_seed(5)
    theirs = _dropout_twice(x)
    after_theirs = torch.rand(3)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(after_ours, after_theirs), "the generator advanced differently"


def test_a_half_precision_dropout_stays_whole() -> None:
    """In bfloat16 eager rounds ``mask * scale`` before the product, a fused kernel would not: not split."""
    traced = make_fx(_dropout_twice)(torch.randn(8, 8, dtype=torch.bfloat16))
    assert split_native_dropouts(traced.graph) == 0


def test_coops_partitioner_splits_the_dropout_and_replays_eagers_mask() -> None:
    """coop's partitioner under AOTAutograd (no inductor: the emitted modules run as fx graphs): the joint graph's
    native_dropout is split, checkpoint-all rebuilds its output in the backward from the saved mask, and loss and
    gradients equal eager's bit for bit under the same seed (a mask drawn again would change them)."""
    from functorch.compile import aot_module, nop

    from coop.compiled.partitioner import CoopPartitioner

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4))
    batch = torch.randn(8, 16)
    partitioner = CoopPartitioner(1.0, formulation="checkpoint-all")
    compiled = aot_module(model, fw_compiler=nop, bw_compiler=nop,
                          partition_fn=partitioner)
    grads = []
    for step_fn in (compiled, model):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(11)
        loss = step_fn(batch).pow(2).mean()
        loss.backward()
        grads.append((loss.detach(), *(p.grad for p in model.parameters())))
    for ours, eager in zip(*grads, strict=True):
        assert torch.equal(ours, eager)
    (plan,) = partitioner.plans
    forward_targets = [n.target for n in plan.partition.forward.graph.nodes]
    backward_targets = [n.target for n in plan.partition.backward.graph.nodes]
    # the forward's draw and first product are one native_dropout again (coop.compiled.first_dropout); the
    # backward rebuilds the output from the saved mask and draws nothing
    assert plan.partition.rejoined_dropouts == 1
    assert forward_targets.count(torch.ops.aten.native_dropout.default) == 1
    assert torch.ops.coop.dropout_mask.default not in forward_targets
    assert not {torch.ops.coop.dropout_mask.default, torch.ops.aten.native_dropout.default} & set(backward_targets), \
        "a mask drawn again in the backward"
    assert plan.partition.recomputed(), "checkpoint-all rebuilds the dropout's output in the backward"


def test_the_mask_op_is_charged_what_native_dropout_allocates_inside_it() -> None:
    """The lowering charges ``coop.dropout_mask`` twice its input's bytes as workspace (hand-counted: 33 x 65
    float32 = 8,580 B, twice: 17,160 B; the CPU allocator rounds nothing): what the CPU allocator, read by a meter
    that is not coop's, holds inside the call beyond its input and the mask it returns."""
    from coop.graph_capture.lower import lower
    from coop.graph_capture.trace import TracedStep
    from tests.independent_meter import HeldBytes

    x = torch.randn(33, 65)
    traced = make_fx(lambda x: torch.ops.aten.native_dropout(x, 0.3, True)[0].sum())(x)
    split_native_dropouts(traced.graph)
    traced.recompile()
    step = TracedStep(module=traced, param_names=[], buffer_names=[], frozen_names=[], batch_size=0,
                      output_grads=[], output_buffers=[])
    lowered = lower(step, [("input", "x")], "dropout")
    (mask,) = [n for n in lowered.graph.nodes if n.random]
    assert mask.workspace == 17_160 == 2 * 33 * 65 * 4
    with HeldBytes(held=[x]) as meter:
        kept = torch.ops.coop.dropout_mask(x, 0.3)
    assert meter.peak_bytes - 33 * 65 * 4 - kept.numel() == mask.workspace
