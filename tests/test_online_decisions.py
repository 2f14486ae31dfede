"""The online engine's extension points (issue 44, item 4): the walk calls its composed ``decisions`` where
OnlineSimulator's docstring says, and the DELTA engines compose their decisions instead of forwarding hooks.

The oracle is the walk as the docstring writes it: ``before_step`` once per program step, in order; for every
compute (first or recomputation) ``decisions.on_run(node)`` right before the engine's ``run_node(node)``; one
``decisions.evict`` per eviction; ``decisions.finish`` once, last.
"""

from __future__ import annotations

import inspect

from coop.online.delta_sim import DeltaSimulator
from coop.online.online_result import run_engine
from coop.online.online_sim import Decisions, OnlineSimulator, simulate_online
from coop.online.policies import make_policy
from tests.test_online_walk import BIG, UNIT, residual_chain

#: The hooks a Decisions object answers (its public methods).
HOOKS = {name for name, _ in inspect.getmembers(Decisions, inspect.isfunction) if not name.startswith("_")}


class Recording(Decisions):
    """The plain decisions, each call written to the engine's log."""

    def before_step(self, position: int) -> None:
        self.engine.log.append(("before_step", position))

    def on_run(self, node: int) -> None:
        self.engine.log.append(("on_run", node))

    def evict(self, key: int) -> None:
        self.engine.log.append(("evict", key))
        super().evict(key)

    def finish(self) -> None:
        self.engine.log.append(("finish", None))


class RecordingEngine(OnlineSimulator):
    """A plain engine whose op runs are logged beside its decisions' calls."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.log: list[tuple[str, int | None]] = []
        self.decisions = Recording(self)

    def run_node(self, node: int) -> None:
        self.log.append(("run_node", node))


def test_the_walk_calls_its_decisions_where_the_docstring_says() -> None:
    graph, _ = residual_chain()
    budget = UNIT + BIG + 10 + UNIT - 1  # x_K is evicted once and its chain recomputed (tests/test_online_walk.py)
    engine = RecordingEngine(graph, budget, make_policy("dtr"), 10.0, compact=True)
    result = run_engine(engine)
    assert result.status == "ok" and result.evictions >= 1 and result.recomputations >= 1
    log = engine.log
    assert [p for hook, p in log if hook == "before_step"] == list(range(len(engine.order)))
    runs = [(hook, node) for hook, node in log if hook in ("on_run", "run_node")]
    assert runs == [(hook, node) for node in engine.executed for hook in ("on_run", "run_node")]
    assert sum(hook == "evict" for hook, _ in log) == result.evictions
    assert log[-1] == ("finish", None) and sum(hook == "finish" for hook, _ in log) == 1
    # Composing the plain decisions changes nothing: the same schedule as the engine with its default decisions.
    plain = simulate_online(graph, budget, "dtr", compact=True)
    assert result.schedule == plain.schedule and result.evictions == plain.evictions


def test_the_delta_engines_compose_their_decisions_with_one_parent_each() -> None:
    from coop.runtime.fallback import DeltaStep, DynamicStep  # lazy: torch only for this test

    for engine, parent in ((DeltaSimulator, OnlineSimulator), (DeltaStep, DynamicStep), (DynamicStep, OnlineSimulator)):
        assert engine.__bases__ == (parent,)
        forwarded = HOOKS & set(vars(engine))
        assert forwarded == set(), f"{engine.__name__} overrides decision hooks {sorted(forwarded)}"
