"""Eager's dropout split into its draw and a recomputable product (``split_native_dropouts``).

Oracle: ``aten.native_dropout`` itself, run eagerly under the same seed: the split graph's output, mask and the
generator's next draw must equal it bit for bit; a dtype where the product would round differently is left whole.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coop.graph_capture.random_ops import MASK_DRAWS, split_native_dropouts
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
    # the first mask is a result (read as bool): the bool draw; the second is read only by casts (none here): the
    # float8 draw (on CPU, where the mask is drawn alone)
    assert [node.target for node in random] == [torch.ops.coop.dropout_mask.default,
                                                 torch.ops.coop.float8_dropout_mask.default]
    assert [node.meta["val"].dtype for node in random] == [torch.bool, torch.float8_e5m2]
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
    # on CPU the forward draws the mask alone and stays split (coop.compiled.first_dropout); the backward rebuilds
    # the output from the saved mask and draws nothing
    assert plan.partition.rejoined_dropouts == 0
    # undecomposed (no inductor), the backward reads the mask by native_dropout_backward: the bool draw
    assert forward_targets.count(torch.ops.coop.dropout_mask.default) == 1
    assert torch.ops.coop.float8_dropout_mask.default not in forward_targets
    assert torch.ops.aten.native_dropout.default not in forward_targets
    assert not {*MASK_DRAWS, torch.ops.aten.native_dropout.default} & set(backward_targets), \
        "a mask drawn again in the backward"
    assert plan.partition.recomputed(), "checkpoint-all rebuilds the dropout's output in the backward"


def _lowered_mask(x: torch.Tensor) -> object:
    """The Graph node of the one dropout draw in a split ``native_dropout(x, 0.3)`` step."""
    from coop.graph_capture.lower import lower
    from coop.graph_capture.trace import TracedStep

    traced = make_fx(lambda x: torch.ops.aten.native_dropout(x, 0.3, True)[0].sum())(x)
    split_native_dropouts(traced.graph)
    traced.recompile()
    step = TracedStep(module=traced, param_names=[], buffer_names=[], frozen_names=[], batch_size=0,
                      output_grads=[], output_buffers=[])
    lowered = lower(step, [("input", "x")], "dropout")
    (mask,) = [n for n in lowered.graph.nodes if n.random]
    return mask


def test_the_cpu_mask_op_draws_in_place_and_is_charged_nothing() -> None:
    """On CPU ``coop.dropout_mask`` draws into the bool mask itself: the CPU allocator, read by a meter that is not
    coop's, holds nothing inside the call beyond its input and the mask it returns, and the lowering charges 0."""
    from tests.independent_meter import HeldBytes

    x = torch.randn(33, 65)
    assert _lowered_mask(x).workspace == 0
    with HeldBytes(held=[x]) as meter:
        kept = torch.ops.coop.dropout_mask(x, 0.3)
    assert meter.peak_bytes - 33 * 65 * 4 - kept.numel() == 0


def test_native_dropout_run_whole_holds_what_the_other_devices_charge() -> None:
    """Where the mask is not drawn alone (CUDA) ``coop.dropout_mask`` runs native_dropout whole, charged twice its
    input's bytes (hand-counted: 33 x 65 float32 = 8,580 B, twice: 17,160 B). Run whole on CPU, native_dropout
    holds that inside the call beyond its input and the mask (the CPU allocator's events, a meter not coop's): the
    upper bound is reached there; the meta-device graph is lowered as a non-CPU device's."""
    from coop.graph_capture.random_ops import whole_dropout_mask
    from tests.independent_meter import HeldBytes

    x = torch.randn(33, 65)
    assert _lowered_mask(x.to("meta")).workspace == 17_160 == 2 * 33 * 65 * 4
    with HeldBytes(held=[x]) as meter:
        kept = whole_dropout_mask(x, 0.3)
    assert meter.peak_bytes - 33 * 65 * 4 - kept.numel() == 17_160


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize("p", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_forms_of_the_mask_op_draw_native_dropouts_mask(layout: str, p: float, dtype: torch.dtype) -> None:
    """The CPU draw (the mask alone) and the whole form (native_dropout, its output dropped): the same mask, strides
    and generator state after it as ``aten.native_dropout`` under the same seed."""
    from coop.graph_capture.random_ops import whole_dropout_mask

    x = torch.randn(4, 6, 5, 7, dtype=dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "strided":
        x = x[:, ::2]
    for draw in (torch.ops.coop.dropout_mask, whole_dropout_mask, torch.ops.coop.float8_dropout_mask):
        torch.manual_seed(9)
        theirs = torch.ops.aten.native_dropout(x, p, True)[1]
        after_theirs = torch.rand(3)
        torch.manual_seed(9)
        ours = draw(x, p)
        after_ours = torch.rand(3)
        assert ours.stride() == theirs.stride()
        if draw is torch.ops.coop.float8_dropout_mask:  # zeros and ones, as float8_e5m2 bytes 0x00 and 0x3C
            assert ours.dtype == torch.float8_e5m2
            assert torch.equal(ours.view(torch.uint8), theirs.to(torch.uint8) * 0x3C)
            assert torch.equal(ours.to(dtype), theirs.to(dtype))
        else:
            assert ours.dtype == torch.bool and torch.equal(ours, theirs)
        assert torch.equal(after_ours, after_theirs), "the generator advanced differently"


def test_the_float8_mask_holds_one_byte_an_element_and_no_scratch() -> None:
    """The float8 draw holds what the bool draw holds (a meter that is not coop's: the CPU allocator's events), one
    byte an element (hand-counted: 33 x 65 = 2,145 B), and nothing inside the call."""
    from tests.independent_meter import HeldBytes

    x = torch.randn(33, 65)
    with HeldBytes(held=[x]) as meter:
        kept = torch.ops.coop.float8_dropout_mask(x, 0.3)
    assert kept.numel() * kept.element_size() == 2_145
    assert meter.peak_bytes - 33 * 65 * 4 == 2_145


def test_a_draw_not_on_cpu_stays_the_bool_mask() -> None:
    """Where the mask is not drawn alone (a meta-device graph, planned as CUDA's), every draw is the bool
    ``dropout_mask`` even where only casts read it: the float8 draw is CPU's."""
    traced = make_fx(lambda x: torch.ops.aten.native_dropout(x, 0.3, True)[0].tanh())(torch.randn(8, 8, device="meta"))
    assert split_native_dropouts(traced.graph) == 1
    random = [node for node in traced.graph.nodes if node.op == "call_function" and is_random(node)]
    assert [node.target for node in random] == [torch.ops.coop.dropout_mask.default]
    assert random[0].meta["val"].dtype == torch.bool
