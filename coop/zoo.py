"""The model zoo: small built-in models for ``coop capture --model NAME``, tests and benchmarks.

:func:`build` returns ``(model, example_batch, loss_fn)``: ``loss_fn`` is None when the model's
own forward returns the loss (or an object with ``.loss``, as transformers models do). The
hand-written models (MLP, CNN with BatchNorm + in-place ReLU + dropout, a transformer stack with
tied embeddings) live here so the package never imports from ``tests``; ``tests/models.py``
re-exports them. transformers models are built from small configs with random weights: nothing
is downloaded. :func:`model_from_factory` loads a user's own model the same way (``coop capture
FILE.py:FACTORY``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from coop.errors import CoopError


class MLP(nn.Module):
    """Linear/GELU layers with dropout and a cross-entropy loss."""

    def __init__(self, inputs: int = 32, hidden: int = 64, layers: int = 3, classes: int = 10) -> None:
        super().__init__()
        widths = [inputs] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(widths))
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.dropout(F.gelu(layer(x)))
        return F.cross_entropy(self.head(x), target)


class CNN(nn.Module):
    """Conv + BatchNorm + in-place ReLU + dropout blocks: exercises buffers and in-place ops."""

    def __init__(self, channels: int = 8, layers: int = 2, classes: int = 10) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = 3
        for _ in range(layers):
            blocks += [nn.Conv2d(width, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                       nn.Dropout2d(0.1)]
            width = channels
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pooled = self.features(image).mean(dim=(2, 3))
        return F.cross_entropy(self.head(pooled), target)


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP, each with dropout."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (hidden // self.heads) ** 0.5
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        attn = self.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1))
        x = x + self.dropout(self.proj((attn @ v).transpose(1, 2).reshape(batch, seq, hidden)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """A small decoder-only language model with tied input/output embeddings."""

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 2, heads: int = 4, seq: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.position = nn.Parameter(torch.zeros(seq, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, like GPT-2's lm_head/wte

    def forward(self, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())


ZOO_NAMES: tuple[str, ...] = ("mlp", "cnn", "transformer", "gpt2", "bert", "resnet", "llama", "vit", "mobilenet")

Built = tuple[nn.Module, tuple[torch.Tensor, ...], "Callable[..., torch.Tensor] | None"]


def build(name: str, **size: Any) -> Built:
    """``(model, example_batch, loss_fn | None)`` for a zoo model in train mode.

    Parameters
    ----------
    name : str
        The zoo model: one of :data:`ZOO_NAMES`.
    **size : Any
        Size options (all optional): ``layers``, ``hidden``, ``batch``, ``seq`` (token models), ``image``
        (image side for cnn/resnet/vit/mobilenet), ``heads``, ``kv_heads`` (llama; default half of ``heads``),
        ``intermediate`` (llama's MLP width; default twice ``hidden``), ``vocab``, ``dtype`` (the parameters' and
        floating batch tensors' dtype by name, e.g. ``"bfloat16"``; default float32), ``seed`` (default 0; seeds
        the global RNG too, so the weights are the same on every call).

    Returns
    -------
    Built
        The model (in train mode), its example batch, and its loss function or None.

    Raises
    ------
    CoopError
        For an unknown model or size option.
    """
    builders = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer, "gpt2": _gpt2, "bert": _bert, "resnet": _resnet,
                "llama": _llama, "vit": _vit, "mobilenet": _mobilenet}
    if name not in builders:
        raise CoopError(f"unknown zoo model {name!r}: choose one of {', '.join(ZOO_NAMES)}")
    known = {"layers", "hidden", "batch", "seq", "image", "heads", "kv_heads", "intermediate", "vocab", "dtype", "seed"}
    unknown = sorted(set(size) - known)
    if unknown:
        raise CoopError(f"unknown size option {unknown[0]!r} for zoo model {name!r}: use {', '.join(sorted(known))}")
    if name != "llama" and ({"kv_heads", "intermediate"} & set(size)):
        raise CoopError(f"kv_heads and intermediate size the zoo's llama only, not {name!r}: drop them")
    dtype = _dtype(size.pop("dtype", None))
    generator = torch.Generator().manual_seed(int(size.pop("seed", 0)))
    torch.manual_seed(int(generator.initial_seed()))
    model, batch, loss_fn = builders[name](generator, **size)
    if dtype is not None:
        model = model.to(dtype)
        batch = tuple(t.to(dtype) if t.is_floating_point() else t for t in batch)
    return model.train(), batch, loss_fn


def _dtype(name: str | None) -> torch.dtype | None:
    """The floating dtype named ``name`` ("bfloat16", "float16", "float32"), None for None; a CoopError else."""
    if name is None:
        return None
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CoopError(f"dtype {name!r} is not a floating torch dtype: use bfloat16, float16 or float32")
    return dtype


def _tokens(generator: torch.Generator, vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def _mlp(generator: torch.Generator, layers: int = 3, hidden: int = 64, batch: int = 8, **_: Any) -> Built:
    model = MLP(inputs=32, hidden=hidden, layers=layers)
    return model, (torch.randn(batch, 32, generator=generator), torch.randint(0, 10, (batch,), generator=generator)), None


def _cnn(generator: torch.Generator, layers: int = 2, hidden: int = 8, batch: int = 4, image: int = 16, **_: Any) -> Built:
    model = CNN(channels=hidden, layers=layers)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return model, (images, torch.randint(0, 10, (batch,), generator=generator)), None


def _transformer(generator: torch.Generator, layers: int = 2, hidden: int = 32, batch: int = 2, seq: int = 16,
                 heads: int = 4, vocab: int = 64, **_: Any) -> Built:
    model = Transformer(vocab=vocab, hidden=hidden, layers=layers, heads=heads, seq=seq)
    return model, (_tokens(generator, vocab, batch, seq), _tokens(generator, vocab, batch, seq)), None


def _gpt2(generator: torch.Generator, layers: int = 2, hidden: int = 64, batch: int = 2, seq: int = 32,
          heads: int = 4, vocab: int = 128, **_: Any) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab, n_positions=max(seq, 32))
    model = GPT2LMHeadModel(config)
    tokens = _tokens(generator, vocab, batch, seq)
    return model, (tokens,), _language_model_loss


def _bert(generator: torch.Generator, layers: int = 2, hidden: int = 64, batch: int = 2, seq: int = 32,
          heads: int = 4, vocab: int = 128, **_: Any) -> Built:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab,
                        intermediate_size=4 * hidden, max_position_embeddings=max(seq, 32))
    model = BertForMaskedLM(config)
    tokens = _tokens(generator, vocab, batch, seq)
    return model, (tokens,), _language_model_loss


def _llama(generator: torch.Generator, layers: int = 2, hidden: int = 64, batch: int = 2, seq: int = 32,
           heads: int = 4, vocab: int = 128, kv_heads: int | None = None, intermediate: int | None = None,
           **_: Any) -> Built:
    """Llama: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention (by default half as many kv heads and an
    MLP twice as wide as ``hidden``; Llama-2-7B: ``kv_heads=32, intermediate=11008``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=kv_heads or max(1, heads // 2), intermediate_size=intermediate or 2 * hidden,
                         vocab_size=vocab,
                         max_position_embeddings=max(seq, 32), attn_implementation="eager")
    model = LlamaForCausalLM(config)
    tokens = _tokens(generator, vocab, batch, seq)
    return model, (tokens,), _language_model_loss


def _vit(generator: torch.Generator, layers: int = 2, hidden: int = 64, batch: int = 2, image: int = 32,
         heads: int = 4, **_: Any) -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=image, patch_size=8, num_hidden_layers=layers, hidden_size=hidden,
                       num_attention_heads=heads, intermediate_size=4 * hidden, num_labels=10,
                       hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, attn_implementation="eager")
    model = ViTForImageClassification(config)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    return model, (images, labels), _classifier_loss


