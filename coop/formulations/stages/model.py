"""The frontier-advancing stage model that Checkmate, POET and MONeT solve.

Jain, Jain, Paranjape, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate: Breaking
the Memory Wall with Optimal Tensor Rematerialization", MLSys 2020, section 4.

A schedule is split into T frontier-advancing stages, T = the number of positions: stage t
computes position t and may recompute earlier positions; nothing later is touched. The model's
variables, in the paper's names:

* ``R[t,i]`` -- position i is (re)computed in stage t (MONeT: ``R[t,i,p]``, with implementation p);
* ``S[t,i]`` -- i is retained in memory from stage t-1 into stage t (``S[T,i]``: after the last stage);
* ``FREE[t,i,k]`` -- i is freed right after k is computed in stage t;
* ``U[t,k]`` -- the memory in use while k is computed in stage t.

This module holds what the three formulations share:

* :class:`StageProblem` and :func:`project`: a graph projected onto order positions with memory in
  integer units (one choice per node: the node's own cost, memory and workspace);
* :func:`build_stage_model`: Checkmate's MILP on a :class:`StageProblem`, with a
  :class:`ModelExtension` hook through which POET adds its paging variables;
* the parts of the model MONeT (Shah et al., ICLR 2021) builds with per-node implementation
  choices too: :func:`latest_possible_reads`, :func:`add_retention_variables` (S) and
  :func:`add_memory_recurrence` (the U chain, with each formulation's bytes, workspace and frees);
* from a solution to a :class:`~coop.schedule.Schedule` (``stages_from_solution``, ``schedule_from_stages``,
  ``schedule_from_stage_steps``): :mod:`coop.formulations.stages.solution`.

The rows MONeT writes for reads, in-place execution and FREE keep their own forms in
:mod:`coop.formulations.monet.milp` (they add rows that always hold where Checkmate's builder writes
none), so that both models stay what they were.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Protocol

from coop.formulations.core.deadline import Deadline
from coop.formulations.milp.backends import LinearModel
from coop.graph import Graph
from coop.schedule import prompt_order

#: A matrix entry: a model variable index (int) or a constant fixed by the stage structure.
Entry = int | bool
#: A linear expression: (variable, coefficient) terms and a constant.
Linear = tuple[list[tuple[int, float]], float]


# -------------------------------------------------------------------- the problem
@dataclass(frozen=True)
class StageProblem:
    """A graph projected onto order positions, with memory in integer units (one choice per node)."""

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
        """The number of positions (and stages)."""
        return len(self.ids)


def project(graph: Graph, budget: int, memory_levels: int | None) -> StageProblem:
    """Project ``graph`` onto the positions of ``prompt_order(graph)`` (extra outputs right after their op).

    Parameters
    ----------
    graph : Graph
        The training step.
    budget : int
        The memory budget in the graph's units (caller-owned values included).
    memory_levels : int or None
        At most this many memory units below the budget: memory is divided by the gcd of all sizes
        (exact), or rounded up to a coarser unit when that leaves more than ``memory_levels`` levels
        (feasibility kept: sizes round up, the budget rounds down). None: always exact.

    Returns
    -------
    StageProblem
        The positions, their sizes in units, inputs, users and the capacity left for computed values.

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4: the graph's topological order fixes the stages.
    """
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
    return StageProblem(
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


# -------------------------------------------------------------------- linear expressions over entries
def entries_sum(entries: Sequence[Entry]) -> Linear:
    """The sum of 0-1 entries as a linear expression (True adds 1 to the constant, False nothing).

    Parameters
    ----------
    entries : sequence of Entry
        Variable indices or constants.

    Returns
    -------
    Linear
        ``(terms, constant)``.
    """
    terms, constant = [], 0.0
    for entry in entries:
        if entry is True:
            constant += 1
        elif entry is not False:
            terms.append((entry, 1.0))
    return terms, constant


def linear_plus(*parts: Linear) -> Linear:
    """The sum of linear expressions (terms kept in order, not merged).

    Parameters
    ----------
    *parts : Linear
        Expressions to add.

    Returns
    -------
    Linear
        Their sum.
    """
    return [t for terms, _ in parts for t in terms], sum(c for _, c in parts)


def linear_scaled(expression: Linear, factor: float) -> Linear:
    """``factor`` times ``expression``.

    Returns
    -------
    Linear
        The scaled expression.
    """
    return [(v, c * factor) for v, c in expression[0]], expression[1] * factor


def entry_value(entry: Entry, values: Sequence[float]) -> bool:
    """Whether an entry is 1 in a solution (a variable above 0.5, or the constant itself).

    Parameters
    ----------
    entry : Entry
        A variable index or a constant.
    values : sequence of float
        The solution's variable values.

    Returns
    -------
    bool
        The entry's 0-1 value.
    """
    return entry if isinstance(entry, bool) else values[entry] > 0.5


# -------------------------------------------------------------------- shared parts of the model
def latest_possible_reads(readers: Sequence[Sequence[int]], recomputable: Sequence[bool],
                          outputs: frozenset[int]) -> list[int]:
    """For each position i, the last stage in which any schedule of the stage space may read i.

    A reader j reads i when j is computed: in stage j, and, if j is recomputable, in any later stage
    up to the last one that may read j. Graph outputs may be read up to the end.

    Parameters
    ----------
    readers : sequence of sequences of int
        Per position, the positions that may read it, ascending.
    recomputable : sequence of bool
        Per position, whether it may be computed in a later stage than its own.
    outputs : frozenset of int
        The positions of graph outputs.

    Returns
    -------
    list of int
        Per position, the last stage that may read it (-1: none).

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4: ``S[t,i]`` is fixed to 0 where no later stage reads i.
    """
    T = len(readers)
    latest = [-1] * T
    for i in range(T - 1, -1, -1):
        for j in readers[i]:
            until = max(j, latest[j]) if recomputable[j] else j
            if recomputable[j] and j in outputs:
                until = T - 1
            latest[i] = max(latest[i], until)
    return latest


def add_retention_variables(model: LinearModel, latest_reads: Sequence[int], outputs: frozenset[int]) -> list[list[Entry]]:
    """The ``S[t,i]`` variables, t = 1..T (``S[0]`` is empty, ``S[T]`` the graph outputs after the last stage).

    Retaining i into stage t is useful only if i may still be read in stage t or later, or i is a graph
    output; otherwise ``S[t,i]`` is fixed to 0 (keeping it could only cost memory).

    Parameters
    ----------
    model : LinearModel
        The model the variables are added to (named ``S[t,i]``).
    latest_reads : sequence of int
        :func:`latest_possible_reads` per position.
    outputs : frozenset of int
        The positions of graph outputs.

    Returns
    -------
    list of lists of Entry
        ``S[t][i]`` for i < t.

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4.
    """
    T = len(latest_reads)
    S: list[list[Entry]] = [[]]
    for t in range(1, T + 1):
        row: list[Entry] = []
        for i in range(t):
            if t == T:
                row.append(i in outputs)
            elif latest_reads[i] >= t or i in outputs:
                row.append(model.add_var(f"S[{t},{i}]"))
            else:
                row.append(False)
        S.append(row)
    return S


def add_memory_recurrence(model: LinearModel, t: int, computing: Sequence[int], retained: Linear, upper: float,
                          added: Callable[[int], Linear], budget_while: Callable[[int, int], None],
                          change_after: Callable[[int], Linear]) -> None:
    """``U[t,k]`` for the positions of stage t that may compute, chained by the paper's recurrence.

    ``U[t,first] = retained + added(first)`` and ``U[t,k] = U[t,prev] + change_after(prev) + added(k)``:
    between two positions that may compute nothing is computed or freed, so the idle positions are
    folded away.

    Parameters
    ----------
    model : LinearModel
        The model the ``U[t,k]`` variables and their rows are added to.
    computing : sequence of int
        The positions that may compute in stage t, ascending.
    retained : Linear
        The memory retained into stage t (``sum_i S[t,i] M_i``).
    upper : float
        The upper bound of every ``U[t,k]``.
    added : callable
        ``added(k)``: the memory computing k adds (``M_k R[t,k]``).
    budget_while : callable
        ``budget_while(u, k)`` adds the budget rows while k runs (its workspace), u the index of ``U[t,k]``.
    change_after : callable
        ``change_after(k)``: the memory change right after k (minus the frees), adding the FREE variables.

    Returns
    -------
    None

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4 (the U/FREE recurrence); MONeT (Shah et al., ICLR 2021)
    puts each implementation's workspace in the same rows.
    """
    previous: int | None = None
    carried: Linear = ([], 0.0)
    for k in computing:
        u = model.add_var(f"U[{t},{k}]", "continuous", 0.0, upper)
        before = retained if previous is None else linear_plus(([(previous, 1.0)], 0.0), carried)
        rhs = linear_plus(before, added(k))
        model.add_row([(u, 1.0)] + [(v, -c) for v, c in rhs[0]], "==", rhs[1])
        budget_while(u, k)
        carried = change_after(k)
        previous = u


# -------------------------------------------------------------------- Checkmate's model (one choice per node)
@dataclass
class StageVariables:
    """Where each of the paper's variables lives in the LinearModel."""

    R: list[list[Entry]]                     # R[t][i], i <= t
    S: list[list[Entry]]                     # S[t][i], i < t, t = 0..T (S[T] = after the last stage)


