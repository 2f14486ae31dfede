"""Benchmark: MONeT (checkpointing + operator implementations) beside Moccasin and Checkmate on captured models,
with MONeT's ablations, at 0.7, 0.5, 0.4, 1/3 and 0.3 of the baseline peak, one byte below the
remat-only floor (proven) and 0.95 of the least budget the remat-only constructions reach.

MONeT (Shah, Wu, Chandrashekaran, Goyal, Yu, "Memory Optimization for Deep Networks", ICLR 2021)
published, at about one third of PyTorch's peak: ResNet-50 +11.95 % time (4.99 GB where PyTorch needs
15.06 GB), GoogleNet +15.8 %, UNet +11.5 %, MobileNet +8.7 %, VGG-16 +9.1 %. Those are measured
training-step times on a GPU; the rows here are coop's predicted extra compute (the simulator's cost
over the baseline cost, analytic costs unless the capture is profiled), so they are comparable only in
trend. Models (full run): ResNet-50 (batch 32, 224 px, transformers' default ResNetConfig), MobileNetV2
(transformers, width 1.0, batch 32, 224 px), VGG-16 (written here, batch 32, 224 px), a U-Net (written
here: 4 levels, base width 64, batch 8, 256 px) and GPT-2 small (12 x 768, batch 8, seq 512). ``quick``
runs small versions of three of them with short limits.

Per (model, budget) the rows are:

* ``monet``: implementation choice and recomputation jointly (coop.formulations.monet.milp; the interval
  model above its ``max_nodes``);
* ``monet: implementations only``: ``recompute=False`` (every node computed once: MONeT's "operator
  optimization only" ablation);
* ``moccasin = checkpointing only``: Moccasin on ``graph.remat_only()`` (default implementations, no
  optional values), which is both the Moccasin peer and MONeT's "checkpointing only" ablation;
* ``checkmate``: the Checkmate MILP on the remat-only graph, where the graph has at most
  ``CHECKMATE_MAX_NODES`` computed nodes (it is quadratic);

each with status, peak / baseline peak, overhead %, gap and wall time. ``monet`` warm-starts from its own
Moccasin run (a share of its time limit) and, as coop.formulations.monet.milp documents for "never worse than
moccasin at the same budget", is given the Moccasin row's schedule as ``hint`` (its ``wall_s`` excludes
that run); ``monet_le_moccasin`` checks the outcome. Whether the captured graphs had implementations (``capture(alternatives=True)``,
coop.graph_capture.alternatives) is in each row (``impl_nodes``, ``optional_values``) and in the notes.

Run: ``.venv/bin/python -m benchmarks.bench_monet [--quick] [--time-limit 60]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from coop.budget import baseline_peak, min_budget
from coop.errors import CoopError
from coop.formulations import solve
from coop.formulations.ladder.constructed_budget import constructed_budget
from coop.graph import Graph, derived_from_graph
from coop.graph_capture import capture
from coop.zoo import build

FRACTIONS: tuple[tuple[str, float], ...] = (("0.7", 0.7), ("0.5", 0.5), ("0.4", 0.4), ("1/3", 1 / 3), ("0.3", 0.3))
QUICK_FRACTIONS: tuple[tuple[str, float], ...] = (("0.8", 0.8), ("0.5", 0.5))
#: Checkmate's MILP is quadratic in the nodes: above this many it is not run.
CHECKMATE_MAX_NODES = 150
#: MONeT's published overheads at about 1/3 of PyTorch's peak (ICLR 2021, table 2 / figure 4).
PUBLISHED_OVERHEAD_PERCENT = {"resnet50": 11.95, "googlenet": 15.8, "unet": 11.5, "mobilenetv2": 8.7, "vgg16": 9.1}

Built = tuple[nn.Module, tuple[torch.Tensor, ...], Callable[..., torch.Tensor]]


# ==================================================================== models
def _classifier_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    out = model(images) if not hasattr(model, "config") else model(pixel_values=images).logits
    return F.cross_entropy(out, labels)


def _images(batch: int, image: int, classes: int, channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(batch, channels, image, image, generator=generator),
            torch.randint(0, classes, (batch,), generator=generator))


class VGG(nn.Module):
    """VGG (Simonyan and Zisserman 2015) from its layer list; ``VGG16`` is configuration D."""

    VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, layers: tuple[int | str, ...], image: int, hidden: int, classes: int) -> None:
        super().__init__()
        modules: list[nn.Module] = []
        channels = 3
        for layer in layers:
            if layer == "M":
                modules.append(nn.MaxPool2d(2))
                image //= 2
            else:
                modules += [nn.Conv2d(channels, int(layer), 3, padding=1), nn.ReLU(inplace=True)]
                channels = int(layer)
        self.features = nn.Sequential(*modules)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels * image * image, hidden), nn.ReLU(inplace=True),
                                        nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class UNet(nn.Module):
    """A U-Net (Ronneberger, Fischer and Brox 2015): two 3x3 conv + BN + ReLU per level, max-pool down,
    transposed conv up, skip connections concatenated; per-pixel classification."""

    def __init__(self, levels: int, width: int, classes: int) -> None:
        super().__init__()
        widths = [width * 2 ** k for k in range(levels + 1)]
        self.down = nn.ModuleList([self._block(3 if k == 0 else widths[k - 1], widths[k]) for k in range(levels)])
        self.bottom = self._block(widths[levels - 1], widths[levels])
        self.up = nn.ModuleList([nn.ConvTranspose2d(widths[k + 1], widths[k], 2, stride=2) for k in reversed(range(levels))])
        self.merge = nn.ModuleList([self._block(2 * widths[k], widths[k]) for k in reversed(range(levels))])
        self.head = nn.Conv2d(widths[0], classes, 1)

    @staticmethod
    def _block(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True),
                             nn.Conv2d(outputs, outputs, 3, padding=1), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips)):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def _segmentation_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(images), labels)


def _unet(batch: int, image: int, levels: int, width: int) -> Built:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, 2, (batch, image, image), generator=generator)
    return UNet(levels, width, 2).train(), (images, labels), _segmentation_loss


def _vgg(batch: int, image: int, layers: tuple[int | str, ...], hidden: int, classes: int) -> Built:
    torch.manual_seed(0)
    return VGG(layers, image, hidden, classes).train(), _images(batch, image, classes), _classifier_loss


def _transformers_vision(config: Any, model_class: Any, batch: int, image: int, classes: int) -> Built:
    torch.manual_seed(0)
    return model_class(config).train(), _images(batch, image, classes), _classifier_loss


def model_specs(quick: bool) -> dict[str, tuple[str, Callable[[], Built]]]:
    """name -> (published key, builder)."""
    from transformers import (
        MobileNetV2Config,
        MobileNetV2ForImageClassification,
        ResNetConfig,
        ResNetForImageClassification,
    )

    if quick:
        return {
            "resnet-mini b32 64px": ("resnet50", lambda: build("resnet", layers=1, hidden=16, batch=32, image=64)),
            "vgg-mini b32 32px": ("vgg16", lambda: _vgg(32, 32, (16, "M", 32, 32, "M", 64, "M"), 64, 10)),
            "unet-mini b8 64px": ("unet", lambda: _unet(8, 64, 2, 8)),
        }
    return {
        "resnet50 b32 224px": ("resnet50", lambda: _transformers_vision(
            ResNetConfig(num_labels=1000), ResNetForImageClassification, 32, 224, 1000)),
        "mobilenetv2 b32 224px": ("mobilenetv2", lambda: _transformers_vision(
            MobileNetV2Config(image_size=224, num_labels=1000), MobileNetV2ForImageClassification, 32, 224, 1000)),
        "vgg16 b32 224px": ("vgg16", lambda: _vgg(32, 224, VGG.VGG16, 4096, 1000)),
        "unet b8 256px": ("unet", lambda: _unet(8, 256, 4, 64)),
        "gpt2-12x768 b8 s512": ("gpt2", lambda: build("gpt2", layers=12, hidden=768, heads=12, batch=8, seq=512,
                                                       vocab=50257)),
    }


def capture_graph(built: Built) -> tuple[Graph, bool, float]:
    """The captured step as coop.plan solves it (random draws replayable), whether capture was asked for
    the implementations PyTorch offers, and the capture time."""
    model, batch, loss_fn = built
    asked = "alternatives" in inspect.signature(capture).parameters
    started = time.perf_counter()
    captured = capture(model, batch, loss_fn, alternatives=True) if asked else capture(model, batch, loss_fn)
    return captured.graph.with_random_replay(), asked, time.perf_counter() - started


# ==================================================================== rows
VARIANTS: tuple[tuple[str, str, dict[str, Any], bool], ...] = (
    # (row label, formulation, options, on the remat-only graph); moccasin first: monet gets its schedule as hint
    ("moccasin = checkpointing only", "moccasin", {}, True),
    ("monet", "monet", {}, False),
    ("monet: implementations only", "monet", {"recompute": False}, False),
    ("checkmate", "checkmate", {}, True),
)


def _row(graph: Graph, budget: int, variant: tuple[str, str, dict[str, Any], bool], time_limit: float,
         hint: Any = None) -> dict[str, Any]:
    label, formulation, options, remat_only = variant
    if formulation == "monet" and options.get("recompute", True) and hint is not None:
        options = options | {"hint": hint}
    target = graph.remat_only() if remat_only else graph
    row: dict[str, Any] = {"variant": label}
    if formulation == "checkmate" and len(target.order) > CHECKMATE_MAX_NODES:
        return row | {"status": "skipped", "note": f"{len(target.order)} nodes > {CHECKMATE_MAX_NODES}: the MILP is "
                                                     "quadratic; not run"}
    if budget < min_budget(target):
        return row | {"status": "infeasible", "note": "below min_budget (proven: no schedule of this graph fits)"}
    started = time.perf_counter()
    try:
        result = solve(target, budget, formulation, time_limit=time_limit, threads=2, **options)
    except CoopError as exc:
        return row | {"status": "error", "note": str(exc), "wall_s": round(time.perf_counter() - started, 2)}
    sim = result.simulation
    fits = sim is not None and sim.peak <= budget
    return row | {
        "status": result.status,
        "fits": fits,
        "peak_vs_baseline": round(sim.peak / baseline_peak(graph), 4) if sim else None,
        "overhead_percent": round(100 * sim.overhead, 3) if sim else None,
        "gap": None if result.gap is None else round(result.gap, 4),
        "wall_s": round(result.wall_s, 2),
        "implementations_used": len(result.extra.get("implementations", [])) if formulation == "monet" else None,
        "inexact_used": len(result.extra.get("inexact_implementations", [])) if formulation == "monet" else None,
        "note": result.message[:160],
    } | ({"result": result} if formulation == "moccasin" else {})


def run(quick: bool = False, time_limit: float = 30.0) -> dict[str, Any]:
    """One row per (model, budget, variant); notes say whether the graphs had implementations."""
    rows: list[dict[str, Any]] = []
    limit = 4.0 if quick else time_limit
    had_impls: dict[str, int] = {}
    for name, (published_key, builder) in model_specs(quick).items():
        graph, asked, capture_s = capture_graph(builder())
        peak0 = baseline_peak(graph)
        impl_nodes = sum(1 for n in graph.nodes if n.impls)
        had_impls[name] = impl_nodes
        common = {"model": name, "nodes": len(graph.order), "impl_nodes": impl_nodes,
                  "optional_values": len(graph.optional_ids), "alternatives_asked": asked,
                  "min_budget_vs_baseline": round(min_budget(graph) / peak0, 4),
                  "remat_min_budget_vs_baseline": round(min_budget(graph.remat_only()) / peak0, 4),
                  "remat_reach_vs_baseline": round(remat_reach(graph) / peak0, 4)}
        print(f"{name}: {json.dumps(common)}, capture {capture_s:.1f} s", file=sys.stderr, flush=True)
        for label, budget in _budgets(graph, peak0, quick):
            published = PUBLISHED_OVERHEAD_PERCENT.get(published_key) if label == "1/3" else None
            rows += run_variants(graph, budget, VARIANTS, limit,
                                 common | {"budget": label, "published_monet_overhead_percent": published})
    return {"rows": rows, "notes": _notes(had_impls, quick, limit)}


def run_variants(graph: Graph, budget: int, variants: Any, limit: float, base: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per variant (``base`` plus its result), in order, each printed as it comes; moccasin's schedule hints
    the variants after it, and monet's row records whether it costs no more than moccasin's."""
    found: dict[str, dict[str, Any]] = {}
    hint = None
    for variant in variants:
        row = base | _row(graph, budget, variant, limit, hint)
        moccasin_result = row.pop("result", None)
        if moccasin_result is not None and moccasin_result.schedule is not None:
            hint = moccasin_result
        found[variant[0]] = row
        print(json.dumps(row), file=sys.stderr, flush=True)
    mark_monet_le_moccasin(found["monet"], found["moccasin = checkpointing only"])
    return list(found.values())


