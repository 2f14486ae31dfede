"""What a replayed op costs on this machine, at the thread count it runs: the per-op host cost and kernel rates.

A replayed CPU op costs more than its kernel: the dispatcher's work and its output's allocation, a few
microseconds each, and above the intra-op grain size with more than one thread, waking the thread pool. The
nominal rates of :mod:`coop.graph_capture.cost` price none of that, so on a step of many small ops a plan's
recomputations (mostly small pointwise ops) looked cheaper than they run, and the baseline cheaper still (issue 42).
:func:`machine_rates` measures four numbers and a table once per process and thread count with a short
calibration (about 0.1 s at one thread on a quiet core), on tensors of ones it makes itself and ops that cannot fail
on any values (``add``, ``mul``, ``view``, ``sum``, ``mm`` and the table's pointwise, softmax, normalisation and
random ops), outside any dispatch mode the caller runs (whose Python work would be timed as the machine's), in place
of the nominal ones. It is the one place a capture runs kernels without a profile: on the CPU only, never on the
model's tensors, never on a CUDA step (see "Capture runs no kernel on made-up data" in README.md):

* ``per_op_s``: the host seconds of one dispatched op on a tiny tensor (its kernel is next to nothing);
* ``flop_rate``: FLOP/s of a 256 x 256 x 256 ``mm`` beyond its host cost;
* ``bandwidth``: bytes/s of a 2**20-element ``add`` (two reads, one write) beyond its host cost;
* ``parallel_s``: what an op above the grain size pays beyond that with more than one thread (0 with one);
* ``element_s``: seconds per output element of the ops :func:`element_recipes` names (transcendental pointwise ops,
  softmax, normalisation, random draws, selections and their backwards), each run on ones it makes itself.

The roofline ``per_op + flops / flop_rate + bytes / bandwidth`` holds for a copy or an ``add`` and for matmuls, not
for those ops: on this 2-core EPYC at one thread a ``tanh`` of 131,072 floats took 807 µs where the roofline says
32 µs, a bool dropout mask of 32,768 draws 430-750 µs against 6 µs, a training batch norm of 262,144 elements 920 µs
against 270 µs (bench_predict's GPT-2 at 0.5: its recomputations ran 17.7 ms, priced 2.5 ms, while its matmuls were
priced within 20 %). A plan recomputes mostly such ops, so a roofline prices its overhead at a fraction of what it
costs. An op of the table costs ``per_op + flops / flop_rate + max(elements x element_s, bytes / bandwidth)``.

:func:`host_costs` turns the calibration off inside a block (the nominal model, as before issue 42): the bench
compares the plans each model chooses. CUDA nodes keep the nominal model: a GPU step's host work overlaps the
kernels it queued, which this calibration does not measure.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from torch.utils._python_dispatch import _disable_current_modes

#: torch's intra-op grain size (``at::internal::GRAIN_SIZE``): pointwise ops on fewer elements run on one thread.
GRAIN_SIZE = 32768
#: The sizes of the calibration's kernels.
MM_SIDE = 256
BANDWIDTH_ELEMENTS = 1 << 20
PARALLEL_ELEMENTS = 2 * GRAIN_SIZE
#: The per-element calibration's tensors: rows x columns ones (65,536 elements, above the grain size).
ELEMENT_ROWS, ELEMENT_COLUMNS = 1024, 64
#: Ops keyed by their input's dtype as well (a cast from bool costs three times a float copy on the machine above).
DTYPE_KEYED = frozenset({"aten._to_copy"})

_ENABLED: ContextVar[bool] = ContextVar("coop_host_costs", default=False)
Rates = TypeVar("Rates")


@dataclass(frozen=True)
class MachineRates:
    """The measured rates of one thread count (seconds, FLOP/s, bytes/s); see the module docstring."""

    per_op_s: float
    flop_rate: float
    bandwidth: float
    parallel_s: float
    threads: int
    #: seconds per output element of the ops priced per element, by :func:`element_key` (empty: the roofline alone)
    element_s: Mapping[str, float] = field(default_factory=dict)

    def op_seconds(self, flops: int, moved: int, elements: int, dispatched: bool, op: str = "") -> float:
        """Seconds of one replayed op: its host cost (where it is dispatched), FLOPs, bytes and thread-pool wake-up.

        Parameters
        ----------
        flops, moved, elements : int
            The op's FLOPs, bytes read and written, and the elements of its largest output.
        dispatched : bool
            Whether the replay dispatches it (an aten op; not a ``getitem`` of a tuple).
        op : str
            The op's :func:`element_key` ('' for none): an op of ``element_s`` pays the larger of its elements' measured
            time and its bytes' (its measurement holds the thread pool's wake-up, so it pays none besides).

        Returns
        -------
        float
            ``per_op_s + flops / flop_rate + moved / bandwidth (+ parallel_s above the grain size)``, with
            ``max(elements x element_s[op], moved / bandwidth)`` for the bytes' term of an op of the table; 0 if not
            dispatched.
        """
        if not dispatched:
            return 0.0
        data = moved / self.bandwidth
        if op in self.element_s:
            return self.per_op_s + flops / self.flop_rate + max(elements * self.element_s[op], data)
        parallel = self.parallel_s if self.threads > 1 and elements >= GRAIN_SIZE else 0.0
        return self.per_op_s + flops / self.flop_rate + data + parallel

    def as_dict(self) -> dict[str, Any]:
        """The rates as a JSON-ready dict (a captured graph's ``meta["host_cost"]``; ``element_ns``: nanoseconds per
        element by op)."""
        return {"per_op_us": round(1e6 * self.per_op_s, 3), "flop_rate": self.flop_rate, "bandwidth": self.bandwidth,
                "parallel_us": round(1e6 * self.parallel_s, 3), "threads": self.threads,
                "element_ns": {op: round(1e9 * s, 4) for op, s in sorted(self.element_s.items())}}


def host_costs_enabled() -> bool:
    """Whether captures price the per-op host cost (only inside ``host_costs(True)``: off by default until bench_predict
    shows it predicts better; see BENCHMARKS.md, bench_predict)."""
    return _ENABLED.get()


@contextlib.contextmanager
def switched(flag: ContextVar[bool], enabled: bool) -> Iterator[None]:
    """``flag`` set to ``enabled`` inside the block (in this thread's or task's context only), put back after it."""
    token = flag.set(bool(enabled))
    try:
        yield
    finally:
        flag.reset(token)


def host_costs(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Captures inside the block price ops with the calibrated rates (True) or the nominal model only (False)."""
    return switched(_ENABLED, enabled)