def _mobilenet(generator: torch.Generator, batch: int = 2, image: int = 32, **_: Any) -> Built:
    """MobileNetV2 at a quarter width: depthwise convolutions, BatchNorm buffers, ReLU6, dropout."""
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    config = MobileNetV2Config(image_size=image, depth_multiplier=0.25, num_labels=10)
    model = MobileNetV2ForImageClassification(config)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    return model, (images, labels), _classifier_loss


def _resnet(generator: torch.Generator, layers: int = 1, hidden: int = 8, batch: int = 2, image: int = 32,
            **_: Any) -> Built:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=hidden, hidden_sizes=[hidden * 2 ** i for i in range(4)], depths=[layers] * 4,
                          layer_type="bottleneck", num_labels=10)
    model = ResNetForImageClassification(config)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    return model, (images, labels), _classifier_loss


def _language_model_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token (GPT-2) or masked-token (BERT) loss with the tokens as labels."""
    return model(input_ids=tokens, labels=tokens).loss


def _classifier_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(pixel_values=images, labels=labels).loss


class LossStep(nn.Module):
    """A zoo model and its loss as one module, for ``torch.compile``: ``LossStep(model, loss_fn)(*batch)`` is the
    loss. The language models' loss is the cross-entropy over their logits with the tokens as labels, computed here:
    Hugging Face's ``loss_function`` breaks the compiled graph in two."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor] | None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is _language_model_loss:
            (tokens,) = batch
            logits = self.model(input_ids=tokens).logits
            return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        out = self.model(*batch) if self.loss_fn is None else self.loss_fn(self.model, *batch)
        return out if isinstance(out, torch.Tensor) else out.loss


