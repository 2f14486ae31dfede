"""DELTA (swap or recompute) against DTR, DTR-eq, DTE and Coop on captured ResNet-50 and GPT-2 small (issue 26).

Issue 26's claim: on captured ResNet-50 (batch 32, 224 x 224) and GPT-2 small (12 layers x 768, batch 8,
sequence 512) with the ``a100-pcie4`` profile, at the same arena size, DELTA's simulated overhead is at
most the best of the recomputation-only policies at every budget from 0.9 down to 0.4 of the baseline
peak, and DELTA finishes at budgets where every recomputation-only policy fails.

Every cell (model, cost reading, budget fraction) runs :func:`coop.online.online_sim.simulate_online`
with each policy of :data:`coop.online.policies.POLICIES` and :func:`coop.online.delta_sim.simulate_delta`
with the profile, on one arena size, ``round(fraction x baseline peak)``; the graph is the captured one
(random draws replayed by the engine) and every schedule that comes back is checked by
:func:`coop.schedule.validate` on ``graph.with_random_replay()``. On the delta rows,
``delta_le_best`` says whether delta finished and its overhead is ``<=`` (the floats as computed, no
rounding) every recomputation-only policy that finished (True as well where delta alone finished;
empty where no policy finishes, delta included); ``margin_pct`` is best minus delta, in % of the baseline
step.

Two cost readings (column ``costs``):

* ``analytic``: the captured costs as they are, ``flops / 1e11 + bytes moved / 2e10`` seconds (a nominal
  CPU-class machine, :mod:`coop.graph_capture.cost`), which DELTA reads as seconds on the profiled device;
* ``a100``: the same graph with each node's cost re-timed for the A100 of the profile: its FLOPs (the
  capture's ``meta["node_flops"]``) at the profile's 19.5 TFLOP/s plus its bytes moved at the A100 80GB
  PCIe's 1,935 GB/s of HBM bandwidth (data sheet). The step is then ~170x shorter, while a copy over
  PCIe 4 takes as long as before: the reading in which the copy times and the compute times are of the
  same device.

The recomputation-only policies' overheads change between the readings only through the ops' relative
costs (FLOP-bound ops run ~195x faster on the A100, memory-bound ones ~97x; a uniform rescale would not
move them at all); DELTA's change with the ratio of copy time to compute, since the link times its copies.

Beside them: the a72 profile (POET's Raspberry Pi 4 paging to an SD card, ~25-45 MB/s) on GPT-2 at 0.7
and 0.5 (analytic costs), where DELTA should recompute nearly everything and approach Coop
(``coop_gap_pct``: delta minus coop, in % of the step); and 0.3 / 0.2, below the claim's range, where the
recomputation-only policies start to fail.

``quick=True``: zoo GPT-2 (2 x 64, batch 4, sequence 128) and a small transformers ResNet (bottleneck
depths 1-1-1-1, widths 32-256, batch 16, 64 x 64) at the same budgets, in under a minute.

Run: ``.venv/bin/python benchmarks/run_all.py --only bench_delta [--quick]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from coop.budget import baseline_peak, min_budget
from coop.device_profiles import load_device_profile
from coop.graph import Graph
from coop.graph_capture import capture
from coop.graph_capture.cost import BANDWIDTH, FLOP_RATE
from coop.online.delta_sim import simulate_delta
from coop.online.online_sim import OnlineSimulator, run_engine
from coop.online.policies import POLICIES, make_policy
from coop.schedule import validate

Built = tuple[Any, Any, Any]

PROFILE = "a100-pcie4"
SLOW_PROFILE = "a72"
#: The claim's budgets (fractions of the baseline peak), then two below its range.
CLAIM_FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
BELOW_FRACTIONS = (0.3, 0.2)
FRACTIONS = CLAIM_FRACTIONS + BELOW_FRACTIONS
SLOW_FRACTIONS = (0.7, 0.5)
RECOMPUTE_ONLY = tuple(POLICIES)  # dtr, dtr-eq, dte, coop
#: HBM bandwidth of the A100 80GB PCIe (NVIDIA A100 Tensor Core GPU data sheet, 2021): 1,935 GB/s.
A100_HBM_BYTES_PER_S = 1.935e12
COST_READINGS = ("analytic", "a100")


# ============================================================================ models
def _resnet(config_options: dict[str, Any], batch: int, image: int) -> Built:
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from coop.zoo import _classifier_loss

    torch.manual_seed(0)
    config = ResNetConfig(**config_options)
    model = ResNetForImageClassification(config).train()
    images = torch.randn(batch, 3, image, image)
    labels = torch.randint(0, config.num_labels, (batch,))
    return model, (images, labels), _classifier_loss


def model_specs(quick: bool) -> dict[str, tuple[Callable[[], Built], bool]]:
    """label -> (builder of (model, batch, loss_fn), whether the model gets the slow-link rows)."""
    from coop.zoo import build

    if quick:
        return {
            "gpt2-2x64 b4 s128": (lambda: build("gpt2", layers=2, hidden=64, batch=4, seq=128), True),
            "resnet-mini b16 64px": (lambda: _resnet({"embedding_size": 16, "hidden_sizes": [32, 64, 128, 256],
                                                      "depths": [1, 1, 1, 1], "num_labels": 10}, 16, 64), False),
        }
    return {
        "resnet50 b32 224px": (lambda: _resnet({"num_labels": 1000}, 32, 224), False),
        "gpt2-12x768 b8 s512": (lambda: build("gpt2", layers=12, hidden=768, heads=12, batch=8, seq=512,
                                              vocab=50257), True),
    }


def capture_graph(built: Built) -> tuple[Graph, float]:
    """The captured step (analytic costs) and the capture time."""
    model, batch, loss_fn = built
    started = time.perf_counter()
    graph = capture(model, batch, loss_fn).graph
    return graph, time.perf_counter() - started


def a100_timed(graph: Graph, profile: str = PROFILE) -> Graph:
    """``graph`` with every cost re-timed for the profile's device: FLOPs at its FLOP rate, the analytic
    model's bytes-moved term at the A100's HBM bandwidth. Needs the capture's ``meta["node_flops"]``."""
    node_flops = graph.meta.get("node_flops")
    if node_flops is None or "analytic" not in str(graph.meta.get("cost_unit", "")):
        raise ValueError(f"{graph.name}: not an analytic capture (no meta['node_flops']); cannot re-time it")
    flops_per_s = load_device_profile(profile).flops_per_s
    data = graph.model_dump()
    for node in data["nodes"]:
        flops = int(node_flops.get(str(node["id"]), 0))
        compute_s = flops / FLOP_RATE
        memory_s = node["cost"] - compute_s
        if memory_s < -1e-12 * max(node["cost"], 1e-30):
            raise ValueError(f"{graph.name}: node {node['id']} costs less than its FLOPs at {FLOP_RATE:.0e} FLOP/s")
        node["cost"] = flops / flops_per_s + max(memory_s, 0.0) * BANDWIDTH / A100_HBM_BYTES_PER_S
        if node.get("impls"):
            raise ValueError(f"{graph.name}: node {node['id']} has implementations; re-timing them is not supported")
    return Graph.model_validate(data)


