"""What an op of a compiled step costs: inductor's kernels at this machine's measured rates, no per-op host cost.

The capture's nominal model (``flops / 1e11 + bytes / 2e10``, :func:`coop.graph_capture.cost.analytic_seconds`) prices
a pointwise op by its bytes alone. A compiled CPU step does not run that way: measured on the 2-core EPYC of
BENCHMARKS.md at one thread (2026-11-29), a compiled ``rand_like`` of 524,288 floats took 7.3 ms (14 ns an element)
and a compiled dropout 9.7 ms, where the nominal model prices the draw at 0.1 ms, while a 134 MFLOP ``mm`` took
3.3 ms against a nominal 1.5 ms. So the solver saw a recomputed dropout mask as some 70 times cheaper than it runs
and a matmul as cheap beside it: BERT at 0.5 recomputed five ``inductor_random`` draws (1.4 M elements, about
20 ms a step) and ran 40 ms slower than inductor's own partitioner.

:func:`reprice` prices each node of a lowered joint graph as the compiled step runs its ops: the machine's measured
FLOP rate and bandwidth and its per-element table (:func:`coop.graph_capture.host_cost.machine_rates`: transcendental
ops, softmax, normalisation, random draws) with no per-op host cost (a fused kernel dispatches once for many aten
ops, and an extern kernel's call is inside the measured rates). Inductor's random draw ``prims.inductor_random`` has
no eager kernel to time; it is priced as the table's ``aten.bernoulli`` (18 ns an element in eager at one thread on
the machine above, against the compiled 14 ns). Only a CPU step is repriced: the calibration times CPU kernels.

Neither ``pricing="draws"`` nor ``pricing="measured"`` became the default on 2026-11-29 (the nominal model stayed it
then; ``"fused"`` below is it now): with the draws priced
right (``pricing="draws"``), BERT at 0.5 stopped recomputing them and recomputed eight ``addmm`` and two ``bmm``
instead (0.570 GFLOP against 0.336), and none of its three rounds met the budget (18,159,240, 19,193,352 and
18,405,384 B against 17,447,940 B; bench_compile's BERT worker, which also ran 255.39 ms against compile-amb's
227.77); ``pricing="measured"`` did the same on BERT and held 9,273,184 B for a 2,258,436 B plan on the tied MLP of
tests/test_compile_observed.py at 0.5 (nominal: 2,521,800 B, then 2,254,344 B). Both plans recompute work whose
inputs are all saved forward values (matmuls, chains of pointwise ops), and inductor does not keep the emitted
order of backward kernels that depend on nothing the backward computed: such a recomputation runs early and lives
long. A price that is right per kernel steers the solver into that; pinning those kernels where the schedule put
them comes first.

``pricing="fused"``, the default since 2026-12-02, keeps the nominal model where it was right and corrects it where
bench_compile measured it wrong (its coop.compile rows each timed against a coop.compile that recomputes nothing).
The step without recomputation was priced a quarter low with eager's draws, which the nominal model prices by their
bytes (GPT-2 at 0.5: 53.84 ms priced, 69.84 measured): the draws are priced as ``"draws"`` prices them. A recomputed
matmul cost what its FLOPs say, but a recomputed pointwise value was priced as if written and read again, where
inductor computes it inside the kernels that read it: GPT-2 at 0.5 priced its recomputations 11.36 ms (6.25 of them
pointwise) and measured 6.0. :func:`inlined_recomputations` prices those values without the buffers inductor then
never writes. With both, the predicted overhead was within max(3 points,
25 %) of the measured in 8 of 15 rows against the nominal 7 of 16 (BENCHMARKS.md, bench_compile, 2026-12-02), with
every bar of the benchmark held; the misses are rows recomputing under 0.07 GFLOP, whose measured overhead (-4 to
+3 %) is within the timing's noise, and the step's own price, low without dropout too (LLaMA 42.83 ms against
54-62 measured, ResNet 2.33 against 7.79, whose recomputation was priced 0.43 ms and measured 0.43): so a compiled
plan also gives its predicted extra as a share of its measured step (``CompiledPlan.overhead_of_step``).

On a CPU step ``"fused"`` has, since 2026-12-02 (the second session that day), priced each recomputation at this
machine's measured rates (:func:`recomputation_rates`: FLOPs at the measured FLOP rate, bytes at the measured
bandwidth, the draws at their table's price, its fused and inlined traffic taken off at that bandwidth), and the
step's first computes as before (:func:`recomputations_at_rates`): the solver's choices are between recomputations,
and every recomputation bench_compile timed cost less than the nominal model priced it (the quiet EPYC: the
recomputations measured at a median 0.54 of their predicted overhead; measured bandwidth 1.19e11 B/s against the
nominal 2e10). The step keeps its nominal price, right within 2 % on the EPYC's transformer steps, and a plan also
gives its extra as a share of its timed step (``CompiledPlan.overhead_of_step``). On the 2-core Xeon of
BENCHMARKS.md (bench_compile, 2026-12-02, one worker, quiet) GPT-2 at 0.5 recomputing 0.3 GFLOP was predicted 12.18 %
by the nominal prices and 6.69 % by these, and measured -1.4 % and -0.3 % against the store-all step: there a plan
that recomputes only pointwise values (GPT-2 at 0.9) ran 2 ms faster than the store-all step, so keeping a value
costs more than its bytes at the measured bandwidth, which no price of a recomputation models. Over the five models
there 2 of 9 rows were within max(3 points, 25 %) (ViT's two), and LLaMA's recomputations were priced low (0.5:
2.94 ms priced, about 5.1 measured)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable

import torch
from torch import fx

from coop.compiled.fusion import is_loop_op, is_pointwise
from coop.errors import CoopError
from coop.graph import Graph
from coop.graph_capture.cost import BANDWIDTH, analytic_seconds, bytes_moved, tensor_leaves
from coop.graph_capture.host_cost import MachineRates, element_key, kernel_calls, machine_rates
from coop.graph_capture.lower import Lowered
from coop.simulator import Simulation, relative_overhead

__all__ = ["COMPILED_KEYS", "DRAWS", "compiled_rates", "inlined_recomputations", "op_seconds", "predicted_overhead",
           "predicted_step_seconds", "recomputation_rates", "recomputations_at_rates", "reprice", "step_rates",
           "unwritten_seconds"]

#: compiled ops priced as an op of the calibration's table: inductor's draw (no eager kernel to time) as a Bernoulli
#: draw, and coop's own mask draws (eager's draws, split from a dropout: :mod:`coop.graph_capture.random_ops`) as
#: the table's bool mask draw, which is the kernel both run
COMPILED_KEYS = {"prims.inductor_random": "aten.bernoulli", "coop.dropout_mask": "coop.bernoulli_mask",
                 "coop.float8_dropout_mask": "coop.bernoulli_mask"}
#: the ops ``pricing="draws"`` prices at the measured rates, the rest nominally: every random draw of a compiled step
#: (before 2026-12-02 inductor's alone, so that with eager's draws, ``fallback_random``, the option priced nothing:
#: bench_compile's GPT-2 at 0.5 priced its step 53.84 ms by the nominal model and ran 69.84 ms; with its mask draws
#: priced so, 62.06 ms against 59.96)
DRAWS = frozenset({"prims.inductor_random", "coop.dropout_mask", "coop.float8_dropout_mask"})


def compiled_rates(rates: MachineRates) -> MachineRates:
    """``rates`` without the per-op host cost and the thread pool's wake-up: a compiled kernel pays neither per aten op.

    Parameters
    ----------
    rates : MachineRates
        A calibration (:func:`coop.graph_capture.host_cost.machine_rates`).

    Returns
    -------
    MachineRates
        The same rates with ``per_op_s`` and ``parallel_s`` zero.
    """
    return dataclasses.replace(rates, per_op_s=0.0, parallel_s=0.0)


def step_rates(placeholders: list[fx.Node], device: torch.device | None) -> MachineRates | None:
    """The rates a joint graph is priced at: this machine's compiled rates for a CPU step, None (nominal) otherwise.

    Parameters
    ----------
    placeholders : list of fx.Node
        The joint graph's placeholders (their fake values name the step's device).
    device : torch.device or None
        The device a meta-device model is planned for (None: the values' own, so a meta-device step without one
        keeps the nominal model).
    """
    if device is not None and device.type != "cpu":
        return None
    if device is None and any(t.device.type != "cpu" for n in placeholders for t in tensor_leaves(n.meta.get("val"))):
        return None
    return compiled_rates(machine_rates())


def op_seconds(fx_node: fx.Node, flops: int, rates: MachineRates) -> float:
    """Seconds of one aten op of a compiled step (module docstring).

    Parameters
    ----------
    fx_node : fx.Node
        A node of the joint graph, with fake values in ``meta["val"]``.
    flops : int
        Its FLOPs (:func:`coop.graph_capture.cost.node_flops`).
    rates : MachineRates
        Compiled rates (:func:`compiled_rates`).

    Returns
    -------
    float
        ``flops / flop_rate + bytes / bandwidth``, or for an op of the per-element table ``flops / flop_rate +
        max(elements x element_s, bytes / bandwidth)``; 0 for a node that is no call or a ``getitem``.
    """
    if fx_node.op != "call_function" or fx_node.target is operator.getitem:
        return 0.0
    moved = bytes_moved(fx_node)
    if not moved:  # a view: no kernel
        return flops / rates.flop_rate
    elements = max((t.numel() for t in tensor_leaves(fx_node.meta.get("val"))), default=0)
    first = fx_node.args[0] if fx_node.args else None
    key = element_key(fx_node.target, first.meta.get("val") if isinstance(first, fx.Node) else None)
    key = COMPILED_KEYS.get(key, key)
    return rates.op_seconds(flops, moved, elements, dispatched=True, op=key, calls=kernel_calls(key, fx_node.args))


def reprice(lowered: Lowered, fx_nodes: dict[str, fx.Node], rates: MachineRates,
            only: frozenset[str] | None = None) -> Lowered:
    """The lowering with each node's cost the sum of its fx nodes' :func:`op_seconds` (in place; returned).

    Parameters
    ----------
    lowered : Lowered
        A joint graph's lowering (before fusion: one node per storage).
    fx_nodes : dict
        fx name -> the fx node of the graph ``lowered`` came from.
    rates : MachineRates
        Compiled rates (:func:`compiled_rates`).
    only : frozenset of str or None
        The ops (by :func:`coop.graph_capture.host_cost.element_key`) priced at ``rates``; every other op keeps the
        nominal :func:`coop.graph_capture.cost.analytic_seconds`. None: every op at ``rates``.

    Returns
    -------
    Lowered
        ``lowered``, its Graph's costs replaced and its ``meta`` naming the rates (``cost_unit``, ``compiled_rates``).
    """
    graph = lowered.graph
    nodes = []
    for node in graph.nodes:
        names = lowered.fx_names.get(node.id, [])
        if node.caller_owned or not names:
            nodes.append(node)
            continue
        cost = sum(_price(fx_nodes[name], lowered.fx_flops.get(name, 0), rates, only) for name in names)
        nodes.append(node.model_copy(update={"cost": cost}))
    which = "every op" if only is None else ", ".join(sorted(only))
    unit = (f"seconds ({which} as a compiled step's kernels run at this machine's measured rates, the rest nominal: "
            "coop.compiled.pricing)")
    meta = {**graph.meta, "cost_unit": unit, "compiled_rates": rates.as_dict()}
    lowered.graph = Graph(name=graph.name, nodes=tuple(nodes), outputs=graph.outputs, order=graph.order, meta=meta)
    return lowered


def _price(fx_node: fx.Node, flops: int, rates: MachineRates, only: frozenset[str] | None) -> float:
    """One fx node's seconds: at ``rates`` where ``only`` names its op (or is None), else the nominal model."""
    if fx_node.op != "call_function":
        return 0.0
    if only is None or element_key(fx_node.target) in only:
        return op_seconds(fx_node, flops, rates)
    return analytic_seconds(fx_node, flops)


