"""PyTorch's own min-cut rematerialization partitioner, run on coop's captured step.

This is the method a PyTorch user reaches for today (``torch.compile`` / AOTAutograd): the
partitioner of ``torch._functorch.partitioners.min_cut_rematerialization_partition`` splits the
joint forward+backward graph into a forward module, which returns the values it saves for the
backward, and a backward module, which recomputes the rest. Its saved set is a minimum cut of
the joint graph (the "min-cut rematerialization" of Chen, He, Li et al.'s AOTAutograd/
functorch work, described in Horace He's "Min-cut optimal(*) recomputation (i.e.
activation checkpointing) with AOTAutograd", 2022); with ``activation_memory_budget`` < 1 it
additionally solves a knapsack that trades saved bytes for recomputed FLOPs (PyTorch 2.4+).

How it is run here, on the SAME graph as every other formulation:

* :func:`aot_style_joint` rewrites a copy of the captured joint module into the layout the
  partitioner expects: placeholders named ``primals_*``, the loss seed ``ones_like(loss)`` that
  ``torch.func.grad`` builds internally replaced by a ``tangents_1`` placeholder (so that the
  partitioner finds the backward as the closure of the tangents), and outputs ordered
  ``(loss, new buffers..., gradients...)`` with ``num_fwd_outputs = 1 + #buffers``. Every other
  node is copied under its own name, so the partitioner's nodes map onto our Graph's nodes by
  name; :func:`split_to_schedule` checks op by op that target and inputs agree and raises
  otherwise. CSE is switched off: it would merge nodes that our Graph keeps apart.
* :func:`split_to_schedule` turns one (forward, backward) split into a coop Schedule: the forward
  computes the forward module's nodes in its order (each value then lives through its last read,
  so what survives into the backward is exactly the saved set); the backward computes the loss
  seed, then the backward module's nodes in its order (the partitioner reorders it like the
  autograd engine), where forward nodes it contains are recomputations. Folded views take no
  step. A node our Graph forbids to recompute (random ops, extra outputs of multi-output ops),
  which the partitioner recomputes at ``activation_memory_budget = 0`` (drawing new random
  numbers), is kept from the forward instead; ``extra["kept_not_recomputable"]`` counts those.

The knob is not a peak bound and is not monotone (bench_captured's sweep in BENCHMARKS.md shows both), so
:func:`pytorch_mincut` sweeps it, simulates every split with the one simulator, and returns the
cheapest schedule whose peak fits the budget, else the lowest-peak one with ``fits = False``.
"""

from __future__ import annotations

import copy
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from coop.errors import CoopError, SolverError
from coop.formulations.core.result import SolveResult
from coop.graph import Graph
from coop.schedule import Schedule, Simulation, Step, simulate

__all__ = ["DEFAULT_MEMORY_BUDGETS", "AotJoint", "SplitPlan", "aot_style_joint", "partition", "pytorch_mincut",
           "split_to_schedule", "sweep_splits"]

FORMULATION = "pytorch-mincut"
#: The default sweep of ``torch._functorch.config.activation_memory_budget``.
DEFAULT_MEMORY_BUDGETS: tuple[float, ...] = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.0)
TANGENT_NAME = "tangents_1"


@dataclass
class AotJoint:
    """The captured joint step in AOTAutograd's layout, and the names it renamed."""

    module: fx.GraphModule
    num_fwd_outputs: int
    #: joint fx name -> captured fx name, for the nodes whose name changed (placeholders, seed)
    renamed: dict[str, str]
    seed_name: str  # captured fx name of ones_like(loss), now the tangents_1 placeholder


@dataclass
class SplitPlan:
    """One split of the partitioner, as a coop schedule and what it says about the split."""

    memory_budget: float
    schedule: Schedule
    simulation: Simulation
    saved_fx: list[str]  # fx names the forward module saves for the backward (joint names)
    saved_nodes: list[int]  # their graph node ids, caller-owned ones left out
    saved_bytes: int
    recomputed_nodes: list[int]  # graph ids the backward module recomputes
    kept_not_recomputable: list[int] = field(default_factory=list)
    added_unplaced: list[int] = field(default_factory=list)

    def summary(self, budget: int) -> dict[str, Any]:
        return {
            "memory_budget": self.memory_budget,
            "peak": self.simulation.peak,
            "cost": self.simulation.cost,
            "overhead": self.simulation.overhead,
            "fits": self.simulation.peak <= budget,
            "saved_values": len(self.saved_fx),
            "saved_nodes": len(self.saved_nodes),
            "saved_bytes": self.saved_bytes,
            "recomputations": self.simulation.recomputations,
            "kept_not_recomputable": len(self.kept_not_recomputable),
            "added_unplaced": len(self.added_unplaced),
        }


