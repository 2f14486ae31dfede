"""An elementwise ``add`` written over one of its operands (MONeT, Shah et al. 2021: in-place operators).

A residual connection adds two activation-sized values (``x + f(x)`` forward, the two branches'
gradients backward): out of place, three activation-sized values are resident at that step. The
implementation ``inplace`` runs ``add_(a, b)`` over ``a``'s storage and ``inplace_other`` runs
``add.out(a, b, out=b)`` over ``b``'s (``Impl.inplace_of``): the operands keep their order, so the
kernel computes ``a + b`` exactly as eager does (``b + a`` would not be bit-identical: with two NaN
operands x86 returns the first one's payload). Offered only for ``add.Tensor`` with the default
``alpha``, where the overwritten operand is a computed value with the output's own layout (no
broadcasting into it, no dtype promotion) that is its whole storage.
"""

from __future__ import annotations

import torch
from torch import fx

from coop.graph_capture.alternatives.base import (
    CapturedStep,
    FoundAlternatives,
    ImplProgram,
    ImplProgramBuilder,
    same_layout,
    whole_storage,
)

aten = torch.ops.aten

#: The op this module rewrites.
ADD = aten.add.Tensor


def add_into_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` written into ``b``'s storage (the operands in eager's order).

    Returns
    -------
    torch.Tensor
        ``b``, now holding ``a + b``.
    """
    return aten.add.out(a, b, out=b)


def add_in_place_program(add: fx.Node, position: int) -> ImplProgram:
    """The implementation ``inplace`` (``add_`` over operand 0) or ``inplace_other`` (:func:`add_into_other` over
    operand 1) of an ``add``.

    Parameters
    ----------
    add
        A captured ``add.Tensor(a, b)``.
    position
        The operand written over: 0 or 1.

    Returns
    -------
    ImplProgram
        Reads ``[a, b]``.
    """
    a, b = add.args[:2]
    builder = ImplProgramBuilder([(a.name, a.meta["val"]), (b.name, b.meta["val"])])
    x, y = builder.inputs
    return builder.done(builder.call(aten.add_.Tensor if position == 0 else add_into_other, x, y))


def find_add_in_place(add: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``inplace`` / ``inplace_other`` for a two-tensor ``add`` whose overwritten operand may take the output.

    Parameters
    ----------
    add
        A captured ``add.Tensor``.
    found
        Receives the implementations.
    """
    graph, owner_of = step.graph, step.owner_of
    if len(add.args) != 2 or add.kwargs or not all(isinstance(v, fx.Node) for v in add.args):
        return
    node = graph.node(owner_of[add.name])
    a, b = add.args
    if a is b:
        return
    for position, (name, operand) in enumerate((("inplace", a), ("inplace_other", b))):
        if operand.name not in owner_of:
            continue
        source = graph.node(owner_of[operand.name])
        if source.caller_owned or source.output_of is not None or source.optional or source.mem != node.mem:
            continue
        value = operand.meta.get("val")
        if not (whole_storage(value) and same_layout(value, add.meta.get("val"))):
            continue
        found.offer(node.id, name, add_in_place_program(add, position), {"inplace_of": source.id})


__all__ = ["ADD", "add_in_place_program", "add_into_other", "find_add_in_place"]
