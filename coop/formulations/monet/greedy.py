"""Greedy eviction that runs computes in place: MONeT's warm start below the out-of-place floor.

MONeT (Shah et al., ICLR 2021) lets an operator overwrite its input (in-place ReLU, a batch norm
backward written over its incoming gradient, a residual add over an operand). A plain graph cannot say
that a value's bytes pass to the value computed over it, so Moccasin and greedy eviction on the graph
with implementations fixed (:func:`~coop.formulations.monet.warm.fixed_impl_graph`) never go below the
out-of-place floor, and CP-SAT's interval model finds nothing there without a start. This is the greedy
eviction heuristic of :mod:`coop.formulations.heuristics.fast_schedules` (DTR-style, offline) with one change: a compute
whose chosen node has an in-place implementation over an input that the rest of the rebuild and the rebuilds
of values that are never recomputed do not read runs in place, needing room only for its workspace; the
input's instance is used up. Where a later compute in the baseline order still reads that input (a forward
value), it runs in place only when running out of place would have to evict (the input is then treated as
evicted, and rebuilt when needed). The result is checked by the simulator on
the graph with implementations by the caller (:mod:`coop.formulations.monet.intervals`).
"""

from __future__ import annotations

from dataclasses import dataclass

from coop.formulations.heuristics.fast_schedules import GreedyEvictor
from coop.formulations.intervals.slots import SlotProblem
from coop.formulations.monet.warm import Choice, usable_impls
from coop.graph import Graph
from coop.schedule import Schedule, Step


@dataclass(frozen=True)
class InPlace:
    """Node ``over``'s storage is overwritten by implementation ``name`` (with its ``workspace``)."""

    over: int
    name: str
    workspace: int


def in_place_options(graph: Graph, fixed: Graph, choices: dict[int, Choice],
                     exact: bool) -> dict[int, tuple[InPlace, ...]]:
    """Per node of ``fixed`` its in-place implementations that fit the chosen one, cheapest first.

    An implementation fits when it reads no more than the chosen one and makes a value of the
    chosen one's size (so the fixed graph's bytes stay right after the swap): a residual add may
    overwrite either operand, whichever is resident and read by nothing later.

    Parameters
    ----------
    fixed : Graph
        ``graph`` with the implementations fixed to ``choices``
        (:func:`coop.formulations.monet.warm.fixed_impl_graph`).
    choices : dict of int to Choice
        Each node's chosen implementation (None: its own fields).
    exact : bool
        Only exact implementations (:func:`coop.formulations.monet.warm.usable_impls`).

    Returns
    -------
    dict of int to tuple of InPlace
        The options of each node that has any, by increasing cost.
    """
    options: dict[int, tuple[InPlace, ...]] = {}
    for node in fixed.nodes:
        original = graph.node(node.id)
        if original.optional or node.output_of is not None or not original.impls:
            continue
        reads = set(original.reads(original.implementation(choices.get(node.id))))
        fitting = [impl for impl in usable_impls(graph, original, exact)
                   if impl.inplace_of is not None and set(original.reads(impl)) <= reads and impl.mem == node.mem]
        if fitting:
            options[node.id] = tuple(InPlace(impl.inplace_of, impl.name, impl.workspace)
                                     for impl in sorted(fitting, key=lambda i: i.cost))
    return options


def in_place_greedy_schedule(fixed: Graph, budget: int, choices: dict[int, Choice],
                             options: dict[int, tuple[InPlace, ...]],
                             rebuild_size_penalty: float = 0.0) -> Schedule | None:
    """Greedy eviction on ``fixed`` under ``budget`` with computes in place where :class:`InPlace` options allow.

    Every compute names its implementation.

    Parameters
    ----------
    fixed : Graph
        The graph with implementations fixed to ``choices``.
    budget : int
        The budget in graph units.
    choices : dict of int to Choice
        Each node's chosen implementation.
    options : dict of int to tuple of InPlace
        The in-place options per node (:func:`in_place_options`).
    rebuild_size_penalty : float
        As in :func:`coop.formulations.heuristics.fast_schedules.greedy_eviction_schedule`.

    Returns
    -------
    Schedule or None
        The schedule, or None when the heuristic gets stuck.
    """
    return _InPlaceEvictor(SlotProblem.build(fixed, budget), choices, options, rebuild_size_penalty).run()


class _InPlaceEvictor(GreedyEvictor):
    def __init__(self, problem: SlotProblem, choices: dict[int, Choice], options: dict[int, tuple[InPlace, ...]],
                 rebuild_size_penalty: float = 0.0) -> None:
        super().__init__(problem, rebuild_size_penalty)
        self.choices = choices
        self.options = options

    def compute_one(self, x: int, hold: set[int], later: list[int]) -> None:
        option = self._overwritable(x, later)
        if option is None:
            self.make_room(self.p.mem[x] + self.p.workspace[x], hold)
            self.steps.append(Step(op="compute", node=x, impl=self.choices.get(x)))
            return
        # x takes over its input's storage: room for the workspace only; the input's instance is used up
        self.make_room(option.workspace, hold)
        self.steps.append(Step(op="compute", node=x, impl=option.name))
        self.resident.discard(option.over)
        self.used -= self.p.mem[option.over]

    def _overwritable(self, x: int, later: list[int]) -> InPlace | None:
        """The first of x's in-place options whose overwritten input may be used up here, if any."""
        return next((option for option in self.options.get(x, ()) if self._may_overwrite(x, option, later)), None)

    def _may_overwrite(self, x: int, option: InPlace, later: list[int]) -> bool:
        u = option.over
        if (u not in self.resident or u in self.p.outputs or not self.p.recomputable[u]
                or self.p.mem[u] != self.p.mem[x] or any(u in self.p.inputs[y] for y in later)):
            return False
        if self.release_after.get(u, -1) > self.now:
            return False  # a rebuild of a value that is never recomputed may read u
        here = self.position[x]
        read_later = any(position >= self.now and position != here for position in self.uses[u])
        # a later compute in the baseline order reads u: overwrite a forward value only where room would otherwise
        # have to be made by evicting (u is then as good as evicted, and rebuilt when that compute needs it); a
        # backward value (a gradient) is left alone: its rebuild would rerun the backward above it
        roomy = self.used + self.p.mem[x] + self.p.workspace[x] <= self.p.capacity
        return not (read_later and (self.p.graph.node(u).kind != "forward" or roomy))


__all__ = ["InPlace", "in_place_greedy_schedule", "in_place_options"]
