"""Online eviction on the Checkmate training graphs: DTR, DTR-eq, DTE and Coop side by side.

For every ``*_train_nx.json`` graph in ``graphs/moccasin/`` and budgets of 90 to 40 %
of the baseline peak, runs :func:`coop.online.online_sim.simulate_online` with each policy and
reports status, compute overhead, evictions, eviction-search time and Coop's fragmentation measure
(mean free bytes / arena at failed allocations). A budget below ``coop.budget.min_budget`` (the
proven lower bound) is infeasible for every method; it is marked so.

Besides the registered policies it runs Coop ablations (``ABLATIONS``): the previous default
(``coop-prev``: window score summing DTR's ``h``, cheap tensors from the arena's top), each of its
two differences alone (``coop-h``, ``coop-ends``), the first version's window score
(``cost / staleness``), Coop without cheap/expensive ends, and without in-place recompute.
:func:`summarize` counts, over the feasible cells, where Coop's overhead and fragmentation are at
most DTR's and DTE's and where Coop finishes while one of them does not (the paper's claim).

:func:`run_captured` does the same on captured training steps (costs in analytic seconds):
GPT-2 small (12 x 768, vocab 50257, batch 8, sequence 512), ResNet-50 (transformers' default
``ResNetConfig``: bottleneck depths 3-4-6-3, batch 16, 224 x 224; at batch 2 its weights and
gradients alone exceed 70 % of the baseline peak) and the zoo's default transformer
(``coop.zoo.build("transformer")``), at the same 90 to 40 % of the baseline peak, plus the issue's GPT-2 (4 layers, batch 2, sequence 128) run on real tensors by the
dynamic fallback (:func:`run_fallback`): every policy at 50 %, three steps, loss and gradients
compared with eager PyTorch by ``torch.equal`` and the meter's peak against the arena.

Run: ``.venv/bin/python benchmarks/bench_online.py [--json] [--captured] [--fallback]`` (the
Checkmate graphs always; the captured models and the fallback when asked).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from coop.budget import baseline_peak, min_budget
from coop.graph_files import load_graph
from coop.online.online_sim import simulate_online
from coop.online.policies import POLICIES, CoopPolicy, EvictionPolicy
from coop.schedule import validate

GRAPH_DIR = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"
FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
POLICY_NAMES = tuple(POLICIES)
#: Coop variants measured beside the registered policies (label -> CoopPolicy options).
ABLATIONS: dict[str, dict[str, Any]] = {
    "coop-prev": {"window_cost": "h", "layout": "ends"},
    "coop-h": {"window_cost": "h"},
    "coop-ends": {"layout": "ends"},
    "coop-cost": {"window_cost": "cost"},
    "coop-no-ends": {"partition": False},
    "coop-no-inplace": {"in_place": False},
}
#: What each ablation changes, for the reasons in :func:`_reason` (the ablation reaching the
#: baselines where Coop does not names the part of Coop that costs it the cell).
_ABLATION_CAUSES = {
    "coop-no-ends": "the cheap/expensive split",
    "coop-no-inplace": "in-place recompute",
    "coop-h": "the per-byte window score (coop-h sums DTR's h instead)",
    "coop-ends": "the hole-ends layout (coop-ends carves cheap tensors from the arena's top)",
}


def _policies(ablations: bool) -> dict[str, str | EvictionPolicy]:
    policies: dict[str, str | EvictionPolicy] = {name: name for name in POLICY_NAMES}
    if ablations:
        policies |= {label: CoopPolicy(**options) for label, options in ABLATIONS.items()}
    return policies


def run(graph_dir: Path = GRAPH_DIR, fractions: tuple[float, ...] = FRACTIONS, ablations: bool = True,
        captured: bool = True, fallback: bool = True) -> dict[str, Any]:
    """The rows of :func:`run_rows` (Checkmate graphs) and :func:`run_captured` (GPT-2 small,
    ResNet-50), and as notes (run_all prints them under the table) each set's :func:`summary_text`
    and the real-tensor fallback's check (:func:`run_fallback`)."""
    rows = run_rows(graph_dir, fractions, ablations)
    notes = ["Checkmate graphs: " + _bulleted(summary_text(compare_coop(rows)))]
    if captured:
        captured_rows = run_captured()
        rows += captured_rows
        notes.append("Captured models: " + _bulleted(summary_text(compare_coop(captured_rows))))
    if fallback:
        notes.append("Runtime fallback on real tensors (GPT-2 4 layers, batch 2, seq 128, 3 steps, 50 % of the "
                     "baseline peak):")
        notes += [", ".join(f"{k}={_short(v)}" for k, v in row.items()) for row in run_fallback()]
    return {"rows": rows, "notes": "\n\n".join(notes)}


