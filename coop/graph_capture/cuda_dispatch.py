"""The kernels ATen's CUDA dispatch picks for dropout and batch norm, chosen for a weightless capture on the CPU.

``F.dropout`` and ``F.batch_norm`` are one call each in a model's code but different programs per device, since
ATen's composite ops pick their kernel by the input's device. A step captured on the meta device for CUDA
(:mod:`coop.graph_capture.meta`) is traced on fake CPU tensors, so without help its Graph is the CPU program and
``coop.load_plan`` refuses the plan on the GPU (its structure differs; measured on an H200 with torch 2.11):

* **dropout** (``aten/src/ATen/native/Dropout.cpp``): ``dropout`` runs the fused ``native_dropout`` (output and
  bool mask in one kernel; backward ``native_dropout_backward``) where ``is_fused_kernel_acceptable`` holds -- a
  CUDA input, ``0 < p < 1``, at least one element -- and the composite ``bernoulli_ -> div_ -> mul`` otherwise.
  GPT-2 small: 25 ``native_dropout`` nodes on the H200, 25 composite chains in the meta capture. In-place
  dropout (ATen's ``dropout_``) and the feature and alpha variants run the composite on every device.
* **batch norm** (``aten/src/ATen/native/Normalization.cpp``, ``_batch_norm_impl_index``): on CUDA,
  ``cudnn_batch_norm`` (backward ``cudnn_batch_norm_backward``) where cuDNN is enabled and the input has at least
  three dimensions, weight and bias, both running statistics (or neither, in training), a float32 or float16
  input (float16 with float32 weights; bfloat16 goes to the native kernel), at most 880,801 samples in training
  (65,535 in eval) and fewer than 2**31 elements; ``native_batch_norm`` otherwise. ResNet-50 on the H200: 53
  ``cudnn_batch_norm`` nodes. cuDNN 8 and later accept every epsilon. Where a GPU's build decides otherwise, the
  refusal of ``coop.load_plan`` names the ops that differ.

:func:`cuda_dispatch` makes the trace call the kernel CUDA's dispatch would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: ``_batch_norm_impl_index``'s limits on the batch for cuDNN (training, eval).
CUDNN_BN_MAX_BATCH = (880801, 65535)


def dropout_fused_on_cuda(input: torch.Tensor, p: float, training: bool, inplace: bool) -> bool:
    """Whether ATen's ``dropout`` runs ``native_dropout`` for these arguments on a CUDA tensor.

    Parameters
    ----------
    input : torch.Tensor
        The tensor dropped out (its device aside).
    p : float
        The probability of an element being zeroed.
    training : bool
        Whether dropout is active.
    inplace : bool
        ``F.dropout(..., inplace=True)``: ATen's ``dropout_``, the composite on every device.

    Returns
    -------
    bool
        ``training and not inplace and 0 < p < 1`` and at least one element (``is_fused_kernel_acceptable``).
    """
    return training and not inplace and 0.0 < p < 1.0 and input.numel() > 0


def batch_norm_on_cudnn(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                        running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool) -> bool:
    """Whether ATen's ``batch_norm`` runs ``cudnn_batch_norm`` for these arguments on CUDA tensors.

    Parameters
    ----------
    input : torch.Tensor
        The normalized tensor (its device aside).
    weight, bias : torch.Tensor or None
        The affine parameters (cuDNN needs both).
    running_mean, running_var : torch.Tensor or None
        The running statistics (both, or neither in training).
    training : bool
        Batch statistics (and an update of the running ones) or the running ones.

    Returns
    -------
    bool
        Whether ``_batch_norm_impl_index`` picks cuDNN (the module docstring lists its conditions).
    """
    if not torch.backends.cudnn.enabled or weight is None or bias is None or input.dim() < 3:
        return False
    stats = running_mean is not None and running_var is not None
    if not (stats or (running_mean is None and running_var is None and training)):
        return False
    if torch.bfloat16 in (input.dtype, weight.dtype) or (input.dtype == torch.float16 and weight.dtype != torch.float32):
        return False
    if input.dtype not in (torch.float32, torch.float16):
        return False
    limit = CUDNN_BN_MAX_BATCH[0] if training else CUDNN_BN_MAX_BATCH[1]
    return input.size(0) <= limit and input.numel() < 2**31 - 1


class _CudaDispatch(TorchFunctionMode):
    """Routes ``F.dropout`` and ``F.batch_norm`` to the kernels CUDA's dispatch would run."""

    def __init__(self) -> None:
        super().__init__()
        self.routed: dict[str, int] = {"native_dropout": 0, "cudnn_batch_norm": 0}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.dropout:
            bound = {"p": 0.5, "training": True, "inplace": False,
                     **dict(zip(("input", "p", "training", "inplace"), args, strict=False)), **kwargs}
            if dropout_fused_on_cuda(bound["input"], float(bound["p"]), bool(bound["training"]),
                                     bool(bound["inplace"])):
                self.routed["native_dropout"] += 1
                return torch.ops.aten.native_dropout(bound["input"], float(bound["p"]), True)[0]
        elif func is F.batch_norm:
            names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
            bound = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5,
                     **dict(zip(names, args, strict=False)), **kwargs}
            if batch_norm_on_cudnn(bound["input"], bound["weight"], bound["bias"], bound["running_mean"],
                                   bound["running_var"], bool(bound["training"])):
                self.routed["cudnn_batch_norm"] += 1
                return torch.ops.aten.cudnn_batch_norm(bound["input"], bound["weight"], bound["bias"],
                                                       bound["running_mean"], bound["running_var"],
                                                       bool(bound["training"]), float(bound["momentum"]),
                                                       float(bound["eps"]))[0]
        return func(*args, **kwargs)


@contextmanager
def cuda_dispatch() -> Iterator[dict[str, int]]:
    """Within it, ``F.dropout`` and ``F.batch_norm`` call the kernels a CUDA device would.

    Yields
    ------
    dict
        How many calls went to ``native_dropout`` and to ``cudnn_batch_norm``.
    """
    mode = _CudaDispatch()
    with mode:
        yield mode.routed


__all__ = ["batch_norm_on_cudnn", "cuda_dispatch", "dropout_fused_on_cuda"]