# -------------------------------------------------------------------- entry point
def pytorch_mincut(graph: Graph, budget: int, *, captured: Any = None,
                   memory_budgets: Sequence[float] | None = None) -> SolveResult:
    """Sweep PyTorch's ``activation_memory_budget`` and keep the cheapest split that fits.

    Every split is simulated by coop.schedule.simulate; ``extra["sweep"]`` reports every knob's peak
    and cost.

    Parameters
    ----------
    budget : int
        The budget in graph units.
    captured : Any
        The :class:`coop.graph_capture.Captured` whose ``graph`` this is (same structure; costs may
        differ, e.g. profiled).
    memory_budgets : Sequence of float or None
        Overrides the sweep (:data:`DEFAULT_MEMORY_BUDGETS`); each value must lie in [0, 1].

    Returns
    -------
    SolveResult
        A "heuristic" result with the chosen split's schedule, its saved set and the sweep in
        ``extra``; when no knob fits the budget, the lowest-peak split and a message saying so.

    Raises
    ------
    CoopError
        When ``captured`` is None, not a Captured or not of this graph, or ``memory_budgets`` is
        empty or has a value outside [0, 1].
    SolverError
        When the partitioner fails (:func:`partition`).
    """
    started = time.perf_counter()
    if captured is None:
        raise CoopError(
            f"pytorch-mincut needs a captured model (coop.capture / coop.plan): graph {graph.name!r} has no fx "
            "joint step to partition; use another formulation for imported graphs"
        )
    _check_same_graph(graph, captured)
    knobs = _check_knobs(DEFAULT_MEMORY_BUDGETS if memory_budgets is None else memory_budgets)
    plans, sweep_s = sweep_splits(graph, captured, knobs)
    best = _choose(plans, budget)
    fits = best.simulation.peak <= budget
    message = "" if fits else (
        f"pytorch-mincut: no activation_memory_budget in {list(knobs)} fits the budget {budget}; "
        f"lowest peak {best.simulation.peak} at activation_memory_budget={best.memory_budget}"
    )
    return SolveResult(
        formulation=FORMULATION,
        status="heuristic",
        schedule=best.schedule,
        simulation=best.simulation,
        objective=best.simulation.cost,
        wall_s=time.perf_counter() - started,
        message=message,
        extra={
            **best.summary(budget),
            "saved_set": best.saved_nodes,
            "sweep": [plan.summary(budget) for plan in plans],
            "cse": False,
            "sweep_s": sweep_s,
        },
    )


def sweep_splits(graph: Graph, captured: Any, knobs: Sequence[float]) -> tuple[list[SplitPlan], float]:
    """One simulated split per knob, and the seconds the sweep took when it ran.

    The splits do not depend on the budget, so they are cached per captured step, graph and knobs
    (:data:`_SWEEPS`, an entry dropped when its step or graph is collected): a comparison over several
    budgets partitions once.

    Parameters
    ----------
    graph : Graph
        The graph the splits are scheduled over.
    captured : Any
        The captured step whose joint module is partitioned.
    knobs : Sequence of float
        The ``activation_memory_budget`` values, each in [0, 1].

    Returns
    -------
    tuple of (list of SplitPlan, float)
        One plan per knob, in order, and ``sweep_s``: the time of the run that filled the cache.

    Raises
    ------
    SolverError
        When the partitioner fails or the AOT-style copy renames a node.
    """

    def run() -> tuple[list[SplitPlan], float]:
        started = time.perf_counter()
        plans = []
        for knob in knobs:
            joint = aot_style_joint(captured)
            forward_module, backward_module = partition(joint, knob)
            plans.append(split_to_schedule(graph, captured, joint, forward_module, backward_module, knob))
        return plans, time.perf_counter() - started

    key = (id(captured), id(graph), tuple(knobs))
    if key not in _SWEEPS:
        _SWEEPS[key] = run()
        for owner in (captured, graph):
            weakref.finalize(owner, _SWEEPS.pop, key, None)
    return _SWEEPS[key]


#: The sweeps run so far, by (captured step, graph, knobs) identity: see :func:`sweep_splits`.
_SWEEPS: dict[tuple[int, int, tuple[float, ...]], tuple[list[SplitPlan], float]] = {}


