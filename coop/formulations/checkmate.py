"""Checkmate: optimal tensor rematerialization as a MILP, and its two-phase LP rounding.

Jain, Jain, Paranjape, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate:
Breaking the Memory Wall with Optimal Tensor Rematerialization", MLSys 2020.

The schedule is split into T frontier-advancing stages, T = the number of computed nodes and
position t = the t-th node of ``prompt_order(graph)``. Stage t computes node t (``R[t,t] = 1``) and may
recompute earlier nodes; nothing later is touched (``R`` lower triangular, ``S`` strictly so).
Variables (section 4 of the paper, the same names below):

* ``R[t,i]`` -- node i is (re)computed in stage t;
* ``S[t,i]`` -- node i is retained in memory from stage t-1 into stage t;
* ``FREE[t,i,k]`` -- node i is freed right after computing node k in stage t (i an input of k,
  or k itself); linearised from the paper's hazards: k is computed, i is not retained into stage
  t+1, and no later user of i is computed in stage t;
* ``U[t,k]`` -- memory in use while node k is computed in stage t (resident values + k's output).

Constraints: ``R[t,k] <= R[t,i] + S[t,i]`` for every input i of k; ``S[t+1,i] <= R[t,i] +
S[t,i]``; ``U[t,k] + workspace[k] * R[t,k] <= budget - caller-owned bytes``; graph outputs are
retained after the last stage; nodes with ``recomputable=False`` are computed in their own stage
only. Objective: ``sum R[t,i] * cost[i]``.

The MILP's memory accounting is conservative (a retained value counts through the whole stage),
so the extracted schedule is always re-simulated with :func:`coop.schedule.simulate`; the
reported peak and cost are the simulator's.

Section 5's approximation (:func:`checkmate_lp`): solve the LP relaxation, round ``S`` with
deterministic thresholds and randomised rounding, recompute on demand what ``S`` does not keep
(phase two: for a fixed ``S`` the cheapest ``R`` is forced), and keep the cheapest schedule that
the simulator says fits.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from functools import reduce
from typing import Any, Protocol

from coop.budget import below_min_budget
from coop.errors import SolverError
from coop.formulations.milp_backends import LinearModel, MilpSolution, solve_lp_relaxation, solve_milp
from coop.formulations.progress import Progress, ProgressCallback
from coop.formulations.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, Step, prompt_order, simulate

DEFAULT_MAX_NODES = 600
#: The LP is solved at the budget, then, while no rounding fits and time remains, at these
#: fractions of the memory left after caller-owned values.
LP_BUDGET_FACTORS = (1.0, 0.9, 0.8, 0.7)
#: CP-SAT reasons over integers; beyond this many memory levels the budget is coarsened.
CP_SAT_MEMORY_LEVELS = 1 << 40

#: What Checkmate's proofs of infeasibility speak about, for messages: the frontier-advancing stages
#: and the one restriction coop adds (an extra output is taken right after its op, in a stage that
#: recomputes nothing, so that no step comes between unseen).
SEARCH_SPACE = ("Checkmate's space: frontier-advancing stages over graph.order, each extra output of a "
                "multi-output op taken in its own stage right after the op, with nothing recomputed there")

# A matrix entry is a model variable index (int) or a constant fixed by the stage structure.
Entry = int | bool


@dataclass(frozen=True)
class _Problem:
    """The graph projected onto order positions, with memory in integer units."""

    ids: tuple[int, ...]                 # position -> node id
    mem: tuple[int, ...]                 # output size in units
    workspace: tuple[int, ...]
    cost: tuple[float, ...]
    deps: tuple[tuple[int, ...], ...]    # positions of the computed inputs
    users: tuple[tuple[int, ...], ...]   # positions of the consumers, ascending
    recomputable: tuple[bool, ...]
    extra_output: tuple[bool, ...]       # an extra output of a multi-output op (Node.output_of)
    outputs: frozenset[int]              # positions that must be resident at the end
    capacity: int                        # budget minus caller-owned memory, in units
    unit: int                            # bytes (graph units) per memory unit
    exact: bool                          # False when sizes were rounded up to a coarser unit

    @property
    def size(self) -> int:
        return len(self.ids)


def _project(graph: Graph, budget: int, memory_levels: int | None) -> _Problem:
    """Positions in ``prompt_order(graph)`` (extra outputs right after their op); memory divided by
    the gcd of all sizes (exact), or rounded up to a coarser unit when that leaves more than
    ``memory_levels`` levels (feasibility kept: sizes round up, the budget rounds down)."""
    order = prompt_order(graph)
    position = {node_id: p for p, node_id in enumerate(order)}
    nodes = [graph.node(i) for i in order]
    sizes = [n.mem for n in nodes] + [n.workspace for n in nodes]
    capacity_bytes = budget - graph.caller_owned_bytes
    unit = reduce(math.gcd, [s for s in sizes if s > 0], 0) or 1
    exact = True
    if memory_levels is not None and capacity_bytes > 0 and capacity_bytes // unit > memory_levels:
        unit = math.ceil(capacity_bytes / memory_levels)
        exact = False
    users: list[list[int]] = [[] for _ in order]
    deps = []
    for p, node in enumerate(nodes):
        computed_inputs = tuple(sorted(position[i] for i in node.inputs if i in position))
        deps.append(computed_inputs)
        for d in computed_inputs:
            users[d].append(p)
    return _Problem(
        ids=tuple(order),
        mem=tuple(-(-n.mem // unit) for n in nodes),
        workspace=tuple(-(-n.workspace // unit) for n in nodes),
        cost=tuple(float(n.cost) for n in nodes),
        deps=tuple(deps),
        users=tuple(tuple(sorted(u)) for u in users),
        recomputable=tuple(n.recomputable for n in nodes),
        extra_output=tuple(n.output_of is not None for n in nodes),
        outputs=frozenset(position[i] for i in graph.outputs if i in position),
        capacity=capacity_bytes // unit if capacity_bytes >= 0 else -1,
        unit=unit,
        exact=exact,
    )


# -------------------------------------------------------------------- the MILP (section 4)
@dataclass
class _Variables:
    """Where each of the paper's variables lives in the LinearModel."""

    R: list[list[Entry]]                     # R[t][i], i <= t
    S: list[list[Entry]]                     # S[t][i], i < t, t = 0..T (S[T] = after the last stage)


