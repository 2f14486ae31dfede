"""(Log-)softmax backward written over its incoming gradient (MONeT, Shah et al. 2021: in-place operators).

``_log_softmax_backward_data(grad, out, dim, dtype)`` (and ``_softmax_backward_data``) allocate
grad_input while grad and the forward's output are resident: on a language model's vocabulary
logits three values of batch x sequence x vocabulary at once, the largest step of GPT-2's
backward. Each row (a slice along ``dim``) of the result depends only on the same row of grad and
out, so the implementation ``grad_inplace`` (``Impl.inplace_of`` = grad) runs the eager kernel on
:data:`ROW_CHUNKS` chunks of rows and copies each chunk's result over grad's rows: its workspace is
one chunk. The CPU kernel computes each row alone, in an order set by the row's length, so the bits
equal eager's (tests/test_alternatives_conv.py compares raw bits, 2-d and 3-d, tiny and huge
gradients); offered on CPU, for ``dim`` the last dimension of a contiguous gradient of the output's
layout and dtype.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import fx

from coop.graph_capture.alternatives.base import (
    CapturedStep,
    FoundAlternatives,
    ImplProgram,
    ImplProgramBuilder,
    same_layout,
    signature,
    whole_storage,
)

aten = torch.ops.aten

#: Row chunks of ``grad_inplace``: its workspace is one chunk, 1/ROW_CHUNKS of grad_input.
ROW_CHUNKS = 16

#: The softmax backwards this module rewrites.
SOFTMAX_BACKWARDS = (aten._log_softmax_backward_data.default, aten._softmax_backward_data.default)


def written_over(grad: torch.Tensor, *written: Any) -> torch.Tensor:
    """The output of a (log-)softmax backward run over its incoming gradient (the program's last call).

    Parameters
    ----------
    grad
        The incoming gradient's storage, now grad_input.
    *written
        The chunk copies into it (listed so that they run first).

    Returns
    -------
    torch.Tensor
        ``grad``.
    """
    return grad


def grad_inplace_program(backward: fx.Node) -> ImplProgram:
    """The implementation ``grad_inplace`` of a (log-)softmax backward: the kernel per chunk of rows, each chunk
    copied over grad's rows.

    Parameters
    ----------
    backward
        A captured backward of :data:`SOFTMAX_BACKWARDS`.

    Returns
    -------
    ImplProgram
        Reads ``[grad, out]``.
    """
    grad, output, _, dtype = backward.args
    builder = ImplProgramBuilder([(grad.name, grad.meta["val"]), (output.name, output.meta["val"])])
    g, out = builder.inputs
    shape = list(grad.meta["val"].shape)
    rows, width = math.prod(shape[:-1]), shape[-1]
    g_rows, out_rows = (builder.call(aten.view.default, v, [rows, width]) for v in (g, out))
    count = min(rows, ROW_CHUNKS)
    written = []
    for first, last in itertools.pairwise([rows * i // count for i in range(count + 1)]):
        chunk = builder.call(backward.target, builder.call(aten.slice.Tensor, g_rows, 0, first, last),
                             builder.call(aten.slice.Tensor, out_rows, 0, first, last), 1, dtype)
        written.append(builder.call(aten.copy_.default, builder.call(aten.slice.Tensor, g_rows, 0, first, last), chunk))
    return builder.done(builder.call(written_over, g, *written))


def find_softmax_grad_inplace(backward: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None:
    """Offer ``grad_inplace`` for a CPU (log-)softmax backward over the last dimension whose grad it may overwrite.

    Parameters
    ----------
    backward
        A captured backward of :data:`SOFTMAX_BACKWARDS`.
    found
        Receives the implementation (its program shared by backwards of one configuration).
    """
    graph, owner_of = step.graph, step.owner_of
    if len(backward.args) != 4 or backward.kwargs:
        return
    grad, output, dim, dtype = backward.args
    if not (isinstance(grad, fx.Node) and isinstance(output, fx.Node) and isinstance(dim, int)):
        return
    value = grad.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.dim() < 2 or value.numel() == 0:
        return
    if dim % value.dim() != value.dim() - 1 or dtype != value.dtype:
        return
    if not (whole_storage(value) and same_layout(value, output.meta.get("val"))
            and same_layout(value, backward.meta.get("val"))):
        return
    grad_node, node = graph.node(owner_of[grad.name]), graph.node(owner_of[backward.name])
    if grad_node.caller_owned or grad_node.output_of is not None or grad_node.mem != node.mem:
        return
    program = found.shared_program(("grad_inplace", *signature(backward)), (grad.name, output.name),
                                   lambda: grad_inplace_program(backward))
    found.offer(node.id, "grad_inplace", program, {"inplace_of": grad_node.id})


__all__ = ["ROW_CHUNKS", "SOFTMAX_BACKWARDS", "find_softmax_grad_inplace", "grad_inplace_program", "written_over"]
