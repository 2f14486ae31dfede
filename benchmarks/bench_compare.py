"""Static plans versus online eviction on the same graphs and budgets (:func:`coop.compare.compare`).

For the Checkmate training graphs in ``graphs/moccasin/`` (the small ones also through
the Checkmate MILP; every one through Moccasin with ``time_limit`` 20 s and the baselines) and one
captured model (the zoo GPT-2, 4 layers, batch 2, sequence 128; costs in analytic seconds), at
90/70/50 % of the baseline peak, this reports per (graph, budget):

* the best static plan that fits (least overhead) and whether its overhead is <= every online
  policy's that finished (DTR, DTR-eq, DTE, Coop; an online policy that ran out of memory or
  thrashed counts as beaten), with every fitting static plan's overhead. Static plans and online
  policies have the same rights: both may recompute random ops by replaying the generator state
  saved before their first draw (the executor and the fallback do so bit for bit);
* for the captured graph, whose cost unit is seconds, the break-even number of training steps
  after which the static plan's solve latency is repaid (``compare``'s ``break_even_vs_*``); the
  Checkmate graphs count profiled cost units, not seconds, so they have none.

Run: ``.venv/bin/python benchmarks/bench_compare.py [--json]``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from coop.compare import compare
from coop.graph import Graph
from coop.graph_files import load_graph
from coop.online.policies import POLICIES

GRAPH_DIR = Path(__file__).resolve().parents[1] / "graphs" / "moccasin"
FRACTIONS = (0.9, 0.7, 0.5)
TIME_LIMIT = 20.0
#: Checkmate's MILP has O(n^2) variables: only graphs up to this many nodes get it.
CHECKMATE_MAX_NODES = 120
BASELINES = ("store-all", "checkpoint-all", "chen-sqrt", "chen-greedy")


def _graphs(graph_dir: Path) -> list[Graph]:
    graphs = [load_graph(path) for path in sorted(graph_dir.glob("*_train_nx.json"))]
    graphs.append(_captured_gpt2())
    return graphs


def _captured_gpt2() -> Graph:
    from coop.graph_capture import capture
    from coop.zoo import build

    model, batch, loss_fn = build("gpt2", layers=4, batch=2, seq=128)
    graph = capture(model, batch, loss_fn=loss_fn).graph
    return graph.model_copy(update={"name": "gpt2-4x64-b2-s128"})


def _formulations(graph: Graph) -> list[str]:
    names = [*BASELINES, "moccasin"]
    if len(graph.nodes) <= CHECKMATE_MAX_NODES:
        names.insert(len(BASELINES), "checkmate")
    return names


def verdicts(graph: Graph, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per budget: the best fitting static plan against every online policy."""
    out = []
    for budget in sorted({r["budget"] for r in rows}, reverse=True):
        here = [r for r in rows if r["budget"] == budget]
        static = [r for r in here if r["kind"] == "static" and r["fits"] and r["overhead"] is not None]
        online = {r["method"]: r for r in here if r["kind"] == "online"}
        best = min(static, key=lambda r: r["overhead"]) if static else None
        finished = {name: r["overhead"] for name, r in online.items() if r["fits"] and r["overhead"] is not None}
        verdict: dict[str, Any] = {
            "graph": graph.name,
            "fraction": here[0]["fraction"],
            "budget": budget,
            "status": here[0]["status"] if here[0]["status"] == "infeasible" else "",
            "best_static": best["method"] if best else None,
            "best_static_overhead": best["overhead"] if best else None,
            "best_static_solve_s": best["solve_s"] if best else None,
            "online_overhead": finished,
            "online_failed": sorted(set(online) - set(finished)),
            "static_le_every_online": best is not None and all(best["overhead"] <= o + 1e-12 for o in finished.values()),
        }
        if best is not None:
            verdict["break_even_steps"] = {p: best.get(f"break_even_vs_{p}") for p in POLICIES}
            beaten_by = [f"{p} {o:.4g}" for p, o in finished.items() if o < best["overhead"] - 1e-12]
            if beaten_by:
                verdict["reason"] = (f"{', '.join(beaten_by)} below {best['method']} {best['overhead']:.4g} "
                                     f"({best['status']}: {best['message'] or 'no message'})")
        verdict["static_overheads"] = {r["method"]: round(r["overhead"], 5) for r in static}
        out.append(verdict)
    return out


def run(graph_dir: Path = GRAPH_DIR, fractions: tuple[float, ...] = FRACTIONS) -> list[dict[str, Any]]:
    """One verdict per (graph, budget fraction): the best static plan against every online policy."""
    results = []
    for graph in _graphs(graph_dir):
        report = compare(graph, list(fractions), formulations=_formulations(graph), policies=list(POLICIES),
                         time_limit=TIME_LIMIT)
        for verdict in verdicts(graph, report.rows):
            verdict["cost_unit"] = report.cost_unit
            verdict["notes"] = report.notes
            results.append(verdict)
    return results


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)


def main(argv: list[str]) -> None:
    results = run()
    if "--json" in argv:
        print(json.dumps(results, indent=1, default=_format))
        return
    for v in results:
        online = ", ".join(f"{p}={_format(o)}" for p, o in v["online_overhead"].items()) or "-"
        even = ", ".join(f"{p}={_format(s)}" for p, s in (v.get("break_even_steps") or {}).items())
        print(f"{v['graph'][:30]:30s} {v['fraction']:.2f} best static {v['best_static']!s:15s} "
              f"overhead {_format(v['best_static_overhead']):>8s} solve {_format(v['best_static_solve_s']):>7s}s | "
              f"online {online} failed {','.join(v['online_failed']) or '-'} | static<=online "
              f"{v['static_le_every_online']} | break-even {even or '-'}")


if __name__ == "__main__":
    main(sys.argv[1:])