# ============================================================================ one cell
def _row(model: str, costs: str, fraction: float, budget: int, policy: str, profile: str | None, result: Any,
         recomputed: float, replay_graph: Graph) -> dict[str, Any]:
    valid = None if result.schedule is None else validate(replay_graph, result.schedule, budget).ok
    swaps = getattr(result, "swaps", 0)
    return {
        "model": model,
        "costs": costs,
        "fraction": fraction,
        "budget": budget,
        "policy": policy,
        "profile": profile,
        "status": result.status,
        "overhead": result.overhead,
        "overhead_pct": 100.0 * result.overhead,
        "recomputed_cost": recomputed,
        "exposed_copy_s": getattr(result, "exposed_copy_s", 0.0),
        "swaps": swaps,
        "prefetched": f"{result.prefetches}/{result.page_ins}" if swaps else None,
        "decisions": (f"{result.swap_decisions} swap, {result.recompute_decisions} recompute"
                      if policy == "delta" else None),
        "swapped_bytes": getattr(result, "swapped_bytes", 0),
        "host_peak": getattr(result, "host_peak", 0),
        "evictions": result.evictions,
        "wall_s": result.wall_s,
        "schedule_valid": valid,
        "baseline_cost": result.baseline_cost,
        "message": result.message,
    }


def recompute_only_row(model: str, costs: str, graph: Graph, replay_graph: Graph, fraction: float, budget: int,
                       policy: str) -> dict[str, Any]:
    """One recomputation-only policy (the engine of ``simulate_online``, read for its recomputed cost)."""
    engine = OnlineSimulator(graph, budget, make_policy(policy), 10.0)
    result = run_engine(engine)
    return _row(model, costs, fraction, budget, policy, None, result, engine.extra_cost, replay_graph)