def _choose(plans: list[SplitPlan], budget: int) -> SplitPlan:
    """Cheapest fitting plan (ties: lower peak, then larger knob); else the lowest peak."""
    fitting = [p for p in plans if p.simulation.peak <= budget]
    if fitting:
        return min(fitting, key=lambda p: (p.simulation.cost, p.simulation.peak, -p.memory_budget))
    return min(plans, key=lambda p: (p.simulation.peak, p.simulation.cost, -p.memory_budget))


def _check_knobs(knobs: Iterable[float]) -> tuple[float, ...]:
    values = tuple(float(k) for k in knobs)
    if not values:
        raise CoopError("pytorch-mincut: memory_budgets is empty; give values in [0, 1] such as 1.0, 0.5, 0.0")
    for value in values:
        if not 0.0 <= value <= 1.0:
            raise CoopError(f"pytorch-mincut: activation_memory_budget {value} is outside [0, 1]; use a value in [0, 1]")
    return values


def _check_same_graph(graph: Graph, captured: Any) -> None:
    if not hasattr(captured, "module") or not hasattr(captured, "owner_of"):
        raise CoopError(f"pytorch-mincut: captured is a {type(captured).__name__}, not a coop Captured; pass coop.capture(...)")
    # the planner passes the captured graph with its random draws made replayable: the same structure
    if graph.structure_sha256 not in (captured.graph.structure_sha256,
                                      captured.graph.with_random_replay().structure_sha256):
        raise CoopError(
            f"pytorch-mincut: graph {graph.name!r} is not the graph of this captured model (structure digests differ); "
            "pass the Captured the graph came from"
        )


# -------------------------------------------------------------------- the AOT-style joint graph
def _find_seed(fx_graph: fx.Graph, loss: fx.Node) -> fx.Node:
    """The ``ones_like(loss)`` that autograd.grad seeds the backward with."""
    seeds = [n for n in fx_graph.nodes
             if n.op == "call_function" and n.target is torch.ops.aten.ones_like.default and n.args[0] is loss]
    if len(seeds) != 1:
        raise SolverError(
            f"pytorch-mincut: expected one loss seed ones_like({loss.name}) in the captured step, found {len(seeds)}; "
            "the capture's layout changed, so the tangent cannot be placed"
        )
    return seeds[0]


def aot_style_joint(captured: Any) -> AotJoint:
    """A fresh copy of the captured joint module in the layout the partitioner expects.

    Placeholders become ``primals_1..N`` (same order), the loss seed becomes the ``tangents_1``
    placeholder, outputs are reordered to ``(loss, new buffers..., gradients...)``. Every other
    node keeps its name, meta (fake values) and arguments. A fresh copy per call, because the
    partitioner mutates its input (dead-code elimination, tags).

    Parameters
    ----------
    captured : Any
        The captured step (its ``module``, ``loss_index``, ``grad_slice`` and ``buffer_slice``).

    Returns
    -------
    AotJoint
        The copied module, its number of forward outputs (the loss and the buffers), the placeholder
        renaming and the seed's name.

    Raises
    ------
    SolverError
        When a copied node would not keep its name.
    """
    source = captured.module.graph
    (flat_outputs,) = source.output_node().args
    flat_outputs = list(flat_outputs)
    loss = flat_outputs[captured.loss_index]
    seed = _find_seed(source, loss)
    target = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    renamed: dict[str, str] = {}
    placeholders = [n for n in source.nodes if n.op == "placeholder"]
    for index, old in enumerate(placeholders, start=1):
        new = target.placeholder(f"primals_{index}")
        new.meta = copy.copy(old.meta)
        env[old] = new
        renamed[new.name] = old.name
    tangent = target.placeholder(TANGENT_NAME)
    tangent.meta = copy.copy(seed.meta)
    env[seed] = tangent
    renamed[tangent.name] = seed.name
    for old in source.nodes:
        if old.op in ("placeholder", "output") or old is seed:
            continue
        new = target.node_copy(old, lambda n: env[n])
        if new.name != old.name:  # a placeholder name took it; the mapping by name would break
            raise SolverError(f"pytorch-mincut: fx node {old.name} was renamed {new.name} in the AOT-style copy")
        env[old] = new
    grads = flat_outputs[captured.grad_slice]
    buffers = flat_outputs[captured.buffer_slice]
    outputs = [loss, *buffers, *grads]
    target.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    target.lint()
    module = fx.GraphModule(captured.module, target)
    return AotJoint(module=module, num_fwd_outputs=1 + len(buffers), renamed=renamed, seed_name=seed.name)


