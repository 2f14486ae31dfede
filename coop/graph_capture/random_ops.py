"""Compact dropout masks: only the random draw is non-recomputable, and it is stored as bool.

On CPU, ``F.dropout`` in training runs ATen's composite ``_dropout``: ``noise =
empty_like(x).bernoulli_(1 - p); noise.div_(1 - p); out = x * noise``. Functionalized and traced,
that is ``bernoulli.p(like, 1 - p) -> div -> mul``, where the ``bernoulli.p`` node holds a full-size
float tensor of zeros and ones. A replay must not draw new numbers: the
executor can recompute a random op only by restoring the generator state saved before its first
draw (:mod:`coop.runtime.rng`), and capture marks every random op not recomputable
(:mod:`coop.graph_capture.lower`), so that float tensor had to stay resident from the forward to
the backward whenever a formulation wanted to recompute the scaled noise.

:func:`compact_random_masks` rewrites every floating ``bernoulli.p`` into

* ``coop.bernoulli_mask(size, 1 - p, device)``: the draw, straight into a bool tensor (1 byte per
  element instead of 2-8), and the only non-recomputable node; it reads no tensor, so the
  ``empty``/``empty_like`` that only gave the draw its shape become dead code; and
* ``_to_copy(mask, dtype)``: the same zeros and ones in the original dtype, an ordinary
  recomputable node feeding the unchanged ``div`` and ``mul``.

Bit-exactness: ``bernoulli_(p)`` with a scalar ``p`` draws the same integers for every dtype of
its output (ATen's CPU kernels draw integers -- MKL's ``viRngBernoulli`` or
``bernoulli_distribution`` -- and cast them), and 0/1 survive bool -> float exactly, so the noise
and everything after it are the same bits as eager PyTorch's, and the generator advances the
same. ``tests/test_capture.py`` checks both with ``torch.equal`` (the draws per dtype and shape,
and loss, gradients and buffers of whole models over three optimizer steps).

The kernel's own scratch (MKL draws into an int32 buffer) is not modelled, as it was not for the
``bernoulli.p`` it replaces.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

aten = torch.ops.aten


@torch.library.custom_op("coop::bernoulli_mask", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def bernoulli_mask(size: Sequence[int], p: float, device: torch.device) -> torch.Tensor:
    """A bool tensor of ``size`` whose elements are True with probability ``p`` (global RNG).

    Parameters
    ----------
    size : sequence of int
        The mask's shape.
    device : torch.device
        Where the mask is drawn (that device's default generator).

    Returns
    -------
    torch.Tensor
        The bool mask.
    """
    return torch.empty(size, dtype=torch.bool, device=device).bernoulli_(p)


@bernoulli_mask.register_fake
def _bernoulli_mask_fake(size: Sequence[int], p: float, device: torch.device) -> torch.Tensor:
    return torch.empty(size, dtype=torch.bool, device=device)


def _is_float_draw(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.bernoulli.p:
        return False
    value = node.meta.get("val")
    uses_own_generator = node.kwargs.get("generator") is not None
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point and not uses_own_generator


def compact_random_masks(graph: fx.Graph) -> int:
    """Split each floating ``bernoulli.p`` into a bool draw and a recomputable cast; returns how many.

    The graph is rewritten in place: the draw becomes :func:`bernoulli_mask` followed by an ``_to_copy`` to the
    draw's dtype, which takes over its uses.

    Parameters
    ----------
    graph : fx.Graph
        The traced step's graph, with fake values in ``meta["val"]``.

    Returns
    -------
    int
        The number of draws rewritten.
    """
    rewritten = 0
    for node in list(graph.nodes):
        if not _is_float_draw(node):
            continue
        value: torch.Tensor = node.meta["val"]
        probability = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        with graph.inserting_before(node):
            mask = graph.call_function(torch.ops.coop.bernoulli_mask.default,
                                       (list(value.shape), float(probability), value.device))
            noise = graph.call_function(aten._to_copy.default, (mask,), {"dtype": value.dtype})
        # fake values: a fresh bool storage for the mask; the cast takes over the draw's float value
        mask.meta = {**node.meta, "val": value.new_empty(value.shape, dtype=torch.bool)}
        noise.meta = dict(node.meta)
        node.replace_all_uses_with(noise)
        graph.erase_node(node)
        rewritten += 1
    return rewritten
