"""The one rule for random draws (issue 25 item 2): first computations of random ops keep graph.order.

Oracle: hand-written schedules on a hand-built graph, whose step indices are counted by hand.
"""

from __future__ import annotations

from coop.graph import Graph, Node
from coop.schedule import Schedule, Step, draws_out_of_order, ordered_first_computations, validate


def two_draws() -> Graph:
    """x -> a (random) ; x -> b (random) ; a + b -> loss. Order: x, a, b, loss."""
    return Graph(nodes=(
        Node(id=0, name="x", mem=4, cost=0.0, kind="input", recomputable=False),
        Node(id=1, name="a", op="aten.bernoulli.p", inputs=(0,), mem=4, cost=1.0, random=True),
        Node(id=2, name="b", op="aten.bernoulli.p", inputs=(0,), mem=4, cost=1.0, random=True),
        Node(id=3, name="loss", op="aten.add.Tensor", inputs=(1, 2), mem=4, cost=1.0),
    ), outputs=(3,))


def computes(*nodes: int) -> Schedule:
    return Schedule(steps=tuple(Step(op="compute", node=v) for v in nodes))


def test_draws_in_the_graphs_order_pass_and_a_swap_is_refused_at_its_step() -> None:
    graph = two_draws()
    assert graph.random_draws == {1, 2}
    assert draws_out_of_order(graph, computes(1, 2, 3)) is None and validate(graph, computes(1, 2, 3)).ok
    swapped = computes(2, 1, 3)  # x is caller-owned: never computed
    assert draws_out_of_order(graph, swapped) == (0, 2)  # step 0 computes b before a was ever drawn
    assert validate(graph.with_random_replay(), swapped).ok is False
    check = validate(graph, swapped, budget=10**6)
    assert not check.ok and check.step == 0 and "out of graph.order" in check.reason and "\n" not in check.reason


def test_a_later_recomputation_of_a_draw_is_not_a_first_draw() -> None:
    graph = two_draws().with_random_replay()  # recomputable, replayed from its saved generator state
    schedule = Schedule(steps=(*computes(1, 2).steps, Step(op="free", node=1), *computes(1, 3).steps))
    assert validate(graph, schedule).ok
    assert draws_out_of_order(graph, schedule) is None


def test_the_order_a_model_keeps() -> None:
    graph = two_draws()
    assert ordered_first_computations(graph, [0, 1, 2, 3], keep_order=True) == [0, 1, 2, 3]
    assert ordered_first_computations(graph, [0, 1, 2, 3], keep_order=False) == [1, 2]
    assert ordered_first_computations(graph, [3, 2, 0], keep_order=False) == [2]


def test_a_schedule_error_carries_the_index_of_its_step() -> None:
    """Issue 25 item 3: the failing step is a field of ScheduleError, not parsed back from its text."""
    import pytest

    from coop.errors import ScheduleError
    from coop.schedule import simulate

    graph = two_draws()
    freed_twice = Schedule(steps=(*computes(1, 2).steps, Step(op="free", node=2), Step(op="free", node=2)))
    with pytest.raises(ScheduleError) as error:
        simulate(graph, freed_twice)
    assert error.value.step == 3 and validate(graph, freed_twice).step == 3
    with pytest.raises(ScheduleError) as error:  # the schedule as a whole: no step to name
        simulate(graph, computes(1, 2))
    assert error.value.step is None and "never computed" in str(error.value)
