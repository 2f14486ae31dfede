"""Fast schedules under a budget without a solver: warm starts for the exact formulations.

* :func:`greedy_eviction_schedule`: offline eviction over the baseline order, in the spirit of DTR
  (Kirisame, Lyubomirsky, Haan, Brennan, He, Roesch, Chen, Tatlock: "Dynamic Tensor
  Rematerialization", ICLR 2021) but with exact next-use distances;
* :func:`peak_shaving_schedule`: recompute the value that lowers the peak step most per unit cost
  until the baseline order fits;
* :func:`improve_by_local_search`: destroy-and-repair over compute sequences (Shaw 1998; Pisinger
  and Ropke 2010).

Every schedule they return is judged by the one simulator, :func:`coop.schedule.simulate`; the local
search screens its candidate sequences with :func:`coop.formulations.heuristics.sequence_profile.sequence_profile`
(the same memory profile for plain compute sequences, an order of magnitude faster).
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Callable

from coop.formulations.core.deadline import Deadline
from coop.formulations.heuristics.recompute_polish import drop_needless, recompute_positions
from coop.formulations.heuristics.sequence_profile import (
    SequenceProfile,
    SequenceTables,
    sequence_cost,
    sequence_profile,
)
from coop.formulations.intervals.slots import SlotProblem
from coop.graph import Graph
from coop.schedule import Schedule, Step, simulate


# ==================================================================== eviction heuristic
def greedy_eviction_schedule(graph: Graph, budget: int, rebuild_size_penalty: float = 0.0,
                             deadline: Deadline | None = None) -> Schedule | None:
    """A fast schedule under ``budget``, or None when the heuristic gets stuck.

    Walks the baseline order; before each compute it makes room by freeing the resident value
    with the smallest ``recompute cost / (bytes x distance to next use)`` that the pending
    computations do not need, and recomputes freed inputs on demand (recursively). In the spirit
    of DTR (Kirisame et al. 2021), but offline with exact next-use distances of the baseline order.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    rebuild_size_penalty : float
        p: multiplies each score by ``(1 + inputs / bytes) ** p``, where ``inputs`` are the bytes of
        the value's recomputable inputs: a value much smaller than what it is made from (a ReLU's
        1-byte mask, a pooled map) is cheap to rebuild in time but its rebuild needs the large input
        back in memory, usually where memory is tightest. 0 is DTR's score.
    deadline : Deadline or None
        Give up (None) once it passes: on the published random layered n1000 graph at 0.9 of its peak the walk
        took 36-92 s (a wide graph keeps hundreds of values resident, each scored per eviction).

    Returns
    -------
    Schedule or None
        The schedule, or None when the heuristic gets stuck (or the deadline passes).

    References
    ----------
    Kirisame et al., "Dynamic Tensor Rematerialization", ICLR 2021 (the eviction score).
    """
    problem = SlotProblem.build(graph, budget)
    return GreedyEvictor(problem, rebuild_size_penalty, deadline).run()


#: With a rebuild-size penalty, a backward value (a gradient) is evicted only when no forward value is nearly as
#: good: its rebuild reruns the backward above it, whose inputs are usually gone by then.
GRADIENT_EVICTION_PENALTY = 1e3

#: The rebuild-size penalties the warm starts try (see :func:`greedy_eviction_schedule`): DTR's score and one
#: that keeps shrinking values (masks, pooled maps, packed indices) unless nothing else can go.
REBUILD_SIZE_PENALTIES = (0.0, 2.0)


class _Stuck(Exception):
    """The heuristic found no value it may free to make room."""


#: The eviction heuristic gives up after this many computes per node (it is thrashing).
COMPUTE_LIMIT_FACTOR = 20


class GreedyEvictor:
    """The walk of :func:`greedy_eviction_schedule`, open to subclasses that change one step.

    :meth:`run` walks the baseline order and calls :meth:`compute` for each node; that makes room
    with :meth:`make_room` (freeing :meth:`cheapest_victim` until the step fits) and recomputes
    missing inputs on demand. :mod:`coop.formulations.monet.greedy` overrides the compute step to
    run it in place.

    Parameters
    ----------
    problem:
        The graph and budget as :class:`~coop.formulations.intervals.slots.SlotProblem`.
    rebuild_size_penalty, deadline:
        See :func:`greedy_eviction_schedule`.
    """

    def __init__(self, problem: SlotProblem, rebuild_size_penalty: float = 0.0,
                 deadline: Deadline | None = None) -> None:
        self.p = problem
        self.deadline = deadline
        # per value, what the rebuild-size penalty multiplies its eviction score by (fixed by the graph: computed once)
        self.score_factor = ({v: self._score_factor(v, rebuild_size_penalty) for v in problem.order}
                             if rebuild_size_penalty else {})
        self.position = {v: k for k, v in enumerate(problem.order)}
        self.uses = {v: sorted(self.position[c] for c in problem.consumers[v]) for v in problem.order}
        self.resident: set[int] = set()
        self.used = 0
        self.steps: list[Step] = []
        self.now = 0
        self.computes = 0
        self.compute_limit = COMPUTE_LIMIT_FACTOR * len(problem.order) + 100  # stops thrashing: it gives up
        # A value that is never recomputed stays until no rebuild can read it any more.
        kept = {v for v in problem.order if not problem.recomputable[v]}
        self.release_after = problem.graph.release_positions(problem.order, kept)

    def run(self) -> Schedule | None:
        try:
            for k, v in enumerate(self.p.order):
                if self.deadline is not None and self.deadline.expired():
                    raise _Stuck
                self.now = k
                self.compute(v, pinned=set())
                self.drop_dead_values()
        except _Stuck:
            return None
        return Schedule(steps=tuple(self.steps))

    def next_use(self, u: int) -> float:
        uses = self.uses[u]
        i = bisect.bisect_left(uses, self.now)
        return uses[i] if i < len(uses) else math.inf

    def drop_dead_values(self) -> None:
        """Values with no later reader in the baseline order (and not outputs) are released; a
        value that is never recomputed only once no later rebuild can need it either."""
        for u in [u for u in self.resident if u not in self.p.outputs and self.next_use(u) == math.inf
                  and self.release_after.get(u, -1) <= self.now]:
            self.resident.discard(u)
            self.used -= self.p.mem[u]
            self.steps.append(Step(op="free", node=u))

    def compute(self, v: int, pinned: set[int]) -> None:
        """Compute v, first rebuilding its missing inputs.

        The rebuild set is the closure of v's missing inputs over their missing ancestors, computed
        in baseline (topological) order; while it runs, every resident input of a pending compute
        is held, so nothing the rebuild relies on is freed under it.
        """
        rebuild = self.missing_ancestors(v)
        pending = [*rebuild, v]
        for index, x in enumerate(pending):
            hold = set(pinned)
            for y in pending[index:]:
                hold.update(self.p.inputs[y])
            self.compute_one(x, hold, pending[index + 1:])
            self.resident.add(x)
            self.used += self.p.mem[x]
            self.computes += 1
        if self.computes > self.compute_limit:
            raise _Stuck

    def compute_one(self, x: int, hold: set[int], later: list[int]) -> None:
        """Make room for x (keeping ``hold``) and emit its compute; ``later``: the computes pending after it."""
        self.make_room(self.p.mem[x] + self.p.workspace[x], hold)
        self.steps.append(Step(op="compute", node=x))

    def missing_ancestors(self, v: int) -> list[int]:
        """The non-resident values v needs rebuilt (transitively), in baseline order."""
        needed: set[int] = set()
        stack = [u for u in self.p.inputs[v] if u not in self.resident]
        while stack:
            u = stack.pop()
            if u in needed:
                continue
            if not self.p.recomputable[u]:
                raise _Stuck
            needed.add(u)
            stack.extend(w for w in self.p.inputs[u] if w not in self.resident and w not in needed)
        return sorted(needed, key=self.position.__getitem__)

    def make_room(self, need: int, hold: set[int]) -> None:
        while self.used + need > self.p.capacity:
            victim = self.cheapest_victim(hold)
            if victim is None:
                raise _Stuck
            self.resident.discard(victim)
            self.used -= self.p.mem[victim]
            self.steps.append(Step(op="free", node=victim))

    def cheapest_victim(self, hold: set[int]) -> int | None:
        best, best_score = None, math.inf
        rebuild: dict[int, int] = {}
        for u in self.resident:
            if u in hold or u in self.p.outputs or not self.p.recomputable[u] or self.p.mem[u] == 0:
                continue
            distance = self.next_use(u) - self.now + 1
            factor = self.score_factor.get(u, 1.0)
            # rebuilding u costs at least u itself, and the score grows with that cost (rounding included): a
            # candidate whose own cost already scores no better is passed over before its ancestors are walked
            if (self.p.cost[u] + 1) / (self.p.mem[u] * distance) * factor >= best_score:
                continue
            score = (self.rebuild_cost(u, rebuild) + 1) / (self.p.mem[u] * distance)
            score *= factor
            if score < best_score:
                best, best_score = u, score
        return best

    def _score_factor(self, v: int, penalty: float) -> float:
        """``(1 + recomputable input bytes / bytes) ** penalty``, times GRADIENT_EVICTION_PENALTY for a gradient."""
        if not self.p.mem[v]:
            return 1.0
        inputs = sum(self.p.mem[w] for w in set(self.p.inputs[v]) if self.p.recomputable[w])
        factor = (1 + inputs / self.p.mem[v]) ** penalty
        return factor * GRADIENT_EVICTION_PENALTY if self.p.graph.node(v).kind == "backward" else factor

    def rebuild_cost(self, u: int, memo: dict[int, int]) -> int:
        """Cost of recomputing u from what is resident now: u plus its missing ancestors (DTR's e*)."""
        if u in memo:
            return memo[u]
        total, stack, seen = 0, [u], {u}
        while stack:
            w = stack.pop()
            total += self.p.cost[w]
            for x in self.p.inputs[w]:
                if x not in self.resident and x not in seen:
                    seen.add(x)
                    stack.append(x)
        memo[u] = total
        return total


# ==================================================================== peak shaving
def peak_shaving_schedule(graph: Graph, budget: int, max_rounds: int | None = None,
                          deadline: Deadline | None = None) -> Schedule | None:
    """A schedule under ``budget`` made by repeatedly shaving the peak of the baseline order.

    Starts from store-all (a sequence of computes, lifetimes from the simulator). While the peak
    step p is over budget, it picks the value u resident across p but not read there whose
    recomputation just before its next read b saves the most memory at p per unit of cost
    (saving = mem_u minus the inputs of u whose lifetimes must now stretch over p to reach b),
    and inserts ``compute u`` before b.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    max_rounds : int or None
        The most shaving rounds; None: ``4 * len(graph.order) + 10``.
    deadline : Deadline or None
        Give up once it passes (None: never). Each round simulates the
        whole sequence, so on a graph of thousands of nodes the rounds take tens of seconds.

    Returns
    -------
    Schedule or None
        A schedule of computes only, or None when no such value is left (or the rounds or the time run
        out) before the peak fits.
    """
    problem = SlotProblem.build(graph, budget)
    sequence = _shave(problem, SequenceTables.build(problem), list(problem.order), max_rounds, deadline=deadline)
    return None if sequence is None else Schedule.from_order(sequence)


def _shave(problem: SlotProblem, tables: SequenceTables, sequence: list[int], max_rounds: int | None = None,
           rng: random.Random | None = None, deadline: Deadline | None = None) -> list[int] | None:
    """Shave the peak of a compute sequence until it fits (see :func:`peak_shaving_schedule`).

    With ``rng`` the candidate moves are tried in a randomly perturbed order (for the local
    search's repairs); returns the new sequence, or None when no move lowers the overflow.
    """
    budget = problem.budget
    rounds = max_rounds if max_rounds is not None else 4 * len(sequence) + 10
    sim = sequence_profile(tables, sequence)
    for _ in range(rounds):
        if sim.peak <= budget:
            return sequence
        if deadline is not None and deadline.expired():
            return None
        excess = _excess(sim, budget)
        candidates = _shave_candidates(problem, sequence, sim)[:_SHAVE_TRIALS]
        if rng is not None and len(candidates) > 1 and rng.random() < 0.5:
            # Swap the best move with a random runner-up now and then: diversity for the repairs.
            k = rng.randrange(1, len(candidates))
            candidates[0], candidates[k] = candidates[k], candidates[0]
        for chain, before in candidates:
            trial = sequence[:before] + list(chain) + sequence[before:]
            trial_sim = sequence_profile(tables, trial)
            # Accept only progress on the total overflow, so the peak cannot just move around.
            if _excess(trial_sim, budget) < excess:
                sequence, sim = trial, trial_sim
                break
        else:
            return None
    return None


#: Simulated-annealing acceptance in the local search (Kirkpatrick, Gelatt and Vecchi 1983): a repaired sequence up
#: to this fraction costlier than the current one is accepted at the start, none at the end (linear cooling). On
#: captured ResNet-50 at 1/3 of its peak (40 s, 3 seeds) it ended at 12.1-12.3 % overhead where accepting only
#: cheaper repairs stalled at 12.65-12.7 %.
ANNEALING_START = 0.001
#: The most recomputations one destroy move removes.
DESTROY_MAX = 2


def improve_by_local_search(graph: Graph, budget: int, schedule: Schedule, time_limit: float,
                            seed: int = 0, max_stall: int | None = None) -> Schedule:
    """A schedule at most as costly as ``schedule`` under ``budget``, by destroy-and-repair.

    A large-neighbourhood search over compute sequences: first drop every recomputation the budget
    does not need, then repeatedly remove one or two recomputations that lie close together in the
    sequence, repair the overflow with randomised peak shaving, drop what the repair made redundant,
    and accept the result when it is cheaper or, while the search is young, at most
    :data:`ANNEALING_START` costlier (simulated annealing); the cheapest sequence seen is returned.
    Candidates are screened by :func:`~coop.formulations.heuristics.sequence_profile.sequence_profile` and the
    result is judged by the simulator; first computations keep their order.

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    budget : int
        The budget in graph units.
    schedule : Schedule
        The legal schedule to improve; its computes are the starting sequence.
    time_limit : float
        Seconds the search may run.
    seed : int
        Seed of the search's random choices.
    max_stall : int or None
        Stop after this many repairs in a row found nothing cheaper than the best; None: run to
        ``time_limit``.

    Returns
    -------
    Schedule
        The cheapest schedule of computes found when its cost is at most ``schedule``'s, else
        ``schedule``; ``schedule`` unchanged when its computes alone (without its frees) do not fit.

    References
    ----------
    Shaw, CP 1998 (large-neighbourhood search); Pisinger and Ropke, Handbook of Metaheuristics 2010.
    """
    problem = SlotProblem.build(graph, budget)
    tables = SequenceTables.build(problem)
    rng = random.Random(seed)
    started = time.perf_counter()
    deadline = started + time_limit
    sequence = [step.node for step in schedule.steps if step.op == "compute"]
    if simulate(graph, Schedule.from_order(sequence)).peak > budget:
        return schedule  # explicit frees were needed to fit: leave it alone
    sequence = _drop_redundant(problem, tables, sequence, deadline, trials=False)
    cost = sequence_cost(tables, sequence)
    best, best_cost = sequence, cost
    stalled = 0
    while (now := time.perf_counter()) < deadline and (max_stall is None or stalled < max_stall):
        stalled += 1
        recomputed = recompute_positions(sequence)
        if not recomputed:
            break
        centre = rng.choice(recomputed)
        near = sorted(recomputed, key=lambda j: abs(j - centre))[: rng.randint(1, DESTROY_MAX)]
        trial = [v for j, v in enumerate(sequence) if j not in set(near)]
        repaired = _shave(problem, tables, trial, max_rounds=4 * len(near) + 8, rng=rng)
        if repaired is None:
            continue
        repaired = _drop_redundant(problem, tables, repaired, deadline, trials=False)
        repaired_cost = sequence_cost(tables, repaired)
        temperature = ANNEALING_START * max(0.0, 1 - (now - started) / time_limit) if time_limit > 0 else 0.0
        if repaired_cost < cost * (1 + temperature):
            sequence, cost = repaired, repaired_cost
            if cost < best_cost:
                best, best_cost, stalled = sequence, cost, 0
    candidate = Schedule.from_order(_drop_redundant(problem, tables, best, deadline, trials=True))
    judged = simulate(graph, candidate)
    return candidate if judged.peak <= budget and judged.cost <= simulate(graph, schedule).cost else schedule


def _drop_redundant(problem: SlotProblem, tables: SequenceTables, sequence: list[int], deadline: float,
                    trials: bool) -> list[int]:
    """``sequence`` less the recomputations the budget does not need: the one pass of
    :func:`~coop.formulations.heuristics.recompute_polish.drop_needless`, screened on the sequence's profile and
    judged by it (exact for a compute-only sequence); ``trials``: the exact trials after the screened sweep."""
    def judge(steps: list[Step]) -> tuple[int, float]:
        nodes = [step.node for step in steps]
        return sequence_profile(tables, nodes).peak, sequence_cost(tables, nodes)

    kept = drop_needless(problem.graph, problem.budget, list(Schedule.from_order(sequence).steps), judge, deadline,
                         tables, trials)
    return sequence if len(kept) == len(sequence) else [step.node for step in kept]


#: How many of the best-scored shaving moves are simulated before giving up on a round.
_SHAVE_TRIALS = 8


def _excess(sim: SequenceProfile, budget: int) -> int:
    """Total memory over budget summed over all steps."""
    return sum(m - budget for m in sim.memory if m > budget)


def _shave_candidates(problem: SlotProblem, sequence: list[int], sim: SequenceProfile
                      ) -> list[tuple[tuple[int, ...], int]]:
    """Moves (recompute a chain ending in u right before u's next read b) that lower the peak step's memory,
    best ratio first.

    The chain is u and, up to :data:`_CHAIN_DEPTH` levels up, the recomputable inputs that are gone at the peak
    step p: rebuilding them too costs compute instead of stretching their lifetimes over p (a ReLU output whose
    batch norm output is gone is rebuilt from the kept convolution output). An input gone at p that is not
    rebuilt is stretched over p and counts against the saving."""
    p = sim.peak_step
    current_end: dict[int, int] = {}  # node -> end of its instance current at step p
    alive_at_p: list[int] = []
    for k, node in enumerate(sequence):
        start, end = sim.start[k], sim.end[k]
        if start <= p:
            current_end[node] = end
            if end > p and start < p:
                alive_at_p.append(node)
    next_read: dict[int, int] = {}  # node -> the first step after p that reads it
    for j in range(len(sequence) - 1, p, -1):
        for source in problem.inputs[sequence[j]]:
            next_read[source] = j
    read_at_p = set(problem.inputs[sequence[p]])
    position = {v: k for k, v in enumerate(problem.order)}
    scored: list[tuple[float, tuple[int, ...], int]] = []
    for u in alive_at_p:
        if u in read_at_p or not problem.recomputable[u] or problem.mem[u] == 0:
            continue
        b = next_read.get(u)
        if b is None:
            continue  # alive only because it is an output: it must stay
        for chain, stretched in _chains(problem, u, lambda w: current_end.get(w, -1) >= p, position):
            saving = problem.mem[u] - stretched
            if saving > 0:
                scored.append(((sum(problem.cost[v] for v in chain) + 1) / saving, chain, b))
    scored.sort(key=lambda item: item[0])
    return [(chain, b) for _, chain, b in scored]


#: How many levels of gone inputs a shaving move may rebuild along with the value it recomputes.
_CHAIN_DEPTH = 3


def _chains(problem: SlotProblem, u: int, alive: Callable[[int], bool],
            position: dict[int, int]) -> list[tuple[tuple[int, ...], int]]:
    """Ways to recompute u at the peak: (the chain to compute in order, bytes of gone inputs stretched over the
    peak). The first stretches every gone input of u (the single recompute); each next one also rebuilds the
    recomputable gone inputs one level further up."""
    result: list[tuple[tuple[int, ...], int]] = []
    chain: list[int] = [u]
    for _ in range(_CHAIN_DEPTH):
        members = set(chain)
        gone = {w for v in chain for w in problem.inputs[v] if w not in members and not alive(w)}
        stretched = sum(problem.mem[w] for w in gone)
        result.append((tuple(chain), stretched))
        rebuildable = [w for w in gone if problem.recomputable[w]]
        if not rebuildable or len(rebuildable) < len(gone):
            break
        chain = sorted(members | set(rebuildable), key=position.__getitem__)
    return result
