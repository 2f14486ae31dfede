"""``auto`` against every formulation it could have chosen, on random graphs and the zoo (issue 24).

For each graph and budget (0.9, 0.7 and 0.5 of the baseline peak, and min_budget), each single formulation
``auto`` may choose (the baselines, Checkmate, Moccasin: :data:`tests.auto_oracle.SINGLE`) runs alone with
the whole time limit, and ``auto`` runs with the same limit shared among its rungs. A row counts the cases
where some formulation found a schedule and auto did not (``auto_missed``), where auto's schedule cost more
than the cheapest single one (``auto_worse``), and where auto's was cheaper (``auto_better``, e.g. a rung
warm-started by another).

The time table (:func:`time_rows`, issue 40): every formulation and ``auto`` at 5, 10 and 30 s on published
graphs (incl. the 1,000-node one), each solve's wall time (graph loaded beforehand) against its limit: every
cell must keep ``wall <= 1.1 x limit + 2 s``.

    python benchmarks/run_all.py --only bench_auto
    python benchmarks/bench_auto.py [--graphs N] [--time-limit S]
    python benchmarks/bench_auto.py --time-table [--limits 5,10,30] [--formulations moccasin,auto]
    python benchmarks/bench_auto.py --unseen 7b,cnn,random [--random-graphs 9] [--out cells.jsonl]

The unseen table (:func:`unseen_cells`, issue 40): graphs no test tunes auto to -- Llama-2-7B- and Mistral-7B-shaped
steps (bf16, batch 1, sequence 4096, captured on the meta device for CUDA) at 0.5 and 0.75 of the peak, 60 s per
solve; EfficientNet-B0- and DenseNet-121-shaped CNNs (batch 8, 64 px) at 0.5 and 0.6, and random layered graphs of
70-100 nodes drawn like the published Moccasin ones at 0.7, 30 s per solve (:mod:`_unseen_graphs`). Each single
formulation auto can choose on the graph runs alone with the whole limit, then auto with the same limit; every
solve is one JSON line (written as it ends, so a stopped run keeps what it measured).
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, given, settings

from coop.budget import baseline_peak, min_budget
from tests.auto_oracle import Comparison, compare_auto
from tests.strategies import random_graphs

FRACTIONS = (0.9, 0.7, 0.5, 0.0)  # 0.0: min_budget
RANDOM_GRAPHS = 500
#: The zoo's default batches are tiny (parameters dominate the step: min_budget near the baseline peak);
#: at this batch activations dominate, as in training.
ZOO_BATCH = 32
ZOO = ("cnn", "gpt2", "bert", "vit", "mobilenet", "resnet")


def _budget(graph: Any, fraction: float) -> int:
    return max(min_budget(graph), int(fraction * baseline_peak(graph)))


def _tally(comparisons: list[Comparison]) -> dict[str, int]:
    found_any = [c for c in comparisons if c.best_cost is not None]
    return {
        "cases": len(comparisons),
        "some_formulation_found": len(found_any),
        "auto_missed": sum(c.auto_cost is None for c in found_any),
        "auto_worse": sum(c.auto_cost is not None and not c.ok for c in found_any),
        "auto_better": sum(c.auto_cost is not None and c.auto_cost < c.best_cost - 1e-9 for c in found_any),
        "auto_only": sum(c.best_cost is None and c.auto_cost is not None for c in comparisons),
    }


def random_rows(count: int, time_limit: float) -> list[dict[str, Any]]:
    by_fraction: dict[float, list[Comparison]] = {f: [] for f in FRACTIONS}

    @settings(max_examples=count, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(graph=random_graphs(max_nodes=10))
    def one(graph: Any) -> None:
        for fraction in FRACTIONS:
            by_fraction[fraction].append(compare_auto(graph, _budget(graph, fraction), time_limit))

    one()
    return [{"graphs": f"{count} random (<= 10 computed nodes)", "budget": "min_budget" if f == 0 else f,
             **_tally(c)} for f, c in by_fraction.items()]


def zoo_rows(time_limit: float) -> list[dict[str, Any]]:
    import coop
    from coop.runtime.executor import replay_graph
    from coop.zoo import build

    rows = []
    for name in ZOO:
        model, batch, loss_fn = build(name, batch=ZOO_BATCH)
        graph = replay_graph(coop.capture(model, batch, loss_fn=loss_fn))
        for fraction in FRACTIONS:
            started = time.perf_counter()
            comparison = compare_auto(graph, _budget(graph, fraction), time_limit)
            rows.append({"graphs": f"zoo {name} ({len(graph.order)} nodes)", "budget": "min_budget" if fraction == 0
                         else fraction, **_tally([comparison]), "best_single": comparison.best,
                         "auto_cost": comparison.auto_cost, "best_cost": comparison.best_cost,
                         "wall_s": round(time.perf_counter() - started, 1)})
    return rows


#: The time table's graphs (graphs/moccasin of the checkout): a training step with repeated blocks (353 nodes) and
#: two random layered graphs (500 and 1,000 nodes, no backward part).
TIME_GRAPHS = ("ResNet50_256_224_224_3_train_nx.json", "random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json",
               "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json")
#: Every formulation that takes a time limit, and auto.
TIMED = ("checkmate", "checkmate-lp", "moccasin", "blocks", "monet", "poet", "auto")
TIME_LIMITS = (5.0, 10.0, 30.0)


def time_rows(limits: tuple[float, ...] = TIME_LIMITS, formulations: tuple[str, ...] = TIMED,
              graphs: tuple[str, ...] = TIME_GRAPHS, fraction: float = 0.8, threads: int = 2) -> list[dict[str, Any]]:
    """One row per (graph, formulation, limit): wall seconds, wall / limit, whether ``1.1 x limit + 2 s`` held, the
    status and the overhead found (a formulation that refuses the graph, e.g. blocks without a backward part, is
    recorded with its one-line reason)."""
    from coop.errors import CoopError
    from coop.formulations import get_formulation, solve
    from coop.graph_files import load_graph

    for name in formulations:  # each solver's modules imported before the clock starts (as in a warm process)
        get_formulation(name)
    rows = []
    for file_name in graphs:
        graph = load_graph(REPO / "graphs" / "moccasin" / file_name)
        budget = math.ceil(fraction * baseline_peak(graph))
        for name in formulations:
            for limit in limits:
                started = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        result = solve(graph, budget, name, time_limit=limit, threads=threads)
                        status, sim, note = result.status, result.simulation, ""
                    except CoopError as exc:
                        status, sim, note = "refused", None, str(exc)[:80]
                wall = time.perf_counter() - started
                fits = sim is not None and sim.peak <= budget
                row = {"graph": f"{file_name.split('_')[0]} {len(graph.order)}", "formulation": name, "limit_s": limit,
                       "wall_s": round(wall, 2), "wall/limit": round(wall / limit, 2),
                       "kept": wall <= 1.1 * limit + 2.0, "status": status,
                       "overhead_%": round(100 * sim.overhead, 3) if fits else None}
                if note:
                    row["note"] = note
                rows.append(row)
                print(row, flush=True)
    return rows


#: Seconds per solve: random graphs (at most 10 computed nodes: every solver finishes far within it) and zoo.
RANDOM_LIMIT, ZOO_LIMIT = 5.0, 10.0


def run(quick: bool = False) -> dict[str, Any]:
    rows = random_rows(50 if quick else RANDOM_GRAPHS, RANDOM_LIMIT) + zoo_rows(5.0 if quick else ZOO_LIMIT)
    notes = (f"Each formulation alone gets the limit ({RANDOM_LIMIT:g} s on random graphs, {ZOO_LIMIT:g} s on the zoo "
             f"at batch {ZOO_BATCH}); auto gets the same limit in all. Costs are the one simulator's (validated, within "
             "the budget). auto_missed and auto_worse must be 0. One thread per solve.")
    return {"rows": rows, "notes": notes}


#: The unseen table's 7B-class shapes (the zoo's llama, built on the meta device): Llama-2-7B, and a grouped-query
#: Mistral-7B-like shape (8 key/value heads, MLP 14,336; its sliding window spans the whole 4,096-token sequence).
SHAPES_7B = {
    "llama-2-7b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "intermediate": 11008, "vocab": 32000},
    "mistral-7b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 14336, "vocab": 32000},
}
STEP_7B = {"batch": 1, "seq": 4096, "dtype": "bfloat16"}
UNSEEN_FRACTIONS = {"7b": (0.75, 0.5), "cnn": (0.5, 0.6), "random": (0.7,)}
UNSEEN_LIMITS = {"7b": 60.0, "cnn": 30.0, "random": 30.0}
UNSEEN_CNNS = ("efficientnet_b0", "densenet121")


def unseen_graphs(group: str, random_graphs: int = 9) -> Any:
    """Yield ``(label, graph, capture seconds)`` of one group of the unseen table ("7b", "cnn" or "random"); random
    draws whose min_budget exceeds 0.7 of their peak are passed over (nothing can fit) and counted in the label."""
    import coop
    from coop.runtime.executor import replay_graph

    sys.path.insert(0, str(REPO / "benchmarks"))
    from _unseen_graphs import cnn, published_like

    if group == "7b":
        from coop.zoo import model_from_zoo
        for name, shape in SHAPES_7B.items():
            started = time.perf_counter()
            model, batch, loss_fn = model_from_zoo("llama", {**shape, **STEP_7B}, meta=True)
            graph = coop.capture(model, batch, loss_fn=loss_fn, device="cuda").graph
            yield name, graph, time.perf_counter() - started
    elif group == "cnn":
        for name in UNSEEN_CNNS:
            started = time.perf_counter()
            model, batch = cnn(name)
            graph = replay_graph(coop.capture(model, batch))
            yield name, graph, time.perf_counter() - started
    else:
        seed, kept = 0, 0
        while kept < random_graphs:
            graph = published_like(seed)
            seed += 1
            if min_budget(graph) > 0.7 * baseline_peak(graph):
                print({"passed_over": graph.name, "min_budget/peak": round(min_budget(graph) / baseline_peak(graph),
                                                                            3)}, flush=True)
                continue
            kept += 1
            yield graph.name.removeprefix("random_layered_"), graph, 0.0


def unseen_singles(graph: Any, budget: int) -> list[str]:
    """Every formulation auto can choose on ``graph`` at ``budget``: the baselines (per-layer on repeated blocks) and
    the solver rungs of its ladder (:func:`coop.formulations.ladder.auto.formulation_ladder`)."""
    from coop.formulations import BASELINES
    from coop.formulations.ladder.auto import formulation_ladder, repeated_blocks

    names = [*BASELINES, *(["per-layer"] if repeated_blocks(graph) else [])]
    return names + [name for name in formulation_ladder(graph, budget) if name not in names]


def solve_row(graph: Any, budget: int, name: str, limit: float) -> dict[str, Any]:
    """One solve, one thread: status, wall seconds, validated overhead (None: no schedule within the budget) and, for
    auto, its rungs (formulation, status, wall, share, overhead)."""
    from coop.errors import CoopError
    from coop.formulations import BASELINES, solve
    from coop.schedule import validate

    timed = name not in (*BASELINES, "per-layer")
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = solve(graph, budget, name, **({"time_limit": limit, "threads": 1} if timed else {}))
        except CoopError as exc:
            return {"formulation": name, "status": "refused", "wall_s": round(time.perf_counter() - started, 1),
                    "overhead_pct": None, "note": str(exc)[:160]}
    wall = time.perf_counter() - started
    check = validate(graph, result.schedule, budget) if result.schedule is not None else None
    row = {"formulation": name, "status": result.status, "wall_s": round(wall, 1),
           "overhead_pct": round(100 * check.overhead, 4) if check is not None and check.ok else None}
    if result.rungs:
        row["rungs"] = [[r.formulation, r.status, round(r.wall_s, 1), round(r.limit_s, 1),
                         None if r.overhead is None else round(100 * r.overhead, 4)] for r in result.rungs]
        row["chose"] = result.extra.get("auto")
    return row


def unseen_cells(groups: tuple[str, ...], random_graphs: int = 9, out: Path | None = None) -> list[dict[str, Any]]:
    """The unseen table: one JSON line per solve (to ``out`` and stdout) and one per cell, the cell's verdict: auto
    within 0.5 percentage points of the best single formulation, and a schedule wherever a single found one."""
    stream = out.open("a") if out is not None else None

    def emit(record: dict[str, Any]) -> None:
        import json
        line = json.dumps(record)
        print(line, flush=True)
        if stream is not None:
            stream.write(line + "\n")
            stream.flush()

    cells = []
    for group in groups:
        limit = UNSEEN_LIMITS[group]
        for label, graph, capture_s in unseen_graphs(group, random_graphs):
            for fraction in UNSEEN_FRACTIONS[group]:
                budget = math.ceil(fraction * baseline_peak(graph))
                cell = {"group": group, "graph": label, "nodes": len(graph.nodes), "fraction": fraction,
                        "limit_s": limit, "capture_s": round(capture_s, 1)}
                started = time.perf_counter()
                singles = []
                for name in unseen_singles(graph, budget):
                    singles.append(solve_row(graph, budget, name, limit))
                    emit({**cell, **singles[-1]})
                auto_row = solve_row(graph, budget, "auto", limit)
                emit({**cell, **auto_row})
                found = [r for r in singles if r["overhead_pct"] is not None]
                best = min(found, key=lambda r: r["overhead_pct"], default=None)
                auto_pct = auto_row["overhead_pct"]
                ok = best is None or (auto_pct is not None and auto_pct <= best["overhead_pct"] + 0.5)
                cells.append({**cell, "best_single": best["formulation"] if best else None,
                              "best_pct": best["overhead_pct"] if best else None, "auto_pct": auto_pct,
                              "auto_chose": auto_row.get("chose"), "ok": ok,
                              "cell_wall_s": round(time.perf_counter() - started, 1), "cell": True})
                emit(cells[-1])
    if stream is not None:
        stream.close()
    return cells


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring): the random and zoo rows, ``--time-table`` or ``--unseen``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unseen", help="comma-separated groups of the unseen table: 7b, cnn, random")
    parser.add_argument("--random-graphs", type=int, default=9, help="random graphs in the unseen table")
    parser.add_argument("--out", type=Path, help="append the unseen table's JSON lines to this file")
    parser.add_argument("--time-table", action="store_true", help="wall time against the limit per formulation")
    parser.add_argument("--limits", help=f"comma-separated limits of the time table (default {TIME_LIMITS})")
    parser.add_argument("--formulations", help="comma-separated formulations of the time table (default: all)")
    parser.add_argument("--graphs", type=int, default=RANDOM_GRAPHS, help="random graphs of the default rows")
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve of the default rows")
    args = parser.parse_args(argv)
    if args.unseen:
        unseen_cells(tuple(args.unseen.split(",")), args.random_graphs, args.out)
    elif args.time_table:
        limits = tuple(float(x) for x in args.limits.split(",")) if args.limits else TIME_LIMITS
        time_rows(limits, tuple(args.formulations.split(",")) if args.formulations else TIMED)
    else:
        for row in random_rows(args.graphs, args.time_limit) + zoo_rows(args.time_limit):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