def delta_row(model: str, costs: str, graph: Graph, replay_graph: Graph, fraction: float, budget: int,
              profile: str) -> dict[str, Any]:
    """delta on ``profile``, with the director's prices summed over the tensors it swapped, in % of the step:
    the swaps' page-out + page-in, and the director's rebuild price (cost plus evicted ancestors) for
    recomputing instead those of them that could be
    recomputed; ``forced_swaps`` counts the others (graph outputs, extra outputs of multi-output ops, kept
    random draws: values no recomputation-only policy may release)."""
    result = simulate_delta(graph, budget, profile)
    row = _row(model, costs, fraction, budget, "delta", profile, result, result.recomputed_cost, replay_graph)
    swapped = [decision for _, decision in result.decision_log if decision.action == "swap"]
    base = result.baseline_cost or 1.0
    return row | {"swap_price_pct": 100 * sum(d.swap_s for d in swapped) / base,
                  "swapped_recompute_price_pct": 100 * sum(d.recompute_s for d in swapped
                                                           if math.isfinite(d.recompute_s)) / base,
                  "forced_swaps": sum(not math.isfinite(d.recompute_s) for d in swapped)}


def verdict(delta: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """delta against the recomputation-only rows of its cell: the best that finished, and delta <= it (exact).

    ``delta_le_best`` is True when delta finished and its overhead is <= that of every recomputation-only
    policy that finished (so also when none did), False when it is above one of them or did not finish
    where one did, None when no policy finishes, delta included."""
    finished = [r for r in others if r["status"] == "ok"]
    best = min(finished, key=lambda r: r["overhead"]) if finished else None
    delta_ok = delta["status"] == "ok"
    coop = next((r for r in others if r["policy"] == "coop"), None)
    le: bool | None = delta_ok and all(delta["overhead"] <= r["overhead"] for r in finished)
    if not delta_ok and not finished:
        le = None  # no policy finishes at this budget, delta included: nothing to compare
    return {
        "best_recompute_only": f"{best['policy']} {best['overhead_pct']:.4g}%" if best else "none finishes",
        "delta_le_best": le,
        "margin_pct": 100.0 * (best["overhead"] - delta["overhead"]) if best and delta_ok else None,
        "only_delta_finishes": delta_ok and not finished,
        "coop_gap_pct": (100.0 * (delta["overhead"] - coop["overhead"])
                         if coop is not None and coop["status"] == "ok" and delta_ok else None),
    }


def sweep(model: str, graph: Graph, costs: str = "analytic", fractions: tuple[float, ...] = FRACTIONS,
          profile: str = PROFILE, slow_fractions: tuple[float, ...] = (),
          policies: tuple[str, ...] = RECOMPUTE_ONLY) -> list[dict[str, Any]]:
    """Rows of one graph: per budget fraction each recomputation-only policy, then delta on ``profile`` and,
    at ``slow_fractions``, delta on the slow link; every delta row carries its :func:`verdict`."""
    replay_graph = graph.with_random_replay()
    peak = baseline_peak(graph)
    rows: list[dict[str, Any]] = []
    for fraction in fractions:
        budget = round(fraction * peak)
        others = [recompute_only_row(model, costs, graph, replay_graph, fraction, budget, p) for p in policies]
        rows += others
        links = [profile] + ([SLOW_PROFILE] if fraction in slow_fractions else [])
        for link in links:
            delta = delta_row(model, costs, graph, replay_graph, fraction, budget, link)
            rows.append(delta | verdict(delta, others))
    return rows


# ============================================================================ summary
def cells(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float, str], dict[str, Any]]:
    """(model, costs, fraction, profile) -> the delta row, in row order."""
    return {(r["model"], r["costs"], r["fraction"], r["profile"]): r for r in rows if r["policy"] == "delta"}


def _reason(delta: dict[str, Any], profile: str) -> str:
    """The measured decomposition of a cell where delta is not <= the best recomputation-only policy."""
    if delta["status"] != "ok":
        return f"delta {delta['status']} ({delta['message']}) where {delta['best_recompute_only']} finishes"
    base = delta["baseline_cost"]
    coop = "-" if delta["coop_gap_pct"] is None else f"{delta['overhead_pct'] - delta['coop_gap_pct']:.4g}%"
    if not delta["swaps"]:
        same = " (as Coop's, whose windows it shares)" if delta["coop_gap_pct"] == 0 else f" (coop {coop})"
        return (f"delta {delta['overhead_pct']:.4g}% swapped nothing (decisions {delta['decisions']}): its filter's "
                f"releases, all recomputed, cost more than {delta['best_recompute_only']}'s{same}")
    link = load_device_profile(profile)
    pageout_s = delta["swaps"] * link.pageout_latency_s + delta["swapped_bytes"] / link.pageout_bytes_per_s
    return (f"delta {delta['overhead_pct']:.4g}% = recompute {100 * delta['recomputed_cost'] / base:.3g}% + exposed "
            f"copy {100 * delta['exposed_copy_s'] / base:.3g}% (page-outs, each waited for, "
            f"{100 * pageout_s / base:.3g}%; {delta['swaps']} swaps, {delta['prefetched']} page-ins prefetched) vs "
            f"{delta['best_recompute_only']}" + ("" if delta["best_recompute_only"].startswith("coop ") else f" (coop {coop})")
            + f"; the director priced its swaps at {delta['swap_price_pct']:.3g}% against "
            f"{delta['swapped_recompute_price_pct']:.3g}% (rebuild) for recomputing the "
            f"{delta['swaps'] - delta['forced_swaps']} of them that could be ({delta['forced_swaps']} forced)")


