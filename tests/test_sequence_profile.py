"""The local search's compute-sequence profile against the simulator and contract 2's brute-force recount."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from coop.errors import ScheduleError
from coop.formulations.heuristics.sequence_profile import SequenceTables, sequence_cost, sequence_profile
from coop.formulations.intervals.slots import SlotProblem
from coop.graph import Graph
from coop.schedule import Schedule, simulate
from tests.strategies import random_graphs, random_schedules
from tests.test_schedule import brute_force_memory
from tests.tiers import check, examples

#: 200 examples in the slow tier, 60 in the fast one (tests/tiers.py)
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _the_profile_of_a_compute_sequence_is_the_simulators(data: st.DataObject) -> None:
    graph = data.draw(random_graphs())
    schedule = data.draw(random_schedules(graph))
    sequence = [step.node for step in schedule.steps if step.op == "compute"]  # recomputations included
    as_scheduled = Schedule.from_order(sequence)
    sim = simulate(graph, as_scheduled)
    tables = SequenceTables.build(SlotProblem.build(graph, sim.peak))
    profile = sequence_profile(tables, sequence)
    assert profile.memory == sim.memory == brute_force_memory(graph, as_scheduled)
    assert (profile.peak, profile.peak_step) == (sim.peak, sim.peak_step)
    assert [(sequence[k], profile.start[k], profile.end[k]) for k in range(len(sequence))] == [
        (instance.node, instance.start, instance.end) for instance in sim.instances]
    assert sequence_cost(tables, sequence) == pytest.approx(sim.cost)


@examples(60, 200)
def test_the_profile_of_a_compute_sequence_is_the_simulators(examples: int) -> None:
    check(_the_profile_of_a_compute_sequence_is_the_simulators, examples, PROPERTY, data=st.data())


def _chain() -> Graph:
    """x (caller-owned, 100 B) -> a (10 B) -> b (20 B, workspace 5) -> c (30 B, the output)."""
    return Graph.model_validate({"nodes": [
        {"id": 0, "name": "x", "kind": "input", "mem": 100, "cost": 0.0},
        {"id": 1, "name": "a", "inputs": [0], "mem": 10, "cost": 1.0},
        {"id": 2, "name": "b", "inputs": [1], "mem": 20, "cost": 2.0, "workspace": 5},
        {"id": 3, "name": "c", "inputs": [1, 2], "mem": 30, "cost": 3.0},
    ], "outputs": [3]})


def test_hand_counted_bytes_of_a_recomputation() -> None:
    graph = _chain()
    tables = SequenceTables.build(SlotProblem.build(graph, 1000))
    # recompute a before c: the first a dies at its read by b, the second lives until c reads it.
    profile = sequence_profile(tables, [1, 2, 1, 3])
    assert profile.memory == [100 + 10, 100 + 10 + 20 + 5, 100 + 20 + 10, 100 + 20 + 10 + 30]
    assert profile.peak == 160 and profile.peak_step == 3
    assert sequence_cost(tables, [1, 2, 1, 3]) == 7.0


def test_a_read_before_any_compute_is_refused_with_its_step() -> None:
    tables = SequenceTables.build(SlotProblem.build(_chain(), 1000))
    with pytest.raises(ScheduleError, match=r"step 0 \(compute %2\): input 1 is not resident") as caught:
        sequence_profile(tables, [2, 1, 3])
    assert caught.value.step == 0