class ModelExtension(Protocol):
    """A hook that adds a formulation's own variables to Checkmate's model (POET's paging).

    ``add_variables`` runs once R and S exist; ``retention_sources(t, i)`` lists variables that may
    also make i resident at the start of stage t+1 (a page-in), added to the right of
    ``S[t+1,i] <= R[t,i] + S[t,i]``; ``kept_to_stage_end(t, i)`` lists variables that, when 1, keep
    i on the device to the end of stage t (a page-out there), added as hazards of FREE.
    """

    def add_variables(self, model: LinearModel, problem: _Problem, R: list[list[Entry]], S: list[list[Entry]]) -> None: ...

    def retention_sources(self, t: int, i: int) -> list[int]: ...

    def kept_to_stage_end(self, t: int, i: int) -> list[int]: ...


def _build_model(problem: _Problem, extension: ModelExtension | None = None) -> tuple[LinearModel, _Variables]:
    model = LinearModel()
    T = problem.size
    last_use = _latest_possible_reads(problem)

    # R[t,i]: stage t computes node t; non-recomputable nodes only in their own stage. The stage
    # of an extra output (right after its op's, or another extra output's) recomputes nothing:
    # the value exists from its op's compute (contract 2), so no step may come between unseen.
    R: list[list[Entry]] = []
    for t in range(T):
        row: list[Entry] = []
        for i in range(t + 1):
            if i == t:
                row.append(True)
            elif not problem.recomputable[i] or problem.extra_output[t]:
                row.append(False)
            else:
                row.append(model.add_var(f"R[{t},{i}]"))
        R.append(row)

    # S[t,i]: retaining i into stage t is useful only if i may still be read in stage t or later
    # (by a user at position >= t, or by a recomputation of a user in a later stage), or i is a
    # graph output; otherwise it is fixed to 0 (keeping it could only cost memory).
    S: list[list[Entry]] = [[]]
    for t in range(1, T + 1):
        row = []
        for i in range(t):
            if t == T:
                row.append(i in problem.outputs)
            elif last_use[i] >= t or i in problem.outputs:
                row.append(model.add_var(f"S[{t},{i}]"))
            else:
                row.append(False)
        S.append(row)
    if extension is not None:
        extension.add_variables(model, problem, R, S)

    def available(t: int, i: int) -> tuple[list[tuple[int, float]], float]:
        """R[t,i] + S[t,i] as (terms, constant)."""
        terms, constant = [], 0.0
        for entry in (R[t][i], S[t][i] if i < t else False):
            if entry is True:
                constant += 1
            elif entry is not False:
                terms.append((entry, 1.0))
        return terms, constant

    for t in range(T):
        for k in range(t + 1):
            # An input must be present when k is computed: R[t,k] <= R[t,i] + S[t,i].
            for i in problem.deps[k]:
                terms, constant = available(t, i)
                _add_implication(model, R[t][k], terms, constant)
        for i in range(t + 1):
            # Retention needs a copy in the previous stage: S[t+1,i] <= R[t,i] + S[t,i].
            terms, constant = available(t, i)
            if extension is not None:
                terms += [(v, 1.0) for v in extension.retention_sources(t, i)]
            _add_implication(model, S[t + 1][i], terms, constant)

    for t in range(T):
        _add_stage_memory(model, problem, t, R, S, extension)

    offset = 0.0
    for t in range(T):
        for i in range(t + 1):
            if R[t][i] is True:
                offset += problem.cost[i]
            elif R[t][i] is not False and problem.cost[i]:
                model.objective.append((R[t][i], problem.cost[i]))
    model.objective_constant = offset
    return model, _Variables(R=R, S=S)