def summary(rows: list[dict[str, Any]], profile: str = PROFILE) -> list[str]:
    """Notes lines: per cost reading, the claim counted over the claim's budgets, its exceptions, the cells
    where only delta finishes, and the slow-link gap to Coop."""
    lines = []
    by_cell = cells(rows)
    for costs in dict.fromkeys(r["costs"] for r in rows):
        claim = [r for (_, c, f, p), r in by_cell.items() if c == costs and p == profile and f in CLAIM_FRACTIONS]
        if not claim:
            continue
        le = [r for r in claim if r["delta_le_best"]]
        compared = [r for r in claim if r["delta_le_best"] is not None]
        per_model = "; ".join(
            f"{m}: {sum(r in le for r in compared if r['model'] == m)} of "
            f"{sum(r['model'] == m for r in compared)}" for m in dict.fromkeys(r["model"] for r in claim))
        nobody = [r for r in claim if r["delta_le_best"] is None]
        if lines:
            lines.append("")  # a blank line ends the previous list
        lines.append(f"**{costs} costs, {profile}**: delta <= the best recomputation-only policy (exact float "
                     f"comparison) in {len(le)} of {len(compared)} cells at 0.9-0.4 ({per_model})"
                     + (f"; no policy finishes, delta included, in {len(nobody)} more: "
                        + ", ".join(f"{r['model']} {r['fraction']}" for r in nobody) if nobody else "") + ".")
        lines += [f"- exception {r['model']} {r['fraction']}: {_reason(r, profile)}"
                  for r in claim if r["delta_le_best"] is False]
        only = [r for (_, c, _, p), r in by_cell.items() if c == costs and p == profile and r["only_delta_finishes"]]
        failed_all = [r for (_, c, _, p), r in by_cell.items()
                      if c == costs and p == profile and r["best_recompute_only"] == "none finishes"]
        lines.append(f"- only delta finishes (every recomputation-only policy fails): {len(only)} of "
                     f"{len(failed_all)} cells where all of them fail"
                     + (": " + ", ".join(f"{r['model']} {r['fraction']} ({r['overhead_pct']:.3g}%)" for r in only)
                        if only else "")
                     + ("; delta fails too at " + ", ".join(f"{r['model']} {r['fraction']} ({r['status']})"
                                                           for r in failed_all if r not in only)
                        if len(only) < len(failed_all) else ""))
        slow = [r for (_, c, _, p), r in by_cell.items() if c == costs and p == SLOW_PROFILE]
        if slow:
            lines.append(f"- {SLOW_PROFILE} (slow link): " + "; ".join(
                f"{r['model']} {r['fraction']}: delta {r['overhead_pct']:.4g}% = recompute "
                f"{100 * r['recomputed_cost'] / r['baseline_cost']:.3g}% + exposed copy "
                f"{100 * r['exposed_copy_s'] / r['baseline_cost']:.3g}% (decisions {r['decisions']}, "
                f"{r['forced_swaps']} swaps forced; swaps priced {r['swap_price_pct']:.3g}% vs "
                f"{r['swapped_recompute_price_pct']:.3g}% rebuild), coop "
                f"{'-' if r['coop_gap_pct'] is None else format(r['overhead_pct'] - r['coop_gap_pct'], '.4g')}%, "
                f"gap {'-' if r['coop_gap_pct'] is None else format(r['coop_gap_pct'], '+.3g')} points"
                for r in slow))
    return lines