class ModelExtension(Protocol):
    """A hook that adds a formulation's own variables to the stage model (POET's paging).

    ``add_variables`` runs once R and S exist; ``retention_sources(t, i)`` lists variables that may
    also make i resident at the start of stage t+1 (a page-in), added to the right of
    ``S[t+1,i] <= R[t,i] + S[t,i]``; ``kept_to_stage_end(t, i)`` lists variables that, when 1, keep
    i on the device to the end of stage t (a page-out there), added as hazards of FREE.
    """

    def add_variables(self, model: LinearModel, problem: StageProblem, R: list[list[Entry]],
                      S: list[list[Entry]]) -> None: ...

    def retention_sources(self, t: int, i: int) -> list[int]: ...

    def kept_to_stage_end(self, t: int, i: int) -> list[int]: ...


def build_stage_model(problem: StageProblem, extension: ModelExtension | None = None,
                      deadline: Deadline | None = None) -> tuple[LinearModel, StageVariables]:
    """Checkmate's MILP over the stages of ``problem``, with a formulation's own variables added by ``extension``.

    ``R[t,t] = 1``; non-recomputable nodes only in their own stage; the stage of an extra output
    recomputes nothing. ``R[t,k] <= R[t,i] + S[t,i]`` for every input i of k; ``S[t+1,i] <= R[t,i] +
    S[t,i]`` (+ the extension's retention sources); ``U[t,k] + workspace[k] R[t,k] <= capacity``;
    objective ``sum R[t,i] cost[i]`` (the forced ``R[t,t]`` in the objective's constant).

    Parameters
    ----------
    problem : StageProblem
        The projected graph (:func:`project`).
    extension : ModelExtension or None
        Adds variables and rows (POET's paging); None: Checkmate's model.
    deadline : Deadline or None
        Stop building once it passes (:class:`~coop.formulations.core.deadline.DeadlinePassed`): the O(T^2) model of
        captured ResNet-50 (353 nodes, 348k variables) took 38 s to build on 2 busy cores.

    Returns
    -------
    tuple of (LinearModel, StageVariables)
        The model and where R and S live in it.

    Raises
    ------
    DeadlinePassed
        When ``deadline`` passes while it builds.

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4.
    """
    model = LinearModel()
    T = problem.size
    building = f"building the stage model of {T} positions"

    def in_time() -> None:
        if deadline is not None:
            deadline.check(building)

    last_use = latest_possible_reads(problem.users, problem.recomputable, problem.outputs)

    # R[t,i]: stage t computes node t; non-recomputable nodes only in their own stage. The stage
    # of an extra output (right after its op's, or another extra output's) recomputes nothing:
    # the value exists from its op's compute (contract 2), so no step may come between unseen.
    R: list[list[Entry]] = []
    for t in range(T):
        in_time()
        row: list[Entry] = []
        for i in range(t + 1):
            if i == t:
                row.append(True)
            elif not problem.recomputable[i] or problem.extra_output[t]:
                row.append(False)
            else:
                row.append(model.add_var(f"R[{t},{i}]"))
        R.append(row)

    S = add_retention_variables(model, last_use, problem.outputs)
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
        in_time()
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
        in_time()
        add_stage_memory(model, problem, t, R, S, extension)

    offset = 0.0
    for t in range(T):
        for i in range(t + 1):
            if R[t][i] is True:
                offset += problem.cost[i]
            elif R[t][i] is not False and problem.cost[i]:
                model.objective.append((R[t][i], problem.cost[i]))
    model.objective_constant = offset
    return model, StageVariables(R=R, S=S)


