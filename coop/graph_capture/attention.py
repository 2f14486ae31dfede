"""The fused attention kernel a CUDA step runs, chosen for a weightless capture traced on the CPU.

``F.scaled_dot_product_attention`` is one call in the model's code but three different programs: on a CUDA
device PyTorch's dispatcher picks a fused kernel (``_scaled_dot_product_flash_attention``,
``_scaled_dot_product_efficient_attention``, ``_scaled_dot_product_cudnn_attention``) by the inputs' dtype,
shapes, mask and dropout, while a CPU trace runs the math decomposition (matmul, softmax, dropout). A step
captured on the meta device for CUDA (:mod:`coop.graph_capture.meta`) is traced on fake CPU tensors, so without
help its Graph is the CPU program, and the plan made from it is refused on the GPU by the structure check of
``coop.load_plan`` (GPT-2 small b8 s512: 1,332 nodes traced on the CPU, 1,030 captured on an H100).

:func:`cuda_attention` makes the trace call the kernel the CUDA dispatcher would: the first backend, in torch's
priority order (``torch._C._get_sdp_priority_order()``), that is enabled (``torch.nn.attention.sdpa_kernel``)
and whose constraints the inputs meet, with the same mask preprocessing as ATen's composite
(``aten/src/ATen/native/transformers/attention.cpp``: a boolean mask made additive, the efficient kernel's mask
expanded to four dimensions and padded to a multiple of 16; flash's head dimension padded to a multiple of 8).
The constraints are those of ``sdp_utils.cpp`` for an sm80-or-newer GPU (A100, H100, H200), read per kernel:

* flash: float16 or bfloat16, no explicit mask, equal head dimensions of at most 256, causal only with
  equal query and key lengths;
* memory-efficient: float32, float16 or bfloat16, head dimensions aligned (4 elements in float32, 8 in half
  precision, also the storage offsets), query and key heads equal (no grouped-query attention);
* cuDNN: float16 or bfloat16, no explicit mask, head dimension a multiple of 8 of at most 128.

What the device alone decides is not known on a CPU: where torch prefers cuDNN attention (sm90 and newer with
cuDNN > 9.15, which reorders the priority at the first CUDA call), the GPU runs another kernel in half precision
than the one chosen here, and ``coop.load_plan`` refuses the plan (its graph's structure differs) in one line.
Capturing and training under the same ``torch.nn.attention.sdpa_kernel([...])`` makes the choice explicit on both
machines.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: torch's SDPBackend numbers (``torch._C._get_sdp_priority_order()`` lists them).
MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3
BACKEND_NAMES = {MATH: "math", FLASH: "flash", EFFICIENT: "efficient", CUDNN: "cudnn"}
HALF = (torch.float16, torch.bfloat16)
#: the fused kernels' ops, as captured nodes name them.
FUSED_OPS = ("aten._scaled_dot_product_flash_attention.default",
             "aten._scaled_dot_product_efficient_attention.default",
             "aten._scaled_dot_product_cudnn_attention.default")


def _enabled(backend: int) -> bool:
    flags = {FLASH: torch.backends.cuda.flash_sdp_enabled, EFFICIENT: torch.backends.cuda.mem_efficient_sdp_enabled,
             MATH: torch.backends.cuda.math_sdp_enabled, CUDNN: torch.backends.cuda.cudnn_sdp_enabled}
    return backend in flags and flags[backend]()


def _dense_4d(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Four-dimensional, last dimension contiguous, no empty sequence: every fused kernel's first filters."""
    tensors = (query, key, value)
    return (all(t.dim() == 4 and t.stride(-1) == 1 for t in tensors)
            and all(t.size(0) == query.size(0) for t in tensors) and query.size(2) > 0 and key.size(2) > 0)


def _heads_match(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool,
                 gqa_supported: bool) -> bool:
    if key.size(1) == query.size(1) and value.size(1) == query.size(1):
        return True
    return enable_gqa and gqa_supported and key.size(1) == value.size(1) and query.size(1) % key.size(1) == 0


def _flash_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                is_causal: bool, enable_gqa: bool) -> bool:
    same_head_dim = query.size(-1) == key.size(-1) == value.size(-1)
    return (query.dtype in HALF and mask is None and same_head_dim and query.size(-1) <= 256
            and (not is_causal or query.size(2) == key.size(2))
            and _heads_match(query, key, value, enable_gqa, gqa_supported=True))


def _efficient_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> bool:
    if query.dtype not in (torch.float32, *HALF):
        return False
    alignment = 8 if query.dtype in HALF else 4
    aligned = (query.size(-1) == key.size(-1) and query.size(-1) % alignment == 0
               and value.size(-1) % alignment == 0)
    offsets_aligned = all(t.storage_offset() % alignment == 0 for t in (query, key, value))
    return aligned and offsets_aligned and _heads_match(query, key, value, enable_gqa, gqa_supported=False)


