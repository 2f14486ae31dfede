"""Activations and their backwards: compact masks, the backward from the output, in-place variants (MONeT, Shah et
al. 2021).

* **compact masks** -- ``threshold_backward(grad, v, t)`` (ReLU's backward) and
  ``hardtanh_backward(grad, v, lo, hi)`` (ReLU6, hardtanh) read only *where* ``v`` blocks the
  gradient. An optional value ``mask = le(v, t)`` (or ``not(lo < v < hi)``: hardtanh's kernel zeroes
  the gradient at a NaN ``v``, ReLU's passes it), one byte per element, is computed from ``v`` while
  it is alive, and the backward's implementation ``mask`` reads ``[grad, mask]`` and runs
  ``masked_fill(grad, mask, 0)``; ``mask_inplace`` runs ``masked_fill_`` into ``grad``'s storage
  (``Impl.inplace_of``). The float ``v`` need not be kept. The kernels write ``+0.0`` where the
  mask holds and copy ``grad`` elsewhere, so the bits are identical (tests/test_alternatives.py
  compares raw bits with signed zeros, NaN, infinities and values at the thresholds).
* **backward from the output** -- ``hardtanh_backward`` reads hardtanh's *input*; its
  implementation ``from_output`` reads the output instead (``out <= lo`` iff ``x <= lo`` since
  ``out = clamp(x, lo, hi)``), which an in-place hardtanh leaves as the only value.
* **in place** -- an activation with an in-place aten variant (``relu_``, ``hardtanh_``, ...)
  over a value of its own size gets the implementation ``inplace`` (``Impl.inplace_of``): the
  executor emits the in-place op on the input's value, whose storage the output takes over. The
  schedule semantics (coop.schedule) decide when that is legal; capture only offers it.
"""

from __future__ import annotations

from typing import Any

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

#: Activations with an in-place aten variant of the same arithmetic (same kernel, written into its input).
IN_PLACE_VARIANTS: dict[Any, Any] = {
    aten.relu.default: aten.relu_.default,
    aten.hardtanh.default: aten.hardtanh_.default,
    aten.leaky_relu.default: aten.leaky_relu_.default,
    aten.silu.default: aten.silu_.default,
    aten.sigmoid.default: aten.sigmoid_.default,
    aten.tanh.default: aten.tanh_.default,
}

#: The backwards that read only where their saved value blocks the gradient (offered ``mask``).
MASKED_BACKWARDS = (aten.threshold_backward.default, aten.hardtanh_backward.default)

#: The backward that can read its activation's output instead of its input (offered ``from_output``).
HARDTANH_BACKWARD = aten.hardtanh_backward.default


# -------------------------------------------------------------------- the programs
def mask_program(backward: fx.Node) -> ImplProgram:
    """The optional value ``mask`` of a threshold/hardtanh backward's saved value.

    Parameters
    ----------
    backward
        A captured ``threshold_backward`` or ``hardtanh_backward``.

    Returns
    -------
    ImplProgram
        Reads the saved value; returns True where the backward's gradient is zero.
    """
    value = backward.args[1]
    builder = ImplProgramBuilder([(value.name, value.meta["val"])])
    (v,) = builder.inputs
    if backward.target is aten.threshold_backward.default:
        return builder.done(builder.call(aten.le.Scalar, v, backward.args[2]))
    # hardtanh_backward passes the gradient only where lo < v < hi: a NaN v gets 0, so the mask is
    # not(lo < v < hi), not (v <= lo or v >= hi)
    low, high = backward.args[2], backward.args[3]
    inside = builder.call(aten.logical_and.default, builder.call(aten.gt.Scalar, v, low), builder.call(aten.lt.Scalar, v, high))
    return builder.done(builder.call(aten.logical_not.default, inside))


def masked_backward_program(backward: fx.Node, mask_id: int, mask: torch.Tensor, in_place: bool = False) -> ImplProgram:
    """The implementation ``mask`` (or ``mask_inplace``) of a threshold/hardtanh backward.

    Parameters
    ----------
    backward
        A captured ``threshold_backward`` or ``hardtanh_backward``.
    mask_id, mask
        The mask's Graph id and (fake) value.
    in_place
        Write into ``grad``'s storage (``masked_fill_``) instead of a new one (``masked_fill``).

    Returns
    -------
    ImplProgram
        Reads ``[grad, mask]``; returns ``masked_fill(grad, mask, 0)``.
    """
    grad = backward.args[0]
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (mask_id, mask)])
    g, m = builder.inputs
    op = aten.masked_fill_.Scalar if in_place else aten.masked_fill.Scalar
    return builder.done(builder.call(op, g, m, 0))