def _latest_possible_reads(problem: _Problem) -> list[int]:
    """For each position i, the last stage in which any schedule may read i.

    A user j reads i when j is computed: in stage j, and, if j is recomputable, in any later stage
    up to the last one that may read j. Graph outputs may be read up to the end.
    """
    T = problem.size
    latest = [-1] * T
    for i in range(T - 1, -1, -1):
        for j in problem.users[i]:
            reads_of_j_until = max(j, latest[j]) if problem.recomputable[j] else j
            if problem.recomputable[j] and j in problem.outputs:
                reads_of_j_until = T - 1
            latest[i] = max(latest[i], reads_of_j_until)
    return latest


def _add_implication(model: LinearModel, lhs: Entry, terms: list[tuple[int, float]], constant: float) -> None:
    """lhs <= sum(terms) + constant, skipping rows that always hold; False rhs forces lhs = 0."""
    if lhs is False or constant >= 1:
        return
    if lhs is True:
        model.add_row(terms, ">=", 1 - constant)
    else:
        model.add_row([(lhs, 1.0)] + [(v, -c) for v, c in terms], "<=", constant)


def _add_stage_memory(model: LinearModel, problem: _Problem, t: int, R: list[list[Entry]],
                      S: list[list[Entry]], extension: ModelExtension | None = None) -> None:
    """U[t,k] and FREE[t,i,k] of stage t, and the budget at every compute of the stage.

    U is only materialised at positions that may compute (R[t,k] not fixed to 0): between two
    such positions nothing is computed or freed, so the chain U[t,k] = U[t,prev] - freed(prev)
    + M[k] R[t,k] is the paper's recurrence with the idle positions folded away.
    """
    retained = [(S[t][i], problem.mem[i]) for i in range(t) if S[t][i] is not False]
    previous_u: int | None = None
    pending_frees: list[tuple[int, float]] = []  # -M_i FREE[t,i,prev] terms (variables)
    pending_constant = 0.0                       # frees fixed to 1
    for k in range(t + 1):
        if R[t][k] is False:
            continue
        u = model.add_var(f"U[{t},{k}]", "continuous", 0.0, float(problem.capacity))
        terms: list[tuple[int, float]] = [(u, 1.0)]
        constant = 0.0
        if previous_u is None:
            # U[t,first] = sum_i S[t,i] M_i + R[t,first] M_first
            for entry, mem in retained:
                if entry is True:
                    constant += mem
                else:
                    terms.append((entry, -float(mem)))
        else:
            terms.append((previous_u, -1.0))
            terms += pending_frees  # U - U_prev + sum M_i FREE[t,i,prev] - M_k R[t,k] = const
            constant -= pending_constant
        if R[t][k] is True:
            constant += problem.mem[k]
        else:
            terms.append((R[t][k], -float(problem.mem[k])))
        model.add_row(terms, "==", constant)
        # The budget while k runs: U[t,k] + workspace[k] R[t,k] <= capacity.
        if problem.workspace[k]:
            if R[t][k] is True:
                model.add_row([(u, 1.0)], "<=", problem.capacity - problem.workspace[k])
            else:
                model.add_row([(u, 1.0), (R[t][k], float(problem.workspace[k]))], "<=", problem.capacity)
        pending_frees, pending_constant = _add_frees_after(model, problem, t, k, R, S, extension)
        previous_u = u