def _add_implication(model: LinearModel, lhs: Entry, terms: list[tuple[int, float]], constant: float) -> None:
    """lhs <= sum(terms) + constant, skipping rows that always hold; False rhs forces lhs = 0."""
    if lhs is False or constant >= 1:
        return
    if lhs is True:
        model.add_row(terms, ">=", 1 - constant)
    else:
        model.add_row([(lhs, 1.0)] + [(v, -c) for v, c in terms], "<=", constant)


def add_stage_memory(model: LinearModel, problem: StageProblem, t: int, R: list[list[Entry]],
                     S: list[list[Entry]], extension: ModelExtension | None = None) -> None:
    """``U[t,k]`` and ``FREE[t,i,k]`` of stage t, and the budget at every compute of the stage.

    U is only materialised at positions that may compute (R[t,k] not fixed to 0): between two
    such positions nothing is computed or freed, so the chain U[t,k] = U[t,prev] - freed(prev)
    + M[k] R[t,k] is the paper's recurrence with the idle positions folded away.

    Parameters
    ----------
    model : LinearModel
        The model the variables and rows are added to.
    problem : StageProblem
        The projected graph.
    extension : ModelExtension or None
        Its ``kept_to_stage_end`` variables are hazards of FREE.

    Returns
    -------
    None

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4.
    """
    terms: list[tuple[int, float]] = []
    constant = 0.0
    for i in range(t):
        entry = S[t][i]
        if entry is True:
            constant += problem.mem[i]
        elif entry is not False:
            terms.append((entry, float(problem.mem[i])))
    retained: Linear = (terms, constant)

    def added(k: int) -> Linear:
        return ([], float(problem.mem[k])) if R[t][k] is True else ([(R[t][k], float(problem.mem[k]))], 0.0)

    def budget_while(u: int, k: int) -> None:
        # The budget while k runs: U[t,k] + workspace[k] R[t,k] <= capacity.
        if problem.workspace[k]:
            if R[t][k] is True:
                model.add_row([(u, 1.0)], "<=", problem.capacity - problem.workspace[k])
            else:
                model.add_row([(u, 1.0), (R[t][k], float(problem.workspace[k]))], "<=", problem.capacity)

    def change_after(k: int) -> Linear:
        freed, freed_constant = add_frees_after(model, problem, t, k, R, S, extension)
        return [(v, -c) for v, c in freed], -freed_constant

    computing = [k for k in range(t + 1) if R[t][k] is not False]
    add_memory_recurrence(model, t, computing, retained, float(problem.capacity), added, budget_while, change_after)


