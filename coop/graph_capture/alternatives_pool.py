"""Max-pool backward from its indices alone (MONeT, Shah et al. 2021: what a backward op stores).

``max_pool2d_with_indices_backward(grad_out, self, ..., indices)`` scatters ``grad_out`` through the
saved argmax ``indices`` into a zero tensor of ``self``'s shape: the CPU kernel reads ``self``'s
sizes and memory format, never its values. Eager keeps the pooled input (a full activation) alive
until the backward only for that. The implementation ``from_indices`` reads ``[grad_out, indices]``
and passes a zero-stride ``expand`` of a 0-d zero in ``self``'s place (no allocation: measured on
CPU, the kernel does not materialize it, unlike the convolution kernels; and its suggested memory
format is the contiguous one, as for the captured input). Offered on CPU for contiguous inputs,
where tests/test_alternatives_conv.py proves the bits equal to the default backward's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from coop.graph import Graph

aten = torch.ops.aten


def from_indices_program(backward: fx.Node) -> Any:
    """``from_indices``: the backward with a zero-stride stand-in for ``self``; reads ``[grad_out, indices]``."""
    from coop.graph_capture.alternatives import _Builder

    grad, source, *geometry, indices = backward.args
    builder = _Builder([(grad.name, grad.meta["val"]), (indices.name, indices.meta["val"])])
    g, index = builder.inputs
    zero = builder.call(aten.new_zeros.default, g, [])
    stand_in = builder.call(aten.expand.default, zero, list(source.meta["val"].shape))
    return builder.done(builder.call(aten.max_pool2d_with_indices_backward.default, g, stand_in, *geometry, index))


def find_max_pool_from_indices(backward: fx.Node, graph: Graph, owner_of: dict[str, int], found: Any) -> None:
    """Offer ``from_indices`` for a CPU max-pool backward over a contiguous, computed (not caller-owned) input."""
    from coop.graph_capture.alternatives import _same_layout

    if len(backward.args) != 8 or backward.kwargs:
        return
    grad, source, indices = backward.args[0], backward.args[1], backward.args[7]
    if not all(isinstance(v, fx.Node) for v in (grad, source, indices)):
        return
    value = source.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or not value.is_contiguous():
        return
    if graph.node(owner_of[source.name]).caller_owned:
        return  # the input stays resident anyway
    program = from_indices_program(backward)
    if _same_layout(program.output.meta["val"], backward.meta["val"]):
        found.impls.setdefault(owner_of[backward.name], {})["from_indices"] = (program, {})


__all__ = ["find_max_pool_from_indices", "from_indices_program"]
