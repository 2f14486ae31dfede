"""Operator implementations PyTorch really offers, found in a captured step (MONeT, Shah et al. 2021).

MONeT ("Memory Optimization for Deep Networks", ICLR 2021) lowers a training step's memory by
choosing *how* each operator runs together with what is recomputed. After lowering, this package
finds in the joint fx graph the choices that are bit-identical to eager PyTorch and adds them to
the Graph (contract 1: ``Node.impls``, optional values), with the fx code the executor runs for
each in :class:`ImplProgram`:

* **activations** (:mod:`~coop.graph_capture.alternatives.activation`): ReLU's and hardtanh's backward from
  a one-byte mask (``mask``, ``mask_inplace``), hardtanh's backward from its output (``from_output``),
  in-place activations (``inplace``); exact.

Steps of a CNN's backward that hold three activations at once get their own modules:

* **batch norm from its output** (:mod:`~coop.graph_capture.alternatives.norm`, ``from_output``; inexact,
  MONeT's output-activated normalisation): ``native_batch_norm_backward`` reads batch norm's output ``y``
  instead of its input and recomputes ``x_hat = (y - beta) / gamma``; offered only where every ``gamma`` is
  nonzero in the real ``values`` passed at capture, with ``exact=False`` and
  :data:`BATCH_NORM_FROM_OUTPUT_TOLERANCE`.
* **convolution backward split** (:mod:`~coop.graph_capture.alternatives.conv`, ``split``): an
  optional value W (weight and bias gradients, from grad_out and the input) and grad_input from
  ``[grad_out, weight, W]``, as MONeT runs backward-data and backward-weight separately; exact.
* **batch norm backward over its incoming gradient** (:mod:`~coop.graph_capture.alternatives.norm`,
  ``grad_inplace``): the eager kernel in channel blocks, grad_input written over grad_out; exact
  on CPU where offered.
* **batch norm forward over its input** (:mod:`~coop.graph_capture.alternatives.norm`, ``forward_inplace``):
  the same aten forward in channel blocks, the output written over x, the statistics concatenated; exact on
  CPU where offered. A backward that still reads x then needs it recomputed, or reads the output
  (``from_output``).
* **(log-)softmax backward over its incoming gradient** (:mod:`~coop.graph_capture.alternatives.softmax`,
  ``grad_inplace``): the eager kernel on chunks of rows, each written over grad's rows; exact on CPU.
* **max-pool backward from its indices** (:mod:`~coop.graph_capture.alternatives.pool`,
  ``from_indices``): the pooled input is not read; exact. ``from_packed`` reads the indices packed to one
  byte each (the argmax's offset inside its window, an optional value made once from the op's int64
  indices, which are then freed); exact.
* **add over one operand** (:mod:`~coop.graph_capture.alternatives.add`, ``inplace`` /
  ``inplace_other``): a residual add written over either operand, operands in eager's order; exact.

The package, bottom up: :mod:`~coop.graph_capture.alternatives.base` (programs, their builder, the record of
what was found), one module of finders per operator family (above), the registry of finders
(:mod:`~coop.graph_capture.alternatives.registry`, in the order they run), and
:mod:`~coop.graph_capture.alternatives.assemble` (:func:`add_alternatives`: found, priced, into the Graph).

Costs (:mod:`~coop.graph_capture.alternatives.price`): no program runs on made-up data at capture
(issue 22). Stored bytes come from a run of the program on fake tensors of the captured layouts, with
the reviewed table of kernels whose storage differs from the meta function's
(:mod:`~coop.graph_capture.storage_table`); the workspace is the program's peak of live intermediate
storages (what a memory meter sees above the inputs) minus its output. Seconds: the analytic model
that priced the nodes, calibrated on a profiled capture by the measured/analytic ratio of the same ops
in the real step (an estimate, not a measurement of the program).
"""


from coop.graph_capture.alternatives.activation import IN_PLACE_VARIANTS
from coop.graph_capture.alternatives.assemble import Alternatives, add_alternatives, programs
from coop.graph_capture.alternatives.base import (
    CapturedStep,
    Finder,
    FoundAlternatives,
    ImplProgram,
    ImplProgramBuilder,
    Read,
    same_layout,
    same_layouts,
    signature,
    whole_storage,
)
from coop.graph_capture.alternatives.norm import BATCH_NORM_FORWARDS, BATCH_NORM_FROM_OUTPUT_TOLERANCE
from coop.graph_capture.alternatives.price import Calibration, Price, price
from coop.graph_capture.alternatives.registry import FINDERS, IMPL_NAMES, RegisteredFinder, find_alternatives

__all__ = ["BATCH_NORM_FORWARDS", "BATCH_NORM_FROM_OUTPUT_TOLERANCE", "FINDERS", "IMPL_NAMES", "IN_PLACE_VARIANTS",
           "Alternatives", "Calibration", "CapturedStep", "Finder", "FoundAlternatives", "ImplProgram",
           "ImplProgramBuilder", "Price", "Read", "RegisteredFinder", "add_alternatives", "find_alternatives", "price",
           "programs", "same_layout", "same_layouts", "signature", "whole_storage"]