class PerThreadCalibration(Generic[Rates]):
    """A calibration ``measure(thread count)`` taken once per torch thread count and kept for the process."""

    def __init__(self, measure: Callable[[int], Rates]) -> None:
        self._measure = measure
        self._kept: dict[int, Rates] = {}

    def at(self, threads: int | None) -> Rates:
        """The calibration at ``threads`` (None: torch's current count), measured on first use."""
        count = torch.get_num_threads() if threads is None else threads
        if count not in self._kept:
            self._kept[count] = self._measure(count)
        return self._kept[count]

    def clear(self) -> None:
        """Forget every calibration: the next use measures again."""
        self._kept.clear()


#: the lambda looks ``calibrate`` up when it measures (a test's substitute is the one called)
_RATES: PerThreadCalibration[MachineRates] = PerThreadCalibration(lambda count: calibrate(count))


def machine_rates(threads: int | None = None) -> MachineRates:
    """The rates of this machine at ``threads`` (default: torch's current count), measured on first use and kept
    (:func:`calibrate`)."""
    return _RATES.at(None if threads is None else int(threads))


def forget_rates() -> None:
    """Drop every cached calibration: the next capture measures again (after the machine's load changed)."""
    _RATES.clear()


def best_seconds(fn: Callable[[], object], calls: int, blocks: int, timer: Callable[[], float]) -> float:
    """The least, over ``blocks``, of the mean seconds of ``calls`` back-to-back calls (after one warm-up call): a
    neighbour's load only adds time. ``timer`` is read twice per block (a test's fake clock counts on it)."""
    fn()
    best = float("inf")
    for _ in range(blocks):
        start = timer()
        for _ in range(calls):
            fn()
        best = min(best, (timer() - start) / calls)
    return best


