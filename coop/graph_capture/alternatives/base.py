"""The substrate every alternatives finder builds on: programs, their builder, and the record of what was found.

A finder (one per operator family: :mod:`~coop.graph_capture.alternatives.activation`,
:mod:`~coop.graph_capture.alternatives.add`, :mod:`~coop.graph_capture.alternatives.conv`,
:mod:`~coop.graph_capture.alternatives.norm`, :mod:`~coop.graph_capture.alternatives.pool`,
:mod:`~coop.graph_capture.alternatives.softmax`) is a function ``finder(node, step, found)`` that the registry
(:mod:`~coop.graph_capture.alternatives.registry`) calls on each captured fx node of the operators it handles.
It reads the capture through :class:`CapturedStep`, writes the fx code of an implementation with
:class:`ImplProgramBuilder` (on fake tensors of the captured layouts: nothing is computed), and records it in
:class:`FoundAlternatives`: an implementation of a node with :meth:`FoundAlternatives.offer`, an optional value
(a compact mask, a convolution's weight gradients) with :meth:`FoundAlternatives.add_optional`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import fx
from torch._guards import detect_fake_mode

from coop.graph import Graph

#: A program reads a source fx node (by name) or an optional value (by its Graph node id).
Read = str | int


@dataclass
class ImplProgram:
    """The fx code of one implementation or optional value.

    ``graph``'s placeholders are bound, in order, to ``reads`` (a captured fx node's name, or the
    Graph id of an optional value); its output is the value. For an implementation of node v the
    value replaces v's storage-owning fx node, and v's folded views are then taken from it.
    """

    graph: fx.Graph
    reads: tuple[Read, ...]

    @property
    def calls(self) -> list[fx.Node]:
        """The program's ``call_function`` nodes, in order."""
        return [n for n in self.graph.nodes if n.op == "call_function"]

    @property
    def output(self) -> fx.Node:
        """The node whose value the program returns."""
        (value,) = self.graph.output_node().args
        return value


class ImplProgramBuilder:
    """Writes one small fx program whose values carry fake tensors of the captured shapes.

    Parameters
    ----------
    reads
        The program's inputs in order: what each placeholder is bound to (see :class:`ImplProgram`) and the
        captured (fake) value it stands for. Their placeholders are :attr:`inputs`.
    """

    def __init__(self, reads: list[tuple[Read, torch.Tensor]]) -> None:
        self.graph = fx.Graph()
        self.reads = tuple(r for r, _ in reads)
        self.mode = detect_fake_mode([v for _, v in reads])
        self.inputs: list[fx.Node] = []
        for index, (_, value) in enumerate(reads):
            node = self.graph.placeholder(f"read_{index}")
            node.meta["val"] = value
            self.inputs.append(node)

    def call(self, op: Any, *args: Any, **kwargs: Any) -> fx.Node:
        """Append a call of ``op``, its value computed on the fake values of its arguments.

        Parameters
        ----------
        op
            An aten op overload, or a plain function of tensors.
        *args, **kwargs
            Its arguments: nodes of this program or constants.

        Returns
        -------
        fx.Node
            The call's node, with its fake value in ``meta["val"]``.
        """
        values = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        keywords = {k: v.meta["val"] if isinstance(v, fx.Node) else v for k, v in kwargs.items()}
        with self.mode if self.mode is not None else contextlib.nullcontext():
            value = op(*values, **keywords)
        node = self.graph.call_function(op, tuple(args), kwargs)
        node.meta["val"] = value
        return node

    def done(self, value: fx.Node) -> ImplProgram:
        """Close the program.

        Parameters
        ----------
        value
            The node whose value the program returns.

        Returns
        -------
        ImplProgram
            The program, bound to this builder's reads.
        """
        self.graph.output(value)
        return ImplProgram(self.graph, self.reads)


