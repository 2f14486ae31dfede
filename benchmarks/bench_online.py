"""Online eviction on the Checkmate training graphs: DTR, DTR-eq, DTE and Coop side by side.

For every ``*_train_nx.json`` graph in ``../shared/graphs/moccasin/`` and budgets of 90 to 40 %
of the baseline peak, runs :func:`coop.runtime.online_sim.simulate_online` with each policy and
reports status, compute overhead, evictions, eviction-search time and Coop's fragmentation measure
(mean free bytes / arena at failed allocations). A budget below the least feasible one
(``coop.budget.min_budget``) is infeasible for every method; it is marked so.

Besides the registered policies it runs Coop ablations (``ABLATIONS``): the first version's window
score (``cost / staleness``), Coop without cheap/expensive ends, and without in-place recompute.
:func:`summarize` counts, over the feasible cells, where Coop's overhead and fragmentation are at
most DTR's and DTE's and where Coop finishes while one of them does not (the paper's claim).

Run: ``.venv/bin/python benchmarks/bench_online.py [--json]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from coop.budget import baseline_peak, min_budget
from coop.graph import load_graph
from coop.runtime.online_sim import simulate_online
from coop.runtime.policies import POLICIES, CoopPolicy, EvictionPolicy
from coop.schedule import validate

GRAPH_DIR = Path(__file__).resolve().parents[2] / "shared" / "graphs" / "moccasin"
FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
POLICY_NAMES = tuple(POLICIES)
#: Coop variants measured beside the registered policies (label -> CoopPolicy options).
ABLATIONS: dict[str, dict[str, Any]] = {
    "coop-cost": {"window_cost": "cost"},
    "coop-no-ends": {"partition": False},
    "coop-no-inplace": {"in_place": False},
}


def _policies(ablations: bool) -> dict[str, str | EvictionPolicy]:
    policies: dict[str, str | EvictionPolicy] = {name: name for name in POLICY_NAMES}
    if ablations:
        policies |= {label: CoopPolicy(**options) for label, options in ABLATIONS.items()}
    return policies


def run(graph_dir: Path = GRAPH_DIR, fractions: tuple[float, ...] = FRACTIONS, ablations: bool = True) -> list[dict[str, Any]]:
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


def compare_coop(rows: list[dict[str, Any]], coop_label: str = "coop") -> list[dict[str, Any]]:
    """Per (graph, budget): is Coop's overhead and fragmentation <= DTR's and DTE's?

    Only budgets where every policy finished ("ok") are compared on overhead; a policy that
    finished where another ran out of memory is listed in ``only_ok``.
    """
    verdicts = []
    keys = sorted({(r["graph"], r["fraction"]) for r in rows}, key=lambda k: (k[0], -k[1]))
    for graph, fraction in keys:
        by_policy = {r["policy"]: r for r in rows if r["graph"] == graph and r["fraction"] == fraction}
        coop = by_policy[coop_label]
        others = [by_policy[p] for p in ("dtr", "dte")]
        all_ok = coop["status"] == "ok" and all(r["status"] == "ok" for r in others)
        verdicts.append(
            {
                "graph": graph,
                "fraction": fraction,
                "feasible": coop["feasible"],
                "all_ok": all_ok,
                "only_ok": [p for p, r in by_policy.items() if r["status"] == "ok" and p in POLICY_NAMES],
                "coop_ok_where_dtr_or_dte_not": coop["status"] == "ok" and any(r["status"] != "ok" for r in others),
                "coop_not_ok_where_dtr_or_dte_ok": coop["status"] != "ok" and any(r["status"] == "ok" for r in others),
                "coop_overhead_le": all_ok and all(coop["overhead"] <= r["overhead"] + 1e-12 for r in others),
                "coop_fragmentation_le": all(coop["fragmentation"] <= r["fragmentation"] + 1e-12 for r in others),
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
                "ok_where_dtr_or_dte_not": sum(v["coop_ok_where_dtr_or_dte_not"] for v in verdicts),
                "not_ok_where_dtr_or_dte_ok": sum(v["coop_not_ok_where_dtr_or_dte_ok"] for v in verdicts),
            }
        )
    return summary


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
    rows = run()
    verdicts = compare_coop(rows)
    if "--json" in argv:
        print(json.dumps({"rows": rows, "coop_vs_baselines": verdicts, "summary": summarize(rows)}, indent=1))
        return
    print(_table(rows))
    print()
    for v in verdicts:
        print(
            f"{v['graph'][:34]:34s} {v['fraction']:.1f} feasible={v['feasible']!s:5s} ok={','.join(v['only_ok']) or '-':22s} "
            f"coop overhead<=dtr,dte: {v['coop_overhead_le']!s:5s} coop fragmentation<=dtr,dte: {v['coop_fragmentation_le']}"
        )
    print()
    for line in summarize(rows):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