def _bulleted(text: str) -> str:
    """summary_text's indented exception lines as a markdown list."""
    return text.replace("\n  ", "\n- ").replace("\n- ", "\n\n- ", 1)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_rows(graph_dir: Path = GRAPH_DIR, fractions: tuple[float, ...] = FRACTIONS,
             ablations: bool = True) -> list[dict[str, Any]]:
    """One row per (graph, budget fraction, policy or Coop ablation)."""
    rows = []
    for path in sorted(graph_dir.glob("*_train_nx.json")):
        graph = load_graph(path)
        peak = baseline_peak(graph)
        least = min_budget(graph)
        for fraction in fractions:
            budget = round(fraction * peak)
            for policy, policy_object in _policies(ablations).items():
                result = simulate_online(graph, budget, policy_object)
                valid = result.schedule is not None and validate(graph, result.schedule, budget).ok
                rows.append(
                    {
                        "graph": graph.name.replace("_train_nx", ""),
                        "nodes": len(graph.nodes),
                        "fraction": fraction,
                        "budget": budget,
                        "feasible": budget >= least,
                        "policy": policy,
                        "status": result.status,
                        "schedule_valid": valid,
                        "overhead": result.overhead,
                        "evictions": result.evictions,
                        "recomputations": result.recomputations,
                        "failures": result.failures,
                        "search_s": result.search_s,
                        "fragmentation": result.fragmentation,
                        "peak_fraction": result.peak / budget,
                        "message": result.message,
                    }
                )
    return rows


#: Captured models: label -> (zoo-style builder, size); built lazily so the Checkmate sweep needs no torch.
CAPTURED_FRACTIONS = FRACTIONS


def _captured_models() -> dict[str, Any]:
    from coop.zoo import _classifier_loss, build

    def gpt2_small() -> tuple[Any, Any, Any]:
        # bench_captured's size: activations, not parameters and gradients (never evictable), dominate.
        return build("gpt2", layers=12, hidden=768, heads=12, vocab=50257, batch=8, seq=512)

    def resnet50(batch: int = 16) -> tuple[Any, Any, Any]:
        import torch
        from transformers import ResNetConfig, ResNetForImageClassification

        torch.manual_seed(0)
        model = ResNetForImageClassification(ResNetConfig(num_labels=10)).train()  # the default config is ResNet-50
        images = torch.randn(batch, 3, 224, 224)
        labels = torch.randint(0, 10, (batch,))
        return model, (images, labels), _classifier_loss

    def zoo_transformer() -> tuple[Any, Any, Any]:
        return build("transformer")

    return {"gpt2-small-b8-s512": gpt2_small, "resnet50-b16": resnet50, "zoo-transformer": zoo_transformer}


def run_captured(fractions: tuple[float, ...] = CAPTURED_FRACTIONS) -> list[dict[str, Any]]:
    """One row per (captured model, budget fraction, policy); the same columns as :func:`run`."""
    import time

    from coop.graph_capture import capture

    rows = []
    for label, builder in _captured_models().items():
        model, batch, loss_fn = builder()
        started = time.perf_counter()
        captured = capture(model, batch, loss_fn=loss_fn)
        capture_s = time.perf_counter() - started
        graph = captured.graph
        replay_graph = graph.with_random_replay()
        peak, least = baseline_peak(graph), min_budget(graph)
        for fraction in fractions:
            budget = round(fraction * peak)
            for policy in POLICY_NAMES:
                result = simulate_online(graph, budget, policy)
                valid = result.schedule is not None and validate(replay_graph, result.schedule, budget).ok
                rows.append(
                    {
                        "graph": label,
                        "nodes": len(graph.nodes),
                        "capture_s": capture_s,
                        "fraction": fraction,
                        "budget": budget,
                        "feasible": budget >= least,
                        "policy": policy,
                        "status": result.status,
                        "schedule_valid": valid,
                        "overhead": result.overhead,
                        "evictions": result.evictions,
                        "recomputations": result.recomputations,
                        "random_replays": result.random_replays,
                        "failures": result.failures,
                        "search_s": result.search_s,
                        "fragmentation": result.fragmentation,
                        "peak_fraction": result.peak / budget,
                        "message": result.message,
                    }
                )
        del model, captured
    return rows


