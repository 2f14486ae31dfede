"""Benchmark: how fast inductor's CPU kernels read a dropout mask of each dtype, against eager.

coop.compile with eager's draws (``fallback_random``) holds each dropout's mask for the backward and rebuilds the
output from it (:func:`coop.graph_capture.random_ops.split_native_dropouts`). The mask's dtype is coop's choice:
native_dropout's own is bool, and :func:`coop.graph_capture.random_ops.float8_dropout_mask` stores the same zeros
and ones as float8_e5m2, one byte an element too. Each row times two kernels on one thread, eager and compiled by
``torch.compile`` (median of ``CALLS`` calls after warm-up): the product ``grad * mask * scale`` alone, and the
backward of an attention softmax with its dropout, ``_softmax_backward_data(grad * mask * scale, y)``, at the shape
of bench_compile's ViT attention probabilities (32 x 4 x 65 x 65). The dtypes: bool and uint8 (one byte, loaded by
inductor's CPU kernels a vector at a time through a scalar loop in torch 2.13), float8_e5m2 (one byte, the mask
coop.compile draws on CPU), float16 (two bytes) and float32 (four, the floor of what a load costs).

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_mask_dtype``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

SHAPE = (32, 4, 65, 65)
SCALE = 1.0 / 0.9
CALLS = 50
DTYPES = (torch.bool, torch.uint8, torch.float8_e5m2, torch.float16, torch.float32)


def _product(grad: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return grad * mask.to(torch.float32) * SCALE


def _softmax_backward(grad: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._softmax_backward_data(grad * mask.to(torch.float32) * SCALE, y, -1, torch.float32)


KERNELS: dict[str, Callable[..., torch.Tensor]] = {"product": _product, "softmax backward": _softmax_backward}


def _median_ms(kernel: Callable[..., torch.Tensor], *args: torch.Tensor) -> float:
    for _ in range(3):
        kernel(*args)
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        kernel(*args)
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 3)


def _mask(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The zeros and ones of ``bits`` (a bool tensor) in ``dtype`` (float8 through its bytes: 0x3C is 1.0)."""
    if dtype == torch.float8_e5m2:
        return (bits.to(torch.uint8) * 0x3C).view(torch.float8_e5m2)
    return bits.to(dtype)


def run() -> dict[str, Any]:
    """One row per (kernel, mask dtype), one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        y = torch.softmax(torch.randn(SHAPE, generator=generator), -1)
        grad = torch.randn(SHAPE, generator=generator)
        bits = torch.rand(SHAPE, generator=generator) > 0.1
        rows = []
        for name, kernel in KERNELS.items():
            reference = kernel(grad, y, bits)
            for dtype in DTYPES:
                mask = _mask(bits, dtype)
                torch._dynamo.reset()
                compiled = torch.compile(kernel)
                if not torch.equal(compiled(grad, y, mask), reference) and name == "product":
                    raise AssertionError(f"the compiled product with a {dtype} mask differs from eager's")
                rows.append({"kernel": name, "mask_dtype": str(dtype).removeprefix("torch."),
                             "bytes_per_element": mask.element_size(), "eager_ms": _median_ms(kernel, grad, y, mask),
                             "compiled_ms": _median_ms(compiled, grad, y, mask)})
    finally:
        torch.set_num_threads(threads)
    by = {(r["kernel"], r["mask_dtype"]): r["compiled_ms"] for r in rows}
    notes = (f"{' x '.join(map(str, SHAPE))} float32, one thread, median of {CALLS} calls after 3. Compiled softmax "
             f"backward reading the mask as bool {by['softmax backward', 'bool']} ms, as float8_e5m2 "
             f"{by['softmax backward', 'float8_e5m2']} ms; the product {by['product', 'bool']} and "
             f"{by['product', 'float8_e5m2']} ms. The product's values are checked equal to eager's for every dtype.")
    return {"rows": rows, "notes": notes}


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
