"""The simulator and validator against contract 2, recounted independently from the contract text."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.errors import GraphError, ScheduleError
from coop.graph import Graph
from coop.schedule import Schedule, Step, load_schedule, prompt_order, schedule_to_json, simulate, validate
from tests.strategies import random_graphs, random_schedules
from tests.tiers import check, examples

#: 150 examples each in the slow tier; the fast tier draws 50 of the costlier properties (tests/tiers.py)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -------------------------------------------------------------------- brute-force recount
def _impl_fields(graph: Graph, step: Step) -> tuple[int, int]:
    """(output memory, workspace) of a compute step, honouring its impl."""
    node = graph.node(step.node)
    if step.impl is None:
        return node.mem, node.workspace
    impl = next(i for i in node.impls if i.name == step.impl)
    return impl.mem, impl.workspace


def brute_force_memory(graph: Graph, schedule: Schedule) -> list[int]:
    """Memory at every step, counted naively from contract 2's words.

    An instance is born at its compute; it is alive through its last read, or up to (not incl.)
    its explicit free, or to the end when it is the final instance of a graph output. A read
    reads the most recent instance. An extra output (``output_of``) is born right after its op's
    first compute and its own compute reads nothing. Caller-owned values are always alive. A value counts only
    while on the device: the latest page_out/page_in/compute/free event of its node at or before
    the step must not be a page_out. The computed node's workspace counts at its own step.
    """
    steps = schedule.steps
    instances: list[dict[str, Any]] = []
    current: dict[int, int] = {}
    first_compute: dict[int, int] = {}
    for j, step in enumerate(steps):
        if step.op == "compute":
            node = graph.node(step.node)
            for source in node.inputs if node.output_of is None else ():
                if source in current:
                    instances[current[source]]["reads"].append(j)
            mem, _ = _impl_fields(graph, step)
            current[step.node] = len(instances)
            start = j if node.output_of is None else first_compute[node.output_of] + 1
            instances.append({"node": step.node, "start": start, "taken": j, "mem": mem, "reads": [], "free": None})
            first_compute.setdefault(step.node, j)
        elif step.op == "free":
            instances[current.pop(step.node)]["free"] = j
    final = set(current.values())

    def alive(k: int, j: int) -> bool:
        inst = instances[k]
        if j < inst["start"]:
            return False
        if inst["free"] is not None:
            return j < inst["free"]
        if inst["node"] in graph.outputs and k in final:
            return True
        return j <= max([inst["taken"], *inst["reads"]])

    def on_device(node_id: int, j: int) -> bool:
        for i in range(j, -1, -1):
            if steps[i].node == node_id:
                return steps[i].op != "page_out"
        return True

    memory = []
    for j, step in enumerate(steps):
        total = sum(graph.node(v).mem for v in graph.caller_owned_ids if on_device(v, j))
        total += sum(inst["mem"] for k, inst in enumerate(instances) if alive(k, j) and on_device(inst["node"], j))
        if step.op == "compute":
            total += _impl_fields(graph, step)[1]
        memory.append(total)
    return memory


def _simulator_matches_brute_force_recount(data: st.DataObject) -> None:
    graph = data.draw(random_graphs(with_impls=data.draw(st.booleans())))
    schedule = data.draw(random_schedules(graph))
    sim = simulate(graph, schedule)
    expected = brute_force_memory(graph, schedule)
    assert sim.memory == expected
    assert sim.peak == (max(expected) if expected else graph.caller_owned_bytes)
    assert validate(graph, schedule).ok


@examples(50, 150)
def test_simulator_matches_brute_force_recount(examples: int) -> None:
    check(_simulator_matches_brute_force_recount, examples, PROPERTY, data=st.data())


def _device_intervals_and_workspace_add_up_to_the_memory(data: st.DataObject) -> None:
    """What the simulator exposes for address placement: each value's stays on the device and each
    step's workspace; summed per step they are its memory, and a value is off the device inside its
    lifetime only while paged out."""
    graph = data.draw(random_graphs(with_impls=data.draw(st.booleans())))
    schedule = data.draw(random_schedules(graph))
    sim = simulate(graph, schedule)
    steps = schedule.steps
    recount = list(sim.workspace)
    assert recount == [_impl_fields(graph, s)[1] if s.op == "compute" else 0 for s in steps]
    blocks = [(graph.node(v).mem, intervals) for v, intervals in sim.owned_device.items()]
    assert set(sim.owned_device) == set(graph.caller_owned_ids)
    blocks += [(instance.mem, instance.device) for instance in sim.instances]
    for mem, intervals in blocks:
        assert all(first <= last for first, last in intervals)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(intervals))  # disjoint, in order
        for first, last in intervals:
            for j in range(first, min(last, len(steps) - 1) + 1):
                recount[j] += mem
    assert recount == sim.memory
    for instance in sim.instances:
        on = {j for first, last in instance.device for j in range(first, last + 1)}
        assert on <= set(range(instance.start, instance.end + 1))
        for j in set(range(instance.start, instance.end + 1)) - on:  # off the device: its latest event is a page_out
            latest = next(steps[i] for i in range(j, -1, -1) if steps[i].node == instance.node)
            assert latest.op == "page_out"


@examples(50, 150)
def test_device_intervals_and_workspace_add_up_to_the_memory(examples: int) -> None:
    check(_device_intervals_and_workspace_add_up_to_the_memory, examples, PROPERTY, data=st.data())


def _simulator_cost_counts_every_compute(data: st.DataObject) -> None:
    graph = data.draw(random_graphs(with_impls=True))
    schedule = data.draw(random_schedules(graph))
    expected = 0.0
    for step in schedule.steps:
        if step.op == "compute":
            node = graph.node(step.node)
            expected += node.cost if step.impl is None else next(i.cost for i in node.impls if i.name == step.impl)
    computes = [s.node for s in schedule.steps if s.op == "compute"]
    sim = simulate(graph, schedule)
    assert sim.cost == pytest.approx(expected)
    assert sim.recomputations == len(computes) - len(set(computes))


@examples(50, 150)
def test_simulator_cost_counts_every_compute(examples: int) -> None:
    check(_simulator_cost_counts_every_compute, examples, PROPERTY, data=st.data())


@PROPERTY
@given(st.data())
def test_freeing_an_input_just_before_its_reader_is_rejected_at_that_step(data: st.DataObject) -> None:
    graph = data.draw(random_graphs())
    schedule = data.draw(random_schedules(graph, page_caller_owned=False))
    reads = [
        (j, source)
        for j, step in enumerate(schedule.steps)
        if step.op == "compute" and graph.node(step.node).output_of is None  # an extra output reads nothing
        for source in graph.node(step.node).inputs
        if not graph.node(source).caller_owned
    ]
    if not reads:
        return
    j, source = data.draw(st.sampled_from(reads))
    broken = Schedule(steps=(*schedule.steps[:j], Step(op="free", node=source), *schedule.steps[j:]))
    verdict = validate(graph, broken)
    assert not verdict.ok
    assert verdict.step == j + 1
    assert f"input {source}" in verdict.reason and "\n" not in verdict.reason


def _schedule_json_round_trip(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    graph = data.draw(random_graphs(with_impls=True))
    schedule = data.draw(random_schedules(graph))
    document = schedule_to_json(graph, schedule, budget=123, formulation="test")
    path = tmp_path_factory.mktemp("schedule") / "s.json"
    path.write_text(json.dumps(document))
    loaded, loaded_document = load_schedule(path)
    assert loaded == schedule
    assert loaded_document["graph"]["sha256"] == graph.sha256
    assert loaded_document["predicted"]["peak"] == simulate(graph, schedule).peak


@examples(50, 150)
def test_schedule_json_round_trip(tmp_path_factory: pytest.TempPathFactory, examples: int) -> None:
    def round_trip(data: st.DataObject) -> None:
        _schedule_json_round_trip(tmp_path_factory, data)

    check(round_trip, examples, PROPERTY, data=st.data())


# -------------------------------------------------------------------- illegal schedules
@pytest.fixture
def tiny() -> Graph:
    """x (input) -> a -> b -> c (output); b has two implementations; d is a side node."""
    return Graph.model_validate(
        {
            "name": "tiny",
            "nodes": [
                {"id": 10, "name": "x", "mem": 4, "cost": 0, "kind": "input"},
                {"id": 1, "name": "a", "mem": 2, "cost": 1, "inputs": [10]},
                {"id": 2, "name": "b", "mem": 3, "cost": 1, "inputs": [1],
                 "impls": [{"name": "inplace", "cost": 1, "mem": 0}]},
                {"id": 3, "name": "c", "mem": 1, "cost": 1, "inputs": [2], "kind": "backward"},
                {"id": 4, "name": "d", "mem": 1, "cost": 1, "inputs": [1]},
            ],
            "outputs": [3],
        }
    )


def _steps(*pairs: tuple[str, int] | tuple[str, int, str]) -> Schedule:
    return Schedule(steps=tuple(Step(op=p[0], node=p[1], impl=p[2] if len(p) > 2 else None) for p in pairs))


ILLEGAL = {
    "reads a freed value": (_steps(("compute", 1), ("free", 1), ("compute", 2)), 2, "input 1"),
    "reads a paged-out value": (_steps(("compute", 1), ("page_out", 1), ("compute", 2)), 2, "paged out"),
    "computes a caller-owned node": (_steps(("compute", 10),), 0, "caller-owned"),
    "frees a caller-owned node": (_steps(("compute", 1), ("free", 10)), 1, "caller-owned"),
    "unknown node": (_steps(("compute", 1), ("compute", 99)), 1, "99"),
    "bad impl": (_steps(("compute", 1), ("compute", 2, "winograd")), 1, "winograd"),
    "frees a value that is not resident": (_steps(("compute", 1), ("free", 2)), 1, "not resident"),
    "pages in a value that is not paged out": (_steps(("compute", 1), ("page_in", 1)), 1, "not paged out"),
    "never computes a node": (_steps(("compute", 1), ("compute", 2), ("compute", 3)), None, "node 4"),
    "output freed at the end": (
        _steps(("compute", 1), ("compute", 4), ("compute", 2), ("compute", 3), ("free", 3)), None, "output 3"),
    "output paged out at the end": (
        _steps(("compute", 1), ("compute", 4), ("compute", 2), ("compute", 3), ("page_out", 3)), None, "output 3"),
}


@pytest.mark.parametrize("case", sorted(ILLEGAL))
def test_validate_rejects_illegal_schedules(tiny: Graph, case: str) -> None:
    schedule, step, fragment = ILLEGAL[case]
    verdict = validate(tiny, schedule)
    assert not verdict.ok
    assert verdict.step == step
    assert fragment in verdict.reason
    assert "\n" not in verdict.reason
    if step is not None:
        assert verdict.reason.startswith(f"step {step} ")
    with pytest.raises(ScheduleError):
        simulate(tiny, schedule)


def test_validate_accepts_impls_paging_and_reports_budget_overrun(tiny: Graph) -> None:
    schedule = _steps(("compute", 1), ("compute", 4), ("page_out", 10), ("compute", 2, "inplace"),
                      ("page_in", 10), ("compute", 3))
    sim = simulate(tiny, schedule)
    # a(2)+x(4) | a+d+x | a (x and d gone: page_out step, d read only at 1) | a+b(0, inplace) | x+b | x+b+c
    assert sim.memory == [6, 7, 2, 2, 4, 5]
    assert sim.workspace == [0] * 6
    assert sim.owned_device == {10: ((0, 1), (4, 5))}  # x is on the host from its page_out to its page_in
    assert [(i.node, i.device) for i in sim.instances] == [(1, ((0, 3),)), (4, ((1, 1),)), (2, ((3, 5),)),
                                                            (3, ((5, 5),))]
    accepted = validate(tiny, schedule, budget=7)
    assert accepted.ok and accepted.simulation.memory == [6, 7, 2, 2, 4, 5]  # handed on to whoever replays it
    verdict = validate(tiny, schedule, budget=6)
    assert not verdict.ok and verdict.step == 1 and "exceeds the budget 6" in verdict.reason


# -------------------------------------------------------------------- extra outputs of multi-output ops
@pytest.fixture
def with_extra() -> Graph:
    """x -> op (mem 10, its extra output e of 4 bytes in its workspace) -> a -> b, and b reads e."""
    return Graph.model_validate({"name": "extra", "nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 1, "cost": 0},
        {"id": 1, "name": "op", "inputs": [0], "mem": 10, "cost": 1, "workspace": 4},
        {"id": 2, "name": "e", "inputs": [1], "mem": 4, "cost": 0, "output_of": 1, "recomputable": False},
        {"id": 3, "name": "a", "inputs": [1], "mem": 2, "cost": 1},
        {"id": 4, "name": "b", "inputs": [3, 2], "mem": 3, "cost": 1},
    ], "outputs": [4]})


def test_an_extra_output_counts_from_its_ops_first_compute_whenever_it_is_taken(with_extra: Graph) -> None:
    prompt = simulate(with_extra, Schedule.from_order([1, 2, 3, 4]))
    late = simulate(with_extra, Schedule.from_order([1, 3, 2, 4]))
    # op's step: x + op + workspace (e inside); then e is resident although taken only at step 2.
    assert late.memory == [1 + 10 + 4, 1 + 10 + 4 + 2, 1 + 4 + 2, 1 + 4 + 2 + 3]
    assert late.peak == prompt.peak == 17
    assert prompt_order(with_extra) == (1, 2, 3, 4)


def test_an_extra_output_does_not_read_its_op_and_needs_it_to_have_run(with_extra: Graph) -> None:
    # op is freed before e is taken: legal, e was produced by op's compute.
    steps = _steps(("compute", 1), ("compute", 3), ("free", 1), ("compute", 2), ("compute", 4))
    assert validate(with_extra, steps).ok
    verdict = validate(with_extra, Schedule.from_order([2, 1, 3, 4]))
    assert not verdict.ok and "extra output of node 1" in verdict.reason and verdict.step == 0
    recompute_extra = _steps(("compute", 1), ("compute", 2), ("compute", 2), ("compute", 3), ("compute", 4))
    assert "not recomputable" in validate(with_extra, recompute_extra).reason


@pytest.mark.parametrize(("change", "message"), [
    ({"inputs": [0]}, "its inputs must be exactly [1]"),
    ({"recomputable": True}, "recomputable false"),
    ({"mem": 5}, "workspace 4 is less than its extra outputs' 5 bytes"),
])
def test_malformed_extra_outputs_are_named(with_extra: Graph, change: dict[str, Any], message: str) -> None:
    data = with_extra.to_dict()
    data["nodes"][2].update(change)
    with pytest.raises(GraphError, match=re.escape(message)):
        Graph.model_validate(data)
