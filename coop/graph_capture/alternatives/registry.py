"""The registry of alternatives finders: which finder runs on which captured operator, in which order.

:data:`FINDERS` lists every finder with the aten ops it handles; :func:`find_alternatives` walks the captured fx
graph once and calls, on each storage-owning call node, the finders registered for its op, in the registry's
order (the order decides the order of a node's implementations and the Graph ids of the optional values). A new
operator family is a module of finders on :mod:`~coop.graph_capture.alternatives.base` plus its rows here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import fx

from coop.graph import Graph
from coop.graph_capture.alternatives.activation import (
    HARDTANH_BACKWARD,
    IN_PLACE_VARIANTS,
    MASKED_BACKWARDS,
    find_from_output,
    find_inplace,
    find_mask,
)
from coop.graph_capture.alternatives.add import ADD, find_add_in_place
from coop.graph_capture.alternatives.base import CapturedStep, Finder, FoundAlternatives
from coop.graph_capture.alternatives.conv import CONVOLUTION_BACKWARD, find_convolution_split
from coop.graph_capture.alternatives.norm import (
    BATCH_NORM_BACKWARD,
    BATCH_NORM_FORWARDS,
    find_batch_norm_forward_inplace,
    find_batch_norm_from_output,
    find_batch_norm_grad_inplace,
)
from coop.graph_capture.alternatives.pool import (
    MAX_POOL_BACKWARD,
    find_max_pool_from_indices,
    find_max_pool_from_packed,
)
from coop.graph_capture.alternatives.softmax import SOFTMAX_BACKWARDS, find_softmax_grad_inplace


class RegisteredFinder(NamedTuple):
    """One row of the registry: a finder and the aten ops (op overloads) it is called on."""

    targets: tuple[Any, ...]
    finder: Finder


#: Every finder, in the order it runs on a node of its ops.
FINDERS: tuple[RegisteredFinder, ...] = (
    RegisteredFinder(MASKED_BACKWARDS, find_mask),
    RegisteredFinder((HARDTANH_BACKWARD,), find_from_output),
    RegisteredFinder(tuple(IN_PLACE_VARIANTS), find_inplace),
    RegisteredFinder(BATCH_NORM_FORWARDS, find_batch_norm_forward_inplace),
    RegisteredFinder((BATCH_NORM_BACKWARD,), find_batch_norm_from_output),
    RegisteredFinder((BATCH_NORM_BACKWARD,), find_batch_norm_grad_inplace),
    RegisteredFinder((CONVOLUTION_BACKWARD,), find_convolution_split),
    RegisteredFinder((MAX_POOL_BACKWARD,), find_max_pool_from_indices),
    RegisteredFinder((MAX_POOL_BACKWARD,), find_max_pool_from_packed),
    RegisteredFinder((ADD,), find_add_in_place),
    RegisteredFinder(SOFTMAX_BACKWARDS, find_softmax_grad_inplace),
)

#: The implementations the finders offer, by name (``mask``, ``mask_inplace``, ``from_output`` of a hardtanh
#: backward, ``inplace`` of an activation: activation; ``split``: conv; ``grad_inplace``: norm and softmax;
#: ``from_indices`` and ``from_packed``: pool; ``inplace`` / ``inplace_other`` of an ``add``: add;
#: ``forward_inplace`` and ``from_output`` of batch norm: norm).
IMPL_NAMES = ("mask", "mask_inplace", "from_output", "inplace", "split", "grad_inplace", "from_indices", "inplace_other",
              "from_packed", "forward_inplace")


def finders_of(target: Any) -> list[Finder]:
    """The registered finders of an op.

    Parameters
    ----------
    target
        A captured fx node's target.

    Returns
    -------
    list[Finder]
        Its finders in the registry's order (empty for an op no finder handles).
    """
    return [row.finder for row in FINDERS if target in row.targets]


def _owned(node: fx.Node, fx_names: dict[int, list[str]], owner_of: dict[str, int]) -> bool:
    """The node is the storage-owning fx node of its Graph node (its value is the node's value)."""
    return fx_names[owner_of[node.name]][0] == node.name


def find_alternatives(module: fx.GraphModule, graph: Graph, fx_names: dict[int, list[str]], owner_of: dict[str, int],
                      values: Mapping[str, torch.Tensor] | None = None) -> FoundAlternatives:
    """The implementations and optional values this captured step allows, from every registered finder.

    Parameters
    ----------
    module
        The captured step.
    fx_names
        Graph id -> its fx nodes' names, the storage owner's first.
    owner_of
        fx node name -> the Graph id owning its storage.
    values
        Placeholder name -> the real tensor at capture: lets batch norm's backward from its output be offered where
        every weight is nonzero; without it that implementation is not offered.

    Returns
    -------
    FoundAlternatives
        The programs found (not yet priced); optional values numbered from the Graph's largest id + 1.
    """
    step = CapturedStep(graph=graph, owner_of=owner_of, values=values or {})
    found = FoundAlternatives(next_id=max(n.id for n in graph.nodes) + 1)
    for node in module.graph.nodes:
        if node.op != "call_function" or not _owned(node, fx_names, owner_of):
            continue
        if graph.node(owner_of[node.name]).random:
            continue
        for finder in finders_of(node.target):
            finder(node, step, found)
    return found


__all__ = ["FINDERS", "IMPL_NAMES", "RegisteredFinder", "find_alternatives", "finders_of"]
