"""MONeT: checkpointing, operator implementations and in-place execution chosen in one MILP.

Shah, Wu, Chandrashekaran, Goyal, Yu, "Memory Optimization for Deep Networks", ICLR 2021.

MONeT's point is that what a training step keeps depends on *how* each operator runs, not only on
what is recomputed: a ReLU backward that reads a 1-bit mask instead of the float output, an
activation that runs in place over its input, a convolution algorithm that trades workspace for
time. It decides checkpointing and these choices jointly, with each implementation's workspace
inside the memory constraints, and reaches budgets that recomputation alone cannot.

The implementations come from the graph (contract 1): ``Node.impls`` with their cost, output,
workspace, the values they read (``Impl.inputs``, possibly ``optional`` values such as a mask)
and the input they overwrite (``Impl.inplace_of``). This module solves a Checkmate-style
frontier-advancing stage model (Jain et al. 2020, the space of :mod:`coop.formulations.checkmate.milp`;
the latest reads, ``S``, the ``U`` recurrence and the schedule's extraction are
:mod:`coop.formulations.stages.model`'s) extended the way MONeT extends its checkpointing MILP with
per-operator implementation variables:

* positions: ``prompt_order(graph)`` with each optional value inserted before the first regular
  node once its inputs are placed (:func:`stage_order`); stage t computes position t (an optional
  value: may skip it) after recomputing earlier positions in increasing order;
* ``R[t,i,p]`` -- position i is (re)computed in stage t with implementation p (p = 0 the node's
  own fields); at most one p per (t, i), exactly one at t = i for a non-optional node;
* ``S[t,i]`` -- i is retained from stage t-1 into stage t; ``S[t+1,i] <= sum_p R[t,i,p] + S[t,i]``;
* a read: ``sum_{p reads i} R[t,k,p] <= sum_q R[t,i,q] + S[t,i]``;
* in place (p of k overwrites u): ``R[t,k,p] + S[t+1,u] <= 1`` and no later reader of u in the
  stage; the step adds no bytes and u's bytes become k's;
* ``FREE[t,i,k]`` -- i freed right after k in stage t (k read it, nobody later in the stage does,
  not retained), ``U[t,k]`` the memory while k runs; ``U[t,k] + sum_p workspace[k,p] R[t,k,p] <=
  budget - caller-owned bytes`` (MONeT's workspace term);
* objective: ``sum cost[i,p] R[t,i,p]``.

A value counts at the largest size its implementations may give it (exact when they agree, as
for every captured op; otherwise the model is conservative and its optimum is reported as
``feasible``). An in-place implementation is offered only where every implementation of the
overwritten node has the in-place output's size. ``exact=True`` drops implementations marked
``exact: false``.

Both models keep first computations in one order: ``graph.order``, or the deferred order of
:func:`coop.formulations.core.solving_order.solving_graph` where that lowers the store-all peak
(``extra["order"]``); statuses speak of schedules in that order.

Scaling: O(T^2 x implementations) binaries and O(T^2 x reads) rows for T positions, like
Checkmate's MILP; tens of nodes solve to optimality in seconds. This stage MILP is the *exact
small-graph model*: it runs on graphs of at most ``max_nodes`` positions (default
:data:`DEFAULT_MAX_NODES`). Above that (captured ResNet-50 has about 800 nodes), and always with
``recompute=False`` or ``model="intervals"``, monet solves MONeT's problem on an O(n) interval model
instead: Moccasin's retention intervals (Bartan et al. 2023) with one literal per node, interval and
implementation, per-implementation memory, workspace and precedences, and in place
(:mod:`coop.formulations.monet.interval_model`, driven by :mod:`coop.formulations.monet.intervals`, warm-started
from moccasin's remat-only schedule and from the lightest-implementation schedule of
:mod:`coop.formulations.monet.warm`). MONeT's own default limit was 24 hours; here ``time_limit``
(seconds to minutes) stops either solver, which returns its incumbent with status ``feasible`` and
the gap (the interval model is restricted and reports ``extra["restricted_bound"]`` instead).

The stage MILP is warm-started from the cheapest of MONeT's warm starts
(:func:`coop.formulations.monet.intervals.monet_warm_starts`): the best remat-only schedule, moccasin's
(Bartan et al. 2023) on the graph with default implementations given ``monet_intervals.REMAT_SHARE`` of
the time limit and itself started from the one warm-start collector; below the remat-only least
peak the lightest-implementation schedule; and the caller's ``hint`` s. The MILP then searches only
schedules cheaper than it (an objective cutoff), and when it
finds none in time that schedule is returned (status ``feasible``): monet is never worse than that
remat-only schedule at the same budget. Pass moccasin's or checkmate's own result as ``hint`` to
make that hold against a run given the whole time limit. On a graph without implementations the
interval path runs moccasin itself with the whole time limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Any

from coop.errors import CoopError
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import MonetIntervalsOptions, MonetOptions
from coop.formulations.core.result import SolveResult
from coop.formulations.core.solving_order import check_order, solving_graph
from coop.formulations.milp.backends import LinearModel, MilpSolution, solve_milp
from coop.formulations.monet.intervals import monet_intervals, monet_warm_starts
from coop.formulations.monet.warm import order_with_optional
from coop.formulations.stages.model import (
    Entry,
    Linear,
    add_memory_recurrence,
    add_retention_variables,
    entries_sum,
    latest_possible_reads,
    linear_plus,
    linear_scaled,
)
from coop.formulations.stages.solution import StageStep, retained_from_solution, schedule_from_stage_steps
from coop.graph import Graph, Impl, Node
from coop.schedule import Schedule, Simulation, simulate

#: Above this many positions (computed nodes plus optional values) the O(T^2) stage model gives way to
#: the O(n) interval model (:mod:`coop.formulations.monet.intervals`).
DEFAULT_MAX_NODES = MonetOptions.max_nodes


@dataclass(frozen=True)
class _Choice:
    """One implementation of a position, in the model's memory units."""

    name: str | None          # None: the node's own fields
    cost: float
    mem: int
    workspace: int
    reads: tuple[int, ...]    # positions of the computed values it reads
    inplace: int | None       # position whose instance it consumes


