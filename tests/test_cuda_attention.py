"""A weightless capture for CUDA runs the fused attention kernel CUDA would (coop.graph_capture.attention).

On an H100, GPT-2 small (float32, b8 s512) captured with its weights ran
``_scaled_dot_product_efficient_attention`` (1,030 nodes, BENCHMARKS.md bench_cuda); the same step traced on the
CPU runs the math decomposition (1,332 nodes), so a plan made on the meta device was refused on the GPU. The
expected kernels below are read off torch's CUDA dispatcher rules (sdp_utils.cpp, sm80+), case by case.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import coop
from coop.errors import CoopError
from coop.graph_capture.attention import EFFICIENT, FLASH, MATH, cuda_backend
from coop.zoo import build

EFFICIENT_OP = "aten._scaled_dot_product_efficient_attention.default"
FLASH_OP = "aten._scaled_dot_product_flash_attention.default"


def _ops(name: str, device: str, **size) -> Counter:
    with torch.device("meta"):
        model, batch, loss_fn = build(name, **size)
    graph = coop.capture(model, batch, loss_fn, device=device).graph
    return Counter(n.op for n in graph.nodes), graph


def _qkv(dtype: torch.dtype, heads: int = 4, kv_heads: int = 4, head_dim: int = 16, q_len: int = 8,
         k_len: int = 8) -> tuple[torch.Tensor, ...]:
    return (torch.empty(2, heads, q_len, head_dim, dtype=dtype, device="meta"),
            torch.empty(2, kv_heads, k_len, head_dim, dtype=dtype, device="meta"),
            torch.empty(2, kv_heads, k_len, head_dim, dtype=dtype, device="meta"))


@pytest.mark.parametrize(("dtype", "mask", "causal", "expected"), [
    (torch.float32, False, True, EFFICIENT),  # flash needs half precision
    (torch.float16, False, True, FLASH),
    (torch.bfloat16, False, False, FLASH),
    (torch.bfloat16, True, False, EFFICIENT),  # flash takes no explicit mask
    (torch.float64, False, False, MATH),  # no fused kernel for float64
])
def test_the_backend_follows_dtype_and_mask(dtype, mask, causal, expected) -> None:
    q, k, v = _qkv(dtype)
    attn_mask = torch.empty(8, 8, dtype=torch.bool, device="meta") if mask else None
    assert cuda_backend(q, k, v, attn_mask, 0.1, causal) == expected


def test_shapes_the_fused_kernels_refuse_fall_back_to_math() -> None:
    assert cuda_backend(*_qkv(torch.float32, head_dim=6)) == MATH  # not a multiple of 4 in float32
    assert cuda_backend(*_qkv(torch.float16, head_dim=6)) == FLASH  # flash pads the head dimension to 8
    assert cuda_backend(*_qkv(torch.float16, head_dim=6), torch.empty(8, 8, device="meta")) == MATH  # efficient: not
    assert cuda_backend(*_qkv(torch.float16, head_dim=264)) == EFFICIENT  # above flash's 256
    # causal with fewer queries than keys: not flash; efficient takes it
    assert cuda_backend(*_qkv(torch.float16, q_len=4, k_len=8), None, 0.0, True) == EFFICIENT
    # grouped-query attention: flash only
    assert cuda_backend(*_qkv(torch.float16, kv_heads=2), enable_gqa=True) == FLASH
    assert cuda_backend(*_qkv(torch.float32, kv_heads=2), enable_gqa=True) == MATH


def test_sdpa_kernel_narrows_the_choice_as_on_the_gpu() -> None:
    q, k, v = _qkv(torch.float16)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert cuda_backend(q, k, v) == EFFICIENT
    with sdpa_kernel([SDPBackend.MATH]):
        assert cuda_backend(q, k, v) == MATH
    assert cuda_backend(q, k, v) == FLASH


def test_gpt2_on_meta_for_cuda_runs_efficient_attention_with_its_seed_on_the_host() -> None:
    ops, graph = _ops("gpt2", "cuda", layers=2)
    assert ops[EFFICIENT_OP] == 2 and ops["aten._scaled_dot_product_efficient_attention_backward.default"] == 2
    assert ops["aten.softmax.default"] + ops["aten._softmax.default"] == 0  # no math attention left
    host = set(graph.meta["host_outputs"])
    assert len(host) == 4  # philox seed and offset of each layer, 0-d int64 on the host
    # counted as the capture of the real model counts them (the fake value says CUDA: one 512-byte block), so that
    # both graphs have one digest; the H200's capture recorded 512 too
    assert all(graph.node(i).device == "cpu" and graph.node(i).mem == 512 for i in host)
    assert {n.device for n in graph.nodes if n.device is not None and n.id not in host} == {"cuda"}
    # the backward reads them: the schedule has to keep them where the kernel put them
    backward = next(n for n in graph.nodes if n.op == "aten._scaled_dot_product_efficient_attention_backward.default")
    assert host & set(backward.inputs)


def test_the_same_model_for_the_cpu_keeps_the_math_attention() -> None:
    ops, graph = _ops("gpt2", "cpu", layers=2)
    assert not any("scaled_dot_product" in op for op in ops)
    assert "host_outputs" not in graph.meta


class _Attention(torch.nn.Module):
    """One causal self-attention layer through F.scaled_dot_product_attention, with a mask when asked."""

    def __init__(self, hidden: int = 32, heads: int = 2, masked: bool = False) -> None:
        super().__init__()
        self.qkv, self.out, self.heads, self.masked = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, 1), heads, masked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril() if self.masked else None
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not self.masked)
        return self.out(y.transpose(1, 2).reshape(batch, seq, hidden)).float().square().mean()


def _attention_ops(dtype: torch.dtype, masked: bool = False, seq: int = 8) -> Counter:
    with torch.device("meta"):
        model = _Attention(masked=masked).to(dtype)
        x = torch.empty(2, seq, 32, dtype=dtype)
    return Counter(n.op for n in coop.capture(model, (x,), device="cuda").graph.nodes)


def test_half_precision_attention_on_meta_for_cuda_runs_flash_attention() -> None:
    ops = _attention_ops(torch.bfloat16)
    assert ops[FLASH_OP] == 1 and ops["aten._scaled_dot_product_flash_attention_backward.default"] == 1
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        ops = _attention_ops(torch.bfloat16)
    assert ops[EFFICIENT_OP] == 1 and ops[FLASH_OP] == 0


def test_a_boolean_mask_is_made_additive_and_padded_for_the_efficient_kernel() -> None:
    ops = _attention_ops(torch.float32, masked=True, seq=10)  # 10 keys: padded to 16, sliced back (ATen's pad_bias)
    assert ops[EFFICIENT_OP] == 1 and ops["aten.constant_pad_nd.default"] == 1
    assert ops["aten.masked_fill.Scalar"] == 1  # True attends: the rest gets -inf
    ops = _attention_ops(torch.float32, masked=True, seq=16)  # aligned: no padding
    assert ops[EFFICIENT_OP] == 1 and ops["aten.constant_pad_nd.default"] == 0


def test_a_plan_for_another_attention_kernel_is_refused_naming_the_ops(tmp_path: Path) -> None:
    with torch.device("meta"):
        meta_model, meta_batch, loss_fn = build("gpt2", layers=1)
    plan = coop.plan(meta_model, 64 * 2**20, meta_batch, loss_fn=loss_fn, device="cuda", formulation="store-all")
    path = tmp_path / "plan.json"
    plan.save(path)
    model, _, _ = build("gpt2", layers=1)  # the CPU runs the math attention: another program
    with pytest.raises(CoopError, match="graph digest differs") as caught:
        coop.load_plan(path, model, loss_fn=loss_fn)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{EFFICIENT_OP} x 1 there, 0 here" in message and "sdpa_kernel" in message
