"""The one options contract of the formulations (issues 12 and 44): every formulation has a typed options class
holding its defaults; a solver receives the object (keywords are typed into it at its entry); the same common
names everywhere; an unknown option refused in one line by every formulation, through coop.formulations.solve."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from bruteforce import optimal_cost

from coop.budget import baseline_peak, below_min_budget, min_budget
from coop.errors import CoopError
from coop.formulations import COMMON_OPTIONS, FORMULATIONS, get_formulation, registered, solve
from coop.formulations.core.options import (
    CheckmateOptions,
    MoccasinOptions,
    MonetIntervalsOptions,
    PoetIntervalsOptions,
    SolverOptions,
)
from coop.formulations.core.solving_order import solving_graph
from coop.formulations.monet.intervals import monet_intervals
from coop.formulations.poet.intervals import poet_intervals
from coop.graph import Graph
from coop.schedule import Schedule, validate

GRAPH_FORMULATIONS = [name for name in FORMULATIONS if name != "pytorch-mincut"]  # that one needs a capture
#: Those that schedule chain(): per-layer refuses a graph without repeated layers (tests/test_per_layer.py runs the
#: common options on a graph of three layers).
CHAIN_FORMULATIONS = [name for name in GRAPH_FORMULATIONS if name != "per-layer"]
#: The plain heuristics: not decorated, called with the keywords they take.
PLAIN = {"store-all", "checkpoint-all", "chen-sqrt", "chen-greedy", "per-layer", "pytorch-mincut"}
#: The solvers not in the registry that other solvers run (each decorated with its own options class).
UNREGISTERED = {"monet_intervals": (monet_intervals, MonetIntervalsOptions),
                "poet_intervals": (poet_intervals, PoetIntervalsOptions)}

COMMON_DEFAULTS = {"time_limit": 60.0, "threads": 2, "progress": None, "hint": None, "captured": None,
                   "deadline": None}
#: Each solver's own defaults, written out here (as its signature gave them before issue 44): the options class
#: is the one place they live now, so this table is what it is checked against.
OWN_DEFAULTS = {
    "store-all": {}, "checkpoint-all": {}, "per-layer": {},
    "chen-sqrt": {"use_articulation_points": True},
    "chen-greedy": {"use_articulation_points": True, "grid_size": 24},
    "checkmate": {"solver": "cbc", "max_nodes": 600, "memory_levels": None, "cost_limit": None, "verbose": False},
    "checkmate-lp": {"max_nodes": 600, "thresholds": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                     "random_roundings": 16, "seed": 0},
    "moccasin": {"max_intervals": 2, "keep_order": None, "extra_slots": None, "seed": 0, "prove": True,
                 "lp_warm_start": True, "local_search": None, "cp_sat_parameters": None, "order": "auto"},
    "blocks": {"seed": 0},
    "monet": {"exact": False, "solver": "highs", "max_nodes": 40, "warm_start": True, "verbose": False,
              "recompute": True, "model": "auto", "max_intervals": 2, "order": "auto"},
    "pytorch-mincut": {"memory_budgets": None},
    "poet": {"objective": "energy", "device_profile": None, "runtime_budget": None, "remat": True, "paging": True,
             "solver": "cbc", "max_nodes": 300, "verbose": False},
    "auto": {"device_profile": None},
    "monet_intervals": {"exact": False, "recompute": True, "max_intervals": 2, "seed": 0},
    "poet_intervals": {"objective": "energy", "device_profile": None, "runtime_budget": None, "remat": True,
                       "paging": True, "max_intervals": 2, "warm_start": True},
}


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


def deep_chain() -> Graph:
    """x -> f1 -> f2 -> f3 -> loss, then b3 (loss, f3), b2 (b3, f2), b1 (b2, f1): below the baseline peak a
    schedule must recompute (forward costs 1, 2, 3 so that which value to recompute matters)."""
    nodes = [
        {"id": 0, "name": "x", "kind": "input", "mem": 10, "cost": 0, "recomputable": False},
        {"id": 1, "name": "f1", "inputs": [0], "mem": 10, "cost": 1},
        {"id": 2, "name": "f2", "inputs": [1], "mem": 10, "cost": 2},
        {"id": 3, "name": "f3", "inputs": [2], "mem": 10, "cost": 3},
        {"id": 4, "name": "loss", "inputs": [3], "mem": 10, "cost": 1},
        {"id": 5, "name": "b3", "inputs": [4, 3], "mem": 10, "cost": 1, "kind": "backward"},
        {"id": 6, "name": "b2", "inputs": [5, 2], "mem": 10, "cost": 1, "kind": "backward"},
        {"id": 7, "name": "b1", "inputs": [6, 1], "mem": 10, "cost": 1, "kind": "backward"},
    ]
    return Graph(name="deep-chain", nodes=nodes, outputs=(4, 7))


# ---------------------------------------------------------------------------------------- the options classes
@pytest.mark.parametrize("name", [*FORMULATIONS, *UNREGISTERED])
def test_every_formulation_has_an_options_class_holding_its_defaults(name: str) -> None:
    options = UNREGISTERED[name][1] if name in UNREGISTERED else registered(name).options
    assert issubclass(options, SolverOptions) and dataclasses.is_dataclass(options)
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    assert defaults == {**COMMON_DEFAULTS, **OWN_DEFAULTS[name]}, name
    assert options.own_options() == set(OWN_DEFAULTS[name]), name
    assert options.uses <= COMMON_OPTIONS, name


@pytest.mark.parametrize("name", list(FORMULATIONS))
def test_a_solver_takes_its_options_class_and_a_plain_heuristic_the_keywords_it_declares(name: str) -> None:
    """A decorated solver carries the registry's class; a plain heuristic's keyword-only parameters are the
    options it reads, with the class's defaults (its signature is its own: it is not decorated)."""
    function = get_formulation(name)
    options = registered(name).options
    if name not in PLAIN:
        assert function.options_type is options, name
        parameters = inspect.signature(function).parameters
        assert list(parameters) == ["graph", "budget", "options", "keywords"], name
        return
    assert not hasattr(function, "options_type"), name
    parameters = list(inspect.signature(function).parameters.values())
    assert [p.name for p in parameters[:2]] == ["graph", "budget"], name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:]), name  # no **options swallowing
    assert {p.name for p in parameters[2:]} == options.taken(), name
    fields = {f.name: f.default for f in dataclasses.fields(options)}
    assert all(p.default == fields[p.name] for p in parameters[2:]), name