@dataclass(frozen=True)
class _Problem:
    ids: tuple[int, ...]
    choices: tuple[tuple[_Choice, ...], ...]
    size: tuple[int, ...]                  # the largest instance any choice makes (units)
    recomputable: tuple[bool, ...]
    optional: tuple[bool, ...]
    extra_output: tuple[bool, ...]
    readers: tuple[tuple[int, ...], ...]   # positions that may read each position, ascending
    outputs: frozenset[int]
    capacity: int
    unit: int
    exact_memory: bool                     # every choice of a node makes the same size

    @property
    def positions(self) -> int:
        return len(self.ids)

    def reading(self, k: int, i: int) -> list[int]:
        """The choices of k that read i."""
        return [p for p, choice in enumerate(self.choices[k]) if i in choice.reads]


def stage_order(graph: Graph) -> tuple[int, ...]:
    """``prompt_order(graph)`` with each optional value placed before the first regular (not an extra
    output) node that comes once all its inputs are placed: the positions of the stage model.

    Parameters
    ----------
    graph : Graph
        The training step.

    Returns
    -------
    tuple of int
        Node ids, one per position.
    """
    return tuple(order_with_optional(graph, set(graph.optional_ids)))


def _usable(node: Node, impl: Impl, exact: bool, uniform_size: dict[int, int | None]) -> bool:
    if exact and not impl.exact:
        return False
    return impl.inplace_of is None or uniform_size[impl.inplace_of] == impl.mem


