"""The one options contract of the formulations (issue 12): keyword-only options, the same common names
everywhere, and an unknown option refused with one line by every formulation, through coop.formulations.solve."""

from __future__ import annotations

import inspect

import pytest

from coop.errors import CoopError
from coop.formulations import COMMON_OPTIONS, FORMULATIONS, get_formulation, solve
from coop.graph import Graph
from coop.schedule import validate

GRAPH_FORMULATIONS = [name for name in FORMULATIONS if name != "pytorch-mincut"]  # that one needs a capture


def chain() -> Graph:
    """A 4-op training-shaped chain: input -> f1 -> f2 -> loss -> b1, every value 10 bytes."""
    nodes = [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0, "recomputable": False},
        {"id": 1, "name": "f1", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "f2", "inputs": [1], "mem": 10, "cost": 1},
        {"id": 3, "name": "loss", "inputs": [2], "mem": 10, "cost": 1},
        {"id": 4, "name": "b1", "inputs": [3, 1], "mem": 10, "cost": 1, "kind": "backward"},
    ]
    return Graph(name="chain", nodes=nodes, outputs=(3, 4))


@pytest.mark.parametrize("name", list(FORMULATIONS))
def test_every_formulation_takes_only_keyword_options(name: str) -> None:
    parameters = list(inspect.signature(get_formulation(name)).parameters.values())
    assert [p.name for p in parameters[:2]] == ["graph", "budget"], name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:]), name  # no **options swallowing


@pytest.mark.parametrize("name", GRAPH_FORMULATIONS)
def test_an_unknown_option_is_refused_with_one_line_naming_it(name: str) -> None:
    with pytest.raises(CoopError) as caught:
        solve(chain(), 10**6, name, time_limt=5)  # a typo of time_limit
    message = str(caught.value)
    assert "\n" not in message and "'time_limt'" in message and name in message and "time_limit" in message


@pytest.mark.parametrize("name", GRAPH_FORMULATIONS)
def test_every_formulation_accepts_the_common_options(name: str) -> None:
    graph = chain()
    result = solve(graph, 10**6, name, time_limit=5, threads=1, progress=None, hint=None, captured=None)
    assert result.schedule is not None, (name, result.status, result.message)
    assert validate(graph, result.schedule, 10**6).ok, name
    assert COMMON_OPTIONS == {"time_limit", "threads", "progress", "hint", "captured"}
