"""Compact dropout masks: only the random draw is non-recomputable, and it is stored as bool.

On CPU, ``F.dropout`` in training runs ATen's composite ``_dropout``: ``noise =
empty_like(x).bernoulli_(1 - p); noise.div_(1 - p); out = x * noise``. Functionalized and traced,
that is ``bernoulli.p(like, 1 - p) -> div -> mul``, where the ``bernoulli.p`` node holds a full-size
float tensor of zeros and ones. A replay must not draw new numbers: the
executor can recompute a random op only by restoring the generator state saved before its first
draw (:mod:`coop.runtime.rng`), and capture marks every random op not recomputable
(:mod:`coop.graph_capture.lower`), so that float tensor had to stay resident from the forward to
the backward whenever a formulation wanted to recompute the scaled noise.

:func:`compact_random_masks` rewrites every floating ``bernoulli.p`` into

* ``coop.bernoulli_mask(size, 1 - p, device)``: the draw, straight into a bool tensor (1 byte per
  element instead of 2-8), and the only non-recomputable node; it reads no tensor, so the
  ``empty``/``empty_like`` that only gave the draw its shape become dead code; and
* ``_to_copy(mask, dtype)``: the same zeros and ones in the original dtype, an ordinary
  recomputable node feeding the unchanged ``div`` and ``mul``.

Bit-exactness: ``bernoulli_(p)`` with a scalar ``p`` draws the same integers for every dtype of
its output (ATen's CPU kernels draw integers -- MKL's ``viRngBernoulli`` or
``bernoulli_distribution`` -- and cast them), and 0/1 survive bool -> float exactly, so the noise
and everything after it are the same bits as eager PyTorch's, and the generator advances the
same. ``tests/test_capture.py`` checks both with ``torch.equal`` (the draws per dtype and shape,
and loss, gradients and buffers of whole models over three optimizer steps).

The kernel's own scratch (MKL draws into an int32 buffer) is not modelled, as it was not for the
``bernoulli.p`` it replaces.

A compiled step with eager's draws keeps each dropout as one ``native_dropout``; :func:`split_native_dropouts`
splits it into :func:`dropout_mask`, native_dropout's own draw (on CPU :func:`float8_dropout_mask`, the same draw
as float8 zeros and ones, which inductor's CPU kernels read faster than a bool):

>>> x = torch.randn(4, 8)
>>> _ = torch.manual_seed(1); mask = torch.ops.coop.dropout_mask(x, 0.25)
>>> _ = torch.manual_seed(1); torch.equal(mask, torch.ops.aten.native_dropout(x, 0.25, True)[1])
True
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch import fx

aten = torch.ops.aten


@torch.library.custom_op("coop::bernoulli_mask", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def bernoulli_mask(size: Sequence[int], p: float, device: torch.device) -> torch.Tensor:
    """A bool tensor of ``size`` whose elements are True with probability ``p`` (global RNG).

    Parameters
    ----------
    size : sequence of int
        The mask's shape.
    device : torch.device
        Where the mask is drawn (that device's default generator).

    Returns
    -------
    torch.Tensor
        The bool mask.
    """
    return torch.empty(size, dtype=torch.bool, device=device).bernoulli_(p)


@bernoulli_mask.register_fake
def _bernoulli_mask_fake(size: Sequence[int], p: float, device: torch.device) -> torch.Tensor:
    return torch.empty(size, dtype=torch.bool, device=device)


def _is_float_draw(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.bernoulli.p:
        return False
    value = node.meta.get("val")
    uses_own_generator = node.kwargs.get("generator") is not None
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point and not uses_own_generator


def compact_random_masks(graph: fx.Graph) -> int:
    """Split each floating ``bernoulli.p`` into a bool draw and a recomputable cast; returns how many.

    The graph is rewritten in place: the draw becomes :func:`bernoulli_mask` followed by an ``_to_copy`` to the
    draw's dtype, which takes over its uses.

    Parameters
    ----------
    graph : fx.Graph
        The traced step's graph, with fake values in ``meta["val"]``.

    Returns
    -------
    int
        The number of draws rewritten.
    """
    rewritten = 0
    for node in list(graph.nodes):
        if not _is_float_draw(node):
            continue
        value: torch.Tensor = node.meta["val"]
        probability = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        with graph.inserting_before(node):
            mask = graph.call_function(torch.ops.coop.bernoulli_mask.default,
                                       (list(value.shape), float(probability), value.device))
            noise = graph.call_function(aten._to_copy.default, (mask,), {"dtype": value.dtype})
        # fake values: a fresh bool storage for the mask; the cast takes over the draw's float value
        mask.meta = {**node.meta, "val": value.new_empty(value.shape, dtype=torch.bool)}
        noise.meta = dict(node.meta)
        node.replace_all_uses_with(noise)
        graph.erase_node(node)
        rewritten += 1
    return rewritten


#: devices whose ``native_dropout`` draws its mask as ``empty_like(x).bernoulli_(1 - p)`` (ATen's CPU kernel: the
#: draw, then the product and a cast to bool), so that :func:`dropout_mask` can draw the same bits straight into a
#: bool tensor like ``x``, without native_dropout's two products and cast; on any other device (CUDA's fused kernel
#: draws its own way) it runs native_dropout whole. ``tests/test_dropout_split.py`` checks both forms against
#: native_dropout: mask, strides and the generator's next draw
MASK_ALONE_DEVICES = ("cpu",)


def draws_mask_alone(device: torch.device) -> bool:
    """Whether :func:`dropout_mask` on ``device`` draws the mask alone (no output computed and dropped)."""
    return torch.device(device).type in MASK_ALONE_DEVICES


@torch.library.custom_op("coop::dropout_mask", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """The bool mask ``aten.native_dropout(x, p, True)`` draws, and only the mask.

    The generator advances exactly as native_dropout's does and the mask is its mask, strides included (the
    module's example): where :func:`draws_mask_alone`, the draw native_dropout makes, into a bool tensor like
    ``x``; elsewhere native_dropout itself, its output dropped (:func:`whole_dropout_mask`).
    """
    if draws_mask_alone(x.device):
        return torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)
    return whole_dropout_mask(x, p)


def whole_dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """native_dropout's mask from native_dropout run whole (its output computed and dropped): any device."""
    return torch.ops.aten.native_dropout(x, p, True)[1]


@dropout_mask.register_fake
def _dropout_mask_fake(x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.bool)


#: the dtype of :func:`float8_dropout_mask`'s zeros and ones: one byte an element like bool, and a float type, so a
#: compiled kernel reads it as a float (see that op)
FLOAT8_MASK_DTYPE = torch.float8_e5m2
#: 1.0 in float8_e5m2's bits (sign 0, exponent 01111 = the bias 15, mantissa 00); 0.0 is the byte 0
FLOAT8_ONE_BITS = 0x3C
#: that byte as a 0-dim tensor: scaling by a Python int would wrap it into a tensor inside every call (9 bytes the
#: CPU allocator sees); the draw is on CPU only (:func:`draws_mask_alone`)
_FLOAT8_ONE = torch.tensor(FLOAT8_ONE_BITS, dtype=torch.uint8)


@torch.library.custom_op("coop::float8_dropout_mask", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def float8_dropout_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """:func:`dropout_mask`'s mask as float8_e5m2 zeros and ones (one byte an element, as the bool mask).

    The draw is the bool mask's own (``bernoulli_`` draws the same integers into any dtype: the module docstring),
    into bytes that are then scaled to 1.0's bits in place, so the generator advances as native_dropout's and no
    scratch is held. Why not bool: inductor's CPU kernels (torch 2.13, AVX2) load a bool or uint8 operand a vector
    at a time through a scalar loop, and a float8 one through a conversion: on the machine of BENCHMARKS.md
    (bench_mask_dtype, 32 x 4 x 65 x 65, one thread) the compiled backward of a softmax with its dropout ran 2.58 ms
    reading a bool mask and 1.25 ms reading this one (eager: 1.28 ms), the product ``x * mask * scale`` 1.02 against
    0.57 ms; bench_compile's ViT, GPT-2 and BERT rows (BENCHMARKS.md) show the step. 0.0 and 1.0 convert exactly to
    every float dtype, so every product with the mask has native_dropout's bits.
    """
    drawn = torch.empty_like(x, dtype=torch.uint8).bernoulli_(1.0 - p)
    return drawn.mul_(_FLOAT8_ONE).view(FLOAT8_MASK_DTYPE)


@float8_dropout_mask.register_fake
def _float8_dropout_mask_fake(x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_like(x, dtype=FLOAT8_MASK_DTYPE)


#: coop's dropout draws: the mask's dtype is bool or FLOAT8_MASK_DTYPE
MASK_DRAWS = (torch.ops.coop.dropout_mask.default, torch.ops.coop.float8_dropout_mask.default)


#: dtypes whose native_dropout output is ``x * (mask * scale)`` with one rounding however a compiler groups the
#: product (a 0/1 factor is exact): in bfloat16 and float16 eager rounds ``mask * scale`` first and inductor's
#: fused kernel does not, so their dropouts stay whole
EXACT_SPLIT_DTYPES = (torch.float32, torch.float64)


def own_scratch_bytes(node: fx.Node) -> int:
    """Bytes a coop op allocates inside itself and frees before it returns, as the ATen call it wraps does.

    :func:`dropout_mask` where it draws the mask alone (CPU): 0, ``bernoulli_`` draws into the bool mask itself (the
    CPU allocator's events inside the call, torch 2.13: none). Elsewhere it runs native_dropout whole: the output
    and, on CPU, a copy of the mask in ``x``'s dtype, both like ``x`` (the allocator's events inside the call);
    CUDA's fused kernel holds the output only: twice ``x``'s bytes are charged, an upper bound (BERT's attention
    dropout at b8 s128: 4 MiB each; uncharged, coop.compile's step held 1.2-1.7 MB over its budget at 0.5). What a
    compiled step's calls hold beyond these charges is measured on its example batch and charged in the next round
    (:mod:`coop.compiled.extern_scratch`). Every other op: 0 (its scratch, if any, is measured or not modelled).

    Parameters
    ----------
    node : fx.Node
        A node with fake values in ``meta["val"]``.

    Returns
    -------
    int
        The op's own scratch in bytes, before the allocator's rounding.
    """
    if node.op != "call_function" or node.target not in MASK_DRAWS:
        return 0
    return dropout_mask_scratch(node.args[0])


def dropout_mask_scratch(x: object) -> int:
    """:func:`dropout_mask`'s own scratch for the input node ``x`` (:func:`own_scratch_bytes`; 0 without a fake
    value)."""
    value = _fake_tensor(x)
    return 0 if value is None or draws_mask_alone(value.device) else native_dropout_scratch(x)


def native_dropout_scratch(x: object) -> int:
    """The scratch of ``native_dropout`` run whole on the input node ``x``: twice its bytes (:func:`own_scratch_bytes`;
    0 without a fake value)."""
    value = _fake_tensor(x)
    return 0 if value is None else 2 * value.numel() * value.element_size()


def _fake_tensor(x: object) -> torch.Tensor | None:
    """The fake tensor value of the fx node ``x``; None for anything else."""
    value = x.meta.get("val") if isinstance(x, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _splittable_dropout(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.native_dropout.default:
        return False
    value = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
    getitems = all(user.target is operator.getitem for user in node.users)
    return isinstance(value, torch.Tensor) and value.dtype in EXACT_SPLIT_DTYPES and train is True and getitems


def _float_mask_serves(node: fx.Node) -> bool:
    """Whether the split of ``node`` (a splittable native_dropout) draws :func:`float8_dropout_mask`: where the mask
    is drawn alone (:func:`draws_mask_alone`) and every reader of native_dropout's mask casts it to a float dtype
    (the backward's ``native_dropout_backward``, decomposed); a reader of the bool itself keeps the bool draw."""
    value: torch.Tensor = node.args[0].meta["val"]
    if not draws_mask_alone(value.device):
        return False
    readers = [reader for user in node.users if user.args[1] == 1 for reader in user.users]
    return all(reader.target is torch.ops.prims.convert_element_type.default and reader.args[1].is_floating_point
               for reader in readers)


def split_native_dropouts(graph: fx.Graph) -> int:
    """Split each ``native_dropout(x, p, True)`` into its draw and a recomputable product; returns how many.

    A joint graph compiled with eager's random kernels (inductor's ``fallback_random``) keeps each dropout as one
    ``native_dropout``, a random op whose float output no schedule may recompute: a plan had to hold it from the
    forward to the backward (4 bytes per element beside the 1-byte mask). Split, the draw is
    :func:`dropout_mask` (the one random node, a bool tensor), or :func:`float8_dropout_mask` (the same draw as one
    byte zeros and ones that compiled kernels read faster) where :func:`_float_mask_serves`, and the output is
    ``x * (mask * scale)``, an ordinary product inductor fuses into its readers and a schedule may recompute from
    ``x`` and the mask. The
    values are native_dropout's bit for bit in :data:`EXACT_SPLIT_DTYPES` (other dtypes stay whole), and the
    generator advances as before. The graph is rewritten in place.

    Parameters
    ----------
    graph : fx.Graph
        A joint graph with fake values in ``meta["val"]``.

    Returns
    -------
    int
        The number of dropouts split.
    """
    split = 0
    for node in list(graph.nodes):
        if not _splittable_dropout(node):
            continue
        x, p = node.args[0], float(node.args[1])
        value: torch.Tensor = x.meta["val"]
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        draw = torch.ops.coop.float8_dropout_mask.default if _float_mask_serves(node) else \
            torch.ops.coop.dropout_mask.default
        with graph.inserting_before(node):
            mask = graph.call_function(draw, (x, p))
            as_dtype = graph.call_function(torch.ops.prims.convert_element_type.default, (mask, value.dtype))
            scaled = graph.call_function(aten.mul.Tensor, (as_dtype, scale))
            output = graph.call_function(aten.mul.Tensor, (x, scaled))
        # fake values: the tracer's own for the two results; the intermediates as the output
        results = {user.args[1]: user.meta.get("val") for user in node.users}
        drawn = results.get(1, torch.empty_like(value, dtype=torch.bool))
        if draw is torch.ops.coop.float8_dropout_mask.default:
            drawn = torch.empty_like(drawn, dtype=FLOAT8_MASK_DTYPE)
        mask.meta = {**node.meta, "val": drawn}
        for created in (as_dtype, scaled, output):
            created.meta = {**node.meta, "val": results.get(0, torch.empty_like(value))}
        for user in list(node.users):
            user.replace_all_uses_with(output if user.args[1] == 0 else mask)
            graph.erase_node(user)
        graph.erase_node(node)
        split += 1
    return split