def _project(graph: Graph, budget: int, exact: bool) -> _Problem:
    order = stage_order(graph)
    position = {node_id: p for p, node_id in enumerate(order)}
    nodes = [graph.node(i) for i in order]
    uniform_size = {n.id: n.mem if all(i.mem == n.mem for i in n.impls) else None for n in graph.nodes}
    raw: list[list[tuple[Impl | None, Node]]] = []
    for node in nodes:
        impls = [impl for impl in node.impls if _usable(node, impl, exact, uniform_size)]
        raw.append([(None, node), *((impl, node) for impl in impls)])
    sizes = [n.mem for n in nodes] + [x.mem for n in nodes for x in n.impls] + [n.workspace for n in nodes]
    sizes += [x.workspace for n in nodes for x in n.impls]
    unit = reduce(math.gcd, [s for s in sizes if s > 0], 0) or 1
    choices: list[tuple[_Choice, ...]] = []
    readers: list[set[int]] = [set() for _ in order]
    for k, options in enumerate(raw):
        row = []
        for impl, node in options:
            reads = () if node.output_of is not None else node.reads(impl)
            at = tuple(sorted(position[i] for i in reads if i in position))
            if any(p >= k for p in at):
                continue  # reads a value placed later (a user-given order): not offered in this space
            source = impl or node
            row.append(_Choice(None if impl is None else impl.name, float(source.cost), -(-source.mem // unit),
                               -(-source.workspace // unit), at,
                               None if impl is None or impl.inplace_of is None else position[impl.inplace_of]))
            for p in at:
                readers[p].add(k)
        choices.append(tuple(row))
    capacity = budget - graph.caller_owned_bytes
    return _Problem(
        ids=order, choices=tuple(choices), size=tuple(max(c.mem for c in row) for row in choices),
        recomputable=tuple(n.recomputable and n.output_of is None for n in nodes),
        optional=tuple(n.optional for n in nodes), extra_output=tuple(n.output_of is not None for n in nodes),
        readers=tuple(tuple(sorted(r)) for r in readers),
        outputs=frozenset(position[i] for i in graph.outputs if i in position),
        capacity=capacity // unit if capacity >= 0 else -1, unit=unit,
        exact_memory=all(uniform_size[n.id] is not None for n in nodes),
    )


# -------------------------------------------------------------------- the model
@dataclass
class _Variables:
    R: list[list[list[Entry]]]   # R[t][i][p], i <= t
    S: list[list[Entry]]         # S[t][i], i < t, t = 0..T


def _at_most(model: LinearModel, left: Linear, right: Linear) -> None:
    """left <= right over 0-1 entries; a row between constants is checked here (a violated one
    makes the model infeasible through a variable fixed to 0 that must be 1)."""
    terms = left[0] + [(v, -c) for v, c in right[0]]
    if not left[0] and left[1] <= 0 and all(c < 0 for _, c in terms):
        return  # 0 <= a sum of non-negative terms plus a non-negative constant
    if not terms:
        if left[1] > right[1]:
            model.add_row([(model.add_var("violated", "binary", 0.0, 0.0), 1.0)], ">=", 1.0)
        return
    model.add_row(terms, "<=", right[1] - left[1])


def _build(problem: _Problem) -> tuple[LinearModel, _Variables]:
    model = LinearModel()
    T = problem.positions
    latest = latest_possible_reads(problem.readers, problem.recomputable, problem.outputs)
    R: list[list[list[Entry]]] = []
    for t in range(T):
        row: list[list[Entry]] = []
        for i in range(t + 1):
            options = problem.choices[i]
            if i == t and len(options) == 1 and not problem.optional[i]:
                row.append([True])
            elif i == t or (problem.recomputable[i] and not problem.extra_output[t]):
                row.append([model.add_var(f"R[{t},{i},{p}]") for p in range(len(options))])
                if i == t and not problem.optional[i]:
                    model.add_row([(v, 1.0) for v in row[-1]], "==", 1.0)
                elif len(options) > 1:
                    model.add_row([(v, 1.0) for v in row[-1]], "<=", 1.0)
            else:
                row.append([False] * len(options))
        R.append(row)
    S = add_retention_variables(model, latest, problem.outputs)

    # The reads, in-place and FREE rows are MONeT's own forms (_at_most over sums of choices), not
    # stage_model's one-choice rows: they also write rows that always hold, which Checkmate's builder
    # skips, so sharing that builder would change this model.
    def present(t: int, i: int) -> Linear:
        return linear_plus(entries_sum(R[t][i]), entries_sum([S[t][i]] if i < t else []))

    for t in range(T):
        for k in range(t + 1):
            for i in {i for c in problem.choices[k] for i in c.reads}:
                _at_most(model, entries_sum([R[t][k][p] for p in problem.reading(k, i)]), present(t, i))
            _add_in_place(model, problem, t, k, R, S)
        for i in range(t + 1):
            _at_most(model, entries_sum([S[t + 1][i]]), present(t, i))
        _add_stage_memory(model, problem, t, R, S)
    for t in range(T):
        for i in range(t + 1):
            for p, entry in enumerate(R[t][i]):
                cost = problem.choices[i][p].cost
                if entry is True:
                    model.objective_constant += cost
                elif entry is not False and cost:
                    model.objective.append((entry, cost))
    return model, _Variables(R=R, S=S)


def _add_in_place(model: LinearModel, problem: _Problem, t: int, k: int, R: list[list[list[Entry]]],
                  S: list[list[Entry]]) -> None:
    """An in-place choice consumes u: u is not retained past the stage and no later node of the stage reads it."""
    for p, choice in enumerate(problem.choices[k]):
        u = choice.inplace
        if u is None or R[t][k][p] is False:
            continue
        mine = entries_sum([R[t][k][p]])
        _at_most(model, linear_plus(mine, entries_sum([S[t + 1][u]])), ([], 1.0))
        for j in problem.readers[u]:
            if k < j <= t:
                _at_most(model, linear_plus(mine, entries_sum([R[t][j][q] for q in problem.reading(j, u)])), ([], 1.0))


def _reads(problem: _Problem, R: list[list[list[Entry]]], t: int, k: int, i: int) -> Linear:
    """Whether k runs in stage t reading i (i = k: whether k runs at all)."""
    return entries_sum(R[t][k] if i == k else [R[t][k][p] for p in problem.reading(k, i)])


def _add_stage_memory(model: LinearModel, problem: _Problem, t: int, R: list[list[list[Entry]]],
                      S: list[list[Entry]]) -> None:
    """Checkmate's U/FREE recurrence over the stage, with each choice's bytes and workspace; an
    in-place choice adds its output less the consumed input and gives the consumed input's free back."""
    retained: Linear = ([], 0.0)
    for i in range(t):
        retained = linear_plus(retained, linear_scaled(entries_sum([S[t][i]]), problem.size[i]))

    def added(k: int) -> Linear:
        total: Linear = ([], 0.0)
        for p, choice in enumerate(problem.choices[k]):
            new_bytes = problem.size[k] - (problem.size[choice.inplace] if choice.inplace is not None else 0)
            total = linear_plus(total, linear_scaled(entries_sum([R[t][k][p]]), new_bytes))
        return total

    def budget_while(u: int, k: int) -> None:
        # MONeT's workspace term: U[t,k] + sum_p workspace[k,p] R[t,k,p] <= capacity.
        workspace: Linear = ([], 0.0)
        for p, choice in enumerate(problem.choices[k]):
            workspace = linear_plus(workspace, linear_scaled(entries_sum([R[t][k][p]]), choice.workspace))
        if workspace[0] or workspace[1]:
            model.add_row([(u, 1.0)] + workspace[0], "<=", problem.capacity - workspace[1])

    computing = [k for k in range(t + 1) if not all(e is False for e in R[t][k])]
    add_memory_recurrence(model, t, computing, retained, float(max(problem.capacity, 0)), added, budget_while,
                          lambda k: _frees_after(model, problem, t, k, R, S))


def _frees_after(model: LinearModel, problem: _Problem, t: int, k: int, R: list[list[list[Entry]]],
                 S: list[list[Entry]]) -> Linear:
    """FREE[t,i,k] for what k reads and k itself, as the memory change after k: minus the freed
    bytes, plus the consumed input's bytes when k ran in place (they now belong to k)."""
    change: Linear = ([], 0.0)
    candidates = sorted({i for c in problem.choices[k] for i in c.reads} | {k})
    for i in candidates:
        read = _reads(problem, R, t, k, i)
        later = [_reads(problem, R, t, j, i) for j in problem.readers[i] if k < j <= t]
        kept = entries_sum([S[t + 1][i]])
        hazards = [kept, *later]
        if (not read[0] and read[1] <= 0) or any(not h[0] and h[1] >= 1 for h in hazards):
            continue
        if not read[0] and all(not h[0] and h[1] <= 0 for h in hazards):
            change = linear_plus(change, ([], -float(problem.size[i])))
            continue
        free = model.add_var(f"FREE[{t},{i},{k}]")
        _at_most(model, ([(free, 1.0)], 0.0), read)
        for hazard in hazards:
            _at_most(model, linear_plus(([(free, 1.0)], 0.0), hazard), ([], 1.0))
        # 1 - FREE <= (1 - read) + kept + later reads
        _at_most(model, linear_plus(read, ([], 0.0)), linear_plus(([(free, 1.0)], 0.0), *hazards))
        change = linear_plus(change, ([(free, -float(problem.size[i]))], 0.0))
    for p, choice in enumerate(problem.choices[k]):
        if choice.inplace is not None:
            change = linear_plus(change, linear_scaled(entries_sum([R[t][k][p]]), problem.size[choice.inplace]))
    return change


# -------------------------------------------------------------------- from the solution to a Schedule
def _chosen(entries: list[Entry], values: list[float]) -> int | None:
    for p, entry in enumerate(entries):
        if entry is True or (entry is not False and values[entry] > 0.5):
            return p
    return None


def _schedule(problem: _Problem, variables: _Variables, values: list[float]) -> Schedule:
    """Stage by stage, in position order, each position with its chosen implementation; the frees of
    :func:`coop.formulations.stages.solution.schedule_from_stage_steps` (a consumed input is gone already)."""
    stages: list[list[StageStep]] = []
    for t in range(problem.positions):
        stage = []
        for k in range(t + 1):
            p = _chosen(variables.R[t][k], values)
            if p is not None:
                choice = problem.choices[k][p]
                stage.append(StageStep(k, choice.reads, choice.name, choice.inplace))
        stages.append(stage)
    kept = [retained_from_solution(variables.S, values, t + 1) for t in range(problem.positions)]
    return schedule_from_stage_steps(problem.ids, stages, kept)


# -------------------------------------------------------------------- entry point
def _check_monet_options(graph: Graph, budget: int, options: MonetOptions) -> None:
    """MONeT's option checks, run first at every budget (one CoopError line each)."""
    if options.model not in ("auto", "stage", "intervals"):
        raise CoopError(f"monet model {options.model!r} is unknown: choose auto, stage or intervals")
    check_order(options.order)


@formulation("monet", options=MonetOptions, check_options=_check_monet_options)
def monet(graph: Graph, budget: int, options: MonetOptions) -> SolveResult:
    """MONeT's joint MILP (Shah et al. 2021) over the stage model described in the module docstring.

    ``exact=True`` never chooses an implementation marked inexact. ``solver``: highs (OR-Tools),
    cbc (PuLP), scip or cp-sat. Status ``optimal`` means optimal over the stage space with every
    implementation offered; ``feasible`` a schedule whose optimality is not proven (time limit,
    conservative sizes, or the remat-only warm start kept because the solver found nothing cheaper).

    ``model``: ``"stage"`` (the exact stage MILP), ``"intervals"`` (the O(n) interval model) or ``"auto"``:
    the stage MILP up to ``max_nodes`` positions, the interval model above. ``recompute=False`` (MONeT's
    "implementation choice only" ablation: every node computed once, the interval model) and
    ``max_intervals`` (the interval model's C) apply to the interval model. ``order``: the order first
    computations keep (:func:`coop.formulations.core.solving_order.solving_graph`: auto, captured or deferred).

    Parameters
    ----------
    graph : Graph
        The training step, with its nodes' implementations (``Node.impls``).
    budget : int
        The memory budget in the graph's units, caller-owned values included.
    options : MonetOptions
        ``time_limit``, ``threads``, ``progress``, ``verbose``, ``solver``: the wall-clock limit (warm starts
        included), worker threads, a progress callback, the solver's log and the MILP backend; ``hint``: schedules
        (or results) that compete as warm starts; ``captured``: unused; ``deadline``: the solve's (made by the
        entry), each stage gets what is left of it; ``exact``, ``max_nodes``, ``warm_start``, ``recompute``,
        ``model``, ``max_intervals``, ``order``: as above.

    Returns
    -------
    SolveResult
        The schedule with the implementations it uses (``extra["implementations"]``).

    References
    ----------
    Shah et al., "Memory Optimization for Deep Networks", ICLR 2021; the stages are Checkmate's
    (Jain et al., MLSys 2020, section 4).
    """
    # options.captured is unused: implementations and their costs come from the graph
    deadline, threads, progress, exact, solver = (options.deadline, options.threads, options.progress, options.exact,
                                                  options.solver)
    graph, order = solving_graph(graph, options.order)
    positions = len(stage_order(graph))
    if options.model == "intervals" or not options.recompute or (options.model == "auto"
                                                                  and positions > options.max_nodes):
        intervals = MonetIntervalsOptions(time_limit=max(1e-3, deadline.remaining()), deadline=deadline,
                                          threads=threads, progress=progress, hint=options.hint, exact=exact,
                                          recompute=options.recompute, max_intervals=options.max_intervals)
        result = monet_intervals(graph, budget, options=intervals)
        result.extra["order"] = order
        return result
    warm = (_cheapest_warm_start(graph, budget, options.hint, exact, deadline.remaining(), threads)
            if options.warm_start else None)
    problem = _project(graph, budget, exact)
    if problem.capacity < 0:
        return SolveResult("monet", "infeasible", wall_s=deadline.elapsed(),
                           message=f"budget {budget} is below the caller-owned values' {graph.caller_owned_bytes}")
    model, variables = _build(problem)
    if warm is not None and model.objective:  # only schedules cheaper than the warm start are of interest
        model.add_row(list(model.objective), "<=", warm[2].cost * (1 + 1e-9) + 1e-9 - model.objective_constant)
    solution = solve_milp(model, solver, time_limit=deadline.remaining(), threads=threads, progress=progress,
                          verbose=options.verbose)
    result = _result(graph, budget, problem, variables, solution, warm, exact)
    result.wall_s = deadline.elapsed()
    result.extra.update({"solver": solver, "variables": model.num_vars, "constraints": len(model.rows),
                         "memory_unit": problem.unit, "memory_exact": problem.exact_memory, "exact": exact,
                         "order": order})
    return result


def _cheapest_warm_start(graph: Graph, budget: int, hint: Any, exact: bool, time_limit: float,
                         threads: int) -> tuple[str, Schedule, Simulation] | None:
    """The cheapest fitting warm start (:func:`coop.formulations.monet.intervals.monet_warm_starts`): the best
    remat-only schedule (moccasin, Bartan et al. 2023), so
    that monet is never worse than it, and below the remat-only least peak the lightest-implementation
    schedule, so that the MILP starts from a point that fits."""
    hints = list(hint) if isinstance(hint, list | tuple) else ([] if hint is None else [hint])
    found = monet_warm_starts(graph, budget, hints, exact, True, time_limit, threads)
    return min(found, key=lambda candidate: candidate[2].cost, default=None)


def _result(graph: Graph, budget: int, problem: _Problem, variables: _Variables, solution: MilpSolution,
            warm: tuple[str, Schedule, Simulation] | None, exact: bool) -> SolveResult:
    found: tuple[Schedule, Simulation] | None = None
    if solution.values is not None:
        schedule = _schedule(problem, variables, solution.values)
        sim = simulate(graph, schedule)
        if sim.peak <= budget and not (exact and _uses_inexact(graph, schedule)):
            found = (schedule, sim)
    if found is not None and (warm is None or found[1].cost <= warm[2].cost):
        status = solution.status if solution.status == "optimal" and problem.exact_memory else "feasible"
        bound = solution.bound if problem.exact_memory else None  # a conservative model bounds nothing
        if status == "optimal":
            bound = min(bound if bound is not None else found[1].cost, found[1].cost)
        return SolveResult("monet", status, schedule=found[0], simulation=found[1], objective=found[1].cost,
                           bound=bound, message=solution.message, extra=_choices(graph, found[0]))
    if warm is not None:
        note = ("the solver proved nothing in its space is cheaper" if solution.status in ("infeasible", "optimal")
                else f"the solver found nothing cheaper in time ({solution.message or solution.status})")
        bound = warm[2].cost if solution.status == "infeasible" else solution.bound
        bound = bound if problem.exact_memory else None
        return SolveResult("monet", "feasible", schedule=warm[1], simulation=warm[2], objective=warm[2].cost,
                           bound=None if bound is None else min(bound, warm[2].cost),
                           message=f"kept the remat-only warm start ({warm[0]}): {note}",
                           extra={"warm_start": warm[0], **_choices(graph, warm[1])})
    if solution.status == "infeasible" and problem.exact_memory:
        return SolveResult("monet", "infeasible", message=f"no schedule fits budget {budget} in MONeT's stage space "
                           "with these implementations (proven); try a larger budget")
    return SolveResult("monet", "unknown", bound=solution.bound,
                       message=f"no schedule within the time limit ({solution.message or solution.status}); "
                               "raise time_limit")


def _uses_inexact(graph: Graph, schedule: Schedule) -> bool:
    return any(not graph.node(s.node).implementation(s.impl).exact for s in schedule.steps if s.impl is not None)


def _choices(graph: Graph, schedule: Schedule) -> dict[str, Any]:
    """Which implementations the plan uses (a plan says which inexact ones it relies on)."""
    used = sorted({(s.node, s.impl) for s in schedule.steps if s.op == "compute" and s.impl is not None})
    inexact = [f"{node}:{impl}" for node, impl in used if not graph.node(node).implementation(impl).exact]
    return {"implementations": [f"{node}:{impl}" for node, impl in used], "inexact_implementations": inexact}


__all__ = ["monet", "stage_order"]
