"""What eager PyTorch's step pays for autograd beyond the ops a replay runs: the cost side of a plan's overhead.

A plan's replay runs the captured aten ops with autograd off; the eager step it is measured against runs the same
kernels and, on top, autograd's own work (issue 42): in the forward, every op that reads a tensor requiring grad
records a graph node (the node, its saved tensors, version counters); in the backward, the engine runs one node
per recorded op and one ``AccumulateGrad`` per parameter (its ready queue, input buffers, the checks of each
gradient's metadata). bench_predict measured coop's store-all replay 8-16 % faster than eager at 1 thread for
that reason, an offset no per-node cost carries, since a node cost is paid alike by the replay and by eager.

:func:`autograd_rates` measures two numbers once per process and thread count (0.13-0.34 s each on the 2-core
development machine under a load of 4-6), outside any
dispatch mode the caller runs, on tensors of ones it makes itself (the CPU only, never the model's ops):

* ``record_s``: what one forward op costs more with grad than without (a chain of ``mul`` on a leaf requiring grad,
  timed with and without ``torch.no_grad``);
* ``node_s``: what one backward node costs the engine beyond the one kernel its formula runs, priced as the replay
  pays for that kernel (the per-node time of the chain's backward, run again on its retained graph, less a ``mul``
  dispatched from Python; eager's engine calls its kernels from C++ and the replay from Python, so this is the
  difference, not the engine alone).

Two chain lengths are timed and differenced, so the per-call work (``backward``'s start, the leaf's gradient)
cancels.
:func:`autograd_work` counts, on a captured step, the forward ops eager records and the backward nodes its engine
runs; :func:`eager_autograd_seconds` prices them. The per-step constants (eager's ``backward()`` call and module
hooks, the replay's flattening of the batch and write-back of the gradients) are left out: tens to hundreds of
microseconds against steps of tens of milliseconds in bench_predict. :func:`autograd_costs` turns the term off
inside a block; a plan then predicts its recomputations' overhead alone, as before issue 42. The term applies only
to node costs measured on this machine (:func:`coop.planner.prediction.priced_in_host_seconds`).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes

from coop.errors import OptionError
from coop.graph_capture.host_cost import PerThreadCalibration, best_seconds, switched
from coop.graph_capture.lower import output_nodes

if TYPE_CHECKING:
    from coop.graph_capture.captured import Captured

#: The calibration's chain lengths: their difference is the number of ops the per-op numbers divide by.
SHORT_CHAIN, LONG_CHAIN = 10, 110
#: Calls per timed block and blocks per timing (the least block counts: :func:`best_seconds`).
CALLS, BLOCKS = 2, 25

_ENABLED: ContextVar[bool] = ContextVar("coop_autograd_costs", default=True)


@dataclass(frozen=True)
class AutogradRates:
    """Autograd's measured cost at one thread count, in seconds (see the module docstring); refused when a number is
    negative or not finite, or the thread count is not a whole number of at least 1."""

    record_s: float
    node_s: float
    threads: int

    def __post_init__(self) -> None:
        for name in ("record_s", "node_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise OptionError(f"{name}={value!r}: autograd's cost is a finite number of seconds, 0 or more")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise OptionError(f"threads={self.threads!r}: a thread count is a whole number, at least 1")

    def as_dict(self) -> dict[str, float | int]:
        """The rates as a JSON-ready dict in microseconds (what ``plan.summary()["autograd_cost"]`` shows)."""
        return {"record_us": round(1e6 * self.record_s, 3), "node_us": round(1e6 * self.node_s, 3),
                "threads": self.threads}


#: the lambda looks ``calibrate_autograd`` up when it measures (a test's substitute is the one called)
_RATES: PerThreadCalibration[AutogradRates] = PerThreadCalibration(lambda count: calibrate_autograd(count))


@dataclass(frozen=True)
class AutogradWork:
    """What autograd does in one eager step: ``recorded`` forward ops that record a graph node, ``nodes`` backward
    nodes the engine runs (one per recorded op, one ``AccumulateGrad`` per parameter)."""

    recorded: int
    nodes: int


def autograd_costs_enabled() -> bool:
    """Whether a plan's predicted overhead counts autograd's cost in the eager step (on unless inside
    ``autograd_costs(False)``; BENCHMARKS.md's bench_predict section has the measurement behind the default)."""
    return _ENABLED.get()


def autograd_costs(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Plans read inside the block predict against eager with autograd's cost (True) or against the captured
    program's node costs alone (False: the recomputations' overhead, ``predicted_recompute_overhead``)."""
    return switched(_ENABLED, enabled)


def autograd_rates(threads: int | None = None) -> AutogradRates:
    """Autograd's cost on this machine at ``threads`` (default: torch's current count), measured on first use.

    Parameters
    ----------
    threads : int or None
        torch's CPU thread count to measure at (at least 1); None for the current one.

    Returns
    -------
    AutogradRates
        The cached calibration of that thread count (:func:`calibrate_autograd`).

    Raises
    ------
    OptionError
        For a thread count that is not a whole number of at least 1.
    """
    return _RATES.at(None if threads is None else _thread_count(threads))


def forget_autograd_rates() -> None:
    """Drop every cached calibration: the next prediction measures again (after the machine's load changed)."""
    _RATES.clear()


def _thread_count(threads: object) -> int:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise OptionError(f"threads={threads!r}: torch needs at least one CPU thread; pass threads=1 or more")
    return threads


def calibrate_autograd(threads: int, timer: Callable[[], float] = time.perf_counter) -> AutogradRates:
    """Measure autograd's per-op and per-node cost at ``threads`` CPU threads (restored afterwards).

    Parameters
    ----------
    threads : int
        torch's CPU thread count while measuring (at least 1).
    timer : callable
        The clock in seconds (a test's fake one).

    Returns
    -------
    AutogradRates
        ``record_s`` and ``node_s``, each 0 or more (a difference the noise made negative counts as 0).

    Raises
    ------
    OptionError
        For a thread count that is not a whole number of at least 1.
    """
    count = _thread_count(threads)
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        # outside any dispatch mode the caller runs, and with grad on whatever the caller's grad mode is
        with torch.enable_grad(), _disable_current_modes():
            _chain_times(SHORT_CHAIN, lambda: 0.0)  # a process's first backward pays its own set-up: not timed
            short, long = _chain_times(SHORT_CHAIN, timer), _chain_times(LONG_CHAIN, timer)
            tiny = torch.ones(8)
            kernel_s = best_seconds(lambda: torch.mul(tiny, tiny), 10 * CALLS, BLOCKS, timer)
    finally:
        torch.set_num_threads(previous)
    ops = LONG_CHAIN - SHORT_CHAIN
    record = ((long.grad_s - long.no_grad_s) - (short.grad_s - short.no_grad_s)) / ops
    node = (long.backward_s - short.backward_s) / ops - kernel_s
    return AutogradRates(record_s=max(0.0, record), node_s=max(0.0, node), threads=count)


@dataclass(frozen=True)
class _ChainTimes:
    grad_s: float  # the forward chain with grad
    no_grad_s: float  # the same chain under torch.no_grad
    backward_s: float  # the backward alone, from the chain's sum (its graph retained and run again)


def _chain_times(length: int, timer: Callable[[], float]) -> _ChainTimes:
    """Time a chain of ``length`` ``mul`` ops on a tiny leaf requiring grad: with grad, without, and with backward."""
    leaf = torch.ones(8, requires_grad=True)
    factor = torch.ones(8)

    def forward() -> torch.Tensor:
        value = leaf
        for _ in range(length):
            value = torch.mul(value, factor)
        return value

    def without_grad() -> None:
        with torch.no_grad():
            forward()

    total = forward().sum()

    def backward() -> None:
        total.backward(retain_graph=True)  # the same graph each call: its nodes, not the forward, are timed
        leaf.grad = None

    # many short blocks: under a neighbour's load, the least of them is likelier to have run undisturbed
    return _ChainTimes(grad_s=best_seconds(forward, CALLS, BLOCKS, timer),
                       no_grad_s=best_seconds(without_grad, CALLS, BLOCKS, timer),
                       backward_s=best_seconds(backward, CALLS, BLOCKS, timer))


def autograd_work(captured: Captured) -> AutogradWork:
    """Count the autograd work of the eager step ``captured`` was traced from, on its joint program.

    A forward op (an aten op's ``fx`` call the loss depends on) records an autograd node when it reads a parameter or
    a value recorded before it; ``getitem`` of a tuple is no op. The engine runs one node per recorded op and one ``AccumulateGrad`` per parameter. (On GPT-2
    3 x 128 this counts 211 recorded ops and 251 nodes where eager's graph has 188 and 228: the traced program
    decomposes a little further than eager's autograd records.)

    Parameters
    ----------
    captured : Captured
        The step as traced: its joint fx program (forward and backward), whose placeholders say which inputs are
        parameters.

    Returns
    -------
    AutogradWork
        The recorded forward ops and the engine's nodes.
    """
    graph = captured.module.graph
    forward = _ancestors(output_nodes(graph)[0])
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    requiring = {n for n, (kind, _) in zip(placeholders, captured.placeholders, strict=True) if kind == "param"}
    parameters = len(requiring & forward)  # a parameter the loss does not reach has no AccumulateGrad to run
    recorded = 0
    for fx_node in graph.nodes:
        if fx_node not in forward or not any(a in requiring for a in fx_node.all_input_nodes):
            continue
        requiring.add(fx_node)
        if isinstance(fx_node.target, torch._ops.OpOverload):  # not a getitem of a recorded op's tuple
            recorded += 1
    return AutogradWork(recorded=recorded, nodes=recorded + parameters)


def _ancestors(node: fx.Node | None) -> set[fx.Node]:
    """``node`` and every fx node it depends on."""
    seen: set[fx.Node] = set()
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(current.all_input_nodes)
    return seen


def eager_autograd_seconds(work: AutogradWork, rates: AutogradRates) -> float:
    """Seconds autograd adds to the eager step: ``recorded * record_s + nodes * node_s``.

    Parameters
    ----------
    work : AutogradWork
        What autograd does in the step (:func:`autograd_work`).
    rates : AutogradRates
        Its per-op and per-node cost (:func:`autograd_rates`).

    Returns
    -------
    float
        The seconds, 0 or more.
    """
    return work.recorded * rates.record_s + work.nodes * rates.node_s


__all__ = ["LONG_CHAIN", "SHORT_CHAIN", "AutogradRates", "AutogradWork", "autograd_costs", "autograd_costs_enabled",
           "autograd_rates", "autograd_work", "calibrate_autograd", "eager_autograd_seconds", "forget_autograd_rates"]