def run_fallback(steps: int = 3, fraction: float = 0.5) -> list[dict[str, Any]]:
    """The issue's check on real tensors: GPT-2 (4 layers, batch 2, seq 128), every policy, ``steps`` steps."""
    import copy
    import time

    import torch

    from coop.graph_capture import capture
    from coop.planner import DynamicPlan
    from coop.runtime.meter import MemoryMeter
    from coop.zoo import build

    model, batch, loss_fn = build("gpt2", layers=4, batch=2, seq=128)
    captured = capture(model, batch, loss_fn=loss_fn)
    budget = round(fraction * baseline_peak(captured.graph))
    rows = []
    for policy in POLICY_NAMES:
        eager, planned = copy.deepcopy(model), copy.deepcopy(model)
        plan = DynamicPlan(captured, planned, budget, policy=policy)
        losses_equal, peaks, step_s = True, [], []
        for step in range(steps):
            torch.manual_seed(100 + step)
            loss = loss_fn(eager, *batch)
            loss.backward()
            torch.manual_seed(100 + step)
            flat = captured.flat_inputs(planned, batch)
            started = time.perf_counter()
            with MemoryMeter(use_cuda=False) as meter:
                meter.track(*flat, *captured.constants())
                planned_loss = plan.step(*batch)
            step_s.append(time.perf_counter() - started)
            losses_equal &= torch.equal(planned_loss, loss.detach())
            peaks.append(meter.peak_bytes)
        grads_equal = all(torch.equal(p.grad, q.grad) for p, q in zip(eager.parameters(), planned.parameters(), strict=True))
        stats = plan.last_stats
        assert stats is not None
        rows.append({"policy": policy, "fraction": fraction, "budget": budget, "steps": steps,
                     "losses_equal": losses_equal, "grads_equal": grads_equal, "meter_peak": max(peaks),
                     "meter_peak_le_budget": max(peaks) <= budget, "arena_peak": stats.arena_peak,
                     "overhead": stats.overhead, "evictions": stats.evictions,
                     "random_replays": stats.extra.get("random_replays", 0), "search_s": stats.search_s,
                     "fragmentation": stats.fragmentation, "step_s": sum(step_s) / len(step_s)})
    return rows


def _at_most(coop: dict[str, Any], others: list[dict[str, Any]], key: str) -> bool:
    """Coop's ``key`` <= every other policy's; for overhead Coop must finish, and a policy that did not finish loses."""
    if key == "overhead":
        return coop["status"] == "ok" and all(r["status"] != "ok" or coop[key] <= r[key] + 1e-12 for r in others)
    return all(coop[key] <= r[key] + 1e-12 for r in others)


def _reason(by_policy: dict[str, dict[str, Any]], coop_label: str, key: str) -> str:
    """Why Coop is not <= DTR and DTE on ``key`` in one cell, from the measurements (the ablations when run)."""
    coop = by_policy[coop_label]
    others = [by_policy[p] for p in ("dtr", "dte")]
    best = min(others, key=lambda r: r[key])
    if key == "overhead" and all(r["status"] != "ok" for r in [coop, *others]):
        return "no policy finishes at this budget"
    if key == "overhead" and coop["status"] != "ok":
        return f"coop {coop['status']} ({coop['message']}) where {best['policy']} finishes"
    measured = f"coop {coop[key]:.4g} vs {best['policy']} {best[key]:.4g}"
    for ablation, what in _ABLATION_CAUSES.items():
        row = by_policy.get(ablation)
        if row is not None and coop_label == "coop" and _at_most(row, others, key):
            return f"{measured}; {ablation} reaches {row[key]:.4g}, so {what} is the cause"
    none = "no Coop ablation reaches it: " if any(a in by_policy for a in _ABLATION_CAUSES) else ""
    if key == "fragmentation":
        return f"{measured}; {none}Coop's windows leave the free bytes at other failures than DTR's single victims"
    return f"{measured}; {none}the cheapest window under Coop's layout holds more recompute than DTR's greedy victims"