def _add_frees_after(model: LinearModel, problem: _Problem, t: int, k: int, R: list[list[Entry]],
                     S: list[list[Entry]], extension: ModelExtension | None = None
                     ) -> tuple[list[tuple[int, float]], float]:
    """FREE[t,i,k] for i in DEPS[k] + {k}; returns the freed memory as (M_i, FREE) terms and a
    constant for frees fixed to 1.

    FREE = R[t,k] (1 - S[t+1,i]) prod_{j in USERS[i], k < j <= t} (1 - R[t,j]): each hazard
    bounds FREE from above (the disaggregated form, tighter than the paper's kappa row) and
    ``1 - FREE <= sum of hazards`` makes it exactly the product.
    """
    terms: list[tuple[int, float]] = []
    constant = 0.0
    for i in problem.deps[k] + (k,):
        hazards: list[tuple[Entry, bool]] = [(R[t][k], True)]  # (entry, whether FREE <= entry)
        hazards.append((S[t + 1][i] if i < t + 1 else False, False))
        hazards += [(R[t][j], False) for j in problem.users[i] if k < j <= t]
        if extension is not None:
            hazards += [(v, False) for v in extension.kept_to_stage_end(t, i)]
        if any(entry is (not positive) for entry, positive in hazards):
            continue  # a hazard always present: never freed here
        live = [(entry, positive) for entry, positive in hazards if not isinstance(entry, bool)]
        if not live:
            constant += problem.mem[i]
            continue
        free = model.add_var(f"FREE[{t},{i},{k}]")
        lower_terms: list[tuple[int, float]] = [(free, 1.0)]
        lower_rhs = 1.0
        for entry, positive in live:
            if positive:
                model.add_row([(free, 1.0), (entry, -1.0)], "<=", 0.0)  # FREE <= R[t,k]
                lower_terms.append((entry, -1.0))
                lower_rhs -= 1.0
            else:
                model.add_row([(free, 1.0), (entry, 1.0)], "<=", 1.0)  # FREE <= 1 - hazard
                lower_terms.append((entry, 1.0))
        # 1 - FREE <= (1 - R[t,k]) + S[t+1,i] + sum R[t,j]
        model.add_row(lower_terms, ">=", lower_rhs)
        if problem.mem[i]:
            terms.append((free, float(problem.mem[i])))
    return terms, constant


