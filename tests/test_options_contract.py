"""The one options contract of the formulations (issue 12): keyword-only options, the same common names
everywhere, and an unknown option refused with one line by every formulation, through coop.formulations.solve."""

from __future__ import annotations

import inspect

import pytest

from coop.budget import below_min_budget, min_budget
from coop.errors import CoopError
from coop.formulations import COMMON_OPTIONS, FORMULATIONS, get_formulation, registered, solve
from coop.graph import Graph
from coop.schedule import Schedule, validate

GRAPH_FORMULATIONS = [name for name in FORMULATIONS if name != "pytorch-mincut"]  # that one needs a capture
#: Those that schedule chain(): per-layer refuses a graph without repeated layers (tests/test_per_layer.py runs the
#: common options on a graph of three layers).
CHAIN_FORMULATIONS = [name for name in GRAPH_FORMULATIONS if name != "per-layer"]


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


@pytest.mark.parametrize("name", CHAIN_FORMULATIONS)
def test_every_formulation_accepts_the_common_options(name: str) -> None:
    graph = chain()
    result = solve(graph, 10**6, name, time_limit=5, threads=1, progress=None, hint=None, captured=None)
    assert result.schedule is not None, (name, result.status, result.message)
    assert validate(graph, result.schedule, 10**6).ok, name
    assert COMMON_OPTIONS == {"time_limit", "threads", "progress", "hint", "captured", "deadline"}


@pytest.mark.parametrize("name", list(FORMULATIONS))
def test_the_typed_options_declare_exactly_what_the_function_takes(name: str) -> None:
    """The options type is the contract callers read; the function's signature is the second source."""
    parameters = list(inspect.signature(get_formulation(name)).parameters.values())[2:]
    assert registered(name).options.taken() == {p.name for p in parameters}, name
    own = registered(name).options.own_options()
    assert {p.name for p in parameters if p.name not in COMMON_OPTIONS} == own, name


def test_options_of_the_wrong_solver_are_refused_before_any_solving() -> None:
    with pytest.raises(CoopError, match="formulation 'checkmate' has no option 'max_intervals'"):
        solve(chain(), 10**6, "checkmate", max_intervals=3)


SOLVERS = ["checkmate", "checkmate-lp", "moccasin", "monet", "poet", "auto"]


@pytest.mark.parametrize("name", SOLVERS)
def test_a_budget_below_min_budget_is_answered_by_the_one_entry_check(name: str) -> None:
    """Hand-counted: the chain's least budget is the step of b1, which holds the input x, what it reads (loss
    and f1) and its output: 4 x 10 = 40; at 39 every solver says infeasible with the one verdict line."""
    graph = chain()
    assert min_budget(graph) == 40
    result = solve(graph, 39, name, time_limit=5, threads=1)
    assert result.status == "infeasible" and result.schedule is None, name
    assert result.message == below_min_budget(39, graph), name


def test_where_store_all_fits_moccasin_returns_it_as_optimal_without_a_model() -> None:
    """The entry check's shortcut (moccasin's; Checkmate's MILP proves the same optimum with its own bound)."""
    graph = chain()
    result = solve(graph, 10**6, "moccasin", time_limit=5, threads=1)
    assert result.status == "optimal" and result.schedule == Schedule.from_order(graph.order)
    assert result.simulation.cost == graph.baseline_cost == 4 and "store-all fits the budget" in result.message


def test_a_cost_limit_below_the_baseline_cost_excludes_store_all_even_where_it_fits() -> None:
    """The chain's baseline computes 4 ops of cost 1: under a cost limit of 3.5 nothing fits, however roomy."""
    result = solve(chain(), 10**6, "checkmate", time_limit=5, threads=1, cost_limit=3.5)
    assert result.status == "infeasible" and result.schedule is None


@pytest.mark.parametrize(("name", "bad"), [("moccasin", {"max_intervals": 0}), ("moccasin", {"order": "backwards"}),
                                           ("monet", {"model": "bogus"}), ("monet", {"order": "backwards"}),
                                           ("poet", {"objective": "bogus"}), ("poet", {"remat": False, "paging": False}),
                                           ("checkmate", {"max_nodes": 2})])
@pytest.mark.parametrize("budget", [39, 10**6])  # below min_budget (40) and above the baseline peak
def test_a_bad_option_is_refused_at_every_budget(name: str, bad: dict, budget: int) -> None:
    with pytest.raises(CoopError) as caught:
        solve(chain(), budget, name, time_limit=5, threads=1, **bad)
    assert "\n" not in str(caught.value)
