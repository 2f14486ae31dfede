"""Graphs no test tunes ``auto`` to (issue 40): EfficientNet-B0- and DenseNet-121-shaped CNNs, and random layered
graphs drawn like the published Moccasin ones.

The CNNs are written here (torchvision is not installed), faithful in structure to the published networks:

* EfficientNet-B0 (Tan & Le, 2019): a stride-2 3x3 stem (32 channels), seven stages of MBConv blocks (expansion,
  kernel, stride, channels, repeats: (1,3,1,16,1), (6,3,2,24,2), (6,5,2,40,2), (6,3,2,80,3), (6,5,1,112,3),
  (6,5,2,192,4), (6,3,1,320,1)); each block a 1x1 expansion (not at expansion 1), a depthwise convolution,
  squeeze-and-excitation (reduced to a quarter of the block's input channels) and a 1x1 projection, every
  convolution followed by batch norm and SiLU but the projection's, a residual where shapes allow; a 1x1 head to
  1,280 channels, global pooling, dropout 0.2 and a 1,000-class linear layer. Stochastic depth (a training-time
  drop of whole residual branches) is left out.
* DenseNet-121 (Huang et al., 2017): a stride-2 7x7 stem (64 channels) and a 3x3 max pool, dense blocks of 6, 12,
  24 and 16 layers (each: batch norm, ReLU, 1x1 convolution to 4 x 32 channels, batch norm, ReLU, 3x3 convolution
  to the growth rate 32, concatenated to its input), transitions (batch norm, ReLU, 1x1 convolution halving the
  channels, 2x2 average pool) between them, a final batch norm and ReLU, global pooling and a 1,000-class linear
  layer.

The random layered graphs (:func:`random_layered`) follow the published files' parameters ``n`` (nodes, a source
and a sink included), ``w`` (width: a layer holds about ``2 w sqrt(n)`` nodes, as the published n100 to n1000
files do), ``nlv`` (node-level variance: each layer's width is drawn uniformly within ``1 +- nlv`` of that mean),
``ed`` (edge density between consecutive layers) and ``scd`` (the share of edges that skip layers), with memory
in tens of units (10 to 8,000) and durations 0 to 1,000 as there, and a random topological order as the baseline
order. They are built as Gagrani et al.'s node-link documents and read by :func:`coop.graph_files.graph_from_dict`,
as the published files are.
"""

from __future__ import annotations

import math
import random
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coop.graph import Graph
from coop.graph_files import graph_from_dict

