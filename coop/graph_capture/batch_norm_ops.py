"""cuDNN's and MIOpen's training batch norm as functional ops: new running statistics as values, none updated in place.

On CUDA, ATen's ``batch_norm`` runs ``cudnn_batch_norm`` (:mod:`coop.graph_capture.cuda_dispatch` names when), and
that kernel updates ``running_mean`` and ``running_var`` in place although its schema does not mark them written
(``Tensor? running_mean``, no ``(a!)``). Functionalization cannot see the update, so the traced op reads the buffers
as if unchanged, and a recomputation would update them a second time. An H200 capture of ResNet-50 (2026-11-26)
held 53 such nodes, recomputable, and a moccasin plan at half its peak recomputed 5 of them: the replay's
gradients stayed equal to eager's while the running statistics drifted from them.

:func:`cudnn_batch_norm_functional` (and the MIOpen twin) clones the running statistics and runs the same kernel on
the clones, returning them beside the kernel's four outputs: the same kernel on the same values, so the output,
the saved statistics and the new running statistics are eager's bits, and running it again recomputes them from
the unchanged old statistics. ``coop.graph_capture.trace`` rewrites every training call with running statistics
into it, as it makes CPU's ``native_batch_norm`` functional; the executor's write-back then copies the new
statistics into the model's buffers, once per step, like every new buffer value. The clones cost two vectors of
the channel count per batch norm.

The fake implementation is the implementation itself: under fake tensors the clones and the kernel's meta function
give the shapes.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _cudnn_on_clones(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float, eps: float) -> Outputs:
    """``cudnn_batch_norm`` in training on clones of the running statistics.

    Returns
    -------
    tuple of torch.Tensor
        The kernel's (output, save_mean, save_var, reserve) and the new running mean and variance.
    """
    new_mean, new_var = running_mean.clone(), running_var.clone()
    out, save_mean, save_var, reserve = aten.cudnn_batch_norm(input, weight, bias, new_mean, new_var, True, momentum,
                                                              eps)
    return out, save_mean, save_var, reserve, new_mean, new_var


def _miopen_on_clones(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``miopen_batch_norm`` (ROCm) in training on clones of the running statistics.

    Returns
    -------
    tuple of torch.Tensor
        The kernel's (output, save_mean, save_var) and the new running mean and variance.
    """
    new_mean, new_var = running_mean.clone(), running_var.clone()
    out, save_mean, save_var = aten.miopen_batch_norm(input, weight, bias, new_mean, new_var, True, momentum, eps)
    return out, save_mean, save_var, new_mean, new_var


cudnn_batch_norm_functional = torch.library.custom_op("coop::cudnn_batch_norm_functional", _cudnn_on_clones,
                                                      mutates_args=())
cudnn_batch_norm_functional.register_fake(_cudnn_on_clones)
miopen_batch_norm_functional = torch.library.custom_op("coop::miopen_batch_norm_functional", _miopen_on_clones,
                                                       mutates_args=())
miopen_batch_norm_functional.register_fake(_miopen_on_clones)

#: the in-place kernel -> (its functional form, how many outputs the kernel returns before the new statistics)
FUNCTIONAL_FORM = {aten.cudnn_batch_norm.default: (torch.ops.coop.cudnn_batch_norm_functional.default, 4),
                   aten.miopen_batch_norm.default: (torch.ops.coop.miopen_batch_norm_functional.default, 3)}

__all__ = ["FUNCTIONAL_FORM", "cudnn_batch_norm_functional", "miopen_batch_norm_functional"]