def partition(joint: AotJoint, memory_budget: float) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Run PyTorch's min-cut partitioner with ``activation_memory_budget = memory_budget``.

    CSE is off, so that no node of coop's graph goes uncomputed by the modules.

    Parameters
    ----------
    joint : AotJoint
        The joint module (:func:`aot_style_joint`); the partitioner mutates it.
    memory_budget : float
        The ``activation_memory_budget`` knob, in [0, 1].

    Returns
    -------
    tuple of (fx.GraphModule, fx.GraphModule)
        The forward and backward modules.

    Raises
    ------
    SolverError
        When the partitioner raises, with the first line of its error.
    """
    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    # cse off: merging duplicate nodes would leave nodes of our Graph that no module computes.
    with functorch_config.patch(activation_memory_budget=memory_budget, cse=False):
        try:
            return min_cut_rematerialization_partition(joint.module, None, num_fwd_outputs=joint.num_fwd_outputs)
        except Exception as exc:  # noqa: BLE001 - the partitioner raises many types; report the first line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise SolverError(
                f"pytorch-mincut: torch's partitioner failed at activation_memory_budget={memory_budget}: "
                f"{type(exc).__name__}: {first}"
            ) from None


# -------------------------------------------------------------------- split -> schedule
class _Mapper:
    """Maps fx nodes of the partitioner's modules onto our Graph, checking them op by op."""

    def __init__(self, graph: Graph, captured: Any, joint: AotJoint) -> None:
        self.graph = graph
        self.captured = captured
        self.joint = joint
        self.captured_nodes = {n.name: n for n in captured.module.graph.nodes}

    def captured_name(self, joint_name: str) -> str:
        return self.joint.renamed.get(joint_name, joint_name)

    def owner(self, joint_name: str) -> int:
        name = self.captured_name(joint_name)
        if name not in self.captured.owner_of:
            raise SolverError(f"pytorch-mincut: the partitioner's node {joint_name} is not a node of the captured step")
        return self.captured.owner_of[name]

    def is_storage_owner(self, joint_name: str) -> bool:
        """True for the fx node that allocates its graph node's storage (not a folded alias)."""
        return self.captured.fx_names[self.owner(joint_name)][0] == self.captured_name(joint_name)

    def check(self, node: fx.Node, saved_alias: dict[str, str]) -> None:
        """The partitioner's node must be the captured node: same op, same inputs (by name)."""
        original = self.captured_nodes.get(self.captured_name(node.name))
        if original is None or original.op != node.op or original.target != node.target:
            raise SolverError(
                f"pytorch-mincut: the partitioner's node {node.name} ({node.target}) does not line up with the captured "
                f"step ({getattr(original, 'target', 'missing')})"
            )
        inputs = [self.captured_name(saved_alias.get(n.name, n.name)) for n in node.all_input_nodes]
        expected = [n.name for n in original.all_input_nodes]
        if inputs != expected:
            raise SolverError(
                f"pytorch-mincut: the partitioner's node {node.name} reads {inputs}, the captured one {expected}"
            )


def split_to_schedule(graph: Graph, captured: Any, joint: AotJoint, forward_module: fx.GraphModule,
                      backward_module: fx.GraphModule, memory_budget: float) -> SplitPlan:
    """Turn one (forward, backward) split into a coop Schedule over ``graph`` and simulate it.

    Parameters
    ----------
    graph : Graph
        The graph the schedule runs.
    captured : Any
        The captured step ``graph`` was made from.
    joint : AotJoint
        The joint module that was partitioned.
    forward_module : fx.GraphModule
        The partitioner's forward module.
    backward_module : fx.GraphModule
        The partitioner's backward module.
    memory_budget : float
        The knob that made the split, recorded in the plan.

    Returns
    -------
    SplitPlan
        The schedule of computes (forward, then backward with its recomputations), its simulation,
        the saved values (fx names, node ids, bytes), the recomputed nodes, the values kept because
        they may not be recomputed, and the nodes placed because no module computed them.
    """
    mapper = _Mapper(graph, captured, joint)
    forward_ids = _forward_steps(mapper, forward_module)
    saved_fx, backward_ids, kept = _backward_steps(mapper, backward_module, set(forward_ids))
    forward_ids, backward_ids, added = _place_unscheduled(graph, forward_ids, backward_ids)
    steps = [Step(op="compute", node=i) for i in (*forward_ids, *backward_ids)]
    schedule = Schedule(steps=tuple(steps))
    simulation = simulate(graph, schedule)
    saved_nodes = list(dict.fromkeys(
        mapper.owner(n) for n in saved_fx if not graph.node(mapper.owner(n)).caller_owned
    ))
    forward_set = set(forward_ids)
    return SplitPlan(
        memory_budget=memory_budget,
        schedule=schedule,
        simulation=simulation,
        saved_fx=saved_fx,
        saved_nodes=saved_nodes,
        saved_bytes=sum(graph.node(i).mem for i in saved_nodes),
        recomputed_nodes=[i for i in backward_ids if i in forward_set],
        kept_not_recomputable=kept,
        added_unplaced=added,
    )