#: EfficientNet-B0's stages: (expansion, kernel, stride, output channels, repeats).
EFFICIENTNET_B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                   (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
#: DenseNet-121's dense blocks (layers each), growth rate and bottleneck width factor.
DENSENET_121 = (6, 12, 24, 16)
GROWTH, BOTTLENECK = 32, 4
CLASSES = 1000


def _conv_bn(inputs: int, outputs: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(outputs)]


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: global pool, 1x1 reduce, SiLU, 1x1 expand, sigmoid, scale."""

    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(F.silu(self.reduce(scale))))


class MBConv(nn.Module):
    """EfficientNet's inverted bottleneck: expansion, depthwise convolution, squeeze-excitation, projection."""

    def __init__(self, inputs: int, outputs: int, expansion: int, kernel: int, stride: int) -> None:
        super().__init__()
        wide = inputs * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [*_conv_bn(inputs, wide, 1), nn.SiLU()]
        layers += [*_conv_bn(wide, wide, kernel, stride, groups=wide), nn.SiLU(),
                   SqueezeExcite(wide, max(1, inputs // 4)), *_conv_bn(wide, outputs, 1)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + x if self.residual else out


class EfficientNetB0(nn.Module):
    """EfficientNet-B0's structure (see the module docstring); forward returns the cross-entropy loss."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.SiLU()]
        channels = 32
        for expansion, kernel, stride, outputs, repeats in EFFICIENTNET_B0:
            for index in range(repeats):
                layers.append(MBConv(channels, outputs, expansion, kernel, stride if index == 0 else 1))
                channels = outputs
        layers += [*_conv_bn(channels, 1280, 1), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pooled = F.adaptive_avg_pool2d(self.features(image), 1).flatten(1)
        return F.cross_entropy(self.classifier(self.dropout(pooled)), target)


class DenseLayer(nn.Module):
    """BN, ReLU, 1x1 conv to ``BOTTLENECK x GROWTH``, BN, ReLU, 3x3 conv to ``GROWTH``; concatenated to the input."""

    def __init__(self, inputs: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(inputs), nn.ReLU(), nn.Conv2d(inputs, BOTTLENECK * GROWTH, 1, bias=False),
                                  nn.BatchNorm2d(BOTTLENECK * GROWTH), nn.ReLU(),
                                  nn.Conv2d(BOTTLENECK * GROWTH, GROWTH, 3, padding=1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


class DenseNet121(nn.Module):
    """DenseNet-121's structure (see the module docstring); forward returns the cross-entropy loss."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]
        channels = 64
        for block, count in enumerate(DENSENET_121):
            for _ in range(count):
                layers.append(DenseLayer(channels))
                channels += GROWTH
            if block != len(DENSENET_121) - 1:
                layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, channels // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                channels //= 2
        layers += [nn.BatchNorm2d(channels), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pooled = F.adaptive_avg_pool2d(self.features(image), 1).flatten(1)
        return F.cross_entropy(self.classifier(pooled), target)


def cnn(name: str, batch: int = 8, image: int = 64, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``(model in train mode, (images, targets))`` for ``"efficientnet_b0"`` or ``"densenet121"``."""
    torch.manual_seed(seed)
    model = {"efficientnet_b0": EfficientNetB0, "densenet121": DenseNet121}[name]()
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, image, image, generator=generator)
    return model.train(), (images, torch.randint(0, CLASSES, (batch,), generator=generator))


def random_layered(seed: int, n: int, w: float, nlv: float = 0.75, ed: float = 0.2, scd: float = 0.14) -> Graph:
    """A random layered graph of ``n`` nodes (a source 0 and a sink 1 included), drawn from ``seed``.

    Parameters
    ----------
    seed : int
        The draw.
    n : int
        Nodes in all (at least 3).
    w : float
        Width: layers hold about ``2 w sqrt(n)`` nodes.
    nlv : float
        Each layer's width is drawn uniformly within ``(1 - nlv, 1 + nlv)`` times the mean.
    ed : float
        Probability of each edge between consecutive layers (every node reads one node of the layer before and is
        read by one of the layer after, besides).
    scd : float
        The share of all edges that skip at least one layer.

    Returns
    -------
    Graph
        The graph, read from its node-link document as the published files are.
    """
    rng = random.Random(f"random_layered/{seed}/{n}/{w}")
    inner, mean = n - 2, max(1.0, 2 * w * math.sqrt(n))
    widths: list[int] = []
    while sum(widths) < inner:
        widths.append(min(inner - sum(widths), max(1, round(mean * rng.uniform(1 - nlv, 1 + nlv)))))
    layers: list[list[int]] = [[0]]
    next_id = 2
    for width in widths:
        layers.append(list(range(next_id, next_id + width)))
        next_id += width
    layers.append([1])
    edges: set[tuple[int, int]] = set()
    for upper, lower in pairwise(layers):
        for target in lower:
            edges.update((source, target) for source in upper if rng.random() < ed)
            edges.add((rng.choice(upper), target))
        for source in upper:
            if not any((source, target) in edges for target in lower):
                edges.add((source, rng.choice(lower)))
    skips = round(scd / (1 - scd) * len(edges))
    for _ in range(skips):
        a = rng.randrange(0, len(layers) - 2)
        b = rng.randrange(a + 2, len(layers))
        edges.add((rng.choice(layers[a]), rng.choice(layers[b])))
    nodes = [{"name": v, "out_cost": 10 * rng.randint(1, 800), "param_cost": 0,
              "duration": 0 if v in (0, 1) else rng.randint(0, 1000)} for v in range(n)]
    return graph_from_dict({"directed": True, "multigraph": False,
                            "graph": {"name": f"random_layered_seed{seed}_n{n}_w{w}_nlv{nlv}_ed{ed}_scd{scd}",
                                      "order": _topological_order(rng, n, edges)},
                            "nodes": nodes, "links": [{"0": a, "1": b} for a, b in sorted(edges)]})


def _topological_order(rng: random.Random, n: int, edges: set[tuple[int, int]]) -> list[int]:
    """A random topological order (Kahn's algorithm, a random ready node each step)."""
    indegree = dict.fromkeys(range(n), 0)
    successors: dict[int, list[int]] = {v: [] for v in range(n)}
    for a, b in edges:
        indegree[b] += 1
        successors[a].append(b)
    ready, order = [v for v in range(n) if indegree[v] == 0], []
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        for successor in successors[node]:
            indegree[successor] -= 1
            if indegree[successor] == 0:
                ready.append(successor)
    return order


def published_like(seed: int) -> Graph:
    """The random layered graph of draw ``seed``: 70 to 100 nodes, the published files' ``w`` range (0.27-0.43)
    and their ``nlv``, ``ed`` and ``scd``."""
    rng = random.Random(f"published_like/{seed}")
    return random_layered(seed, rng.randint(70, 100), round(rng.uniform(0.27, 0.43), 2))


def _smoke(count: int = 3) -> list[dict[str, Any]]:
    """Sizes of a few draws (for a quick look: ``python benchmarks/_unseen_graphs.py``)."""
    return [{"name": g.name, "nodes": len(g.nodes)} for g in (published_like(s) for s in range(count))]


if __name__ == "__main__":
    for line in _smoke():
        print(line)
