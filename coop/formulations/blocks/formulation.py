"""Repeated blocks solved once: a block-level problem per distinct block and budget share, composed, then polished.

Transformer and ResNet steps repeat identical blocks (:mod:`coop.formulations.blocks.repeated` finds them).
A flat solver sees thousands of nodes; this formulation, in the spirit of Rockmate / HiRemate, plans one
block of each group and reuses the plan:

1. **Block level, solved exactly.** For a block and a share of its stored bytes, CP-SAT chooses which of its
   forward values to keep for the backward (``keep[o]``) and which to recompute there (``rebuild[o]``):
   a value the backward reads is kept or rebuilt; a rebuilt value's inputs inside the block are kept or
   rebuilt; values read outside the block (the residual stream, a stage's output) and values that cannot be
   recomputed are kept; kept bytes stay within the share; the rebuild cost (each rebuilt value once, as
   Chen et al.'s segments recompute) is minimised. The model is tiny (two booleans per block node) and is
   solved to optimality for every share of :data:`SHARES`; the frontier of (kept bytes, rebuild cost) is
   what the layer level chooses from.
2. **Layer level.** Every block starts by storing everything; moves take one block of a group one option
   down its frontier (its lower convex hull, steepest byte saving per unit of cost first, earlier blocks
   first); the shortest prefix of moves whose composed schedule fits the budget is found by bisection,
   each candidate composed (:func:`coop.formulations.heuristics.baselines.forward_keep_backward_recompute`: forward
   keeping the chosen values, backward recomputing what is missing once, until its last use) and judged by
   the one simulator.
3. **Polish.** Moccasin (Bartan et al. 2023; its local search, then CP-SAT) starts from the composed
   schedule and gets the time that is left; the cheaper of the two is returned.

What is proven: each block-level option is optimal for its model (``extra["block_options"]``); the layer
level is a greedy over those frontiers and the polish is a local search, so the whole schedule is
``feasible``, never ``optimal``, and the bound is the polish's where it proves one.

References
----------
Zhao et al., "Rockmate", ICML 2023, and HiRemate (ICML 2025): plans of a sequence of blocks from per-block
options; Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016 (segments recomputed once);
Bartan et al., "Moccasin", ICML 2023 (the polish).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from coop.errors import CoopError
from coop.formulations.blocks.repeated import BlockGroup, find_block_groups
from coop.formulations.core.deadline import Deadline, cp_sat_solver
from coop.formulations.core.entry import formulation
from coop.formulations.core.options import BlocksOptions, MoccasinOptions
from coop.formulations.core.progress import ProgressClock
from coop.formulations.core.result import SolveResult
from coop.formulations.heuristics.baselines import (
    ForwardBackward,
    forward_keep_backward_recompute,
    split_forward_backward,
)
from coop.formulations.moccasin.intervals import moccasin
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, simulate

NAME = "blocks"
#: Shares of a block's stored bytes for which the block-level problem is solved.
SHARES = tuple(round(1.0 - 0.05 * k, 2) for k in range(21))
#: The share of the time limit the block level and the layer level may take before the polish.
COMPOSE_SHARE = 0.25
#: Cost units are scaled to integers for CP-SAT (relative precision).
COST_SCALE = 1_000_000


@dataclass(frozen=True)
class BlockOption:
    """One optimal answer of the block-level problem: the offsets kept, their bytes, the rebuild cost."""

    kept: frozenset[int]
    kept_bytes: int
    rebuild_cost: float
    share: float
    optimal: bool


def block_options(graph: Graph, split: ForwardBackward, group: BlockGroup, shares: tuple[float, ...] = SHARES,
                  time_limit: float = 5.0) -> list[BlockOption]:
    """The block-level frontier of ``group``: for each share, the cheapest rebuild within that share of bytes.

    Parameters
    ----------
    group : BlockGroup
        The group whose first block is modelled (every block of the group is the same up to renaming).
    shares : tuple of float
        Shares of the block's stored bytes (those of its values that the backward or a rebuild may read).
    time_limit : float
        Seconds for all the shares together.

    Returns
    -------
    list of BlockOption
        Distinct options that CP-SAT found, most kept bytes first; each says whether CP-SAT proved it optimal.
    """
    block = group.blocks[0]
    offset_of = {v: o for o, v in enumerate(block)}
    backward = set(split.backward)
    inside_readers = {o: [offset_of[c] for c in graph.consumers[v] if c in offset_of] for o, v in enumerate(block)}
    members = [set(blk) for blk in group.blocks]
    forced = {o for o, v in enumerate(block)  # kept: unrecomputable, an output, or read outside its own block
              if not graph.node(v).recomputable or v in graph.outputs
              or any(c not in member and c not in backward for blk, member in zip(group.blocks, members, strict=True)
                     for c in graph.consumers[blk[o]])}
    read_by_backward = {o for o, v in enumerate(block) if any(c in backward for c in graph.consumers[v])}
    full = sum(graph.node(v).mem for o, v in enumerate(block) if o in read_by_backward or o in forced)
    options: list[BlockOption] = []
    per_share = time_limit / max(1, len(shares))
    for share in shares:
        found = _solve_block(graph, block, inside_readers, forced, read_by_backward, int(share * full), per_share)
        if found is not None and all(found.kept != o.kept for o in options):
            options.append(BlockOption(found.kept, found.kept_bytes, found.rebuild_cost, share, found.optimal))
    return sorted(options, key=lambda o: (-o.kept_bytes, o.rebuild_cost))


def _solve_block(graph: Graph, block: tuple[int, ...], inside_readers: dict[int, list[int]], forced: set[int],
                 read_by_backward: set[int], byte_limit: int, seconds: float) -> BlockOption | None:
    model = cp_model.CpModel()
    offset_of = {v: o for o, v in enumerate(block)}
    keep = {o: model.NewBoolVar(f"keep_{o}") for o in range(len(block))}
    rebuild = {o: model.NewBoolVar(f"rebuild_{o}") for o in range(len(block))}
    for o, v in enumerate(block):
        model.AddBoolOr([keep[o], rebuild[o]]).OnlyEnforceIf(_needed(model, o, read_by_backward, rebuild,
                                                                      inside_readers))
        if o in forced:
            model.Add(keep[o] == 1)
        model.AddImplication(keep[o], rebuild[o].Not())
        for source in graph.node(v).inputs:
            s = offset_of.get(source)
            if s is not None:  # a rebuilt value's inputs inside the block are there: kept or rebuilt
                model.AddBoolOr([keep[s], rebuild[s]]).OnlyEnforceIf(rebuild[o])
    model.Add(sum(graph.node(v).mem * keep[o] for o, v in enumerate(block)) <= byte_limit)
    model.Minimize(sum(round(graph.node(v).cost * COST_SCALE) * rebuild[o] for o, v in enumerate(block)))
    solver = cp_sat_solver(Deadline.after(seconds), 1, reserve=False, least=0.05)
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    kept = frozenset(o for o in keep if solver.Value(keep[o]))
    return BlockOption(kept, sum(graph.node(block[o]).mem for o in kept),
                       sum(graph.node(block[o]).cost for o in rebuild if solver.Value(rebuild[o])), 0.0,
                       status == cp_model.OPTIMAL)


def _needed(model: cp_model.CpModel, offset: int, read_by_backward: set[int], rebuild: dict[int, Any],
            inside_readers: dict[int, list[int]]) -> Any:
    """A literal true where the backward reads the value, or a rebuilt value of the block reads it."""
    if offset in read_by_backward:
        return model.NewConstant(1)
    needed = model.NewBoolVar(f"needed_{offset}")
    readers = [rebuild[r] for r in inside_readers[offset]]
    if readers:
        model.AddMaxEquality(needed, readers)
    else:
        model.Add(needed == 0)
    return needed


def _hull(options: list[BlockOption]) -> list[BlockOption]:
    """The options on the lower convex hull of (kept bytes, rebuild cost), most bytes first."""
    hull: list[BlockOption] = []
    for option in sorted(options, key=lambda o: (-o.kept_bytes, o.rebuild_cost)):
        if hull and option.rebuild_cost <= hull[-1].rebuild_cost:
            hull[-1] = option  # fewer bytes for no more cost: the earlier point is dominated
            continue
        while len(hull) >= 2 and _slope(hull[-2], hull[-1]) <= _slope(hull[-1], option):
            hull.pop()
        hull.append(option)
    return hull


def _slope(a: BlockOption, b: BlockOption) -> float:
    """Bytes saved per unit of added cost from ``a`` to ``b``."""
    added = b.rebuild_cost - a.rebuild_cost
    return float("inf") if added <= 0 else (a.kept_bytes - b.kept_bytes) / added


def _moves(groups: list[BlockGroup], frontiers: list[list[BlockOption]]) -> list[int]:
    """The layer level's moves, each the index of the group one of whose blocks goes one option down."""
    steps: list[tuple[float, int, int, int]] = []  # (-slope, option step, block, group)
    for g, (group, frontier) in enumerate(zip(groups, frontiers, strict=True)):
        for step in range(len(frontier) - 1):
            for block in range(group.count):
                steps.append((-_slope(frontier[step], frontier[step + 1]), step, block, g))
    return [g for *_, g in sorted(steps)]