# -------------------------------------------------------------------- from R and S to a Schedule
def _value(entry: Entry, values: list[float]) -> bool:
    return entry if isinstance(entry, bool) else values[entry] > 0.5


def _stages_from_solution(variables: _Variables, values: list[float], size: int) -> tuple[list[list[int]], list[set[int]]]:
    computed = [[i for i in range(t + 1) if _value(variables.R[t][i], values)] for t in range(size)]
    retained = [{i for i in range(t) if _value(variables.S[t][i], values)} for t in range(size + 1)]
    return computed, retained


def _schedule_from_stages(problem: _Problem, computed: list[list[int]], retained: list[set[int]],
                          boundaries: list[tuple[list[int], list[int]]] | None = None) -> Schedule:
    """Stage by stage: compute the R[t,i] = 1 nodes in order; free a value right after its last
    user in the stage when it is not retained into the next stage (the paper's FREE).

    ``boundaries[t]`` = (page-outs, page-ins) after stage t (POET): a value paged out there is kept
    to the end of the stage; the page-outs, then the page-ins, follow the stage's last step.
    """
    steps: list[Step] = []
    size = problem.size
    for t in range(size):
        in_stage = set(computed[t])
        page_out, page_in = boundaries[t] if boundaries is not None else ([], [])
        keep_next = (retained[t + 1] if t + 1 <= size else set()) | set(page_out)
        for k in computed[t]:
            steps.append(Step(op="compute", node=problem.ids[k]))
            for i in problem.deps[k] + (k,):
                later_user = any(j in in_stage for j in problem.users[i] if k < j <= t)
                if not later_user and i not in keep_next:
                    steps.append(Step(op="free", node=problem.ids[i]))
        steps += [Step(op="page_out", node=problem.ids[i]) for i in page_out]
        steps += [Step(op="page_in", node=problem.ids[i]) for i in page_in]
    return Schedule(steps=tuple(steps))


def _stages_for_retention(problem: _Problem, keep: Any) -> tuple[list[list[int]], list[set[int]]]:
    """Phase two of the LP rounding: for a fixed retention choice ``keep(t, i)`` the cheapest R.

    Walk the stages backwards: what stage t+1 reads from retention must be present at the end of
    stage t. Within a stage, walk positions backwards: a demanded value is retained from the
    previous stage when ``keep`` says so (or it cannot be recomputed), else recomputed here,
    which demands its own inputs. Every compute is forced, so this R is the least for that S.
    """
    size = problem.size
    computed: list[list[int]] = [[] for _ in range(size)]
    retained: list[set[int]] = [set() for _ in range(size + 1)]
    retained[size] = set(problem.outputs)
    for t in range(size - 1, -1, -1):
        demanded = set(retained[t + 1])
        stage: list[int] = []
        for k in range(t, -1, -1):
            if k != t and k not in demanded:
                continue
            if k != t and (not problem.recomputable[k] or keep(t, k)):
                retained[t].add(k)
                continue
            stage.append(k)
            demanded.update(problem.deps[k])
        computed[t] = sorted(stage)
    return computed, retained