# ============================================================================ user models
def model_from_zoo(name: str, size: dict[str, Any], meta: bool = False) -> Built:
    """``(model, batch, loss_fn)`` of a zoo model by name (``coop capture --model``).

    Parameters
    ----------
    name : str
        The zoo model: one of :data:`ZOO_NAMES`.
    size : dict of str to int
        Size options, as for :func:`build`.
    meta : bool
        Build it on the meta device: shapes and dtypes without data, so that any size fits this machine
        (``coop capture --meta``; :mod:`coop.graph_capture.meta`).

    Returns
    -------
    Built
        The model, its example batch, and its loss function or None.

    Raises
    ------
    CoopError
        For an unknown model or size option.
    """
    if name not in ZOO_NAMES:
        raise CoopError(f"unknown zoo model {name!r}: choose one of {', '.join(ZOO_NAMES)}")
    if meta:
        with torch.device("meta"):
            return build(name, **size)
    return build(name, **size)


def model_from_factory(target: str) -> Built:
    """A user's model: import FILE.py and call FACTORY() from it (``coop capture FILE.py:FACTORY``).

    Parameters
    ----------
    target : str
        ``FILE.py:FACTORY``; the file's folder is on ``sys.path`` while it is imported.

    Returns
    -------
    Built
        What the factory returned, ``(model, batch)`` or ``(model, batch, loss_fn)``, as a model, batch and loss
        function (or None).

    Raises
    ------
    CoopError
        When ``target`` is not ``FILE.py:FACTORY``, the file does not exist or cannot be imported, it has no such
        function, the factory fails, or it returns anything else.
    """
    file_name, sep, factory_name = target.rpartition(":")
    if not sep or not file_name or not factory_name:
        raise CoopError(f"model {target!r} is not FILE.py:FACTORY (for example models.py:make_model)")
    path = Path(file_name)
    if not path.is_file():
        raise CoopError(f"model file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"coop_user_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise CoopError(f"cannot import {path}: is it a Python file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in the file look their module up there
    sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - user code: report it in one line
        raise CoopError(f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.pop(0)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise CoopError(f"{path} has no function {factory_name!r}")
    try:
        produced = factory()
    except Exception as exc:  # noqa: BLE001 - user code: report it in one line
        raise CoopError(f"{target}() failed: {type(exc).__name__}: {exc}") from None
    return _unpack_factory(produced, f"{target}()")


def _unpack_factory(produced: Any, origin: str) -> Built:
    if not isinstance(produced, tuple) or len(produced) not in (2, 3):
        raise CoopError(f"{origin} must return (model, batch) or (model, batch, loss_fn)")
    module, example_batch, *rest = produced
    return module, example_batch, (rest[0] if rest else None)