def unwritten_seconds(rates: MachineRates | None) -> Callable[[fx.Node], float]:
    """The seconds a fused member's value would cost to write and read back, at ``rates``' bandwidth (None: nominal).

    Parameters
    ----------
    rates : MachineRates or None
        Compiled rates, or None for the nominal :data:`coop.graph_capture.cost.BANDWIDTH`.

    Returns
    -------
    callable
        fx node -> ``2 x its bytes / bandwidth``.
    """
    bandwidth = BANDWIDTH if rates is None else rates.bandwidth

    def seconds(node: fx.Node) -> float:
        value = node.meta.get("val")
        written = value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0
        return 2 * written / bandwidth

    return seconds


def inlined_recomputations(lowered: Lowered, fx_nodes: dict[str, fx.Node], bandwidth: float) -> Lowered:
    """The lowering with each pointwise forward value priced as inductor runs it when the backward recomputes it
    (in place; returned).

    A pointwise value (its node's own op pointwise: a fused group is priced as its last member's kernel) that the
    backward reads costs, when the backward recomputes it, less than its nominal price (its inputs' read and its
    write) says, in two ways:

    * read by exactly one backward node, a loop op (:func:`coop.compiled.fusion.is_loop_op`), it is not written
      again: inductor computes it inside that reader's loop, which reads the value's inputs instead of the value
      (``2 x bytes / bandwidth`` less: its write and its reader's read);
    * read by exactly one forward node, a loop op, the forward need not write it either: a value not saved for the
      backward lives inside its forward reader's kernel (``bytes / bandwidth`` less: its write).

    The node's cost is lowered by what applies (to no less than a tenth of it). Every compute of the node is so
    lowered, the first too, so that recomputing it costs the lowered price, and the step's baseline is lowered by
    the same amount for every schedule: that amount is recorded (``meta["first_compute_discount_s"]``) for
    :func:`predicted_overhead` to add back to the step the overhead is a share of.

    Parameters
    ----------
    lowered : Lowered
        A joint graph's lowering after fusion (:func:`coop.compiled.fusion.fuse_pointwise`), tangents as nodes.
    fx_nodes : dict
        fx name -> the fx node of the graph ``lowered`` came from.
    bandwidth : float
        Bytes per second the saved traffic is priced at (the nominal :data:`coop.graph_capture.cost.BANDWIDTH`, or
        a calibration's).

    Returns
    -------
    Lowered
        ``lowered``, with ``meta["inlined_recomputations"]`` the ids of the nodes so priced and
        ``meta["first_compute_discount_s"]`` the seconds their first computes were lowered by.
    """
    graph = lowered.graph
    readers: dict[int, dict[str, list[int]]] = {node.id: {"forward": [], "backward": []} for node in graph.nodes}
    for node in graph.nodes:
        if node.kind in ("forward", "backward"):
            for source in node.inputs:
                readers[source][node.kind].append(node.id)

    def one_loop_reader(ids: list[int]) -> bool:
        reader = fx_nodes.get(lowered.fx_names.get(ids[0], [""])[0]) if len(ids) == 1 else None
        return reader is not None and is_loop_op(reader)

    nodes, priced, discount = [], [], 0.0
    for node in graph.nodes:
        own = fx_nodes.get(lowered.fx_names.get(node.id, [""])[0])
        backward = readers[node.id]["backward"]
        if (node.kind != "forward" or not node.recomputable or node.random or node.impls or own is None
                or not backward or not is_pointwise(own)):
            nodes.append(node)
            continue
        saved_bytes = (2 * node.mem if one_loop_reader(backward) else 0)
        saved_bytes += node.mem if one_loop_reader(readers[node.id]["forward"]) else 0
        if not saved_bytes:
            nodes.append(node)
            continue
        cost = max(node.cost - saved_bytes / bandwidth, node.cost / 10)
        discount += node.cost - cost
        nodes.append(node.model_copy(update={"cost": cost}))
        priced.append(node.id)
    meta = {**graph.meta, "inlined_recomputations": priced, "first_compute_discount_s": discount}
    lowered.graph = Graph(name=graph.name, nodes=tuple(nodes), outputs=graph.outputs, order=graph.order, meta=meta)
    return lowered