# -------------------------------------------------------------------- entry points
def checkmate(
    graph: Graph,
    budget: int,
    *,
    solver: str = "cbc",
    time_limit: float = 60.0,
    threads: int = 2,
    progress: ProgressCallback | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
    memory_levels: int | None = None,
    cost_limit: float | None = None,
    verbose: bool = False,
) -> SolveResult:
    """The Checkmate MILP (Jain et al. 2020, section 4) solved with ``solver``.

    ``solver``: cbc (PuLP), scip, highs, cp-sat (OR-Tools), gurobi or cplex (PuLP, when
    installed). ``memory_levels`` coarsens memory to at most that many units of the budget
    (CP-SAT defaults to 2**40: exact for any realistic graph); a coarsened model's optimum is
    reported as ``feasible``, since its proof holds for the rounded sizes only. Checkmate's space
    is the frontier-advancing schedules over ``graph.order`` whose extra outputs (of multi-output
    ops) are taken right after their op, in a stage that recomputes nothing (:data:`SEARCH_SPACE`):
    ``infeasible`` above min_budget means no such schedule fits. Options other
    than these are rejected.

    ``cost_limit`` searches only the schedules that cost at most that much (e.g. just below an
    incumbent's cost, to prove it optimal or find a cheaper one): every schedule of the space
    computes each node once in its own stage, so a node whose cost exceeds ``cost_limit`` minus
    the baseline cost is never recomputed (its R entries are fixed to 0, which shrinks the model
    a lot when the limit is tight), and the objective is bounded by the limit. ``infeasible``
    then means that no schedule of the space fits the budget at that cost; ``optimal`` still
    means optimal over the whole space (every schedule left out costs more).
    """
    early = _early_result("checkmate", graph, budget, max_nodes)
    if early is not None:
        return early
    if memory_levels is None and solver.lower().replace("_", "-") in ("cp-sat", "cpsat"):
        memory_levels = CP_SAT_MEMORY_LEVELS
    started = time.perf_counter()
    problem = _project(graph, budget, memory_levels)
    model, variables = _build_model(problem)
    if cost_limit is not None:
        _limit_cost(model, problem, variables, cost_limit)
    # Building the model counts against the time limit (seconds for a few hundred nodes); the
    # solver gets what is left, even a few milliseconds: that solves a small model.
    remaining = time_limit - (time.perf_counter() - started)
    solution = solve_milp(model, solver, time_limit=remaining, threads=threads, progress=progress, verbose=verbose)
    solution.wall_s = time.perf_counter() - started  # the whole solve, model building included
    return _result_from_milp(graph, budget, problem, variables, solution, solver, len(model.rows), model.num_vars,
                             cost_limit)


def _limit_cost(model: LinearModel, problem: _Problem, variables: _Variables, cost_limit: float) -> None:
    """Restrict the model to schedules costing at most ``cost_limit`` (see :func:`checkmate`)."""
    extra = cost_limit - model.objective_constant  # the cost of computing every node once
    for t, row in enumerate(variables.R):
        for i in range(t):
            if not isinstance(row[i], bool) and problem.cost[i] > extra:
                model.upper[row[i]] = 0.0
    if all(float(c).is_integer() for _, c in model.objective):
        extra = math.floor(extra + 1e-9)  # integral costs: the same schedules, and an integral row (CP-SAT)
    model.add_row(list(model.objective), "<=", extra)