def mark_monet_le_moccasin(monet: dict[str, Any], moccasin: dict[str, Any]) -> None:
    """Where monet's row found a schedule, record whether it costs no more than moccasin's (True where moccasin
    found nothing that fits)."""
    if monet.get("fits"):
        monet["monet_le_moccasin"] = (not moccasin.get("fits")
                                      or monet["overhead_percent"] <= moccasin["overhead_percent"] + 1e-9)


def _budgets(graph: Graph, peak0: int, quick: bool) -> list[tuple[str, int]]:
    """The fractions of the baseline peak, and one byte below the remat-only graph's proven floor where the
    implementations lower the floor (no schedule of recomputation alone fits there: min_budget is a bound)."""
    chosen = [(label, math.ceil(fraction * peak0)) for label, fraction in (QUICK_FRACTIONS if quick else FRACTIONS)]
    remat_floor = min_budget(graph.remat_only())
    if min_budget(graph) < remat_floor:
        chosen.append(("remat floor - 1 B", remat_floor - 1))
    reach = remat_reach(graph)
    if min_budget(graph) < REACH_FRACTION * reach:
        chosen.append((f"{REACH_FRACTION:g} x remat reach", math.floor(REACH_FRACTION * reach)))
    return chosen


#: The "remat reach" row's budget: this fraction of the least budget the remat-only constructions reach.
REACH_FRACTION = 0.95