def _call_nodes(module: fx.GraphModule) -> list[fx.Node]:
    return [n for n in module.graph.nodes if n.op in ("call_function", "get_attr")]


def _forward_steps(mapper: _Mapper, forward_module: fx.GraphModule) -> list[int]:
    """Graph ids the forward module computes, in its order (aliases and caller-owned take no step)."""
    graph = mapper.graph
    computed: list[int] = []
    available: set[int] = set()
    for node in _call_nodes(forward_module):
        mapper.check(node, {})
        owner = mapper.owner(node.name)
        if graph.node(owner).caller_owned:
            continue
        if mapper.is_storage_owner(node.name):
            _require_inputs(graph, owner, available, "forward")
            computed.append(owner)
            available.add(owner)
        elif owner not in available:
            raise SolverError(f"pytorch-mincut: forward alias {node.name} is read before its storage (node {owner}) exists")
    return computed


def _backward_steps(mapper: _Mapper, backward_module: fx.GraphModule,
                    forward_computed: set[int]) -> tuple[list[str], list[int], list[int]]:
    """(saved fx names, graph ids the backward computes in order, non-recomputables kept instead)."""
    graph = mapper.graph
    saved: list[str] = []
    available: set[int] = set()
    steps: list[int] = []
    kept: list[int] = []
    seed_id = mapper.captured.owner_of[mapper.joint.seed_name]
    for node in backward_module.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name == TANGENT_NAME:
            continue
        owner = mapper.owner(node.name)
        saved.append(node.name)
        if not graph.node(owner).caller_owned:
            if owner not in forward_computed:
                raise SolverError(f"pytorch-mincut: the backward reads saved {node.name}, which the forward never computed")
            available.add(owner)
    # The tangent: our Graph computes the seed ones_like(loss) as a node, at the start of the backward.
    _require_inputs(graph, seed_id, available | forward_computed, "backward")
    steps.append(seed_id)
    available.add(seed_id)
    for node in _call_nodes(backward_module):
        mapper.check(node, {})
        owner = mapper.owner(node.name)
        value = graph.node(owner)
        if value.caller_owned:
            continue
        if not mapper.is_storage_owner(node.name):
            if owner not in available:
                raise SolverError(f"pytorch-mincut: backward alias {node.name} is read before its storage (node {owner}) exists")
            continue
        if not value.recomputable and owner in forward_computed:
            kept.append(owner)  # a recomputation would redraw random numbers / lose a tuple output
        else:
            _require_inputs(graph, owner, available, "backward")
            steps.append(owner)
        available.add(owner)
    return saved, steps, kept


def _require_inputs(graph: Graph, node_id: int, available: set[int], phase: str) -> None:
    """Every input must be caller-owned or resident in this phase (saved, computed, kept)."""
    for source in graph.node(node_id).inputs:
        if not graph.node(source).caller_owned and source not in available:
            raise SolverError(
                f"pytorch-mincut: {phase} node {node_id} ({graph.node(node_id).name}) reads node {source} "
                f"({graph.node(source).name}), which is neither saved nor computed before it in the {phase}"
            )


def _place_unscheduled(graph: Graph, forward_ids: list[int],
                       backward_ids: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Graph nodes neither module computes (dead to the partitioner, e.g. an unused random draw).

    Our Graph requires every node computed once; each goes right after the last of its inputs,
    in the forward when all its inputs are forward values, else in the backward.
    """
    scheduled = set(forward_ids) | set(backward_ids)
    missing = [v for v in graph.order if v not in scheduled]
    forward, backward = list(forward_ids), list(backward_ids)
    for node_id in missing:
        inputs = [s for s in graph.node(node_id).inputs if not graph.node(s).caller_owned]
        if all(s in forward for s in inputs):
            where = forward
        else:
            where = backward
        position = max((len(where) - where[::-1].index(s) for s in inputs if s in where), default=0)
        where.insert(position, node_id)
    return forward, backward, missing