def checkmate_lp(
    graph: Graph,
    budget: int,
    *,
    time_limit: float = 60.0,
    threads: int = 2,
    progress: ProgressCallback | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
    thresholds: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    random_roundings: int = 16,
    seed: int = 0,
) -> SolveResult:
    """Checkmate's two-phase LP rounding (Jain et al. 2020, section 5).

    Solve the LP relaxation of the MILP; round S at each deterministic threshold and with
    ``random_roundings`` randomised roundings (keep with probability S*); for each rounding
    recompute on demand (the least R for that S); simulate; return the cheapest schedule that
    fits. When none fits, the LP is solved again under a tighter budget (:data:`LP_BUDGET_FACTORS`)
    and rounded again, while the time limit allows. ``bound`` is the optimum of the LP at the
    full budget, a lower bound on every schedule's cost. Model building, every LP and every
    rounding count against ``time_limit``.
    """
    started = time.perf_counter()
    early = _early_result("checkmate-lp", graph, budget, max_nodes)
    if early is not None:
        return early
    deadline = started + time_limit  # building the model and rounding count against the limit too
    rng = random.Random(seed)
    lower_bound: float | None = None
    best: tuple[Schedule, Simulation, str] | None = None
    fitting = tried = planned = 0
    lp_notes: list[str] = []
    for factor in LP_BUDGET_FACTORS:
        if lower_bound is not None and (best is not None or time.perf_counter() > deadline):
            break
        # Rounding can overshoot the LP's budget; when no rounding fits, the LP is solved again
        # under a tighter budget (the schedules are still checked against the real one).
        lp_budget = graph.caller_owned_bytes + math.floor(factor * (budget - graph.caller_owned_bytes))
        problem = _project(graph, lp_budget, None)
        model, variables = _build_model(problem)
        relaxation = solve_lp_relaxation(model, time_limit=deadline - time.perf_counter(), threads=threads)
        lp_notes.append(f"x{factor:g}: {relaxation.message}")
        if relaxation.values is None:
            if lower_bound is None:
                return _lp_failure(relaxation, model, budget, time_limit, time.perf_counter() - started)
            break  # a tighter LP that is infeasible or unsolved in time: keep what the first gave
        if lower_bound is None:
            lower_bound = relaxation.objective or 0.0  # the full-budget LP bounds every schedule
        rules = _rounding_rules(variables, relaxation.values, thresholds, random_roundings, rng, factor)
        planned += len(rules)
        for label, keep in rules:
            if tried and time.perf_counter() > deadline:
                break  # at least one rounding always runs: the LP solution is already paid for
            tried += 1
            computed, retained = _stages_for_retention(problem, keep)
            schedule = _schedule_from_stages(problem, computed, retained)
            sim = simulate(graph, schedule)
            if sim.peak <= budget:
                fitting += 1
                if best is None or sim.cost < best[1].cost:
                    best = (schedule, sim, label)
            if progress is not None:
                progress(Progress(time.perf_counter() - started, best[1].cost if best else None, lower_bound, label))
    wall = time.perf_counter() - started
    extra = {"roundings": tried, "fitting": fitting, "lp_solver": "; ".join(lp_notes)}
    cut_short = f" (time limit: {tried} of {planned} roundings tried)" if tried < planned else ""
    if best is None:
        return SolveResult("checkmate-lp", "unknown", objective=None, bound=lower_bound, wall_s=wall, extra=extra,
                           message=f"none of the {tried} LP roundings fits the budget {budget}{cut_short}; "
                                   f"try checkmate (MILP) or chen-greedy")
    schedule, sim, label = best
    extra["rounding"] = label
    return SolveResult("checkmate-lp", "feasible", schedule=schedule, simulation=sim, objective=sim.cost,
                       bound=lower_bound, wall_s=wall, extra=extra,
                       message=f"best of {fitting}/{tried} fitting roundings ({label}){cut_short}")


def _lp_failure(relaxation: MilpSolution, model: LinearModel, budget: int, time_limit: float,
                wall: float) -> SolveResult:
    """The result when the full-budget LP relaxation gives no solution: infeasible, or unsolved in time."""
    extra = {"variables": model.num_vars, "constraints": len(model.rows), "lp_wall_s": relaxation.wall_s}
    if relaxation.status == "infeasible":
        return SolveResult("checkmate-lp", "infeasible", wall_s=wall, extra=extra,
                           message=f"LP relaxation proven infeasible: no schedule fits budget {budget} in "
                                   f"{SEARCH_SPACE}; try a larger budget or moccasin")
    return SolveResult("checkmate-lp", "unknown", wall_s=wall, extra=extra,
                       message=f"LP relaxation ({model.num_vars} variables, {len(model.rows)} constraints) not "
                               f"solved within the {time_limit:g} s time limit [{relaxation.message}]; raise "
                               f"time_limit or use chen-greedy or moccasin")