def _overpriced(rows: list[dict[str, Any]]) -> str:
    """The measured reasons where delta swaps and still loses to the best recomputation-only policy or to Coop."""
    losing = [r for r in rows if r["policy"] == "delta" and r["swaps"] and r["status"] == "ok"
              and (r["delta_le_best"] is False or (r["coop_gap_pct"] or 0.0) > 0)]
    chosen = [r for r in losing if r["forced_swaps"] < r["swaps"]]
    over = [r for r in chosen if 100 * r["recomputed_cost"] / r["baseline_cost"] < r["swapped_recompute_price_pct"]]
    forced = [r for r in losing if r["forced_swaps"] == r["swaps"]]
    above = [r for r in forced if r["best_recompute_only"] != "none finishes"
             and 100 * r["recomputed_cost"] / r["baseline_cost"] > r["overhead_pct"] + r["margin_pct"]]
    text = ""
    if chosen:
        text += (f" Of the {len(chosen)} finished delta rows that chose to swap tensors it could have recomputed and "
                 f"still lost to the best recomputation-only policy or to Coop, in {len(over)} the rebuild price the "
                 "director put on those tensors alone (swapped_recompute_price_pct) exceeds the recomputation the "
                 "whole run paid (recomputed_cost): each tensor is priced with its evicted ancestors, which one later "
                 "recomputation rebuilds for many tensors at once, so the price overstates the cost of recomputing "
                 "and the director swaps where recomputing would have cost less.")
    if forced:
        text += (f" In {len(forced)} losing rows every swap was forced (values only delta may release: graph outputs, "
                 "extra outputs such as batch norm's saved statistics); in "
                 f"{len(above)} of them delta's recomputation alone exceeds the best policy's whole overhead: its "
                 "windows, holding those values, release other tensors than the recomputation-only policies' do, and "
                 "those cost more to recompute.")
    return text


# ============================================================================ run
def run(quick: bool = False) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    facts: list[str] = []
    ratios: list[float] = []
    for label, (builder, slow) in model_specs(quick).items():
        graph, capture_s = capture_graph(builder())
        timed = a100_timed(graph)
        peak = baseline_peak(graph)
        ratios.append(graph.baseline_cost / timed.baseline_cost)
        facts.append(f"{label}: {len(graph.nodes)} nodes, captured in {capture_s:.1f} s, baseline peak {peak:,} B, "
                     f"min_budget {min_budget(graph) / peak:.3f} of it; baseline step {graph.baseline_cost:.4g} s "
                     f"analytic, {timed.baseline_cost:.4g} s A100-timed")
        rows += sweep(label, graph, "analytic", slow_fractions=SLOW_FRACTIONS if slow else ())
        rows += sweep(label, timed, "a100")
    invalid = [r for r in rows if r["status"] == "ok" and not r["schedule_valid"]]
    slowest = max(rows, key=lambda r: r["wall_s"])
    notes = [
        *summary(rows),
        "",
        "Graphs: " + "; ".join(facts) + ".",
        "",
        (f"Every schedule returned was validated on the replay graph: {len(invalid)} of "
         f"{sum(r['status'] == 'ok' for r in rows)} ok rows invalid. Status is the engine's: ok, oom (nothing "
         "evictable makes room), thrashed (extra time past 10x the step, or a finished run above 2x). Slowest "
         f"simulation: {slowest['wall_s']:.2f} s ({slowest['model']}, {slowest['costs']} costs, {slowest['fraction']}, "
         f"{slowest['policy']}). Columns: overhead = (recomputed_cost + exposed_copy_s) / baseline step, in the "
         "graph's seconds (overhead_pct the same in %); swapped_bytes the page-out bytes, host_peak the most host "
         "bytes at once; prefetched = page-ins started ahead of their use / all page-ins; decisions the director's "
         "verdicts on the released tensors."),
        "",
        ("How DELTA's overhead is made (coop.online.delta_sim): the compute waits for every page-out (the "
         "allocation that needed the room is made once the copy has left), and a page-in is prefetched only into "
         "free memory, else paged in on demand; the director swaps a released tensor when its page-out plus "
         "page-in take less than rebuilding it (its cost plus its evicted ancestors'; DTR's e*, which adds the evicted "
         "descendants as well, made it swap more: a100 costs, 2 of 12 cells on 2026-11-26 18:16). A copy takes the link's time whatever the "
         "graph's costs, so the analytic costs (a nominal 1e11 FLOP/s: the step is "
         f"{min(ratios):.0f}-{max(ratios):.0f}x the A100-timed one here) give every copy that much more compute to "
         "hide behind than the A100 would.") + _overpriced(rows),
    ]
    return {"rows": rows, "notes": "\n".join(notes)}


if __name__ == "__main__":
    import sys

    result = run(quick="--quick" in sys.argv[1:])
    print("\n".join(result["notes"].splitlines()))