def compose(graph: Graph, split: ForwardBackward, groups: list[BlockGroup], frontiers: list[list[BlockOption]],
            levels: list[list[int]]) -> Schedule:
    """The whole schedule for per-block option levels: ``levels[g][b]`` indexes ``frontiers[g]``.

    Parameters
    ----------
    frontiers : list of list of BlockOption
        Each group's options.
    levels : list of list of int
        Each block's option.

    Returns
    -------
    Schedule
        The forward keeping every value outside the groups and each block's chosen values; the backward
        recomputing the rest once, where first needed.
    """
    in_groups = set().union(*(g.nodes for g in groups)) if groups else set()
    keep = {v for v in split.forward if v not in in_groups}
    for group, frontier, chosen in zip(groups, frontiers, levels, strict=True):
        for block, level in zip(group.blocks, chosen, strict=True):
            keep |= {block[o] for o in frontier[level].kept}
    return forward_keep_backward_recompute(graph, split, keep, free_recomputed=False)


def composed_schedule(graph: Graph, budget: int, split: ForwardBackward, groups: list[BlockGroup],
                      frontiers: list[list[BlockOption]]) -> tuple[Schedule, Simulation, list[list[int]]] | None:
    """The layer level: the fewest moves down the frontiers whose composed schedule fits ``budget``.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    frontiers : list of list of BlockOption
        Each group's hull of options.

    Returns
    -------
    tuple or None
        The schedule, its simulation and the per-block levels; None where even every move does not fit.
    """
    moves = _moves(groups, frontiers)

    def after(count: int) -> tuple[Schedule, Simulation, list[list[int]]]:
        levels = [[0] * g.count for g in groups]
        for g in moves[:count]:
            block = min(range(groups[g].count), key=lambda b: (levels[g][b], b))
            levels[g][block] += 1
        schedule = compose(graph, split, groups, frontiers, levels)
        return schedule, simulate(graph, schedule), levels

    low, high = 0, len(moves)
    best = after(high)
    if best[1].peak > budget:
        return None
    while low < high:  # the least count that fits (peaks fall as blocks keep less)
        middle = (low + high) // 2
        candidate = after(middle)
        if candidate[1].peak <= budget:
            best, high = candidate, middle
        else:
            low = middle + 1
    return best


