"""Late outputs (coop.formulations.heuristics.late_outputs): schedules near the floor where no baseline fits.

The oracles are independent of coop's simulator: a stem-shaped graph whose bytes are counted by hand and whose
least peak the brute-force search of tests/bruteforce.py confirms, and a memory counter written here from
contract 2 (coop.schedule's docstring) that re-checks every schedule the heuristic returns on random graphs.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.budget import min_budget
from coop.formulations import BASELINES, solve
from coop.formulations.heuristics.baselines import checkpoint_all
from coop.formulations.heuristics.late_outputs import late_outputs_schedule, movable_outputs, near_floor_schedule
from coop.graph import Graph, Node
from coop.schedule import Schedule, validate
from tests.bruteforce import least_peak
from tests.strategies import random_graphs

OWNED_KINDS = ("input", "param", "buffer")


def stem_graph() -> Graph:
    """A network's stem and head as a training step (ResNet's shape at issue 41, in small numbers).

    Forward: ``c = conv(x, w)`` (8), ``r = relu(c)`` (8), ``p = pool(r)`` (2), ``loss = sum(p)`` (1). Backward:
    ``g = ones()`` (1), ``gp = expand(g)`` (2), ``gh = mm(gp, p)`` (3, an output: the head's weight gradient, read
    by nothing), ``gr = unpool(gp, r)`` (8), ``gc = relu_backward(gr, c)`` (8), ``gw = conv_backward(gc, x)`` (1, an
    output). Caller-owned: x (4) and w (1).

    By hand: ``gc``'s step holds x + w + c + gr + gc = 5 + 24 = 29 (min_budget). Computing ``gh`` in the backward's
    order leaves it resident at that step: 32 in every baseline. Computed last, from ``gp`` and ``p`` rebuilt
    from x and w, its step holds x + w + gw + gp + p + gh = 5 + 1 + 2 + 2 + 3 = 13, and rebuilding ``p`` holds at
    most x + w + gw + c + r = 22 (c and r rebuilt on the way, freed at their last read).
    """
    def node(i: int, name: str, kind: str, inputs: tuple[int, ...], mem: int, cost: float = 1.0) -> Node:
        return Node(id=i, name=name, kind=kind, inputs=inputs, mem=mem, cost=0.0 if kind in OWNED_KINDS else cost)

    nodes = [
        node(0, "x", "input", (), 4), node(1, "w", "param", (), 1),
        node(2, "c", "forward", (0, 1), 8), node(3, "r", "forward", (2,), 8), node(4, "p", "forward", (3,), 2),
        node(5, "loss", "forward", (4,), 1),
        node(6, "g", "backward", (), 1), node(7, "gp", "backward", (6,), 2), node(8, "gh", "backward", (7, 4), 3),
        node(9, "gr", "backward", (7, 3), 8), node(10, "gc", "backward", (9, 2), 8),
        node(11, "gw", "backward", (10, 0), 1),
    ]
    return Graph(name="stem", nodes=nodes, outputs=(5, 8, 11))


def pinned_graph() -> Graph:
    """:func:`stem_graph` with the head's backward one op: ``hb = head_backward(gp, p)`` (2, the gradient passed
    on, its workspace 3 covering its extra output) whose extra output is the weight gradient ``gh`` (3, an output),
    as a convolution backward's.

    By hand: ``gh`` exists from ``hb``'s first compute, cannot be recomputed and must be resident at the end, so it
    is resident at ``gc``'s step, which depends on ``hb``: 29 + 3 = 32.
    """
    graph = stem_graph()
    nodes = {node.id: node for node in graph.nodes}
    nodes[8] = Node(id=8, name="gh", kind="backward", inputs=(12,), mem=3, cost=0.0, recomputable=False,
                    output_of=12)
    nodes[12] = Node(id=12, name="hb", kind="backward", inputs=(7, 4), mem=2, cost=1.0, workspace=3)
    nodes[9] = Node(id=9, name="gr", kind="backward", inputs=(12, 3), mem=8, cost=1.0)
    order = (2, 3, 4, 5, 6, 7, 12, 8, 9, 10, 11)
    return Graph(name="pinned", nodes=[nodes[i] for i in (0, 1, *order)], outputs=(5, 8, 11), order=order)


def test_min_budget_counts_an_output_that_cannot_come_back() -> None:
    graph = pinned_graph()
    assert min_budget(graph) == 32 == least_peak(graph)  # by hand, and by the brute force over every schedule
    assert min_budget(graph, paging=True) < 32  # paging may move it to the host
    result = solve(graph, 31, "auto", time_limit=5.0)
    assert result.status == "infeasible" and result.schedule is None  # at once: no solver searches below it


def counted_peak(graph: Graph, schedule: Schedule) -> int:
    """The peak by contract 2, counted here: caller-owned values always; an instance from its compute to its
    free, else to its last read (a recompute of its node starts another), else (an output's last instance) to the
    end; an extra output from the step after its op's first compute (its own step reads nothing); the step's
    workspace."""
    steps = schedule.steps
    owned = sum(n.mem for n in graph.nodes if n.kind in OWNED_KINDS)
    spans: list[list[int]] = []  # [node, start, end]
    current: dict[int, int] = {}
    first: dict[int, int] = {}
    for j, step in enumerate(steps):
        if step.op == "free":
            spans[current.pop(step.node)][2] = j - 1
            continue
        node = graph.node(step.node)
        for source in node.inputs if node.output_of is None else ():  # an extra output's step reads nothing
            if source in current:
                spans[current[source]][2] = max(spans[current[source]][2], j)
        current.pop(step.node, None)  # an earlier instance ends at its last read
        first.setdefault(step.node, j)
        current[step.node] = len(spans)  # an extra output exists from its op's first compute on
        spans.append([step.node, j if node.output_of is None else first[node.output_of] + 1, j])
    for node_id, k in current.items():
        if node_id in graph.outputs:
            spans[k][2] = len(steps) - 1
    memory = [owned + (graph.node(s.node).workspace if s.op == "compute" else 0) for s in steps]
    for node_id, start, end in spans:
        for j in range(start, end + 1):
            memory[j] += graph.node(node_id).mem
    return max(memory)


def test_stem_fits_one_byte_above_the_floor_where_no_baseline_does() -> None:
    graph = stem_graph()
    budget = 29
    assert min_budget(graph) == 29 and least_peak(graph) == 29  # the brute force: the floor is reached
    for name in BASELINES:
        assert solve(graph, budget, name).simulation.peak >= 32, name  # type: ignore[union-attr]
    assert movable_outputs(graph) == {5, 8, 11}
    found = near_floor_schedule(graph, budget)
    assert found is not None
    schedule, simulation = found
    assert validate(graph, schedule, budget).ok
    assert simulation.peak == counted_peak(graph, schedule) == 29
    computes = [graph.node(s.node).name for s in schedule.steps if s.op == "compute"]
    assert computes[-1] == "gh" and computes.count("gh") == 1  # computed last, once: nothing read it before


def test_auto_returns_a_schedule_near_the_floor() -> None:
    graph = stem_graph()
    result = solve(graph, 29, "auto", time_limit=5.0)
    assert result.schedule is not None and validate(graph, result.schedule, 29).ok
    assert counted_peak(graph, result.schedule) <= 29
    assert "late-outputs" in result.extra["auto_tried"]


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.data())
def test_every_late_outputs_schedule_is_legal_and_within_the_budget(data: st.DataObject) -> None:
    """Budgets below checkpoint-all's own peak (where it needs a rewrite, about one example in ten finds one): every
    schedule returned validates, fits, and its peak counted here by contract 2 is the simulator's."""
    graph = data.draw(random_graphs(max_nodes=10))
    base = checkpoint_all(graph, 0).schedule
    assert base is not None
    top = counted_peak(graph, base)
    if top <= min_budget(graph):
        return
    budget = data.draw(st.integers(min_budget(graph), top - 1))
    found = late_outputs_schedule(graph, budget, base)
    if found is None:
        return
    schedule, simulation = found
    assert validate(graph, schedule, budget).ok
    assert simulation.peak <= budget and counted_peak(graph, schedule) == simulation.peak
    assert schedule.steps != base.steps  # below checkpoint-all's peak: rewritten