def _rounding_rules(variables: _Variables, values: list[float], thresholds: tuple[float, ...],
                    random_roundings: int, rng: random.Random, factor: float) -> list[tuple[str, Any]]:
    """Section 5's deterministic thresholds and randomised roundings of the LP's S."""
    def retention(t: int, i: int) -> float:
        entry = variables.S[t][i]
        return float(entry) if isinstance(entry, bool) else values[entry]

    tag = "" if factor == 1 else f" (LP budget x{factor:g})"
    rules: list[tuple[str, Any]] = [(f"threshold {tau:g}{tag}", _threshold_rule(retention, tau)) for tau in thresholds]
    rules += [(f"random #{n}{tag}", _random_rule(retention, rng)) for n in range(random_roundings)]
    return rules


def _threshold_rule(retention: Any, tau: float) -> Any:
    return lambda t, i: retention(t, i) >= tau


def _random_rule(retention: Any, rng: random.Random) -> Any:
    # Each (t, i) decided once, so that repeated queries of one rounding agree.
    draws: dict[tuple[int, int], bool] = {}

    def keep(t: int, i: int) -> bool:
        if (t, i) not in draws:
            draws[(t, i)] = rng.random() < retention(t, i)
        return draws[(t, i)]

    return keep


def _early_result(name: str, graph: Graph, budget: int, max_nodes: int) -> SolveResult | None:
    """Refuse graphs too big for an O(n^2) model; answer budgets below min_budget."""
    if len(graph.order) > max_nodes:
        raise SolverError(
            f"graph {graph.name!r} has {len(graph.order)} computed nodes, above max_nodes={max_nodes}: "
            f"Checkmate's MILP has O(n^2) variables; use moccasin, or raise max_nodes"
        )
    if below := below_min_budget(budget, graph):
        return SolveResult(name, "infeasible", message=below)
    return None


def _result_from_milp(graph: Graph, budget: int, problem: _Problem, variables: _Variables, solution: MilpSolution,
                      solver: str, num_rows: int, num_vars: int, cost_limit: float | None = None) -> SolveResult:
    extra: dict[str, Any] = {"solver": solver, "variables": num_vars, "constraints": num_rows,
                             "memory_unit": problem.unit, "memory_exact": problem.exact, "cost_limit": cost_limit}
    objective, bound = solution.objective, solution.bound
    if solution.values is None:
        status = solution.status if solution.status == "infeasible" and problem.exact else "unknown"
        message = solution.message or solution.status
        if status == "infeasible":
            at_cost = "" if cost_limit is None else f" at a cost of at most {cost_limit:g}"
            message = (f"no schedule fits budget {budget}{at_cost} in {SEARCH_SPACE} (proven by {solver}); "
                       f"try a larger budget or moccasin")
        if solution.status == "infeasible" and not problem.exact:
            message = "infeasible with memory rounded up to the coarse unit; retry with a larger memory_levels"
        return SolveResult("checkmate", status, wall_s=solution.wall_s, message=message, extra=extra)
    computed, retained = _stages_from_solution(variables, solution.values, problem.size)
    schedule = _schedule_from_stages(problem, computed, retained)
    sim = simulate(graph, schedule)
    extra["milp_objective"] = objective
    if sim.peak > budget:
        return SolveResult("checkmate", "unknown", wall_s=solution.wall_s, bound=bound, extra=extra,
                           message=f"the solver's schedule simulates to peak {sim.peak} > budget {budget} "
                                   f"(numerical tolerance); not returned")
    status = solution.status
    if status == "optimal" and not problem.exact:
        status, bound = "feasible", None
    if status == "optimal":
        bound = min(bound if bound is not None else sim.cost, sim.cost)
    return SolveResult("checkmate", status, schedule=schedule, simulation=sim, objective=sim.cost, bound=bound,
                       wall_s=solution.wall_s, extra=extra, message=solution.message)


__all__ = ["checkmate", "checkmate_lp"]
