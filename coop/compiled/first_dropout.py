"""A split dropout's first product taken from the draw itself: one ``native_dropout`` in the emitted forward.

With eager's random kernels (``fallback_random``) coop splits each ``native_dropout(x, p, True)`` of the joint graph
into its draw :func:`coop.graph_capture.random_ops.dropout_mask` and the product ``x * (mask * scale)``, so that a
schedule may rebuild the output from ``x`` and the bool mask. Where the draw runs native_dropout whole and drops its
output (any device but CPU: :func:`coop.graph_capture.random_ops.draws_mask_alone`), the forward computed every
dropout's output twice: measured on bench_compile's BERT with nothing
recomputed (2026-11-30, one thread), the forward ran 17 % slower than the plain compiled step's and the step
7.6 % slower, while drawing the mask alone made the two equal.

:func:`rejoin_first_products` undoes the split where nothing is rebuilt: in the emitted forward graph, the first
product of each draw (the same ``x``, the same mask, native_dropout's scale) becomes ``native_dropout(x, p, True)[0]``
and the draw ``[1]`` of the same call; a later product of the same draw (a recomputation) stays a product of the
mask. The values are the same bits (the split is exact in float32 and float64: ``tests/test_dropout_split.py``), the
generator advances by the same one call, and the output exists from the draw on, as inside the draw before (the
draw's scratch, :func:`coop.graph_capture.random_ops.own_scratch_bytes`, counts it there). Only a product the
schedule computes right after its draw is joined (:data:`NEAR`), so no output lives longer than the schedule says:
on bench_compile's BERT 5 of its 7 draws (2026-11-30); the two attention-probability draws ran 8 computations before
their products and stay split.

A draw on CPU stays split: there it is the mask alone (``bernoulli_`` into a bool tensor, or bytes read as float8 zeros
and ones: :func:`coop.graph_capture.random_ops.float8_dropout_mask`, never rejoined), and native_dropout whole
would add its two products over ``x`` and a cast to bool that the split's product, fused into its readers, does not
need. Measured on bench_compile's ViT at the plain compile's held bytes, nothing recomputed, one process, 21
alternating steps (2026-12-01, one thread): split 190.6 ms holding 55,488,296 B, rejoined 189.2 ms holding 57,618,216 B
(plain compile 180.0 ms, 57,817,896 B): the same time within this machine's noise, 2.1 MB less held.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from coop.graph_capture.random_ops import draws_mask_alone

aten = torch.ops.aten
prims = torch.ops.prims

__all__ = ["NEAR", "REJOINED", "rejoin_first_products"]

#: the meta key marking a native_dropout that stands for a draw and its first product (its scratch is the draw's)
REJOINED = "coop_rejoined_dropout"

#: the most computations that may run between a draw and its first product for the two to be joined (the product's
#: own cast and scale not counted): any more, and the output would live through work the schedule ran without it
NEAR = 0


def rejoin_first_products(graph: fx.Graph) -> int:
    """Each draw and its first product in ``graph`` (an emitted forward) as one ``native_dropout``; returns how many.

    The graph is rewritten in place; the casts and scales left without readers are dead code for the caller's
    ``eliminate_dead_code``.
    """
    nodes = list(graph.nodes)
    order = {node: index for index, node in enumerate(nodes)}
    joined = 0
    for draw in [n for n in nodes if n.op == "call_function" and n.target is torch.ops.coop.dropout_mask.default]:
        value = draw.meta.get("val")
        if isinstance(value, torch.Tensor) and draws_mask_alone(value.device):
            continue  # its draw is the mask alone: cheaper split than native_dropout's two products and cast
        product = _first_product(draw, nodes, order)
        if product is None:
            continue
        x, p = draw.args[0], draw.args[1]
        with graph.inserting_before(draw):
            whole = graph.call_function(aten.native_dropout.default, (x, p, True))
            output = graph.call_function(operator.getitem, (whole, 0))
            mask = graph.call_function(operator.getitem, (whole, 1))
        whole.meta = {key: value for key, value in draw.meta.items() if key != "val"}
        whole.meta["val"] = (product.meta.get("val"), draw.meta.get("val"))
        whole.meta[REJOINED] = True
        mask.meta = dict(draw.meta)
        output.meta = dict(product.meta)
        draw.replace_all_uses_with(mask)
        product.replace_all_uses_with(output)
        graph.erase_node(product)
        graph.erase_node(draw)
        joined += 1
    return joined


def _first_product(draw: fx.Node, nodes: list[fx.Node], order: dict[fx.Node, int]) -> fx.Node | None:
    """The earliest ``x * (convert(draw) * scale)`` of ``draw``'s own ``x`` and scale, if it runs near the draw."""
    x, p = draw.args[0], float(draw.args[1])
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    products = []
    for cast in draw.users:
        if cast.target is not prims.convert_element_type.default or cast.args[0] is not draw:
            continue
        for scaled in cast.users:
            if scaled.target is not aten.mul.Tensor or scaled.args != (cast, scale):
                continue
            products += [(order[m], m, cast, scaled) for m in scaled.users
                         if m.target is aten.mul.Tensor and m.args == (x, scaled)]
    if not products:
        return None
    position, product, cast, scaled = min(products, key=lambda item: item[0])
    between = [n for n in nodes[order[draw] + 1:position]
               if n.op == "call_function" and n not in (cast, scaled) and n.target is not operator.getitem]
    return product if len(between) <= NEAR else None