@pytest.mark.parametrize("name", list(UNREGISTERED))
def test_the_solvers_other_solvers_run_carry_their_options_class(name: str) -> None:
    function, options = UNREGISTERED[name]
    assert function.options_type is options


def test_no_signature_binding_in_the_formulations() -> None:
    """Issue 44: the typed options object is the contract; nothing in coop/formulations reads a signature."""
    package = Path(__file__).resolve().parents[1] / "coop" / "formulations"
    for path in sorted(package.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(import inspect|from inspect import)", text, re.MULTILINE), path.name
        assert "inspect.signature" not in text and "Signature(" not in text, path.name


# ---------------------------------------------------------------------------------------- refusing options
@pytest.mark.parametrize("name", GRAPH_FORMULATIONS)
def test_an_unknown_option_is_refused_with_one_line_naming_it(name: str) -> None:
    with pytest.raises(CoopError) as caught:
        solve(chain(), 10**6, name, time_limt=5)  # a typo of time_limit
    message = str(caught.value)
    assert "\n" not in message and "'time_limt'" in message and name in message and "time_limit" in message


@pytest.mark.parametrize("name", [name for name in GRAPH_FORMULATIONS if name not in PLAIN])
def test_a_direct_keyword_call_refuses_an_unknown_option_in_one_line(name: str) -> None:
    with pytest.raises(CoopError) as caught:
        get_formulation(name)(chain(), 10**6, time_limt=5)
    message = str(caught.value)
    assert "\n" not in message and "'time_limt'" in message and name in message


def test_options_of_another_solver_or_beside_keywords_are_refused_in_one_line() -> None:
    moccasin = get_formulation("moccasin")
    with pytest.raises(CoopError, match=r"takes MoccasinOptions, not CheckmateOptions: convert with "
                                        r"MoccasinOptions.from_options") as caught:
        moccasin(chain(), 10**6, options=CheckmateOptions(time_limit=5))
    assert "\n" not in str(caught.value)
    with pytest.raises(CoopError, match="options=... or keywords, not both"):
        moccasin(chain(), 10**6, options=MoccasinOptions(time_limit=5), threads=1)


def test_options_of_the_wrong_solver_are_refused_before_any_solving() -> None:
    with pytest.raises(CoopError, match="formulation 'checkmate' has no option 'max_intervals'"):
        solve(chain(), 10**6, "checkmate", max_intervals=3)


@pytest.mark.parametrize(("name", "bad"), [("moccasin", {"max_intervals": 0}), ("moccasin", {"order": "backwards"}),
                                           ("monet", {"model": "bogus"}), ("monet", {"order": "backwards"}),
                                           ("poet", {"objective": "bogus"}), ("poet", {"remat": False, "paging": False}),
                                           ("checkmate", {"max_nodes": 2})])
@pytest.mark.parametrize("budget", [39, 10**6])  # below min_budget (40) and above the baseline peak
def test_a_bad_option_is_refused_at_every_budget(name: str, bad: dict, budget: int) -> None:
    with pytest.raises(CoopError) as caught:
        solve(chain(), budget, name, time_limit=5, threads=1, **bad)
    assert "\n" not in str(caught.value)
    with pytest.raises(CoopError):  # the same check given an options object
        get_formulation(name)(chain(), budget, options=registered(name).options(time_limit=5, threads=1, **bad))


# ---------------------------------------------------------------------------------------- solving with options
@pytest.mark.parametrize("name", CHAIN_FORMULATIONS)
def test_every_formulation_accepts_the_common_options(name: str) -> None:
    graph = chain()
    result = solve(graph, 10**6, name, time_limit=5, threads=1, progress=None, hint=None, captured=None)
    assert result.schedule is not None, (name, result.status, result.message)
    assert validate(graph, result.schedule, 10**6).ok, name
    assert COMMON_OPTIONS == {"time_limit", "threads", "progress", "hint", "captured", "deadline"}


def test_a_keyword_call_and_an_options_call_both_reach_checkmates_proven_optimum() -> None:
    """The brute-force oracle (tests/bruteforce.py, written from the schedule contract alone) gives the optimum of
    Checkmate's staged space; both call forms must prove it."""
    graph = deep_chain()
    budget = min_budget(graph) + 10
    assert budget < baseline_peak(graph)
    staged = optimal_cost(graph, budget, "staged")
    assert staged is not None and staged > graph.baseline_cost  # a recomputation is needed
    checkmate = get_formulation("checkmate")
    by_keywords = checkmate(graph, budget, time_limit=20, threads=1)
    by_object = checkmate(graph, budget, options=CheckmateOptions(time_limit=20, threads=1))
    for result in (by_keywords, by_object):
        assert result.status == "optimal", result.message
        assert validate(graph, result.schedule, budget).cost == staged == result.objective


def test_a_keyword_call_and_an_options_call_both_reach_moccasins_proven_optimum() -> None:
    graph = deep_chain()
    budget = min_budget(graph) + 10
    in_order = optimal_cost(solving_graph(graph)[0], budget, "in_order")
    moccasin = get_formulation("moccasin")
    by_keywords = moccasin(graph, budget, time_limit=20, threads=1, seed=3)
    by_object = moccasin(graph, budget, options=MoccasinOptions(time_limit=20, threads=1, seed=3))
    for result in (by_keywords, by_object):
        assert result.status == "optimal", result.message
        assert validate(graph, result.schedule, budget).cost == in_order


def test_an_option_given_as_an_object_is_the_one_the_solver_reads() -> None:
    """A cost limit below the baseline cost excludes every schedule: infeasible in both forms (not the default)."""
    graph = chain()
    for result in (solve(graph, 10**6, "checkmate", time_limit=5, threads=1, cost_limit=3.5),
                   get_formulation("checkmate")(graph, 10**6,
                                                options=CheckmateOptions(time_limit=5, threads=1, cost_limit=3.5))):
        assert result.status == "infeasible" and result.schedule is None


SOLVERS = ["checkmate", "checkmate-lp", "moccasin", "monet", "poet", "auto"]


@pytest.mark.parametrize("name", SOLVERS)
def test_a_budget_below_min_budget_is_answered_by_the_one_entry_check(name: str) -> None:
    """Hand-counted: the chain's least budget is the step of b1, which holds the input x, what it reads (loss
    and f1) and its output: 4 x 10 = 40; at 39 every solver says infeasible with the one verdict line."""
    graph = chain()
    assert min_budget(graph) == 40
    # POET may page x out: its bound counts only the caller-owned values a step reads (30: b1's own reads and output)
    paging = name == "poet"
    budget = 39 if not paging else min_budget(graph, paging=True) - 1
    assert not paging or budget == 29
    result = solve(graph, budget, name, time_limit=5, threads=1)
    assert result.status == "infeasible" and result.schedule is None, name
    assert result.message == below_min_budget(budget, graph, paging=paging), name


def test_where_store_all_fits_moccasin_returns_it_as_optimal_without_a_model() -> None:
    """The entry check's shortcut (moccasin's; Checkmate's MILP proves the same optimum with its own bound)."""
    graph = chain()
    result = solve(graph, 10**6, "moccasin", time_limit=5, threads=1)
    assert result.status == "optimal" and result.schedule == Schedule.from_order(graph.order)
    assert result.simulation.cost == graph.baseline_cost == 4 and "store-all fits the budget" in result.message


def test_auto_hands_the_device_profile_to_poet_only() -> None:
    """Each rung's options are derived from auto's typed options: the device profile reaches poet's, and the
    rungs whose options have no such field (checkmate, moccasin) run rather than refuse it."""
    graph = deep_chain()
    budget = min_budget(graph) + 10
    result = solve(graph, budget, "auto", time_limit=20, threads=1, device_profile="m4")
    ran = {rung.formulation: rung for rung in result.rungs}
    assert ran["checkmate"].status == "optimal", ran["checkmate"].note
    assert "has no option" not in result.message
    assert validate(graph, result.schedule, budget).cost == optimal_cost(graph, budget, "staged")
