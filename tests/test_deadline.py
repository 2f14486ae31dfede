"""One deadline, kept (issue 40): made once from ``time_limit`` at a formulation's entry, handed to every stage.

Oracles are arithmetic on a fake clock, never the wall clock: a test advances the clock where a stage "takes
time" (a monkeypatched warm start) and checks what the next stage was given. Wall times against limits are
measured in benchmarks/bench_auto.py's time table, not here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from coop.budget import baseline_peak, min_budget
from coop.errors import InfeasibleError, OptionError, SolveTimeoutError
from coop.formulations import FORMULATIONS, solve
from coop.formulations.checkmate import milp as checkmate_module
from coop.formulations.core.deadline import CP_SAT_RESERVE_S, CP_SAT_RESERVE_SHARE, Deadline, cp_sat_solver
from coop.formulations.core.options import MoccasinOptions
from coop.formulations.core.result import SolveResult
from coop.formulations.heuristics import warm_start as warm_start_module
from coop.formulations.heuristics.fast_schedules import peak_shaving_schedule
from coop.formulations.ladder import auto as auto_module
from coop.formulations.ladder.auto import cheapest_fitting_baseline, no_schedule_error
from coop.formulations.moccasin import intervals as moccasin_module
from coop.graph import Graph, Node
from coop.graph_files import load_graph
from coop.schedule import simulate
from tests.test_bruteforce_oracle import _eight_nodes_least_peak_57 as eight_nodes_least_peak_57
from tests.test_options_contract import chain


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wide_step(width: int = 6) -> Graph:
    """An input x (10 bytes), a fan of ``width`` values f_k of 10 bytes read by a loss (1 byte), and a backward b_k
    (1 byte) per f_k reading the loss and f_k. min_budget is the loss's step, 10 + 60 + 1 = 71; the baseline peaks at
    b1's step (72): at 71 a schedule must drop an f_k after the loss and recompute it (cost 1)."""
    nodes = [Node(id=0, name="x", kind="input", mem=10, cost=0.0, recomputable=False)]
    for k in range(1, width + 1):
        nodes.append(Node(id=k, name=f"f{k}", inputs=(0,), mem=10, cost=1.0))
    total = width + 1
    nodes.append(Node(id=total, name="loss", inputs=tuple(range(1, width + 1)), mem=1, cost=1.0))
    outputs = [total]
    for k in range(1, width + 1):
        nodes.append(Node(id=total + k, name=f"b{k}", inputs=(total, k), mem=1, cost=1.0, kind="backward"))
        outputs.append(total + k)
    return Graph(name="wide", nodes=tuple(nodes), outputs=tuple(outputs))


#: Between wide_step()'s min_budget (71) and its baseline peak (72).
WIDE_BUDGET = 71


def test_the_wide_step_is_as_counted() -> None:
    graph = wide_step()
    assert min_budget(graph) == 71 and baseline_peak(graph) == 72


# ---------------------------------------------------------------------------- the deadline object
def test_a_deadline_counts_down_on_its_clock_and_a_child_never_outlives_its_parent() -> None:
    clock = FakeClock()
    parent = Deadline.after(10.0, clock=clock)
    clock.advance(4.0)
    assert parent.remaining() == 6.0 and parent.elapsed() == 4.0 and not parent.expired()
    assert Deadline.after(30.0, within=parent).remaining() == 6.0  # capped by the parent
    assert Deadline.after(2.0, within=parent).remaining() == 2.0
    assert parent.share(0.5).remaining() == 3.0
    clock.advance(7.0)
    assert parent.remaining() == 0.0 and parent.expired()


def test_the_one_cp_sat_builder_gives_what_is_left_less_the_reserve_and_the_threads() -> None:
    clock = FakeClock()
    deadline = Deadline.after(10.0, clock=clock)
    clock.advance(2.0)
    solver = cp_sat_solver(deadline, 3, seed=7, parameters={"cp_model_probing_level": 0})
    left = 8.0
    assert solver.parameters.max_time_in_seconds == pytest.approx(left - CP_SAT_RESERVE_S - CP_SAT_RESERVE_SHARE * left)
    assert solver.parameters.num_workers == 3 and solver.parameters.random_seed == 7
    assert solver.parameters.cp_model_probing_level == 0
    clock.advance(9.0)  # past the deadline: the least positive limit CP-SAT accepts
    assert cp_sat_solver(deadline, 1).parameters.max_time_in_seconds == pytest.approx(0.01)


