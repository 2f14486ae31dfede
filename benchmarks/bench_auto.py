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


if __name__ == "__main__":
    if "--time-table" in sys.argv:
        limits = tuple(float(x) for x in sys.argv[sys.argv.index("--limits") + 1].split(",")) if "--limits" in \
            sys.argv else TIME_LIMITS
        names = tuple(sys.argv[sys.argv.index("--formulations") + 1].split(",")) if "--formulations" in sys.argv \
            else TIMED
        time_rows(limits, names)
        sys.exit(0)
    graphs = int(sys.argv[sys.argv.index("--graphs") + 1]) if "--graphs" in sys.argv else RANDOM_GRAPHS
    limit = float(sys.argv[sys.argv.index("--time-limit") + 1]) if "--time-limit" in sys.argv else 10.0
    for row in random_rows(graphs, limit) + zoo_rows(limit):
        print(row, flush=True)
