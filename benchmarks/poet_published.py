"""POET's *published* MILP, re-implemented from the paper as an independent reference (PuLP + CBC).

Patil, Jain, Dutta, Stoica, Gonzalez, "POET: Training Neural Networks on Tiny Devices with
Integrated Rematerialization and Paging", ICML 2022, section 3 and appendix; the semantics its
public solver gives POET's graphs are written down in ``graphs/poet/README.md``. This
module is written from those equations, not from any repository's code, and it imports neither
``coop.formulations.poet.milp`` nor Checkmate: it is the reference that coop's ``poet`` is compared with
(``benchmarks/bench_poet.py``, ``tests/test_poet_published.py``). It uses coop only to read the
graph, to replay the schedule it returns through coop's one simulator (:func:`coop.schedule.simulate`)
and to price it with coop's device-profile model (:mod:`coop.device_profiles`), so that both are
priced the same.

The model (stage t first-computes the node at position t of the order; the paper's names):

* ``R[t,i]`` compute i in stage t (``R[t,t] = 1``, nothing above the diagonal);
  ``S_RAM[t,i]`` i on the device at the start of stage t; ``S_SD[t,i]`` i on the slow tier;
  ``M_in[t,i]`` / ``M_out[t,i]`` page i in / out during stage t; ``FREE[t,(i,k)]`` Checkmate's
  free of i after computing k; continuous ``U[t,k]``, device bytes while stage t computes k.
* ``R[t,v] <= R[t,u] + S_RAM[t,u]`` for every edge u -> v;
  ``S_RAM[t+1,i] <= S_RAM[t,i] + R[t,i] + M_in[t,i]``; ``S_SD[t+1,i] <= S_SD[t,i] + M_out[t,i]``;
  ``M_in <= S_SD``; ``M_out <= S_RAM``.
* ``U[t,0] = R[t,0] m_0 + sum_i S_RAM[t,i] m_i``; ``U[t,k+1] = U[t,k] + R[t,k+1] m_{k+1} - sum
  FREE[t,(i,k)] m_i``; ``0 <= U <= budget``; FREE as Checkmate's (i is freed after its last use in
  stage t unless kept into stage t+1).
* objective ``sum R compute_j + sum M_in pagein_j + sum M_out pageout_j`` (or the same in seconds);
  optional runtime budget ``sum R runtime_s <= factor x sum runtime_s``.

Where the published semantics differ from coop's ``poet`` (``semantics="published"``, the default,
keeps every one of them; ``semantics="coop"`` switches all of them to coop's, which the test uses
to show the reference and coop's poet solve the same problem):

1. **Runtime budget counts compute only** in the published model; coop's counts compute plus
   paging time (stricter). ``coop``: paging seconds are added.
2. **The slow-tier copy persists**: once paged out, a value may be paged in again and again
   (``S_SD`` only needs one earlier page-out), also after it was recomputed. In coop a page moves
   the value (one tier at a time), so a second page-in needs a second page-out. The converted
   schedule pays that page-out again: its coop price can exceed the model's own objective, and
   both numbers are reported. ``coop``: ``S_SD[t+1] <= S_SD[t] + M_out[t] - M_in[t]``,
   ``S_SD[t+1] <= 1 - R[t] + M_out[t]``, ``M_in[t] + R[t] <= 1``.
3. **A page-out needs the value resident at the start of the stage** (``M_out[t,i] <= S_RAM[t,i]``)
   and its device copy is counted through stage t under the FREE rule; coop pages out at the
   boundary after stage t any value on the device there (``M_out[t,i] <= R[t,i] + S_RAM[t,i]``,
   kept to the stage's end, gone from the next stage). ``coop``: those rows.
4. Page-ins are counted from the start of the next stage in both (``S_RAM[t+1]`` in ``U[t+1,0]``).
5. Prices: the published code reads joules from its platform table (and scales ``memory_power``
   in place, so a second solve in one process sees another value); here every price comes from
   the coop :class:`~coop.device_profiles.DeviceProfile`, as coop's poet does.
6. Graph features POET's graphs never have (caller-owned values, outputs, workspace,
   implementations, extra outputs, optional values) are refused with :class:`PublishedModelError`;
   a non-recomputable node gets ``R[t,i] = 0`` below the diagonal.

Two equivalent reductions: variables that the published model's own constraints fix at zero
(``U[t,k]`` and ``FREE`` for k > t, the upper triangles) are not created, and the objective is
scaled so that the baseline scores 1e4 (a microcontroller's joules are 1e-5; CBC's absolute
tolerances would swallow them). Neither changes the optimum.

Conversion to a coop Schedule (the same for both semantics): stage by stage, the computes of
``R[t]`` in order; a value leaves the device right after its last use in the stage (at the stage's
start when the stage does not use it) unless ``S_RAM[t+1]`` keeps it; it leaves by ``page_out``
when a page-in brings it back before any recomputation, else by ``free``; at the stage's end the
values of ``S_RAM[t+1]`` not on the device are paged in. Each value is on the device no longer than
the model counts it, so the simulated peak is at most the model's ``U``.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pulp as pl

from coop.device_profiles import DeviceProfile, load_device_profile
from coop.errors import CoopError
from coop.graph import Graph
from coop.schedule import Schedule, ScheduleError, Step, simulate

Semantics = Literal["published", "coop"]
Objective = Literal["energy", "time"]
#: The objective is scaled so that the baseline (every node computed once) scores this.
OBJECTIVE_SCALE = 1e4


class PublishedModelError(CoopError):
    """A graph or option the published POET model has no meaning for."""


@dataclass(frozen=True)
class _Instance:
    """The graph by position in its order, with the prices of one compute / page-in / page-out."""

    ids: tuple[int, ...]
    mem: tuple[int, ...]
    seconds: tuple[float, ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    recomputable: tuple[bool, ...]
    compute: tuple[float, ...]
    pagein: tuple[float, ...]
    pageout: tuple[float, ...]
    pagein_s: tuple[float, ...]
    pageout_s: tuple[float, ...]

    @property
    def size(self) -> int:
        return len(self.ids)


def _instance(graph: Graph, profile: DeviceProfile, objective: Objective) -> _Instance:
    unsupported = [(n.id, what) for n in graph.nodes for what, present in (
        ("caller-owned", n.caller_owned), ("workspace", n.workspace), ("implementations", n.impls),
        ("extra output", n.output_of is not None), ("optional", n.optional)) if present]
    if unsupported or graph.outputs:
        node, what = unsupported[0] if unsupported else (graph.outputs[0], "output")
        raise PublishedModelError(f"graph {graph.name!r}: node {node} has a feature ({what}) that POET's published "
                                  "model has no meaning for; compare on graphs of POET's layout (graphs/poet)")
    position = {node_id: p for p, node_id in enumerate(graph.order)}
    nodes = [graph.node(i) for i in graph.order]
    preds = tuple(tuple(sorted({position[u] for u in n.inputs})) for n in nodes)
    succs: list[list[int]] = [[] for _ in nodes]
    for v, inputs in enumerate(preds):
        for u in inputs:
            succs[u].append(v)
    pin_s = tuple(profile.pagein_s(n.mem) for n in nodes)
    pout_s = tuple(profile.pageout_s(n.mem) for n in nodes)
    if objective == "energy":
        compute = tuple(profile.compute_j(float(n.cost)) for n in nodes)
        pagein, pageout = (tuple(profile.pagein_j(n.mem) for n in nodes), tuple(profile.pageout_j(n.mem) for n in nodes))
    else:
        compute, pagein, pageout = tuple(float(n.cost) for n in nodes), pin_s, pout_s
    return _Instance(tuple(graph.order), tuple(n.mem for n in nodes), tuple(float(n.cost) for n in nodes), preds,
                     tuple(tuple(s) for s in succs), tuple(n.recomputable for n in nodes), compute, pagein, pageout,
                     pin_s, pout_s)


# -------------------------------------------------------------------- the model
@dataclass
class _Model:
    problem: pl.LpProblem
    R: dict[tuple[int, int], Any]
    S: dict[tuple[int, int], Any]
    SSD: dict[tuple[int, int], Any]
    MIN: dict[tuple[int, int], Any]
    MOUT: dict[tuple[int, int], Any]
    scale: float


def _binary(name: str) -> Any:
    return pl.LpVariable(name, cat=pl.LpBinary)


def _build(inst: _Instance, budget: int, runtime_budget: float | None, paging: bool, remat: bool,
           semantics: Semantics) -> _Model:
    T = inst.size
    problem = pl.LpProblem("POET_published", pl.LpMinimize)
    R: dict[tuple[int, int], Any] = {}
    for t in range(T):
        R[t, t] = _binary(f"R_{t}_{t}")
        R[t, t].lowBound = 1  # R[t,t] = 1 (PuLP resets a binary's bounds at creation)
        for i in range(t):
            if remat and inst.recomputable[i]:
                R[t, i] = _binary(f"R_{t}_{i}")
    S = {(t, i): _binary(f"SRam_{t}_{i}") for t in range(1, T) for i in range(t)}  # S_RAM, below the diagonal
    SSD: dict[tuple[int, int], Any] = {}
    MIN: dict[tuple[int, int], Any] = {}
    MOUT: dict[tuple[int, int], Any] = {}
    if paging:
        SSD = {(t, i): _binary(f"SSd_{t}_{i}") for t in range(1, T) for i in range(t)}
        MIN = {(t, i): _binary(f"MIn_{t}_{i}") for t in range(1, T) for i in range(t)}
        first = 0 if semantics == "coop" else 1  # coop: a value computed in stage t may leave after it
        MOUT = {(t, i): _binary(f"MOut_{t}_{i}") for t in range(first, T) for i in range(t + (semantics == "coop"))}
    scale = OBJECTIVE_SCALE / max(sum(inst.compute), 1e-300) if sum(inst.compute) > 0 else 1.0
    problem += scale * (pl.lpSum(inst.compute[i] * var for (_, i), var in R.items())
                        + pl.lpSum(inst.pagein[i] * var for (_, i), var in MIN.items())
                        + pl.lpSum(inst.pageout[i] * var for (_, i), var in MOUT.items()))
    model = _Model(problem, R, S, SSD, MIN, MOUT, scale)
    _add_dependencies_and_retention(model, inst, semantics)
    _add_memory(model, inst, budget, semantics)
    if runtime_budget is not None:
        seconds = [inst.seconds[i] * var for (_, i), var in R.items()]
        if semantics == "coop":
            seconds += [inst.pagein_s[i] * var for (_, i), var in MIN.items()]
            seconds += [inst.pageout_s[i] * var for (_, i), var in MOUT.items()]
        problem += pl.lpSum(seconds) <= runtime_budget * sum(inst.seconds) * (1 + 1e-9), "runtime_budget"
    return model


def _add_dependencies_and_retention(model: _Model, inst: _Instance, semantics: Semantics) -> None:
    problem, R, S, SSD, MIN, MOUT = model.problem, model.R, model.S, model.SSD, model.MIN, model.MOUT
    T = inst.size
    for t in range(T):
        for v in range(t + 1):
            for u in inst.preds[v]:  # R[t,v] <= R[t,u] + S_RAM[t,u]
                if (t, v) in R:
                    problem += R[t, v] <= R.get((t, u), 0) + S.get((t, u), 0)
    for (t, i), kept in S.items():  # S_RAM[t,i] <= S_RAM[t-1,i] + R[t-1,i] + M_in[t-1,i]
        problem += kept <= S.get((t - 1, i), 0) + R.get((t - 1, i), 0) + MIN.get((t - 1, i), 0)
    for (t, i), page_in in MIN.items():  # M_in <= S_SD
        problem += page_in <= SSD[t, i]
    for (t, i), page_out in MOUT.items():
        if semantics == "published":  # M_out <= S_RAM
            problem += page_out <= S[t, i]
        else:  # coop: only a value on the device at the stage's end leaves, and it leaves the device
            problem += page_out <= R.get((t, i), 0) + S.get((t, i), 0)
            if (t + 1, i) in S:
                problem += page_out + S[t + 1, i] <= 1
    for (t, i), on_host in SSD.items():
        if semantics == "published":  # S_SD[t,i] <= S_SD[t-1,i] + M_out[t-1,i]: the copy persists
            problem += on_host <= SSD.get((t - 1, i), 0) + MOUT.get((t - 1, i), 0)
        else:  # coop: a page moves the value, and a recomputation drops the host copy
            problem += on_host <= SSD.get((t - 1, i), 0) + MOUT.get((t - 1, i), 0) - MIN.get((t - 1, i), 0)
            problem += on_host <= 1 - R.get((t - 1, i), 0) + MOUT.get((t - 1, i), 0)
            problem += on_host + S[t, i] <= 1
            if (t, i) in MIN and (t, i) in R:
                problem += MIN[t, i] + R[t, i] <= 1


def _add_memory(model: _Model, inst: _Instance, budget: int, semantics: Semantics) -> None:
    """U and Checkmate's FREE rule; under ``coop`` a value paged out after stage t is kept to its end."""
    problem, R, S = model.problem, model.R, model.S
    for t in range(inst.size):
        U = [pl.LpVariable(f"U_{t}_{k}", lowBound=0, upBound=budget) for k in range(t + 1)]
        problem += U[0] == inst.mem[0] * R.get((t, 0), 0) + pl.lpSum(inst.mem[i] * S[t, i] for i in range(t))
        for k in range(t):
            freed = [inst.mem[i] * _free(model, inst, t, i, k, semantics) for i in inst.preds[k] if (t, k) in R]
            problem += U[k + 1] == U[k] + inst.mem[k + 1] * R.get((t, k + 1), 0) - pl.lpSum(freed)