# ---------------------------------------------------------------------------- the deadline reaches every stage
def test_moccasin_gives_cp_sat_only_what_the_warm_starts_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm starts 'take' 7 of 10 s on the fake clock: CP-SAT gets the 3 s left, less its reserve (it used to
    get the time limit less the elapsed time of its own clock, which began after the entry's checks)."""
    clock = FakeClock()
    graph = wide_step()
    seen: dict[str, object] = {}
    real_best_warm_start = moccasin_module.best_warm_start

    def slow_warm_start(*args: object, deadline: Deadline, until: Deadline, **kwargs: object) -> object:
        seen["warm"], seen["until"] = deadline, until
        found = real_best_warm_start(*args, deadline=deadline, until=until, **kwargs)
        clock.advance(7.0)
        return found

    def recording_solver(deadline: Deadline, threads: int, **kwargs: object) -> object:
        solver = cp_sat_solver(deadline, threads, **kwargs)
        seen.setdefault("cp_sat", []).append((deadline, solver.parameters.max_time_in_seconds, threads))
        return solver

    monkeypatch.setattr(moccasin_module, "best_warm_start", slow_warm_start)
    monkeypatch.setattr(moccasin_module, "cp_sat_solver", recording_solver)
    parent = Deadline.after(10.0, clock=clock)
    result = solve(graph, WIDE_BUDGET, "moccasin", time_limit=10.0, threads=1, deadline=parent, local_search=0.0)
    assert result.schedule is not None
    until = seen["until"]
    assert isinstance(until, Deadline) and until.at == parent.at  # the entry's deadline is the caller's
    assert seen["warm"].at == pytest.approx(parent.at - 10.0 + 10.0 * moccasin_module.WARM_START_SHARE)
    deadline, seconds, threads = seen["cp_sat"][0]
    assert deadline.at == parent.at and threads == 1
    assert seconds == pytest.approx(3.0 - CP_SAT_RESERVE_S - CP_SAT_RESERVE_SHARE * 3.0)


def test_a_warm_start_returned_because_no_time_was_left_warns_what_time_would_let_cp_sat_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm starts 'take' all 10 s: the schedule is a last resort, and the outermost call says so (once)."""
    clock = FakeClock()
    real_best_warm_start = moccasin_module.best_warm_start

    def slow_warm_start(*args: object, **kwargs: object) -> object:
        found = real_best_warm_start(*args, **kwargs)
        clock.advance(10.0)
        return found

    monkeypatch.setattr(moccasin_module, "best_warm_start", slow_warm_start)
    parent = Deadline.after(10.0, clock=clock)
    with pytest.warns(UserWarning, match=r"^moccasin: CP-SAT not run: the warm starts and the model .* a last resort: "
                                         r"a time_limit of \d+ s or more would let CP-SAT search$") as caught:
        result = solve(wide_step(), WIDE_BUDGET, "moccasin", time_limit=10.0, threads=1, deadline=parent,
                       local_search=0.0)
    assert len(caught) == 1 and result.schedule is not None and result.extra["cp_sat_status"] == "NOT_RUN"


def test_checkmate_stops_building_its_model_at_the_deadline_and_runs_no_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the O(n^2) model counts: on captured ResNet-50 it took 38 s, so a 10 s limit returned after 36 s.
    Here the caller's deadline has passed before the model is built: no MILP is solved, and no proof is claimed."""
    clock = FakeClock()
    parent = Deadline.after(10.0, clock=clock)
    clock.advance(10.5)

    def no_solve(*args: object, **kwargs: object) -> None:
        raise AssertionError("the MILP was solved past the deadline")

    monkeypatch.setattr(checkmate_module, "solve_milp", no_solve)
    result = solve(wide_step(), WIDE_BUDGET, "checkmate", time_limit=10.0, threads=1, deadline=parent)
    assert result.status == "unknown" and result.schedule is None
    assert result.message.startswith("no schedule found within 10 s: building the stage model of")
    assert "stopped at the time limit" in result.message and "try moccasin" in result.message


def test_the_entry_makes_the_deadline_from_time_limit_within_a_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    given: list[Deadline] = []
    real_best_warm_start = moccasin_module.best_warm_start

    def recording(*args: object, until: Deadline, **kwargs: object) -> object:
        given.append(until)
        return real_best_warm_start(*args, until=until, **kwargs)

    monkeypatch.setattr(moccasin_module, "best_warm_start", recording)
    parent = Deadline.after(10.0, clock=clock)
    solve(wide_step(), WIDE_BUDGET, "moccasin", time_limit=4.0, threads=1, deadline=parent, local_search=0.0)
    solve(wide_step(), WIDE_BUDGET, "moccasin", time_limit=40.0, threads=1, deadline=parent, local_search=0.0)
    assert [d.at - parent.started for d in given] == [4.0, 10.0]  # its own limit, or the caller's when earlier


def test_warm_starts_share_their_time_so_a_slow_walk_leaves_time_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """3bc40e8 collected the warm starts quickest first and stopped at its deadline once one fitted: greedy
    eviction, slow on a wide graph (36-92 s on random layered n1000), used all of it and peak shaving never ran.
    Each walk now gets half of what is left: one that uses all of its part leaves the rest to the next."""
    clock = FakeClock()
    graph = wide_step()
    budgets: list[tuple[str, float]] = []

    def walk(name: str) -> object:
        def run(graph: Graph, budget: int, *args: object, deadline: Deadline | None = None, **kwargs: object) -> None:
            budgets.append((name, deadline.remaining()))
            clock.advance(deadline.remaining())  # it runs to the end of its part and finds nothing
        return run

    monkeypatch.setattr(warm_start_module, "peak_shaving_schedule", walk("peak-shaving"))
    monkeypatch.setattr(warm_start_module, "greedy_eviction_schedule", walk("greedy-eviction"))
    monkeypatch.setattr(warm_start_module, "online_schedule", walk("online eviction"))
    deadline = Deadline.after(8.0, clock=clock)
    warm_start_module.best_warm_start(graph, WIDE_BUDGET, None, 0.0, deadline=deadline, until=deadline)
    # peak shaving 8/2, greedy eviction 4/2, its rebuild-size-aware run 2/2, online eviction the rest
    assert budgets == [("peak-shaving", 4.0), ("greedy-eviction", 2.0), ("greedy-eviction", 1.0),
                       ("online eviction", 1.0)]


# ---------------------------------------------------------------------------- auto derives each rung's options
def test_auto_hands_its_deadline_to_every_rung_and_lists_each(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    calls: list[tuple[str, float, Deadline]] = []

    def fake_rung(graph: Graph, budget: int, name: str, options: object = None, **keywords: object) -> SolveResult:
        if options is None:  # the baselines, run as candidates (no solver time)
            return real_run_solver(graph, budget, name, **keywords)
        calls.append((name, options.time_limit, options.deadline))
        clock.advance(2.0)
        return SolveResult(name, "unknown", message="stopped at the time limit")

    real_run_solver = auto_module.run_solver
    monkeypatch.setattr(auto_module, "run_solver", fake_rung)
    graph = wide_step()
    parent = Deadline.after(20.0, clock=clock)
    with pytest.warns(UserWarning, match=r"auto: no solver found a schedule cheaper .* last resort; a time_limit"):
        result = solve(graph, WIDE_BUDGET, "auto", time_limit=20.0, threads=1, deadline=parent)
    assert [name for name, _, _ in calls] == ["checkmate", "moccasin"]
    assert all(deadline.at == parent.at for _, _, deadline in calls)
    assert [limit for _, limit, _ in calls] == [10.0, 18.0]  # half of 20, then all of the 18 left
    assert [(rung.formulation, rung.status, rung.wall_s) for rung in result.rungs[1:]] == [
        ("checkmate", "unknown", 2.0), ("moccasin", "unknown", 2.0)]
    assert result.rungs[0].status == "heuristic" and result.fallback
    assert "checkmate: unknown, 2.0 of 10.0 s, no schedule within the budget" in result.message


# ---------------------------------------------------------------------------- honest outcomes
@pytest.mark.parametrize("bad", [{"time_limit": 0}, {"time_limit": -1.0}, {"time_limit": math.nan},
                                 {"time_limit": math.inf}, {"threads": 0}, {"threads": -2}])
@pytest.mark.parametrize("name", list(FORMULATIONS))
def test_a_bad_time_limit_or_thread_count_is_refused_in_one_line(name: str, bad: dict) -> None:
    with pytest.raises(OptionError) as caught:
        solve(chain(), 10**6, name, **bad)
    message = str(caught.value)
    assert "\n" not in message and next(iter(bad)) in message and "give e.g." in message
    assert message.startswith(f"formulation {name!r}: ")  # the one check, named for the formulation


def test_the_typed_options_refuse_a_nan_time_limit_too() -> None:
    with pytest.raises(OptionError, match="time_limit=nan is not a positive number of seconds"):
        MoccasinOptions(time_limit=math.nan)


def test_a_time_out_is_not_called_infeasible_and_says_what_to_try() -> None:
    """The eight-node graph's least peak is 57 (brute force) and min_budget 53: at 56 nothing fits, unproven."""
    graph = eight_nodes_least_peak_57()
    timed_out = SolveResult("auto", "unknown", wall_s=10.0, message="no schedule found within 10 s")
    error = no_schedule_error(graph, 56, timed_out, 10.0)
    assert isinstance(error, SolveTimeoutError) and not isinstance(error, InfeasibleError)
    message = str(error)
    assert message.startswith("no schedule found within 10 s by auto") and "\n" not in message
    assert "the best peak reached is" in message and "the smallest budget known to fit is" in message
    assert "try a longer time_limit" in message and error.fits_at is not None and error.fits_at >= 57
    with pytest.raises(SolveTimeoutError):
        cheapest_fitting_baseline(graph, 56, failed="auto", result=timed_out, time_limit=10.0)
    with pytest.raises(InfeasibleError):  # no solver's result: the baselines' own verdict, as before
        cheapest_fitting_baseline(graph, 56, failed="auto")
    proven = SolveResult("checkmate", "infeasible", message="no schedule of the space fits")
    assert type(no_schedule_error(graph, 56, proven)) is InfeasibleError


# ---------------------------------------------------------------------------- 3bc40e8
N1000 = "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json"


def test_moccasin_under_a_short_limit_keeps_the_warm_start_that_a_slow_first_one_used_to_starve(
        moccasin_dir: Path) -> None:
    """The published random layered n1000 graph at 0.9 of its peak, 4 s. Since 3bc40e8 the first warm start to fit
    was greedy eviction's (36-92 s here, 365 %) and peak shaving (0.4 s here) found its deadline passed: moccasin
    returned 100-163 % where its parent returned 0.69 %. The oracle is peak shaving run alone: Moccasin starts from
    the best warm start, so it never returns more. 4 s since 2026-11-30 (8 s before; the starving warm start ran past
    either): peak shaving's schedule came back at 3, 4 and 8 s alike under a load of 6 on 2 cores."""
    graph = load_graph(moccasin_dir / N1000)
    budget = math.ceil(0.9 * baseline_peak(graph))
    shaved = peak_shaving_schedule(graph, budget)
    assert shaved is not None
    oracle = simulate(graph, shaved)
    assert oracle.peak <= budget
    result = solve(graph, budget, "moccasin", time_limit=4.0, threads=2)
    assert result.simulation is not None and result.simulation.peak <= budget
    assert result.simulation.cost <= oracle.cost, (result.extra.get("warm_start"), result.simulation.overhead)


def test_an_online_policy_is_not_started_without_its_expected_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy runs to its end once started (DTR took 138 s on random layered n1000): with less left than
    ONLINE_POLICY_S_PER_NODE per node none starts; with enough, every one runs."""
    graph = wide_step()
    started: list[str] = []

    def policy(graph: Graph, budget: int, name: str, **kwargs: object) -> object:
        started.append(name)
        return SolveResult(name, "unknown")

    monkeypatch.setattr(warm_start_module, "simulate_online", policy)
    clock = FakeClock()
    need = warm_start_module.ONLINE_POLICY_S_PER_NODE * len(graph.order)
    assert warm_start_module.online_schedule(graph, WIDE_BUDGET, deadline=Deadline.after(0.9 * need, clock=clock)) is None
    assert started == []
    warm_start_module.online_schedule(graph, WIDE_BUDGET, deadline=Deadline.after(10 * need, clock=clock))
    assert started == list(warm_start_module.POLICIES)


def test_every_cp_sat_solve_is_also_stopped_from_a_timer_at_its_limit(monkeypatch) -> None:
    """CP-SAT checks its own limit only between steps; the solver coop builds arms a timer that calls its
    ``stop_search`` when the limit has passed, and cancels it once the solve returns."""
    import threading

    from ortools.sat.python import cp_model

    armed: list[tuple[float, object, list[str]]] = []

    class RecordingTimer:
        def __init__(self, interval: float, function: object) -> None:
            self.events: list[str] = []
            armed.append((interval, function, self.events))

        def start(self) -> None:
            self.events.append("start")

        def cancel(self) -> None:
            self.events.append("cancel")

    monkeypatch.setattr(threading, "Timer", RecordingTimer)
    model = cp_model.CpModel()
    x = model.new_int_var(0, 10, "x")
    model.maximize(x)
    solver = cp_sat_solver(Deadline.after(5.0), 1, reserve=False)
    assert solver.solve(model) == cp_model.OPTIMAL and solver.value(x) == 10
    assert len(armed) == 1
    interval, function, events = armed[0]
    assert interval == pytest.approx(solver.parameters.max_time_in_seconds) and 4.0 < interval <= 5.0
    assert function == solver.stop_search and events == ["start", "cancel"]
    assert solver.parameters.use_feasibility_pump is False