@derived_from_graph
def remat_reach(graph: Graph) -> int:
    """The least budget the remat-only constructions reach (coop.formulations.ladder.constructed_budget on
    ``graph.remat_only()``: checkpoint-all, Chen's schedules, greedy eviction by bisection): an upper bound on
    the true remat-only floor, which lies between min_budget and it."""
    return constructed_budget(graph.remat_only()).budget


def _notes(had_impls: dict[str, int], quick: bool, limit: float) -> str:
    with_impls = [name for name, count in had_impls.items() if count]
    without = [name for name, count in had_impls.items() if not count]
    parts = [(f"{'quick mode: small models, ' if quick else ''}time limit {limit:g} s per solve, 2 threads; monet is "
             "hinted with the moccasin row's schedule.")]
    if with_impls:
        parts.append(f"Captured with implementations (capture(alternatives=True)): {', '.join(with_impls)}.")
    if without:
        parts.append(f"No implementations in the captured graph (monet = moccasin there): {', '.join(without)}.")
    parts.append("'remat floor - 1 B': one byte below min_budget of the remat-only graph (a proven lower bound of "
                 "every schedule without implementations), where the implementations lower the floor; moccasin and "
                 "checkmate are infeasible there by proof.")
    parts.append(f"'{REACH_FRACTION:g} x remat reach': {REACH_FRACTION:g} of the least budget that the remat-only "
                 "constructions reach (remat_reach_vs_baseline: checkpoint-all, Chen's, greedy eviction by "
                 "bisection; an upper bound on the remat-only floor, not a proof): moccasin is run there too.")
    parts.append("MONeT published at ~1/3 of PyTorch's peak: ResNet-50 +11.95 % (4.99 GB vs 15.06 GB), GoogleNet "
                 "+15.8 %, UNet +11.5 %, MobileNet +8.7 %, VGG-16 +9.1 % (measured GPU time; coop's overheads are "
                 "predicted compute).")
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, 4 s limits")
    parser.add_argument("--time-limit", type=float, default=60.0, help="time limit per solve")
    args = parser.parse_args()
    print(json.dumps(run(quick=args.quick, time_limit=args.time_limit), indent=1))


if __name__ == "__main__":
    main()
