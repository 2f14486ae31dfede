"""The channels-last copies inductor's layout optimization makes of a joint graph's caller-owned convolution inputs.

With ``layout_optimization`` on (coop.compile's measured rounds turn it on for a model with convolutions,
:mod:`coop.compiled.api`), inductor runs each convolution in channels-last. A convolution input that the graph
computes is written in that layout by its producer; one the caller owns (the batch, a weight: a placeholder of
the joint graph) is copied once, and the copy is what the backward's convolution reads, so it lives from the
forward's first kernel to that backward kernel, across the step's peak. No value of coop's Graph holds those bytes:
measured on bench_compile's ViT (one patch convolution, batch 32 x 3 x 64 x 64 float32, weight 128 x 3 x 8 x 8), a
plan predicted at 47,429,976 B held 49,115,176 B, 1,685,200 B more, of which the two copies are 1,671,168 B
(2026-12-01).

:func:`channels_last_copy_bytes` counts them (each placeholder once), so that :func:`coop.compiled.refit.
fit_measured` can tell a round whose excess these copies explain from one whose kernels inductor moved.
"""

from __future__ import annotations

import torch
from torch import fx

__all__ = ["channels_last_copy_bytes"]

#: the convolution ops whose input and weight inductor lays out channels-last
_CONVOLUTIONS = frozenset({torch.ops.aten.convolution.default})


def channels_last_copy_bytes(graph: fx.Graph) -> int:
    """Bytes of the channels-last copies of the caller-owned inputs and weights of a joint graph's convolutions.

    Parameters
    ----------
    graph : fx.Graph
        A joint graph (placeholders: the caller-owned values and the tangents), fake values in ``meta["val"]``.

    Returns
    -------
    int
        The sum, over each placeholder that a 2-D or 3-D convolution reads as its input or weight and that is not
        already channels-last contiguous, of its bytes (counted once however many convolutions read it); 0 for a
        graph without convolutions.
    """
    copied: dict[str, int] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _CONVOLUTIONS:
            continue
        for arg in node.args[:2]:
            if not isinstance(arg, fx.Node) or arg.op != "placeholder" or arg.name in copied:
                continue
            value = arg.meta.get("val")
            if not isinstance(value, torch.Tensor) or value.dim() not in (4, 5):
                continue
            layout = torch.channels_last if value.dim() == 4 else torch.channels_last_3d
            if value.is_contiguous(memory_format=layout):
                continue
            copied[arg.name] = value.numel() * value.element_size()
    return sum(copied.values())