def calibrate(threads: int, timer: Callable[[], float] = time.perf_counter) -> MachineRates:
    """Measure the rates at ``threads`` CPU threads (restored afterwards); see the module docstring.

    Parameters
    ----------
    threads : int
        torch's CPU thread count while measuring (at least 1).
    timer : callable
        The clock in seconds (a test's fake one).

    Returns
    -------
    MachineRates
        The per-op host seconds, FLOP rate, bandwidth and thread-pool wake-up, each positive (the wake-up 0 or more).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        # outside any dispatch mode the caller runs (a mode's Python work is no part of the machine's op cost)
        with torch.no_grad(), _disable_current_modes():
            tiny = torch.ones(8)
            add, mul, view, total = (torch.ops.aten.add.Tensor._op, torch.ops.aten.mul.Tensor._op,
                                     torch.ops.aten.view.default._op, torch.ops.aten.sum.default._op)

            def small_ops() -> None:
                add(tiny, tiny)
                mul(tiny, tiny)
                view(tiny, [2, 4])
                total(tiny)

            per_op = best_seconds(small_ops, 50, 5, timer) / 4
            square = torch.ones(MM_SIDE, MM_SIDE)
            mm = torch.ops.aten.mm.default._op
            mm_s = best_seconds(lambda: mm(square, square), 4, 3, timer)
            wide = torch.ones(BANDWIDTH_ELEMENTS)
            wide_s = best_seconds(lambda: add(wide, wide), 4, 3, timer)
            medium = torch.ones(PARALLEL_ELEMENTS)
            medium_s = best_seconds(lambda: add(medium, medium), 10, 3, timer)
            per_call = {op: best_seconds(call, 2, 3, timer) for op, call in element_recipes().items()}
    finally:
        torch.set_num_threads(previous)
    floor = 1e-9
    per_op = max(per_op, floor)
    flop_rate = 2 * MM_SIDE ** 3 / max(mm_s - per_op, floor)
    bandwidth = 3 * 4 * BANDWIDTH_ELEMENTS / max(wide_s - per_op, floor)
    parallel = 0.0 if threads <= 1 else max(0.0, medium_s - per_op - 3 * 4 * PARALLEL_ELEMENTS / bandwidth)
    elements = ELEMENT_ROWS * ELEMENT_COLUMNS
    element_s = {op: max(seconds - per_op, floor) / elements for op, seconds in per_call.items()}
    return MachineRates(per_op_s=per_op, flop_rate=flop_rate, bandwidth=bandwidth, parallel_s=parallel,
                        threads=max(1, int(threads)), element_s=element_s)


def element_key(target: Any, first_input: Any = None) -> str:
    """The key of an op in :attr:`MachineRates.element_s`: its overload packet's qualified name (``"aten.tanh"``;
    any overload), with the first input's dtype for an op of :data:`DTYPE_KEYED` (``"aten._to_copy.bool"``); '' for a
    target that is no torch op.

    Parameters
    ----------
    target : Any
        An fx node's target.
    first_input : Any
        The op's first argument's value (a tensor or a fake one), or None.
    """
    packet = getattr(target, "_overloadpacket", None)
    if packet is None:
        return ""
    name = str(packet)
    if name in DTYPE_KEYED and isinstance(first_input, torch.Tensor):
        return f"{name}.{str(first_input.dtype).removeprefix('torch.')}"
    return name


def element_recipes() -> dict[str, Callable[[], object]]:
    """The ops priced per element (by :func:`element_key`), each as a call on ``ELEMENT_ROWS x ELEMENT_COLUMNS``
    ones made here (a batch norm's as 16 x 16 x 16 x 16, its statistics from its own forward): values no op of the
    table can fail on."""
    aten, rows, columns = torch.ops.aten, ELEMENT_ROWS, ELEMENT_COLUMNS
    x, grad = torch.ones(rows, columns), torch.ones(rows, columns)
    mask = torch.ones(rows, columns, dtype=torch.bool)
    weight, bias = torch.ones(columns), torch.zeros(columns)
    _, mean, rstd = aten.native_layer_norm.default(x, [columns], weight, bias, 1e-5)
    image, channels, zeros = x.view(16, 16, 16, 16), torch.ones(16), torch.zeros(16)
    _, saved_mean, saved_invstd = aten.native_batch_norm.default(image, channels, zeros, zeros.clone(),
                                                                 channels.clone(), True, 0.1, 1e-5)
    cpu = torch.device("cpu")

    def stats() -> tuple[torch.Tensor, torch.Tensor]:  # running statistics the training kernel updates
        return zeros.clone(), channels.clone()

    def called(name: str, *args: torch.Tensor) -> Callable[[], object]:
        op = getattr(aten, name).default
        return lambda: op(*args)

    recipes = {f"aten.{name}": called(name, x)
               for name in ("tanh", "exp", "sigmoid", "silu", "gelu", "rsqrt", "sin", "cos", "log", "erf")}
    recipes.update({f"aten.{name}": called(name, grad, x)
                    for name in ("tanh_backward", "sigmoid_backward", "silu_backward", "gelu_backward")})
    recipes.update({
        "aten.div": lambda: aten.div.Scalar(x, 3.0),
        "aten.threshold_backward": lambda: aten.threshold_backward.default(grad, x, 0),
        "aten._softmax": lambda: aten._softmax.default(x, -1, False),
        "aten._safe_softmax": lambda: aten._safe_softmax.default(x, -1),
        "aten._log_softmax": lambda: aten._log_softmax.default(x, -1, False),
        "aten._softmax_backward_data": lambda: aten._softmax_backward_data.default(grad, x, -1, torch.float32),
        "aten._log_softmax_backward_data": lambda: aten._log_softmax_backward_data.default(grad, x, -1, torch.float32),
        "aten.native_layer_norm": lambda: aten.native_layer_norm.default(x, [columns], weight, bias, 1e-5),
        "aten.native_layer_norm_backward": lambda: aten.native_layer_norm_backward.default(
            grad, x, [columns], mean, rstd, weight, bias, [True, True, True]),
        "aten.native_batch_norm": lambda: aten.native_batch_norm.default(image, channels, zeros, *stats(), True, 0.1,
                                                                          1e-5),
        "aten._native_batch_norm_legit_functional": lambda: aten._native_batch_norm_legit_functional.default(
            image, channels, zeros, *stats(), True, 0.1, 1e-5),
        "aten.native_batch_norm_backward": lambda: aten.native_batch_norm_backward.default(
            image, image, channels, zeros, channels, saved_mean, saved_invstd, True, 1e-5, [True, True, True]),
        "aten.bernoulli": lambda: aten.bernoulli.p(x, 0.5),
        "aten.native_dropout": lambda: aten.native_dropout.default(x, 0.1, True),
        # the custom op's body (its first call through torch.library took 2.9 s here; the rest is a host cost)
        "coop.bernoulli_mask": lambda: torch.empty(rows, columns, dtype=torch.bool, device=cpu).bernoulli_(0.9),
        "aten.where": lambda: aten.where.self(mask, x, grad),
        "aten.masked_fill": lambda: aten.masked_fill.Scalar(x, mask, 0.0),
        "aten._to_copy.bool": lambda: aten._to_copy.default(mask, dtype=torch.float32),
    })
    return recipes


__all__ = ["GRAIN_SIZE", "MachineRates", "PerThreadCalibration", "best_seconds", "calibrate", "element_key",
           "element_recipes", "forget_rates", "host_costs", "host_costs_enabled", "machine_rates"]