@formulation(NAME, options=BlocksOptions)
def blocks(graph: Graph, budget: int, options: BlocksOptions) -> SolveResult:
    """Plan repeated blocks once, compose, then polish with Moccasin (see the module docstring).

    Parameters
    ----------
    graph : Graph
        A training step's graph (forward and backward).
    budget : int
        The budget in graph units (parsed).
    options : BlocksOptions
        The options; their fields follow.
    time_limit : float
        Seconds for everything; :data:`COMPOSE_SHARE` of it at most for the block and layer levels.
    threads : int
        Workers of the polish's CP-SAT.
    progress : ProgressCallback or None
        Called with the composed schedule's cost and the polish's progress.
    hint : Any
        Schedules (or results) the polish may also start from.
    seed : int
        The polish's random seed.
    deadline : Deadline
        The solve's deadline (made from ``time_limit`` by the entry); the polish gets what is left of it.

    Returns
    -------
    SolveResult
        ``feasible`` with the cheaper of the composed and the polished schedule; ``extra`` has the groups
        found, each group's options (optimal or not) and levels, and both costs. Without repeated blocks, or
        where no composition fits, Moccasin's own result on the whole time, saying so.

    Raises
    ------
    CoopError
        When the graph has no backward part.

    References
    ----------
    Zhao et al., Rockmate, ICML 2023; HiRemate, ICML 2025; Chen et al. 2016; Bartan et al., Moccasin, ICML 2023.
    """
    deadline, progress, hint = options.deadline, options.progress, options.hint
    clock = ProgressClock(progress, deadline)
    split = split_forward_backward(graph, NAME)
    groups = find_block_groups(graph, split.forward)
    hints = list(hint) if isinstance(hint, list | tuple) else ([] if hint is None else [hint])
    extra: dict[str, Any] = {"groups": [{"period": g.period, "count": g.count} for g in groups]}
    composed = None
    if groups:
        per_group = COMPOSE_SHARE * deadline.remaining() / 2 / len(groups)
        frontiers = [_hull(block_options(graph, split, g, time_limit=per_group)) for g in groups]
        extra["block_options"] = [[{"share": o.share, "kept_bytes": o.kept_bytes, "rebuild_cost": o.rebuild_cost,
                                    "optimal": o.optimal} for o in f] for f in frontiers]
        composed = composed_schedule(graph, budget, split, groups, frontiers) if all(frontiers) else None
    if composed is not None:
        schedule, sim, levels = composed
        extra |= {"levels": levels, "composed_cost": sim.cost}
        clock.report(sim.cost, None, "blocks: composed")
        hints = [schedule, *hints]
    polish = MoccasinOptions(time_limit=max(1e-3, deadline.remaining()), deadline=deadline, threads=options.threads,
                             progress=progress, hint=hints or None, seed=options.seed)
    polished = moccasin(graph, budget, options=polish)
    extra["polish"] = {"status": polished.status, "message": polished.message}
    if composed is None:
        why = "no repeated blocks found" if not groups else "no composition of the block options fits the budget"
        polished.formulation = NAME
        polished.message = f"{why}: Moccasin's result on the whole graph ({polished.message})"
        polished.extra |= extra
        return polished
    schedule, sim, _ = composed
    if polished.schedule is not None and polished.simulation.cost < sim.cost:
        schedule, sim = polished.schedule, polished.simulation
        how = f"the composed schedule polished by Moccasin ({polished.message})"
    else:
        how = "the composed schedule (Moccasin's polish found nothing cheaper)"
    if sim.peak > budget:  # never hand out a schedule the simulator rejects
        raise CoopError(f"blocks: internal error, a schedule peaking at {sim.peak} above budget {budget}")
    return SolveResult(NAME, "feasible", schedule, sim, sim.cost, polished.bound, clock.elapsed_s,
                       f"{len(groups)} block group(s) ({', '.join(f'{g.count} x {g.period}' for g in groups)}) planned "
                       f"once each; {how}", extra)


__all__ = ["COMPOSE_SHARE", "NAME", "SHARES", "BlockOption", "block_options", "blocks", "compose",
           "composed_schedule"]