def recomputation_rates(rates: MachineRates) -> MachineRates:
    """The rates a recomputed kernel is priced at: ``rates`` with the per-element table kept for the random draws
    alone (:data:`COMPILED_KEYS`' ops), so that every other op pays its FLOPs at the measured FLOP rate and its bytes
    at the measured bandwidth; convolutions keep their fitted rates.

    Parameters
    ----------
    rates : MachineRates
        Compiled rates (:func:`compiled_rates`).

    Returns
    -------
    MachineRates
        The same rates, ``element_s`` cut to the draws.
    """
    draws = set(COMPILED_KEYS.values())
    return dataclasses.replace(rates, element_s={op: s for op, s in rates.element_s.items() if op in draws})


def recomputations_at_rates(priced: Lowered, at_rates: Graph) -> Lowered:
    """``priced`` with each computed node's cost its cost in ``at_rates`` (in place; returned): a recomputation
    priced at this machine's measured rates, the step's first computes still at ``priced``'s.

    ``at_rates`` is the same lowering priced at :func:`recomputation_rates` (same fusion, so the same node ids).
    Every compute of a node pays one cost in the Graph; the difference between a node's two prices is added to
    ``meta["first_compute_discount_s"]``, which :func:`predicted_step_seconds` adds back to the baseline, so that the
    step is priced as before and only what a schedule computes again is priced at the measured rates.

    Parameters
    ----------
    priced : Lowered
        The lowering at its pricing's costs (after fusion and :func:`inlined_recomputations`).
    at_rates : Graph
        The same Graph at :func:`recomputation_rates` (its fused and inlined values priced at that bandwidth).

    Returns
    -------
    Lowered
        ``priced``, its Graph's costs replaced and ``meta["recomputation_rates"]`` naming the rates.
    """
    graph = priced.graph
    if len(at_rates.nodes) != len(graph.nodes):
        raise CoopError("coop.compile: the two pricings of one joint graph fused it differently; report it")
    nodes, discount = [], float(graph.meta.get("first_compute_discount_s", 0.0))
    for node, other in zip(graph.nodes, at_rates.nodes, strict=True):
        if node.caller_owned or not node.recomputable:
            nodes.append(node)
            continue
        discount += node.cost - other.cost
        nodes.append(node.model_copy(update={"cost": other.cost}))
    meta = {**graph.meta, "first_compute_discount_s": discount,
            "recomputation_rates": at_rates.meta.get("compiled_rates")}
    priced.graph = Graph(name=graph.name, nodes=tuple(nodes), outputs=graph.outputs, order=graph.order, meta=meta)
    return priced


def predicted_step_seconds(graph: Graph, simulation: Simulation) -> float:
    """A compiled plan's predicted step without recomputation: the simulation's baseline plus the discount its first
    computes were priced below (``meta["first_compute_discount_s"]``, :func:`inlined_recomputations`).

    Parameters
    ----------
    graph : Graph
        The plan's Graph.
    simulation : Simulation
        The schedule's simulation.

    Returns
    -------
    float
        Seconds, in the Graph's cost unit.
    """
    return simulation.baseline_cost + float(graph.meta.get("first_compute_discount_s", 0.0))


def predicted_overhead(graph: Graph, simulation: Simulation | None) -> float:
    """A compiled plan's predicted recomputation overhead: its extra cost over the step's own.

    Parameters
    ----------
    graph : Graph
        The plan's Graph (:func:`predicted_step_seconds` reads its first computes' discount).
    simulation : Simulation or None
        The schedule's simulation (None: nothing planned, 0).

    Returns
    -------
    float
        ``(cost - baseline_cost) / predicted_step_seconds``.
    """
    if simulation is None:
        return 0.0
    return relative_overhead(simulation.cost - simulation.baseline_cost, predicted_step_seconds(graph, simulation))
