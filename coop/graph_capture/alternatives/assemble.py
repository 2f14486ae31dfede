"""The alternatives found in a captured step, priced, into its Graph (MONeT, Shah et al. 2021).

:func:`add_alternatives` runs the registered finders (:mod:`~coop.graph_capture.alternatives.registry`), prices
each program once (:mod:`~coop.graph_capture.alternatives.price`; programs sharing an fx graph share its price)
and returns the Graph whose nodes carry their implementations (``Node.impls``), with the optional values that some
implementation reads, and every program the executor runs (:class:`Alternatives`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import fx

from coop.graph import Graph, Impl, Node
from coop.graph_capture.alternatives.base import ImplProgram
from coop.graph_capture.alternatives.price import Calibration, Price, price
from coop.graph_capture.alternatives.registry import IMPL_NAMES, find_alternatives
from coop.graph_capture.cost import NodeProfile, analytic_seconds, node_flops


@dataclass
class Alternatives:
    """The Graph with implementations and optional values, and their fx programs."""

    graph: Graph
    impl_fx: dict[int, dict[str, ImplProgram]] = field(default_factory=dict)  # node id -> impl name -> program
    optional_fx: dict[int, ImplProgram] = field(default_factory=dict)  # optional node id -> program


def add_alternatives(module: fx.GraphModule, graph: Graph, fx_names: dict[int, list[str]], owner_of: dict[str, int],
                     profiled: NodeProfile | None = None, values: Mapping[str, torch.Tensor] | None = None) -> Alternatives:
    """``graph`` with the alternatives the registered finders find, each priced.

    Parameters
    ----------
    module
        The captured step.
    fx_names
        Graph id -> its fx nodes' names, the storage owner's first.
    owner_of
        fx node name -> the Graph id owning its storage.
    profiled
        The step's measured seconds, where the capture was profiled: the programs' seconds are then the analytic
        model calibrated on the step (:class:`~coop.graph_capture.alternatives.price.Calibration`), and a node's
        implementation replaces its measured seconds.
    values
        Placeholder name -> real tensor at capture (see
        :func:`~coop.graph_capture.alternatives.registry.find_alternatives`).

    Returns
    -------
    Alternatives
        The Graph with the implementations (``Node.impls``) and the optional values they read, and their programs.
    """
    found = find_alternatives(module, graph, fx_names, owner_of, values)
    calibration = Calibration.of_step(module, profiled) if profiled is not None else None
    by_name = {n.name: n for n in module.graph.nodes}
    owner_seconds = _owner_seconds(profiled)
    prices: dict[int, Price] = {}  # fx graph id -> its price: shared programs are priced once

    def price_once(program: ImplProgram) -> Price:
        if id(program.graph) not in prices:
            prices[id(program.graph)] = price(program, calibration)
        return prices[id(program.graph)]

    result = Alternatives(graph=graph)
    optional_nodes: list[Node] = []
    for (value_name, *_), (mask_id, program, reads) in found.optional.items():
        cost = price_once(program)
        inputs = reads if isinstance(reads, tuple) else (reads,)
        source = graph.node(inputs[0])
        # every tensor of a tuple value (W of a split convolution backward: weight and bias grads) is stored
        # a value made from a multi-output op's extra output (which exists only after the op's first compute and is
        # never recomputed) is made once too, so that the extra output can be freed right after it
        once = any(graph.node(i).output_of is not None for i in inputs)
        optional_nodes.append(Node(id=mask_id, name=value_name if ":" in value_name else f"mask_{value_name}", op=str(program.output.target), inputs=inputs,
                                   mem=cost.mem + cost.extra, cost=cost.seconds, workspace=cost.workspace,
                                   kind=source.kind, optional=True, recomputable=not once))
        result.optional_fx[mask_id] = program
    nodes = []
    for node in graph.nodes:
        impls = []
        for name, (program, extra) in found.impls.get(node.id, {}).items():
            cost = price_once(program)
            owner = by_name[fx_names[node.id][0]]
            seconds = max(node.cost - owner_seconds(owner) + cost.seconds, 0.0)
            reads = _impl_reads(node, program, fx_names, owner_of, by_name)
            mem = node.mem if "inplace_of" in extra else cost.mem  # in place: the overwritten input's bytes
            # a multi-output op's extra outputs exist at its step, where contract 2 counts them as its workspace (the
            # Graph requires it): those it allocates (batch norm's weight/bias grads) or hands out (a split
            # convolution's W, then also counted as a read value at that step: a weight-sized double count)
            extras = sum(graph.node(e).mem for e in graph.extra_outputs.get(node.id, ()))
            impls.append(Impl(name=name, cost=seconds, mem=mem, workspace=cost.workspace + max(cost.extra, extras),
                              inputs=None if reads == node.inputs else reads, **extra))
            result.impl_fx.setdefault(node.id, {})[name] = program
        nodes.append(node.model_copy(update={"impls": tuple(impls)}) if impls else node)
    used = {r for programs in result.impl_fx.values() for p in programs.values() for r in p.reads if isinstance(r, int)}
    optional_nodes = [n for n in optional_nodes if n.id in used]
    result.optional_fx = {k: v for k, v in result.optional_fx.items() if k in used}
    counts = {name: sum(name in p for p in result.impl_fx.values()) for name in IMPL_NAMES}
    meta = {**graph.meta, "alternatives": {**counts, "optional": len(optional_nodes)}}
    result.graph = Graph(name=graph.name, nodes=(*nodes, *optional_nodes), outputs=graph.outputs, order=graph.order,
                         meta=meta)
    return result


def _owner_seconds(profiled: NodeProfile | None) -> Callable[[fx.Node], float]:
    """The cost of one captured fx node as the nodes were priced: measured, or the analytic model."""
    def seconds(node: fx.Node) -> float:
        if profiled is not None:
            return profiled.seconds.get(node.name, 0.0)
        return analytic_seconds(node, node_flops(node))

    return seconds


def _impl_reads(node: Node, program: ImplProgram, fx_names: dict[int, list[str]], owner_of: dict[str, int],
                by_name: dict[str, fx.Node]) -> tuple[int, ...]:
    """The Graph ids an implementation reads: its program's reads and those of the node's folded fx nodes."""
    reads: set[int] = {r if isinstance(r, int) else owner_of[r] for r in program.reads}
    for name in fx_names[node.id][1:]:
        reads.update(owner_of[source.name] for source in by_name[name].all_input_nodes)
    reads.discard(node.id)
    ordered = [i for i in node.inputs if i in reads]
    return (*ordered, *sorted(reads - set(ordered)))


def programs(alternatives: Alternatives) -> Iterator[tuple[int, str | None, ImplProgram]]:
    """Every program of the alternatives.

    Parameters
    ----------
    alternatives
        What :func:`add_alternatives` returned.

    Returns
    -------
    Iterator
        (node id, implementation name or None for an optional value, program): the optional values' first.
    """
    for node_id, program in alternatives.optional_fx.items():
        yield node_id, None, program
    for node_id, by_impl in alternatives.impl_fx.items():
        for name, program in by_impl.items():
            yield node_id, name, program


__all__ = ["Alternatives", "add_alternatives", "programs"]