def from_output_program(backward: fx.Node, output: fx.Node) -> ImplProgram:
    """The implementation ``from_output`` of a ``hardtanh_backward``: the same mask from hardtanh's output.

    Parameters
    ----------
    backward
        A captured ``hardtanh_backward(grad, x, lo, hi)``.
    output
        The captured hardtanh whose input ``x`` is.

    Returns
    -------
    ImplProgram
        Reads ``[grad, out]``; returns ``hardtanh_backward(grad, out, lo, hi)``.
    """
    grad = backward.args[0]
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (output.name, output.meta["val"])])
    g, out = builder.inputs
    return builder.done(builder.call(aten.hardtanh_backward.default, g, out, *backward.args[2:]))


def inplace_program(activation: fx.Node) -> ImplProgram:
    """The implementation ``inplace`` of an activation.

    Parameters
    ----------
    activation
        A captured activation of :data:`IN_PLACE_VARIANTS`.

    Returns
    -------
    ImplProgram
        Reads its input; runs the in-place variant on it.
    """
    source = activation.args[0]
    builder = ImplProgramBuilder([(source.name, source.meta["val"])])
    (x,) = builder.inputs
    return builder.done(builder.call(IN_PLACE_VARIANTS[activation.target], x, *activation.args[1:]))


# -------------------------------------------------------------------- the finders
def find_mask(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``mask`` (and ``mask_inplace``) for a threshold/hardtanh backward whose saved value is computed.

    Parameters
    ----------
    backward
        A captured backward of :data:`MASKED_BACKWARDS`.
    found
        Receives the implementations and the mask (an optional value shared by backwards of one saved value).
    """
    graph, owner_of = step.graph, step.owner_of
    grad, value = backward.args[0], backward.args[1]
    if not isinstance(grad, fx.Node) or not isinstance(value, fx.Node):
        return
    if graph.node(owner_of[value.name]).caller_owned:
        return  # a parameter or input stays resident anyway: a mask would only add bytes
    key = (value.name, str(backward.target), *map(repr, backward.args[2:]))
    mask_id, mask = found.optional_once(key, lambda: mask_program(backward), owner_of[value.name])
    program = masked_backward_program(backward, mask_id, mask.output.meta["val"])
    if not same_layout(program.output.meta["val"], backward.meta["val"]):
        return
    node_id = owner_of[backward.name]
    found.offer(node_id, "mask", program)
    grad_node = graph.node(owner_of[grad.name])
    if (not grad_node.caller_owned and grad_node.output_of is None and grad_node.mem == graph.node(node_id).mem
            and whole_storage(grad.meta.get("val")) and same_layout(grad.meta.get("val"), backward.meta["val"])):
        program = masked_backward_program(backward, mask_id, mask.output.meta["val"], in_place=True)
        found.offer(node_id, "mask_inplace", program, {"inplace_of": grad_node.id})


def find_from_output(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``from_output`` for a ``hardtanh_backward`` whose saved input feeds a hardtanh of the same bounds.

    Parameters
    ----------
    backward
        A captured ``hardtanh_backward``.
    found
        Receives the implementation.
    """
    value = backward.args[1]
    for user in value.users if isinstance(value, fx.Node) else ():
        if user.target is aten.hardtanh.default and tuple(user.args[1:]) == tuple(backward.args[2:]):
            program = from_output_program(backward, user)
            if same_layout(program.output.meta["val"], backward.meta["val"]):
                found.offer(step.owner_of[backward.name], "from_output", program)
            return


def find_inplace(activation: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``inplace`` for an activation over a computed value of its own layout that is its whole storage.

    Parameters
    ----------
    activation
        A captured activation of :data:`IN_PLACE_VARIANTS`.
    found
        Receives the implementation.
    """
    graph, owner_of = step.graph, step.owner_of
    source = activation.args[0]
    if not isinstance(source, fx.Node) or source.name not in owner_of:
        return
    source_node = graph.node(owner_of[source.name])
    node = graph.node(owner_of[activation.name])
    if source_node.caller_owned or source_node.output_of is not None or source_node.mem != node.mem:
        return
    if not (whole_storage(source.meta.get("val")) and same_layout(source.meta.get("val"), activation.meta.get("val"))):
        return
    found.offer(node.id, "inplace", inplace_program(activation), {"inplace_of": source_node.id})


__all__ = ["HARDTANH_BACKWARD", "IN_PLACE_VARIANTS", "MASKED_BACKWARDS", "find_from_output", "find_inplace", "find_mask",
           "from_output_program", "inplace_program", "mask_program", "masked_backward_program"]
