"""Operator implementations PyTorch really offers, found in a captured step (MONeT, Shah et al. 2021).

MONeT ("Memory Optimization for Deep Networks", ICLR 2021) lowers a training step's memory by
choosing *how* each operator runs together with what is recomputed. After lowering, this module
finds in the joint fx graph the choices that are bit-identical to eager PyTorch and adds them to
the Graph (contract 1: ``Node.impls``, optional values), with the fx code the executor runs for
each in :class:`ImplProgram`:

* **compact masks** -- ``threshold_backward(grad, v, t)`` (ReLU's backward) and
  ``hardtanh_backward(grad, v, lo, hi)`` (ReLU6, hardtanh) read only *where* ``v`` blocks the
  gradient. An optional value ``mask = le(v, t)`` (or ``not(lo < v < hi)``: hardtanh's kernel zeroes
  the gradient at a NaN ``v``, ReLU's passes it), one byte per element, is computed from ``v`` while
  it is alive, and the backward's implementation ``mask`` reads ``[grad, mask]`` and runs
  ``masked_fill(grad, mask, 0)``; ``mask_inplace`` runs ``masked_fill_`` into ``grad``'s storage
  (``Impl.inplace_of``). The float ``v`` need not be kept. The kernels write ``+0.0`` where the
  mask holds and copy ``grad`` elsewhere, so the bits are identical (tests/test_alternatives.py
  compares raw bits with signed zeros, NaN, infinities and values at the thresholds).
* **backward from the output** -- ``hardtanh_backward`` reads hardtanh's *input*; its
  implementation ``from_output`` reads the output instead (``out <= lo`` iff ``x <= lo`` since
  ``out = clamp(x, lo, hi)``), which an in-place hardtanh leaves as the only value.
* **batch norm from its output** (inexact, MONeT's output-activated normalisation) --
  ``native_batch_norm_backward``'s implementation ``from_output`` reads batch norm's output ``y``
  instead of its input and recomputes ``x_hat = (y - beta) / gamma``
  (:func:`batch_norm_from_output_program`); offered only where every ``gamma`` is nonzero in the real
  ``values`` passed at capture, with ``exact=False`` and :data:`BATCH_NORM_FROM_OUTPUT_TOLERANCE`.
* **in place** -- an activation with an in-place aten variant (``relu_``, ``hardtanh_``, ...)
  over a value of its own size gets the implementation ``inplace`` (``Impl.inplace_of``): the
  executor emits the in-place op on the input's value, whose storage the output takes over. The
  schedule semantics (coop.schedule) decide when that is legal; capture only offers it.

Steps of a CNN's backward that hold three activations at once get their own modules:

* **convolution backward split** (:mod:`~coop.graph_capture.alternatives_conv`, ``split``): an
  optional value W (weight and bias gradients, from grad_out and the input) and grad_input from
  ``[grad_out, weight, W]``, as MONeT runs backward-data and backward-weight separately; exact.
* **batch norm backward over its incoming gradient** (:mod:`~coop.graph_capture.alternatives_norm`,
  ``grad_inplace``): the eager kernel in channel blocks, grad_input written over grad_out; exact
  on CPU where offered.
* **batch norm forward over its input** (:mod:`~coop.graph_capture.alternatives_norm`, ``forward_inplace``):
  the same aten forward in channel blocks, the output written over x, the statistics concatenated; exact on
  CPU where offered. A backward that still reads x then needs it recomputed, or reads the output
  (``from_output``).
* **(log-)softmax backward over its incoming gradient** (:mod:`~coop.graph_capture.alternatives_softmax`,
  ``grad_inplace``): the eager kernel on chunks of rows, each written over grad's rows; exact on CPU.
* **max-pool backward from its indices** (:mod:`~coop.graph_capture.alternatives_pool`,
  ``from_indices``): the pooled input is not read; exact. ``from_packed`` reads the indices packed to one
  byte each (the argmax's offset inside its window, an optional value made once from the op's int64
  indices, which are then freed); exact.
* **add over one operand** (:mod:`~coop.graph_capture.alternatives_add`, ``inplace`` /
  ``inplace_other``): a residual add written over either operand, operands in eager's order; exact.

Costs (:mod:`~coop.graph_capture.alternatives_price`): no program runs on made-up data at capture
(issue 22). Stored bytes come from a run of the program on fake tensors of the captured layouts, with
the reviewed table of kernels whose storage differs from the meta function's
(:mod:`~coop.graph_capture.storage_table`); the workspace is the program's peak of live intermediate
storages (what a memory meter sees above the inputs) minus its output. Seconds: the analytic model
that priced the nodes, calibrated on a profiled capture by the measured/analytic ratio of the same ops
in the real step (an estimate, not a measurement of the program).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

from coop.graph import Graph, Impl, Node
from coop.graph_capture.cost import NodeProfile, analytic_seconds, node_flops

aten = torch.ops.aten

#: Activations with an in-place aten variant of the same arithmetic (same kernel, written into its input).
IN_PLACE_VARIANTS: dict[Any, Any] = {
    aten.relu.default: aten.relu_.default,
    aten.hardtanh.default: aten.hardtanh_.default,
    aten.leaky_relu.default: aten.leaky_relu_.default,
    aten.silu.default: aten.silu_.default,
    aten.sigmoid.default: aten.sigmoid_.default,
    aten.tanh.default: aten.tanh_.default,
}

#: The implementations capture offers, by name (``split``: coop.graph_capture.alternatives_conv;
#: ``grad_inplace``: coop.graph_capture.alternatives_norm and alternatives_softmax; ``from_indices`` and
#: ``from_packed``: coop.graph_capture.alternatives_pool;
#: ``inplace`` / ``inplace_other`` of an ``add``: coop.graph_capture.alternatives_add; ``forward_inplace`` of a
#: batch norm forward: coop.graph_capture.alternatives_norm).
IMPL_NAMES = ("mask", "mask_inplace", "from_output", "inplace", "split", "grad_inplace", "from_indices", "inplace_other",
              "from_packed", "forward_inplace")

#: Training-mode batch norm forwards whose saved statistics ``native_batch_norm_backward`` reads.
BATCH_NORM_FORWARDS = (aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default,
                       aten._native_batch_norm_legit.default)

#: Declared relative error of batch norm's backward from its output against eager autograd, relative to the
#: size of each gradient's terms (max |gamma * invstd| * max |g| for grad_input, the largest per-channel
#: sum |g * x_hat| and sum |g| for grad_weight and grad_bias; relative to max |grad| itself the error is
#: unbounded, as grad_input cancels to ~0 when few elements share a channel). Measured in float32 over 200
#: random shapes (>= 16 elements a channel), 0.1 <= |gamma| <= 2, beta ~ N(0, 1): at most 6.1e-7; declared
#: with a safety factor of ~16. It grows with |beta| / |gamma| (y - beta loses x_hat's low bits).
BATCH_NORM_FROM_OUTPUT_TOLERANCE = 1e-5

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
        return [n for n in self.graph.nodes if n.op == "call_function"]

    @property
    def output(self) -> fx.Node:
        (value,) = self.graph.output_node().args
        return value


@dataclass
class Alternatives:
    """The Graph with implementations and optional values, and their fx programs."""

    graph: Graph
    impl_fx: dict[int, dict[str, ImplProgram]] = field(default_factory=dict)  # node id -> impl name -> program
    optional_fx: dict[int, ImplProgram] = field(default_factory=dict)  # optional node id -> program


class _Builder:
    """Writes one small fx program whose values carry fake tensors of the captured shapes."""

    def __init__(self, reads: list[tuple[Read, torch.Tensor]]) -> None:
        self.graph = fx.Graph()
        self.reads = tuple(r for r, _ in reads)
        self.mode = detect_fake_mode([v for _, v in reads])
        self.inputs = []
        for index, (_, value) in enumerate(reads):
            node = self.graph.placeholder(f"read_{index}")
            node.meta["val"] = value
            self.inputs.append(node)

    def call(self, op: Any, *args: Any, **kwargs: Any) -> fx.Node:
        values = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        keywords = {k: v.meta["val"] if isinstance(v, fx.Node) else v for k, v in kwargs.items()}
        with self.mode if self.mode is not None else contextlib.nullcontext():
            value = op(*values, **keywords)
        node = self.graph.call_function(op, tuple(args), kwargs)
        node.meta["val"] = value
        return node

    def done(self, value: fx.Node) -> ImplProgram:
        self.graph.output(value)
        return ImplProgram(self.graph, self.reads)


# -------------------------------------------------------------------- the programs
def mask_program(backward: fx.Node) -> ImplProgram:
    """``mask`` of a threshold/hardtanh backward's saved value: True where its gradient is zero."""
    value = backward.args[1]
    builder = _Builder([(value.name, value.meta["val"])])
    (v,) = builder.inputs
    if backward.target is aten.threshold_backward.default:
        return builder.done(builder.call(aten.le.Scalar, v, backward.args[2]))
    # hardtanh_backward passes the gradient only where lo < v < hi: a NaN v gets 0, so the mask is
    # not(lo < v < hi), not (v <= lo or v >= hi)
    low, high = backward.args[2], backward.args[3]
    inside = builder.call(aten.logical_and.default, builder.call(aten.gt.Scalar, v, low), builder.call(aten.lt.Scalar, v, high))
    return builder.done(builder.call(aten.logical_not.default, inside))


