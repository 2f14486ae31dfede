"""The one warm-start collector (coop.formulations.heuristics.warm_start.WarmStarts): what it keeps and how it ranks,
against hand-counted peaks and costs."""

from __future__ import annotations

from coop.errors import ScheduleError
from coop.formulations.heuristics.warm_start import WarmStarts
from coop.graph import Graph
from coop.schedule import Schedule, Step

X, A, R1, R2, B, C = 0, 1, 2, 3, 4, 5


def two_draws() -> Graph:
    """x (1 B, the batch) -> a (10 B); two random draws r1, r2 (1 B each, in this order); b (10 B) reads a, r1,
    r2; c (5 B) reads x. Outputs b and c. Every op costs 1."""
    nodes = [
        {"id": X, "name": "x", "kind": "input", "mem": 1, "cost": 0, "recomputable": False},
        {"id": A, "name": "a", "inputs": [X], "mem": 10, "cost": 1},
        {"id": R1, "name": "r1", "inputs": [], "mem": 1, "cost": 1, "recomputable": False, "random": True},
        {"id": R2, "name": "r2", "inputs": [], "mem": 1, "cost": 1, "recomputable": False, "random": True},
        {"id": B, "name": "b", "inputs": [A, R1, R2], "mem": 10, "cost": 1},
        {"id": C, "name": "c", "inputs": [X], "mem": 5, "cost": 1},
    ]
    return Graph.model_validate({"name": "two_draws", "nodes": nodes, "outputs": [B, C], "order": [A, R1, R2, B, C]})


def computes(*nodes: int) -> Schedule:
    return Schedule.from_order(nodes)


#: At b's step x, a, r1, r2 and b are resident: 1 + 10 + 1 + 1 + 10 = 23 B, the peak of the captured order.
BUDGET = 23
STORE_ALL = computes(A, R1, R2, B, C)                                       # cost 5, peak 23
RECOMPUTING = Schedule(steps=(Step(op="compute", node=A), Step(op="free", node=A), *computes(R1, R2, A, B, C).steps))
OVER = computes(C, A, R1, R2, B)                                            # c held at b's step: 28 B
OUT_OF_ORDER = computes(A, R2, R1, B, C)                                     # r2 drawn before r1
ILLEGAL = computes(B, A, R1, R2, C)                                          # b before what it reads


def offered(collector: WarmStarts) -> WarmStarts:
    for name, schedule in [("illegal", ILLEGAL), ("over", OVER), ("out of order", OUT_OF_ORDER),
                           ("recomputing", RECOMPUTING), ("store-all", STORE_ALL), ("nothing", None)]:
        collector.offer(name, schedule)
    return collector


def test_it_keeps_the_legal_fitting_in_order_candidates_and_ranks_by_cost() -> None:
    collector = offered(WarmStarts(two_draws(), BUDGET))
    assert [(name, sim.peak, sim.cost) for name, _, sim in collector.found] == [("recomputing", 23, 6.0),
                                                                               ("store-all", 23, 5.0)]
    assert collector.best()[0] == "store-all"


def test_the_hooks_change_what_is_kept_and_how_it_is_ranked() -> None:
    costliest = offered(WarmStarts(two_draws(), BUDGET, key=lambda candidate: -candidate[2].cost))
    assert costliest.best()[0] == "recomputing"
    once = offered(WarmStarts(two_draws(), BUDGET, accept=lambda schedule, sim: sim.recomputations == 0))
    assert [name for name, _, _ in once.found] == ["store-all"]

    def refuse_c_first(schedule: Schedule) -> Schedule:
        if schedule.steps[0].node == C:
            raise ScheduleError("c first")
        return schedule

    roomy = offered(WarmStarts(two_draws(), 28, prepare=refuse_c_first))
    assert "over" not in [name for name, _, _ in roomy.found]  # it fits 28 B, but prepare dropped it
