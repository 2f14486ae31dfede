"""A split dropout's draw and first product run as one native_dropout (coop.compiled.first_dropout).

The graphs are built by hand as coop's emitter writes a split dropout (``dropout_mask``, a cast, the scale, the
product); the draw's fake value names the device the graph was emitted for (a meta value: a device whose draw runs
native_dropout whole, as CUDA's does); the graphs run on CPU tensors. The oracle is eager PyTorch: ``native_dropout``
under the same seed gives the same output, mask and generator state as the graph before and after the rewrite.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

import coop.graph_capture.random_ops  # noqa: F401 - registers coop::dropout_mask
from coop.compiled.first_dropout import rejoin_first_products

P = 0.25
SCALE = 1.0 / (1.0 - P)
aten, prims = torch.ops.aten, torch.ops.prims


def _split_dropout(between: bool, recompute: bool, device: str = "meta") -> fx.GraphModule:
    """``x -> draw -> (cast, scale, product)``; ``between``: a ``tanh`` of ``x`` runs between the draw and its
    product; ``recompute``: a second product of the same draw after it; ``device``: the draw's fake value's."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    draw = graph.call_function(torch.ops.coop.dropout_mask.default, (x, P))
    draw.meta["val"] = torch.empty(64, 32, dtype=torch.bool, device=device)
    outputs = [draw]
    if between:
        outputs.append(graph.call_function(aten.tanh.default, (x,)))
    for _ in range(2 if recompute else 1):
        cast = graph.call_function(prims.convert_element_type.default, (draw, torch.float32))
        scaled = graph.call_function(aten.mul.Tensor, (cast, SCALE))
        outputs.append(graph.call_function(aten.mul.Tensor, (x, scaled)))
    graph.output(tuple(outputs))
    return fx.GraphModule(torch.nn.Module(), graph)


def _run(module: fx.GraphModule, x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    torch.manual_seed(5)
    return module(x), torch.get_rng_state()


def _targets(module: fx.GraphModule) -> list[object]:
    return [n.target for n in module.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def test_a_product_right_after_its_draw_is_native_dropouts_own_output_bit_for_bit() -> None:
    x = torch.randn(64, 32)
    module = _split_dropout(between=False, recompute=True)
    before, state_before = _run(module, x)
    assert rejoin_first_products(module.graph) == 1
    module.graph.eliminate_dead_code()
    module.recompile()
    after, state_after = _run(module, x)
    assert torch.ops.coop.dropout_mask.default not in _targets(module)
    assert _targets(module).count(aten.native_dropout.default) == 1
    # the second product (a recomputation) is still built from the mask: one cast, one scale, one product
    assert _targets(module).count(aten.mul.Tensor) == 2
    torch.manual_seed(5)
    output, mask = aten.native_dropout(x, P, True)
    assert torch.equal(after[0], mask) and torch.equal(after[1], output) and torch.equal(after[2], output)
    for ours, theirs in zip(before, after, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(state_before, state_after)


def test_a_product_the_schedule_placed_after_other_work_stays_split() -> None:
    module = _split_dropout(between=True, recompute=False)
    assert rejoin_first_products(module.graph) == 0
    assert torch.ops.coop.dropout_mask.default in _targets(module)
    assert aten.native_dropout.default not in _targets(module)


def test_a_draw_emitted_for_cpu_stays_split() -> None:
    """On CPU the draw is the mask alone (no output computed and dropped), so its first product is not joined."""
    module = _split_dropout(between=False, recompute=False, device="cpu")
    assert rejoin_first_products(module.graph) == 0
    assert torch.ops.coop.dropout_mask.default in _targets(module)
    assert aten.native_dropout.default not in _targets(module)