def _free(model: _Model, inst: _Instance, t: int, i: int, k: int, semantics: Semantics) -> Any:
    """FREE[t,(i,k)] = 1 exactly when none of the hazards holds (Checkmate, Jain et al. 2020, eq. 4-5):
    k not computed in stage t, i kept into stage t+1, a later consumer of i computed in stage t
    (and under ``coop``, i paged out after stage t)."""
    R, S = model.R, model.S
    hazards: list[Any] = [1 - R[t, k]]
    if (t + 1, i) in S:
        hazards.append(S[t + 1, i])
    hazards += [R[t, j] for j in inst.succs[i] if k < j <= t and (t, j) in R]
    if semantics == "coop" and (t, i) in model.MOUT:
        hazards.append(model.MOUT[t, i])
    free = _binary(f"Free_{t}_{i}_{k}")
    model.problem += 1 - free <= pl.lpSum(hazards)
    model.problem += len(hazards) * (1 - free) >= pl.lpSum(hazards)
    return free


# -------------------------------------------------------------------- solving
@dataclass
class PublishedResult:
    """What the published model found, its schedule replayed and priced by coop.

    ``objective``: the model's own objective (its accounting, unscaled: J or s); ``energy_j`` /
    ``time_s``: coop's price of the converted schedule (they differ where difference 2 of the
    module docstring applies); ``peak``: coop's simulated peak (None when there is no schedule).
    """

    status: str                  # optimal, feasible (time limit), infeasible (proven), unknown
    schedule: Schedule | None = None
    objective: float | None = None
    bound: float | None = None
    build_s: float = 0.0
    solve_s: float = 0.0
    energy_j: float | None = None
    time_s: float | None = None
    compute_s: float | None = None
    peak: int | None = None
    recomputations: int | None = None
    page_ins: int | None = None
    page_outs: int | None = None
    message: str = ""

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        return max(0.0, self.objective - self.bound) / max(abs(self.objective), 1e-300)

    @property
    def wall_s(self) -> float:
        return self.build_s + self.solve_s