def _cudnn_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                enable_gqa: bool) -> bool:
    head = query.size(-1)
    return (query.dtype in HALF and mask is None and head == key.size(-1) == value.size(-1) and head % 8 == 0
            and head <= 128 and _heads_match(query, key, value, enable_gqa, gqa_supported=False))


def cuda_backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                 dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False) -> int:
    """The SDPA backend an sm80-or-newer CUDA device runs for these inputs (:data:`FLASH`, :data:`EFFICIENT`,
    :data:`CUDNN` or :data:`MATH`), by torch's priority order and enabled flags.

    Parameters
    ----------
    query, key, value : torch.Tensor
        The attention's inputs (fake or real; only shapes, strides and dtypes are read).
    dropout_p : float
        The attention dropout (every fused kernel here draws its own).
    enable_gqa : bool
        Grouped-query attention (fewer key/value heads than query heads).

    Returns
    -------
    int
        The backend's number.
    """
    del dropout_p  # every kernel considered supports dropout on sm80+
    dense = _dense_4d(query, key, value)
    fits = {
        FLASH: lambda: dense and _flash_fits(query, key, value, attn_mask, is_causal, enable_gqa),
        EFFICIENT: lambda: dense and _efficient_fits(query, key, value, enable_gqa),
        CUDNN: lambda: dense and _cudnn_fits(query, key, value, attn_mask, enable_gqa),
        MATH: lambda: True,
    }
    for backend in torch._C._get_sdp_priority_order():
        if backend in fits and _enabled(backend) and fits[backend]():
            return backend
    return MATH


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """ATen's ``convert_boolean_attn_mask``: a boolean mask (True attends) as 0 / -inf of the query's dtype."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask.logical_not(), -math.inf)


def _efficient_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """ATen's ``preprocess_mask``: expanded to (batch, heads, queries, keys), the last dimension padded to a
    multiple of 16 and sliced back (or made contiguous where a stride is not a multiple of 16)."""
    expanded = mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    last = expanded.size(-1)
    if last % 16:
        return F.pad(expanded, (0, 16 - last % 16))[..., :last]
    if any(expanded.stride(d) % 16 for d in range(3)):
        return expanded.contiguous()
    return expanded


def _fused_attention(backend: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
                     scale: float | None) -> torch.Tensor:
    """The fused kernel's call as ATen's ``scaled_dot_product_attention`` makes it on CUDA."""
    aten = torch.ops.aten
    compute_log_sumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if backend == FLASH:
        head = query.size(-1)
        full_scale = scale if scale is not None else 1.0 / math.sqrt(head)
        pad = (0, -head % 8)
        padded = [F.pad(t, pad) if pad[1] else t for t in (query, key, value)]
        out = aten._scaled_dot_product_flash_attention(*padded, dropout_p, is_causal, False, scale=full_scale)[0]
        return out[..., :head] if pad[1] else out
    mask = _additive(attn_mask, query.dtype)
    if backend == EFFICIENT:
        mask = _efficient_mask(mask, query, key) if mask is not None else None
        return aten._scaled_dot_product_efficient_attention(query, key, value, mask, compute_log_sumexp, dropout_p,
                                                            is_causal, scale=scale)[0]
    return aten._scaled_dot_product_cudnn_attention(query, key, value, mask, compute_log_sumexp, dropout_p,
                                                    is_causal, False, scale=scale)[0]


class _CudaAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to the kernel :func:`cuda_backend` names."""

    def __init__(self) -> None:
        super().__init__()
        self.chosen: list[int] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
                 **dict(zip(names, args, strict=False)), **kwargs}
        backend = cuda_backend(bound["query"], bound["key"], bound["value"], bound["attn_mask"], bound["dropout_p"],
                               bound["is_causal"], bound["enable_gqa"])
        self.chosen.append(backend)
        if backend == MATH:
            return func(*args, **kwargs)
        return _fused_attention(backend, bound["query"], bound["key"], bound["value"], bound["attn_mask"],
                                bound["dropout_p"], bound["is_causal"], bound["scale"])


@contextmanager
def cuda_attention() -> Iterator[list[int]]:
    """Within it, ``F.scaled_dot_product_attention`` calls the fused kernel a CUDA device would run.

    Yields
    ------
    list of int
        The backend chosen at each call, in order (:data:`BACKEND_NAMES`).
    """
    mode = _CudaAttention()
    with mode:
        yield mode.chosen


__all__ = ["BACKEND_NAMES", "CUDNN", "EFFICIENT", "FLASH", "FUSED_OPS", "MATH", "cuda_attention", "cuda_backend"]