def compare_coop(rows: list[dict[str, Any]], coop_label: str = "coop") -> list[dict[str, Any]]:
    """Per (graph, budget): is Coop's overhead and fragmentation <= DTR's and DTE's? With a reason where not.

    Overhead: Coop must finish, and is <= a policy that did not finish (the paper's claim that Coop
    stays feasible where DTR fails); fragmentation is compared in every cell.
    """
    verdicts = []
    keys = sorted({(r["graph"], r["fraction"]) for r in rows}, key=lambda k: (k[0], -k[1]))
    for graph, fraction in keys:
        by_policy = {r["policy"]: r for r in rows if r["graph"] == graph and r["fraction"] == fraction}
        coop = by_policy[coop_label]
        others = [by_policy[p] for p in ("dtr", "dte")]
        all_ok = coop["status"] == "ok" and all(r["status"] == "ok" for r in others)
        overhead_le = _at_most(coop, others, "overhead")
        fragmentation_le = _at_most(coop, others, "fragmentation")
        reasons = []
        if not overhead_le:
            reasons.append("overhead: " + _reason(by_policy, coop_label, "overhead"))
        if not fragmentation_le:
            reasons.append("fragmentation: " + _reason(by_policy, coop_label, "fragmentation"))
        verdicts.append(
            {
                "graph": graph,
                "fraction": fraction,
                "feasible": coop["feasible"],
                "all_ok": all_ok,
                "only_ok": [p for p, r in by_policy.items() if r["status"] == "ok" and p in POLICY_NAMES],
                "coop_ok_where_dtr_or_dte_not": coop["status"] == "ok" and any(r["status"] != "ok" for r in others),
                "coop_not_ok_where_dtr_or_dte_ok": coop["status"] != "ok" and any(r["status"] == "ok" for r in others),
                "coop_overhead_le": overhead_le,
                "coop_fragmentation_le": fragmentation_le,
                "reason": "; ".join(reasons),
            }
        )
    return verdicts


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per Coop variant, over the feasible cells: how often it matches or beats DTR and DTE."""
    labels = ["coop", *(label for label in ABLATIONS if any(r["policy"] == label for r in rows))]
    summary = []
    for label in labels:
        verdicts = [v for v in compare_coop(rows, label) if v["feasible"]]
        summary.append(
            {
                "variant": label,
                "feasible_cells": len(verdicts),
                "all_ok_cells": sum(v["all_ok"] for v in verdicts),
                "overhead_le_dtr_and_dte": sum(v["coop_overhead_le"] for v in verdicts),
                "fragmentation_le_dtr_and_dte": sum(v["coop_fragmentation_le"] for v in verdicts),
                "both_le_dtr_and_dte": sum(v["coop_overhead_le"] and v["coop_fragmentation_le"] for v in verdicts),
                "ok_where_dtr_or_dte_not": sum(v["coop_ok_where_dtr_or_dte_not"] for v in verdicts),
                "not_ok_where_dtr_or_dte_ok": sum(v["coop_not_ok_where_dtr_or_dte_ok"] for v in verdicts),
            }
        )
    return summary


def summary_text(verdicts: list[dict[str, Any]]) -> str:
    """The claim checked in words: cells where Coop is <= DTR and DTE on both, then each exception and why."""
    feasible = [v for v in verdicts if v["feasible"]]
    both = sum(v["coop_overhead_le"] and v["coop_fragmentation_le"] for v in feasible)
    headline = (
        f"coop <= dtr and dte in both overhead and fragmentation in {both} of {len(feasible)} feasible cells "
        f"(overhead {sum(v['coop_overhead_le'] for v in feasible)}, fragmentation "
        f"{sum(v['coop_fragmentation_le'] for v in feasible)}; coop finishes where dtr or dte does not in "
        f"{sum(v['coop_ok_where_dtr_or_dte_not'] for v in feasible)})"
    )
    lines = [headline]
    lines += [f"  exception {v['graph']} {v['fraction']:.1f}: {v['reason']}" for v in feasible if v["reason"]]
    return "\n".join(lines)


def _table(rows: list[dict[str, Any]]) -> str:
    header = f"{'graph':34s} {'frac':>4s} {'feas':>4s} {'policy':15s} {'status':8s} {'overhead':>9s} {'evict':>5s} {'search_s':>8s} {'frag':>6s}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{r['graph'][:34]:34s} {r['fraction']:4.1f} {'y' if r['feasible'] else 'n':>4s} {r['policy']:15s} "
            f"{r['status']:8s} {r['overhead']:9.4f} {r['evictions']:5d} {r['search_s']:8.4f} {r['fragmentation']:6.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    rows = run_rows()
    captured = run_captured() if "--captured" in argv else []
    fallback = run_fallback() if "--fallback" in argv else []
    verdicts = compare_coop(rows)
    captured_verdicts = _captured_verdicts(captured)
    if "--json" in argv:
        print(json.dumps({"rows": rows, "coop_vs_baselines": verdicts, "summary": summarize(rows),
                          "summary_text": summary_text(verdicts),
                          "captured_rows": captured, "captured_coop_vs_baselines": captured_verdicts,
                          "fallback": fallback}, indent=1))
        return
    _print_section(rows, verdicts)
    print()
    for line in summarize(rows):
        print(line)
    print(summary_text(verdicts))
    if captured:
        print()
        _print_section(captured, captured_verdicts)
        print(summary_text(captured_verdicts))
    for row in fallback:
        print(row)


def _captured_verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return compare_coop(rows) if rows else []


def _print_section(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> None:
    print(_table(rows))
    print()
    for v in verdicts:
        print(
            f"{v['graph'][:34]:34s} {v['fraction']:.1f} feasible={v['feasible']!s:5s} ok={','.join(v['only_ok']) or '-':22s} "
            f"coop overhead<=dtr,dte: {v['coop_overhead_le']!s:5s} coop fragmentation<=dtr,dte: {v['coop_fragmentation_le']}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