def solve_published(graph: Graph, budget: int, device_profile: str | DeviceProfile, *, objective: Objective = "energy",
                    runtime_budget: float | None = None, paging: bool = True, remat: bool = True,
                    semantics: Semantics = "published", time_limit: float = 60.0, threads: int = 1) -> PublishedResult:
    """Solve POET's published MILP with CBC, convert its solution to a coop Schedule, validate and price it.

    ``runtime_budget``: a factor of the baseline compute time (``sum R runtime_s <= factor x sum
    runtime_s``; with ``semantics="coop"`` paging time counts too). ``time_limit``: CBC's limit in
    seconds (building the model is timed apart, ``build_s``).
    """
    if objective not in ("energy", "time") or semantics not in ("published", "coop"):
        raise PublishedModelError(f"objective {objective!r} / semantics {semantics!r}: choose energy or time / "
                                  "published or coop")
    if not remat and not paging:
        raise PublishedModelError("remat=False and paging=False leave only the baseline; allow one of them")
    profile = load_device_profile(device_profile)
    inst = _instance(graph, profile, objective)
    started = time.perf_counter()
    model = _build(inst, budget, runtime_budget, paging, remat, semantics)
    built = time.perf_counter()
    status, bound = _run_cbc(model.problem, time_limit, threads)
    result = PublishedResult(status, build_s=built - started, solve_s=time.perf_counter() - built)
    if status not in ("optimal", "feasible"):
        result.message = "CBC proved the model infeasible" if status == "infeasible" else "CBC found no solution in time"
        return result
    result.objective = pl.value(model.problem.objective) / model.scale
    result.bound = result.objective if status == "optimal" else (None if bound is None else bound / model.scale)
    _replay(graph, inst, model, profile, budget, result)
    return result