@dataclass
class CapturedStep:
    """What a finder reads of the capture.

    ``graph``: the lowered Graph; ``owner_of``: fx node name -> the Graph id of the node owning its storage;
    ``values``: placeholder name -> the real tensor at capture (empty where not given: then batch norm's backward
    from its output is not offered).
    """

    graph: Graph
    owner_of: dict[str, int]
    values: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class FoundAlternatives:
    """Programs found before they are priced: per node its implementations; optional values by key.

    ``next_id`` is the Graph id the next optional value gets.
    """

    next_id: int = 0
    #: node id -> implementation name -> (program, further :class:`~coop.graph.Impl` fields)
    impls: dict[int, dict[str, tuple[ImplProgram, dict[str, Any]]]] = field(default_factory=dict)
    #: key -> (id, program, the Graph id(s) it reads); the key's first item names the value: ``mask_<key[0]>``, or
    #: key[0] itself where it holds a ":" (fx names never do), e.g. ``conv_weight_grad:<backward>``
    optional: dict[tuple[str, ...], tuple[int, ImplProgram, int | tuple[int, ...]]] = field(default_factory=dict)
    #: configuration -> program: nodes of equal shapes and arguments share one fx graph (see :meth:`shared_program`)
    programs: dict[tuple[Any, ...], ImplProgram] = field(default_factory=dict)

    def offer(self, node_id: int, name: str, program: ImplProgram, fields: dict[str, Any] | None = None) -> None:
        """Record the implementation ``name`` of node ``node_id``.

        Parameters
        ----------
        node_id
            The Graph node it implements.
        name
            The implementation's name (one of :data:`~coop.graph_capture.alternatives.registry.IMPL_NAMES`).
        program
            Its fx code.
        fields
            Further :class:`~coop.graph.Impl` fields (``inplace_of``, ``exact``, ``tolerance``).
        """
        self.impls.setdefault(node_id, {})[name] = (program, {} if fields is None else fields)

    def add_optional(self, key: tuple[str, ...], program: ImplProgram, reads: int | tuple[int, ...]) -> int:
        """Record an optional value under the next free Graph id.

        Parameters
        ----------
        key
            Identifies the value (see :attr:`optional`).
        program
            The fx code that makes it.
        reads
            The Graph id(s) it is made from.

        Returns
        -------
        int
            Its Graph id.
        """
        value_id = self.next_id
        self.optional[key] = (value_id, program, reads)
        self.next_id += 1
        return value_id

    def optional_once(self, key: tuple[str, ...], build: Callable[[], ImplProgram],
                      reads: int | tuple[int, ...]) -> tuple[int, ImplProgram]:
        """The optional value of ``key``, recorded by :meth:`add_optional` from ``build()`` the first time it is asked.

        Parameters
        ----------
        key, reads
            As for :meth:`add_optional`.
        build
            Makes the value's program (called only when ``key`` is new).

        Returns
        -------
        tuple[int, ImplProgram]
            The value's Graph id and program.
        """
        if key not in self.optional:
            self.add_optional(key, build(), reads)
        value_id, program, _ = self.optional[key]
        return value_id, program

    def shared_program(self, key: tuple[Any, ...], reads: tuple[Read, ...],
                       build: Callable[[], ImplProgram]) -> ImplProgram:
        """The program of configuration ``key`` bound to ``reads``: built once per capture (long programs, e.g. a
        batch norm backward in channel blocks, cost a fake-tensor call per op), its fx graph shared by equal nodes.

        Parameters
        ----------
        key
            The configuration, usually the implementation's name and :func:`signature` of the node.
        reads
            What this node's program reads.
        build
            Builds the program (called only when ``key`` is new).

        Returns
        -------
        ImplProgram
            The shared fx graph bound to ``reads``.
        """
        program = self.programs.get(key)
        if program is None:
            program = self.programs[key] = build()
        return ImplProgram(program.graph, reads)


class Finder(Protocol):
    """Offers the alternatives of one captured fx node (the registry calls it on the operators it handles)."""

    def __call__(self, node: fx.Node, step: CapturedStep, found: FoundAlternatives) -> None: ...


def signature(node: fx.Node) -> tuple[Any, ...]:
    """A node's configuration.

    Parameters
    ----------
    node
        A captured fx node.

    Returns
    -------
    tuple
        Its target, and each argument's layout (tensors) or value (the rest).
    """
    def describe(arg: Any) -> Any:
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), str(value.dtype), tuple(value.stride()), str(value.device)
        return repr(arg) if not isinstance(arg, fx.Node) else ("node", repr(value))
    return (str(node.target), *(describe(a) for a in node.args))


def same_layout(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are tensors of one shape, dtype, stride and device.

    Parameters
    ----------
    a, b
        Any values (a non-tensor never matches).

    Returns
    -------
    bool
        True where one could stand for the other's storage layout.
    """
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and a.stride() == b.stride() and a.device == b.device)


def same_layouts(produced: Any, expected: Any) -> bool:
    """Whether two output tuples match item by item: both None, or tensors of :func:`same_layout`.

    Parameters
    ----------
    produced, expected
        Tuples of tensors or None of equal length (a program's output, the captured node's value).

    Returns
    -------
    bool
        True where every item matches.
    """
    return all(a is None and b is None or same_layout(a, b) for a, b in zip(produced, expected, strict=True))


def whole_storage(value: Any) -> bool:
    """Whether ``value`` is a contiguous tensor that is its whole storage.

    Returns
    -------
    bool
        True where an in-place op on it writes exactly the node's bytes.
    """
    return (isinstance(value, torch.Tensor) and value.is_contiguous() and value.storage_offset() == 0
            and value.numel() * value.element_size() == value.untyped_storage().nbytes())


__all__ = ["CapturedStep", "Finder", "FoundAlternatives", "ImplProgram", "ImplProgramBuilder", "Read", "same_layout",
           "same_layouts", "signature", "whole_storage"]
