"""A capture runs no kernel on synthetic data (issue 22, item 1).

Running ``_scaled_dot_product_efficient_attention_backward`` on zero-filled inputs killed the process on an
H100 (ARCHITECTURE.md, "Facts the code relies on"), so an unprofiled capture must compute nothing: tracing runs
on fake tensors, storage sizes come from a reviewed table and MONeT's programs are priced on fake tensors. The
guard is a dispatch mode under the whole capture that records every aten op whose arguments or results hold a
real tensor (neither fake nor meta); the old storage probe (zero-filled inputs made with ``torch.zeros`` and
``as_strided``, then the op) and the old pricing (zero-filled inputs, then the program) both show up in it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from coop import capture
from coop.zoo import build

aten = torch.ops.aten

#: What tracing legitimately does to real tensors: ``make_fx`` lifts a tensor constant that the model's code
#: creates while it is traced (transformers' KV cache makes empty ones, ``torch.tensor([])``, in GPT-2) into the
#: fake mode with ``lift_fresh``, an alias of its argument (``lift_fresh(Tensor(a) self) -> Tensor(a)``): no kernel.
#: The parameters and the batch themselves are turned into fake tensors without any op reaching this mode.
ALLOWED = frozenset({aten.lift_fresh.default})


class RealKernels(TorchDispatchMode):
    """Records every op dispatched with a real (not fake, not meta) tensor among its arguments or results."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[Any] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(_real(t) for t in pytree.tree_leaves((args, kwargs, out))):
            self.ops[func] += 1
        return out


def _real(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and value.device.type != "meta"


class Attention(nn.Module):
    """One causal self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, hidden: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).square().mean()


def _sdpa_model(name: str) -> tuple[nn.Module, tuple, Any]:
    if name == "attention":
        torch.manual_seed(0)
        return Attention(), (torch.randn(2, 4, 8),), None
    return build(name, layers=1, hidden=32, seq=16)


def test_the_guard_sees_kernels_on_made_up_data_and_not_fake_ones() -> None:
    """The old probe's pattern is recorded: a zero-filled base, a strided view of it, the op on it."""
    with RealKernels() as guard:
        base = torch.zeros(8)
        torch.exp(base.as_strided((2, 3), (3, 1), 1))
        with FakeTensorMode():
            torch.exp(torch.zeros(8).as_strided((2, 3), (3, 1), 1))
    assert guard.ops == Counter({aten.zeros.default: 1, aten.as_strided.default: 1, aten.exp.default: 1})


@pytest.mark.parametrize("alternatives", [False, True])
@pytest.mark.parametrize("name", ["attention", "gpt2"])
def test_the_capture_of_a_model_using_sdpa_runs_no_kernel_on_synthetic_data(name: str, alternatives: bool) -> None:
    model, batch, loss_fn = _sdpa_model(name)
    with RealKernels() as guard:
        captured = capture(model, batch, loss_fn, alternatives=alternatives)
    assert set(guard.ops) <= ALLOWED, dict(guard.ops)
    if name == "gpt2":  # transformers' SDPA attention; on CPU with dropout it traces into SDPA's math ops
        assert model.config._attn_implementation == "sdpa"
    else:
        targets = {str(n.target) for n in captured.module.graph.nodes if n.op == "call_function"}
        assert any("scaled_dot_product" in t and "backward" in t for t in targets), sorted(targets)


class ReLUHead(nn.Module):
    """Linear, ReLU, linear under an mse_loss: MONeT offers a mask and an in-place ReLU (programs not in the step)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.layers(x), y)


def test_a_profiled_capture_runs_only_the_real_step() -> None:
    """Profiling runs the step's own ops on the caller's tensors; the alternatives' programs are not run."""
    torch.manual_seed(0)
    model, batch = ReLUHead(), (torch.randn(4, 6), torch.randn(4, 3))
    with RealKernels() as guard:
        captured = capture(model, batch, profile=True, alternatives=True)
    assert {impl.name for node in captured.graph.nodes for impl in node.impls} >= {"mask", "inplace"}
    step = {n.target for n in captured.module.graph.nodes if n.op == "call_function"}
    assert guard.ops and set(guard.ops) <= step | ALLOWED, set(guard.ops) - step