def _run_cbc(problem: pl.LpProblem, time_limit: float, threads: int) -> tuple[str, float | None]:
    """Solve with PuLP's bundled CBC; the status, and the best bound read from CBC's log when it stopped early."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "cbc.log"
        solver = pl.PULP_CBC_CMD(msg=False, timeLimit=max(1, round(time_limit)), threads=threads, logPath=str(log))
        problem.solve(solver)
        text = log.read_text() if log.exists() else ""
    bound = re.search(r"Lower bound:\s*(-?[0-9.eE+-]+)", text)
    if problem.status == pl.LpStatusInfeasible:
        return "infeasible", None
    if problem.sol_status == pl.LpSolutionOptimal:
        return "optimal", None
    if problem.sol_status == pl.LpSolutionIntegerFeasible:
        return "feasible", float(bound.group(1)) if bound else None
    return "unknown", None


def _chosen(variables: dict[tuple[int, int], Any]) -> set[tuple[int, int]]:
    return {key for key, var in variables.items() if (var.varValue or 0.0) > 0.5}


def _replay(graph: Graph, inst: _Instance, model: _Model, profile: DeviceProfile, budget: int,
            result: PublishedResult) -> None:
    """Convert, simulate with coop's simulator, price with coop's profile; a failure is reported, not raised."""
    try:
        schedule = to_schedule(inst, _chosen(model.R), _chosen(model.S))
        simulation = simulate(graph, schedule)
    except (ScheduleError, ValueError) as exc:
        result.status, result.message = "invalid", f"the solution does not convert to a legal schedule: {exc}"
        return
    result.schedule, result.peak, result.recomputations = schedule, simulation.peak, simulation.recomputations
    price = price_schedule(graph, schedule, profile)
    result.energy_j, result.time_s, result.compute_s = price["energy_j"], price["time_s"], price["compute_s"]
    result.page_ins, result.page_outs = price["page_ins"], price["page_outs"]
    if simulation.peak > budget:
        result.status = "invalid"
        result.message = f"the converted schedule peaks at {simulation.peak} B, above the budget {budget} B"


def to_schedule(inst: _Instance, computed: set[tuple[int, int]], kept: set[tuple[int, int]]) -> Schedule:
    """The coop Schedule of a solution given by its R (``computed``) and S_RAM (``kept``) entries, as (stage, position).

    Paging follows from them (module docstring): a value dropped from the device is paged out when
    a page-in brings it back before any recomputation; ``ValueError`` when the solution is not a
    legal POET schedule (an input not resident, a page-in with no host copy).
    """
    T = inst.size
    steps: list[Step] = []
    device: set[int] = set()
    host: set[int] = set()

    def leave(i: int, t: int) -> None:
        device.discard(i)
        if _paged_in_before_recomputed(i, t, T, computed, kept):
            steps.append(Step(op="page_out", node=inst.ids[i]))
            host.add(i)
        else:
            steps.append(Step(op="free", node=inst.ids[i]))

    for t in range(T):
        stays = {i for (s, i) in kept if s == t + 1}
        if device != {i for (s, i) in kept if s == t}:
            raise ValueError(f"stage {t}: the device holds {sorted(device)}, S_RAM says otherwise")
        order = sorted(k for (s, k) in computed if s == t)
        last_use = {i: k for k in order for i in inst.preds[k]}
        for i in sorted(device - stays - set(last_use)):
            leave(i, t)  # not used in this stage and not kept: off the device from the stage's start
        for k in order:
            missing = [u for u in inst.preds[k] if u not in device]
            if missing:
                raise ValueError(f"stage {t}: position {k} reads {missing}, not on the device")
            steps.append(Step(op="compute", node=inst.ids[k]))
            device.add(k)
            host.discard(k)  # coop: recomputing drops a host copy
            for i in [u for u in inst.preds[k] if last_use[u] == k and u not in stays] + [k] * (k not in last_use):
                if i in device and i not in stays:
                    leave(i, t)
        for i in sorted(stays - device):
            if i not in host:
                raise ValueError(f"stage {t}: S_RAM[{t + 1},{i}] needs a page-in of a value with no host copy")
            steps.append(Step(op="page_in", node=inst.ids[i]))
            host.discard(i)
            device.add(i)
    return Schedule(steps=tuple(steps))


def _paged_in_before_recomputed(i: int, t: int, T: int, computed: set[tuple[int, int]],
                                kept: set[tuple[int, int]]) -> bool:
    """Whether i, leaving the device in stage t, is next needed through a page-in (kept into a stage
    after one that does not compute it) rather than a recomputation."""
    for s in range(t, T):
        if s > t and (s, i) in computed:
            return False
        if (s + 1, i) in kept and (s, i) not in computed:
            return True
    return False


def price_schedule(graph: Graph, schedule: Schedule, profile: DeviceProfile) -> dict[str, Any]:
    """Energy and time of a schedule on a profile by coop's device-profile model (compute and paging)."""
    price = {"compute_j": 0.0, "paging_j": 0.0, "compute_s": 0.0, "paging_s": 0.0, "page_ins": 0, "page_outs": 0}
    for step in schedule.steps:
        node = graph.node(step.node)
        if step.op == "compute":
            price["compute_j"] += profile.compute_j(float(node.cost))
            price["compute_s"] += float(node.cost)
        elif step.op == "page_in":
            price["paging_j"] += profile.pagein_j(node.mem)
            price["paging_s"] += profile.pagein_s(node.mem)
            price["page_ins"] += 1
        elif step.op == "page_out":
            price["paging_j"] += profile.pageout_j(node.mem)
            price["paging_s"] += profile.pageout_s(node.mem)
            price["page_outs"] += 1
    return {**price, "energy_j": price["compute_j"] + price["paging_j"], "time_s": price["compute_s"] + price["paging_s"]}


__all__ = ["PublishedModelError", "PublishedResult", "price_schedule", "solve_published", "to_schedule"]
