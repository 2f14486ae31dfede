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