def masked_backward_program(backward: fx.Node, mask_id: int, mask: torch.Tensor, in_place: bool = False) -> ImplProgram:
    """The backward from ``[grad, mask]``: ``masked_fill(grad, mask, 0)``, or ``masked_fill_`` into ``grad``."""
    grad = backward.args[0]
    builder = _Builder([(grad.name, grad.meta["val"]), (mask_id, mask)])
    g, m = builder.inputs
    op = aten.masked_fill_.Scalar if in_place else aten.masked_fill.Scalar
    return builder.done(builder.call(op, g, m, 0))


def from_output_program(backward: fx.Node, output: fx.Node) -> ImplProgram:
    """``hardtanh_backward(grad, out, lo, hi)``: the same mask from hardtanh's output as from its input."""
    grad = backward.args[0]
    builder = _Builder([(grad.name, grad.meta["val"]), (output.name, output.meta["val"])])
    g, out = builder.inputs
    return builder.done(builder.call(aten.hardtanh_backward.default, g, out, *backward.args[2:]))


def batch_norm_gradients(grad_input: torch.Tensor | None, grad_weight: torch.Tensor | None,
                         grad_bias: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The output tuple of ``native_batch_norm_backward`` (the program's last call packs it)."""
    return grad_input, grad_weight, grad_bias


def batch_norm_from_output_program(backward: fx.Node, output: fx.Node, bias: fx.Node | None) -> ImplProgram:
    """``native_batch_norm_backward`` (training mode) from batch norm's output ``y`` instead of its input.

    MONeT's output-activated normalisation: ``x_hat = (y - beta) / gamma`` per channel, then the
    training-mode gradients with per-channel sums over every dimension but 1 and ``n`` elements each::

        grad_bias   = sum(g)
        grad_weight = sum(g * x_hat)
        grad_input  = gamma * invstd * (g - grad_bias / n - x_hat * grad_weight / n)
                    = (y - beta) * (-invstd * grad_weight / n) + g * (gamma * invstd) - gamma * invstd * grad_bias / n

    The last form needs one full-size buffer at a time (written in place), so the program's workspace
    is one activation that is freed before the output exists. The saved mean is not needed. It is
    undefined where a ``gamma`` is zero (``y`` then holds nothing of ``x``): capture offers it only
    where every weight is nonzero, and a weight trained to zero later makes its gradients NaN or inf.
    Reads ``[grad, y, weight, (bias,) save_invstd]``.
    """
    grad, _, weight, *_, invstd = backward.args[:7]
    output_mask = backward.args[9]
    reads = [(grad.name, grad.meta["val"]), (output.name, output.meta["val"]), (weight.name, weight.meta["val"])]
    reads += [(bias.name, bias.meta["val"])] if bias is not None else []
    reads += [(invstd.name, invstd.meta["val"])]
    builder = _Builder(reads)
    g, y, gamma, *beta, inv = builder.inputs
    y_value = y.meta["val"]
    channels = y_value.shape[1]
    shape = [1, channels] + [1] * (y_value.dim() - 2)
    dims = [d for d in range(y_value.dim()) if d != 1]
    count = y_value.numel() // max(channels, 1)
    gamma_c, inv_c = builder.call(aten.view.default, gamma, shape), builder.call(aten.view.default, inv, shape)
    beta_c = builder.call(aten.view.default, beta[0], shape) if beta else None

    def centered() -> fx.Node:  # y - beta, a fresh buffer
        return builder.call(aten.sub.Tensor, y, beta_c) if beta_c is not None else builder.call(aten.clone.default, y)

    x_hat = builder.call(aten.div_.Tensor, centered(), gamma_c)
    sum_g_xhat = builder.call(aten.sum.dim_IntList, builder.call(aten.mul_.Tensor, x_hat, g), dims, True)
    sum_g = builder.call(aten.sum.dim_IntList, g, dims, True)
    scale = builder.call(aten.mul.Tensor, gamma_c, inv_c)  # gamma * invstd
    slope = builder.call(aten.mul.Scalar, builder.call(aten.mul.Tensor, inv_c, sum_g_xhat), -1.0 / count)
    shift = builder.call(aten.mul.Scalar, builder.call(aten.mul.Tensor, scale, sum_g), -1.0 / count)
    grad_input = builder.call(aten.mul_.Tensor, centered(), slope)
    grad_input = builder.call(aten.addcmul_.default, grad_input, g, scale)
    grad_input = builder.call(aten.add_.Tensor, grad_input, shift)
    grad_weight = builder.call(aten.view.default, sum_g_xhat, [channels]) if output_mask[1] else None
    grad_bias = builder.call(aten.view.default, sum_g, [channels]) if output_mask[2] else None
    return builder.done(builder.call(batch_norm_gradients, grad_input if output_mask[0] else None, grad_weight, grad_bias))


def inplace_program(activation: fx.Node) -> ImplProgram:
    """The activation's in-place variant on its input's value."""
    source = activation.args[0]
    builder = _Builder([(source.name, source.meta["val"])])
    (x,) = builder.inputs
    return builder.done(builder.call(IN_PLACE_VARIANTS[activation.target], x, *activation.args[1:]))


# -------------------------------------------------------------------- finding the alternatives
@dataclass
class _Found:
    """Programs found before they are priced: per node its implementations; optional values by key."""

    impls: dict[int, dict[str, tuple[ImplProgram, dict[str, Any]]]] = field(default_factory=dict)
    #: key -> (id, program, the Graph id(s) it reads); the key's first item names the value: ``mask_<key[0]>``, or
    #: key[0] itself where it holds a ":" (fx names never do), e.g. ``conv_weight_grad:<backward>``
    optional: dict[tuple[str, ...], tuple[int, ImplProgram, int | tuple[int, ...]]] = field(default_factory=dict)
    #: configuration -> program: nodes of equal shapes and arguments share one fx graph (see :func:`shared_program`)
    programs: dict[tuple[Any, ...], ImplProgram] = field(default_factory=dict)


def signature(node: fx.Node) -> tuple[Any, ...]:
    """A node's configuration: its target, and each argument's layout (tensors) or value (the rest)."""
    def describe(arg: Any) -> Any:
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), str(value.dtype), tuple(value.stride()), str(value.device)
        return repr(arg) if not isinstance(arg, fx.Node) else ("node", repr(value))
    return (str(node.target), *(describe(a) for a in node.args))


def shared_program(found: _Found, key: tuple[Any, ...], reads: tuple[Read, ...],
                   build: Callable[[], ImplProgram]) -> ImplProgram:
    """The program of configuration ``key`` bound to ``reads``: built once per capture (long programs, e.g. a
    batch norm backward in channel blocks, cost a fake-tensor call per op), its fx graph shared by equal nodes."""
    program = found.programs.get(key)
    if program is None:
        program = found.programs[key] = build()
    return ImplProgram(program.graph, reads)


def _owned(node: fx.Node, fx_names: dict[int, list[str]], owner_of: dict[str, int]) -> bool:
    """The node is the storage-owning fx node of its Graph node (its value is the node's value)."""
    return fx_names[owner_of[node.name]][0] == node.name


def _same_layout(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and a.stride() == b.stride() and a.device == b.device)


def _whole_storage(value: Any) -> bool:
    """A contiguous tensor that is its whole storage (an in-place op then writes exactly the node's bytes)."""
    return (isinstance(value, torch.Tensor) and value.is_contiguous() and value.storage_offset() == 0
            and value.numel() * value.element_size() == value.untyped_storage().nbytes())


def find(module: fx.GraphModule, graph: Graph, fx_names: dict[int, list[str]], owner_of: dict[str, int],
         values: Mapping[str, torch.Tensor] | None = None) -> _Found:
    """The mask, from-output and in-place programs this captured graph allows.

    ``values`` (placeholder name -> the real tensor at capture) lets batch norm's backward from its
    output be offered where every weight is nonzero; without it that implementation is not offered.
    """
    from coop.graph_capture.alternatives_add import find_add_in_place
    from coop.graph_capture.alternatives_conv import find_convolution_split
    from coop.graph_capture.alternatives_norm import find_batch_norm_forward_inplace, find_batch_norm_grad_inplace
    from coop.graph_capture.alternatives_pool import find_max_pool_from_indices, find_max_pool_from_packed
    from coop.graph_capture.alternatives_softmax import SOFTMAX_BACKWARDS, find_softmax_grad_inplace

    found = _Found()
    next_id = max(n.id for n in graph.nodes) + 1
    for node in module.graph.nodes:
        if node.op != "call_function" or not _owned(node, fx_names, owner_of):
            continue
        node_id = owner_of[node.name]
        if graph.node(node_id).random:
            continue
        if node.target in (aten.threshold_backward.default, aten.hardtanh_backward.default):
            next_id = _find_mask(node, graph, owner_of, found, next_id)
            if node.target is aten.hardtanh_backward.default:
                _find_from_output(node, owner_of, found)
        if node.target in IN_PLACE_VARIANTS:
            _find_inplace(node, graph, owner_of, found)
        if node.target in BATCH_NORM_FORWARDS:
            find_batch_norm_forward_inplace(node, graph, owner_of, found)
        if node.target is aten.native_batch_norm_backward.default:
            _find_batch_norm_from_output(node, owner_of, found, values or {})
            find_batch_norm_grad_inplace(node, graph, owner_of, found)
        if node.target is aten.convolution_backward.default:
            next_id = find_convolution_split(node, graph, owner_of, found, next_id)
        if node.target is aten.max_pool2d_with_indices_backward.default:
            find_max_pool_from_indices(node, graph, owner_of, found)
            next_id = find_max_pool_from_packed(node, graph, owner_of, found, next_id)
        if node.target is aten.add.Tensor:
            find_add_in_place(node, graph, owner_of, found)
        if node.target in SOFTMAX_BACKWARDS:
            find_softmax_grad_inplace(node, graph, owner_of, found)
    return found


def _find_mask(backward: fx.Node, graph: Graph, owner_of: dict[str, int], found: _Found, next_id: int) -> int:
    grad, value = backward.args[0], backward.args[1]
    if not isinstance(grad, fx.Node) or not isinstance(value, fx.Node):
        return next_id
    if graph.node(owner_of[value.name]).caller_owned:
        return next_id  # a parameter or input stays resident anyway: a mask would only add bytes
    key = (value.name, str(backward.target), *map(repr, backward.args[2:]))
    if key not in found.optional:
        found.optional[key] = (next_id, mask_program(backward), owner_of[value.name])
        next_id += 1
    mask_id, mask, _ = found.optional[key]
    program = masked_backward_program(backward, mask_id, mask.output.meta["val"])
    if not _same_layout(program.output.meta["val"], backward.meta["val"]):
        return next_id
    impls = found.impls.setdefault(owner_of[backward.name], {})
    impls["mask"] = (program, {})
    grad_node = graph.node(owner_of[grad.name])
    if (not grad_node.caller_owned and grad_node.output_of is None and grad_node.mem == graph.node(owner_of[backward.name]).mem
            and _whole_storage(grad.meta.get("val")) and _same_layout(grad.meta.get("val"), backward.meta["val"])):
        program = masked_backward_program(backward, mask_id, mask.output.meta["val"], in_place=True)
        impls["mask_inplace"] = (program, {"inplace_of": grad_node.id})
    return next_id


def _find_from_output(backward: fx.Node, owner_of: dict[str, int], found: _Found) -> None:
    value = backward.args[1]
    for user in value.users if isinstance(value, fx.Node) else ():
        if user.target is aten.hardtanh.default and tuple(user.args[1:]) == tuple(backward.args[2:]):
            program = from_output_program(backward, user)
            if _same_layout(program.output.meta["val"], backward.meta["val"]):
                found.impls.setdefault(owner_of[backward.name], {})["from_output"] = (program, {})
            return


def _find_batch_norm_from_output(backward: fx.Node, owner_of: dict[str, int], found: _Found,
                                 values: Mapping[str, torch.Tensor]) -> None:
    """Batch norm's backward from its output: training mode, an affine forward whose weight is a
    placeholder with no zero at capture, and an output of the layout the backward reads."""
    grad, source, weight, *_, invstd = backward.args[:7]
    training, output_mask = backward.args[7], backward.args[9]
    if not (training and isinstance(grad, fx.Node) and isinstance(weight, fx.Node) and isinstance(invstd, fx.Node)):
        return
    forward = invstd.args[0] if invstd.target is operator.getitem else None
    if not isinstance(forward, fx.Node) or forward.target not in BATCH_NORM_FORWARDS or forward.args[1] is not weight:
        return
    if forward.args[0] is not source or not all(isinstance(m, bool) for m in output_mask):
        return
    real = values.get(weight.name) if weight.op == "placeholder" else None
    if real is None or not bool(torch.all(real != 0)):
        return  # x_hat = (y - beta) / gamma is undefined at a zero gamma
    bias = forward.args[2]
    output = next((u for u in forward.users if u.target is operator.getitem and u.args[1] == 0), None)
    if output is None or output.name not in owner_of or (bias is not None and not isinstance(bias, fx.Node)):
        return
    if not _same_layout(output.meta.get("val"), source.meta.get("val")):
        return
    program = batch_norm_from_output_program(backward, output, bias)
    produced, expected = program.output.meta["val"], backward.meta["val"]
    if all(a is None and b is None or _same_layout(a, b) for a, b in zip(produced, expected, strict=True)):
        found.impls.setdefault(owner_of[backward.name], {})["from_output"] = (
            program, {"exact": False, "tolerance": BATCH_NORM_FROM_OUTPUT_TOLERANCE})


def _find_inplace(activation: fx.Node, graph: Graph, owner_of: dict[str, int], found: _Found) -> None:
    source = activation.args[0]
    if not isinstance(source, fx.Node) or source.name not in owner_of:
        return
    source_node = graph.node(owner_of[source.name])
    node = graph.node(owner_of[activation.name])
    if source_node.caller_owned or source_node.output_of is not None or source_node.mem != node.mem:
        return
    if not (_whole_storage(source.meta.get("val")) and _same_layout(source.meta.get("val"), activation.meta.get("val"))):
        return
    found.impls.setdefault(node.id, {})["inplace"] = (inplace_program(activation), {"inplace_of": source_node.id})


# -------------------------------------------------------------------- into the Graph
def add_alternatives(module: fx.GraphModule, graph: Graph, fx_names: dict[int, list[str]], owner_of: dict[str, int],
                     profiled: NodeProfile | None = None, values: Mapping[str, torch.Tensor] | None = None) -> Alternatives:
    """``graph`` with the alternatives :func:`find` finds, priced by :func:`price` (calibrated on the step when
    ``profiled``).

    ``values``: placeholder name -> real tensor at capture (see :func:`find`)."""
    from coop.graph_capture.alternatives_price import Calibration, Price, price

    found = find(module, graph, fx_names, owner_of, values)
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
    """Every program: (node id, implementation name or None for an optional value, program)."""
    for node_id, program in alternatives.optional_fx.items():
        yield node_id, None, program
    for node_id, by_impl in alternatives.impl_fx.items():
        for name, program in by_impl.items():
            yield node_id, name, program


__all__ = ["BATCH_NORM_FROM_OUTPUT_TOLERANCE", "IMPL_NAMES", "IN_PLACE_VARIANTS", "Alternatives", "ImplProgram", "add_alternatives", "find", "programs"]
