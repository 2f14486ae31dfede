"""The channels-last copies counted for a joint graph's caller-owned convolution inputs (coop.compiled.layout_copies).

The oracle is hand-counted bytes: each placeholder a convolution reads as its input or weight, once, unless it is
already channels-last; a computed input (laid out by its producer) is not counted.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coop.compiled.layout_copies import channels_last_copy_bytes

aten = torch.ops.aten


def _conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


def test_caller_owned_inputs_and_weights_are_counted_once_and_computed_inputs_not() -> None:
    def step(batch: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        hidden = _conv(batch, w1).relu()
        return _conv(hidden, w2) + _conv(hidden, w2)  # w2 read twice: one copy

    batch, w1, w2 = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4, 4, 3, 3)
    graph = make_fx(step, tracing_mode="fake")(batch, w1, w2).graph
    assert channels_last_copy_bytes(graph) == 4 * (2 * 3 * 8 * 8 + 4 * 3 * 3 * 3 + 4 * 4 * 3 * 3)


def test_a_channels_last_input_and_a_graph_without_convolutions_count_nothing() -> None:
    batch = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    weight = torch.randn(4, 3, 3, 3)
    graph = make_fx(_conv, tracing_mode="fake")(batch, weight).graph
    assert channels_last_copy_bytes(graph) == 4 * 4 * 3 * 3 * 3  # the weight alone
    linear = make_fx(lambda x, w: x @ w, tracing_mode="fake")(torch.randn(4, 4), torch.randn(4, 4)).graph
    assert channels_last_copy_bytes(linear) == 0