def add_frees_after(model: LinearModel, problem: StageProblem, t: int, k: int, R: list[list[Entry]],
                    S: list[list[Entry]], extension: ModelExtension | None = None) -> Linear:
    """``FREE[t,i,k]`` for i in DEPS[k] + {k}: the freed memory as (FREE, M_i) terms and a constant for frees fixed to 1.

    FREE = R[t,k] (1 - S[t+1,i]) prod_{j in USERS[i], k < j <= t} (1 - R[t,j]): each hazard
    bounds FREE from above (the disaggregated form, tighter than the paper's kappa row) and
    ``1 - FREE <= sum of hazards`` makes it exactly the product.

    Parameters
    ----------
    model : LinearModel
        The model the FREE variables and rows are added to.
    problem : StageProblem
        The projected graph.
    t, k : int
        The stage and the position just computed.
    extension : ModelExtension or None
        Its ``kept_to_stage_end`` variables are further hazards.

    Returns
    -------
    Linear
        The memory freed right after k.

    References
    ----------
    Checkmate (Jain et al., MLSys 2020), section 4 (FREE linearised from its hazards).
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


__all__ = ["Entry", "Linear", "ModelExtension", "StageProblem", "StageVariables",
           "add_frees_after", "add_memory_recurrence", "add_retention_variables", "add_stage_memory",
           "build_stage_model", "entries_sum", "entry_value", "latest_possible_reads", "linear_plus",
           "linear_scaled", "project"]
