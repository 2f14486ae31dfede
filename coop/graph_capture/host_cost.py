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

* ``fitted``: a convolution and its backward, each fitted through a small and a large convolution of ones
  (:func:`convolution_fits`) as ``per_op + calls x per_call + max(flops x per_flop, bytes / bandwidth)`` (a backward
  makes one kernel call per gradient of input or weight). On this machine at one thread a 3 x 3 convolution paid about
  130 µs per call on oneDNN's path and then ran at 50-80 GFLOP/s for 3 to 128 input channels (a 3-channel one of
  14 MFLOP: 450 µs fault-free), so the "third of the mm's rate" the zoo CNN's first convolution showed was its call
  cost, and minor page faults where the allocator handed it fresh pages (480 faults, 1.6-1.9 ms a call, until the
  allocator kept its 1 MiB outputs), not its channel count.

At more than one thread the calibration keeps the pool warm and takes medians (:func:`pooled_seconds`) after waiting a
little for a stalled pool (:func:`settle_pool`): with the two cores shared, an op above the grain size timed after
10 ms idle took 4-16 ms (its worker asleep, woken behind another process's slice), and in phases of seconds every
such op took about 12 ms, which the earlier min-of-3-blocks calibration recorded as a 7-14 ms wake-up per op.
:func:`machine_rates` bounds a calibration at more than one thread by one thread's (:func:`within_one_thread`): a
scheduler's stall is not the machine's rate.

:func:`host_costs` turns the calibration off inside a block (the nominal model, as before issue 42): the bench
compares the plans each model chooses. CUDA nodes keep the nominal model: a GPU step's host work overlaps the
kernels it queued, which this calibration does not measure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import flop_registry

#: torch's intra-op grain size (``at::internal::GRAIN_SIZE``): pointwise ops on fewer elements run on one thread.
GRAIN_SIZE = 32768
#: The sizes of the calibration's kernels.
MM_SIDE = 256
BANDWIDTH_ELEMENTS = 1 << 20
PARALLEL_ELEMENTS = 2 * GRAIN_SIZE
#: The per-element calibration's tensors: rows x columns ones (65,536 elements, above the grain size).
ELEMENT_ROWS, ELEMENT_COLUMNS = 1024, 64
#: The convolutions the per-call fit times, (batch, channels, out channels, side), 3 x 3 kernels: a small one (3
#: channels, 55,296 FLOPs: mostly the kernel call) and a large one (32 channels, 18.9 MFLOP). Both batches above 1:
#: torch takes oneDNN's path there (about 130 µs per call on the 2-core EPYC above, where a batch-1 3 x 3 convolution of
#: a small image takes torch's own, about 25 µs).
CONV_SHAPES = ((2, 3, 8, 8), (4, 32, 32, 16))
#: At more than one thread: blocks per median, calls per probe, the probe's per-call seconds above which the pool is
#: stalled, and the pauses while it is (:func:`settle_pool`).
POOLED_BLOCKS = 5
SETTLE_CALLS = 4
STALL_S = 2e-3
SETTLE_TRIES, SETTLE_PAUSE_S = 4, 0.1
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
    #: the ops priced per call and per FLOP (convolutions), by :func:`element_key`: (seconds per kernel call, seconds
    #: per FLOP); empty: the roofline alone
    fitted: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: the probes :func:`settle_pool` took before measuring (0 at one thread; ``SETTLE_TRIES``: measured stalled)
    settle_tries: int = 0

    def op_seconds(self, flops: int, moved: int, elements: int, dispatched: bool, op: str = "", calls: int = 1) -> float:
        """Seconds of one replayed op: its host cost (where it is dispatched), FLOPs, bytes and thread-pool wake-up.

        Parameters
        ----------
        flops, moved, elements : int
            The op's FLOPs, bytes read and written, and the elements of its largest output.
        dispatched : bool
            Whether the replay dispatches it (an aten op; not a ``getitem`` of a tuple).
        op : str
            The op's :func:`element_key` ('' for none): an op of ``element_s`` pays the larger of its elements' measured
            time and its bytes' (its measurement holds the thread pool's wake-up, so it pays none besides); an op of
            ``fitted`` pays ``calls`` kernel calls and the larger of its FLOPs' fitted time and its bytes'.
        calls : int
            The kernel calls of an op of ``fitted`` (a convolution's backward: one per gradient of input or weight).

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
        if op in self.fitted:
            per_call, per_flop = self.fitted[op]
            return self.per_op_s + calls * per_call + max(flops * per_flop, data)
        if op in self.element_s:
            return self.per_op_s + flops / self.flop_rate + max(elements * self.element_s[op], data)
        parallel = self.parallel_s if self.threads > 1 and elements >= GRAIN_SIZE else 0.0
        return self.per_op_s + flops / self.flop_rate + data + parallel

    def as_dict(self) -> dict[str, Any]:
        """The rates as a JSON-ready dict (a captured graph's ``meta["host_cost"]``; ``element_ns``: nanoseconds per
        element by op)."""
        return {"per_op_us": round(1e6 * self.per_op_s, 3), "flop_rate": self.flop_rate, "bandwidth": self.bandwidth,
                "parallel_us": round(1e6 * self.parallel_s, 3), "threads": self.threads,
                "element_ns": {op: round(1e9 * s, 4) for op, s in sorted(self.element_s.items())},
                "fitted": {op: {"call_us": round(1e6 * call, 3), "gflop_rate": round(1e-9 / flop, 3)}
                           for op, (call, flop) in sorted(self.fitted.items())},
                "settle_tries": self.settle_tries}


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


def within_one_thread(rates: MachineRates, single: MachineRates) -> MachineRates:
    """``rates`` (``rates.threads`` threads) kept between one thread's (``single``) and ``threads`` times faster: no
    FLOP, byte, element or per-FLOP convolution term dearer than one thread's or cheaper than a ``threads``-th of it, no
    dispatch or convolution call dearer (the wake-up, measured on its own, stays). Under load a median of an op of
    0.3-1 ms at two threads could still catch its worker preempted mid-op for a scheduler slice (convolution fits at
    4-8 GFLOP/s, a 32-channel convolution priced 42 ms), and a stalled small convolution made the fit's slope vanish:
    neither is what a clean op costs, which does at most one thread's work on each and at least its share."""
    share = max(1, rates.threads)

    def between(value: float, one: float) -> float:  # seconds per unit: within [one / share, one]
        return min(max(value, one / share), one)

    fitted = {op: (min(call, single.fitted[op][0]), between(flop, single.fitted[op][1])) if op in single.fitted
              else (call, flop) for op, (call, flop) in rates.fitted.items()}
    element_s = {op: between(seconds, single.element_s[op]) if op in single.element_s else seconds
                 for op, seconds in rates.element_s.items()}
    return dataclasses.replace(rates, per_op_s=min(rates.per_op_s, single.per_op_s),
                               flop_rate=1 / between(1 / rates.flop_rate, 1 / single.flop_rate),
                               bandwidth=1 / between(1 / rates.bandwidth, 1 / single.bandwidth), element_s=element_s,
                               fitted=fitted)


def _measured(count: int) -> MachineRates:
    """The calibration ``machine_rates`` keeps: at more than one thread, bounded by one thread's (kept too)."""
    rates = calibrate(count)
    return rates if count <= 1 else within_one_thread(rates, _RATES.at(1))


#: the lambda looks ``_measured`` (and so ``calibrate``) up when it measures (a test's substitute is the one called)
_RATES: PerThreadCalibration[MachineRates] = PerThreadCalibration(lambda count: _measured(count))


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


def pooled_seconds(fn: Callable[[], object], calls: int, blocks: int, timer: Callable[[], float],
                   warm: Callable[[], object]) -> float:
    """What :func:`best_seconds` measures at more than one thread: ``warm()`` first (the pool's workers kept spinning, as
    a step's back-to-back ops keep them), one warm-up call, then the median over ``max(blocks, POOLED_BLOCKS)`` blocks
    of the mean seconds of ``calls`` calls (the thread pool's state, not its luckiest block). ``timer`` is read twice
    per block."""
    warm()
    fn()
    means = []
    for _ in range(max(blocks, POOLED_BLOCKS)):
        start = timer()
        for _ in range(calls):
            fn()
        means.append((timer() - start) / calls)
    return statistics.median(means)


def settle_pool(probe: Callable[[], object], timer: Callable[[], float], sleep: Callable[[float], object]) -> int:
    """Wait (at most ``SETTLE_TRIES - 1`` pauses of ``SETTLE_PAUSE_S``) while a call of ``probe`` (an op above the grain
    size) takes more than ``STALL_S``: a phase where the other processes hold both cores, so that every parallel region
    waits a scheduler slice (about 12 ms here) for its worker, lasting seconds. Returns the tries taken
    (``SETTLE_TRIES`` and the last one still stalled: the calibration measures that state)."""
    for attempt in range(1, SETTLE_TRIES + 1):
        if pooled_seconds(probe, SETTLE_CALLS, 1, timer, probe) <= STALL_S or attempt == SETTLE_TRIES:
            return attempt
        sleep(SETTLE_PAUSE_S)
    return SETTLE_TRIES


def fit_per_call(small: tuple[float, int], large: tuple[float, int], calls: int, per_op: float) -> tuple[float, float]:
    """(Seconds per kernel call, seconds per FLOP) through two measurements ``(seconds, FLOPs)`` of one op, a small and
    a large one, each of ``calls`` kernel calls and one dispatch: ``seconds = per_op + calls x call + FLOPs x
    per_flop`` at both (each term at least a floor)."""
    (small_s, small_flops), (large_s, large_flops) = small, large
    per_flop = max((large_s - small_s) / max(large_flops - small_flops, 1), 1e-15)
    return max((small_s - per_op - small_flops * per_flop) / calls, 0.0), per_flop


def convolution_fits(per_op: float, measure: Callable[[Callable[[], object], int, int], float]) -> \
        dict[str, tuple[float, float]]:
    """``MachineRates.fitted`` for ``aten.convolution`` and ``aten.convolution_backward``: each op timed (``measure(fn,
    calls, blocks)``) on :data:`CONV_SHAPES`' small and large convolution of ones made here, both gradients for the
    backward (two kernel calls), its FLOPs by torch's FLOP registry (what the capture's nodes are priced by)."""
    aten, fits = torch.ops.aten, {}
    timed: dict[str, list[tuple[float, int]]] = {"aten.convolution": [], "aten.convolution_backward": []}
    for batch, channels, out_channels, side in CONV_SHAPES:
        x, w = torch.ones(batch, channels, side, side), torch.ones(out_channels, channels, 3, 3)
        bias, geometry = torch.ones(out_channels), ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        out = aten.convolution.default(x, w, bias, *geometry)
        grad, mask = torch.ones_like(out), [True, True, True]
        grads = aten.convolution_backward.default(grad, x, w, [out_channels], *geometry, mask)
        forward_flops = flop_registry[aten.convolution](x, w, bias, *geometry, out_val=out)
        backward_flops = flop_registry[aten.convolution_backward](grad, x, w, [out_channels], *geometry, mask,
                                                                  out_val=grads)
        forward = functools.partial(aten.convolution.default, x, w, bias, *geometry)
        backward = functools.partial(aten.convolution_backward.default, grad, x, w, [out_channels], *geometry, mask)
        timed["aten.convolution"].append((measure(forward, 2, 3), forward_flops))
        timed["aten.convolution_backward"].append((measure(backward, 2, 3), backward_flops))
    for op, (small, large) in timed.items():
        fits[op] = fit_per_call(small, large, 1 if op == "aten.convolution" else 2, per_op)
    return fits


def calibrate(threads: int, timer: Callable[[], float] = time.perf_counter,
              sleep: Callable[[float], object] = time.sleep) -> MachineRates:
    """Measure the rates at ``threads`` CPU threads (restored afterwards); see the module docstring.

    At more than one thread every quantity is measured with the pool warm and as a median (:func:`pooled_seconds`),
    after :func:`settle_pool`: an op timed after the pool slept (10 ms idle) paid 4-16 ms under load, and in phases of
    seconds every parallel op paid about 12 ms, which min-of-blocks timings on an idle pool took for the machine's
    rates (a 7-14 ms wake-up per op, 1.3 GFLOP/s).

    Parameters
    ----------
    threads : int
        torch's CPU thread count while measuring (at least 1).
    timer : callable
        The clock in seconds (a test's fake one).
    sleep : callable
        Pauses for the given seconds (a test's fake one; only at more than one thread, while the pool is stalled).

    Returns
    -------
    MachineRates
        The per-op host seconds, FLOP rate, bandwidth and thread-pool wake-up, each positive (the wake-up 0 or more).
    """
    previous, count = torch.get_num_threads(), max(1, int(threads))
    torch.set_num_threads(count)
    try:
        # outside any dispatch mode the caller runs (a mode's Python work is no part of the machine's op cost), and
        # with torch's CPU generator put back: the table's random draws must not move the user's random stream
        with torch.no_grad(), _disable_current_modes(), torch.random.fork_rng(devices=[]):
            tiny, medium = torch.ones(8), torch.ones(PARALLEL_ELEMENTS)
            add, mul, view, total = (torch.ops.aten.add.Tensor._op, torch.ops.aten.mul.Tensor._op,
                                     torch.ops.aten.view.default._op, torch.ops.aten.sum.default._op)

            def probe() -> None:  # above the grain size: a parallel region at more than one thread
                for _ in range(SETTLE_CALLS):
                    add(medium, medium)

            def measure(fn: Callable[[], object], calls: int, blocks: int) -> float:
                if count == 1:
                    return best_seconds(fn, calls, blocks, timer)
                return pooled_seconds(fn, calls, blocks, timer, probe)

            def small_ops() -> None:
                add(tiny, tiny)
                mul(tiny, tiny)
                view(tiny, [2, 4])
                total(tiny)

            settled = 0 if count == 1 else settle_pool(lambda: add(medium, medium), timer, sleep)
            per_op = measure(small_ops, 50, 5) / 4
            square = torch.ones(MM_SIDE, MM_SIDE)
            mm = torch.ops.aten.mm.default._op
            mm_s = measure(lambda: mm(square, square), 4, 3)
            wide = torch.ones(BANDWIDTH_ELEMENTS)
            wide_s = measure(lambda: add(wide, wide), 4, 3)
            medium_s = measure(lambda: add(medium, medium), 10, 3)
            per_call = {op: measure(call, 2, 3) for op, call in element_recipes().items()}
            fitted = convolution_fits(max(per_op, 1e-9), measure)
    finally:
        torch.set_num_threads(previous)
    floor = 1e-9
    per_op = max(per_op, floor)
    flop_rate = 2 * MM_SIDE ** 3 / max(mm_s - per_op, floor)
    bandwidth = 3 * 4 * BANDWIDTH_ELEMENTS / max(wide_s - per_op, floor)
    parallel = 0.0 if count <= 1 else max(0.0, medium_s - per_op - 3 * 4 * PARALLEL_ELEMENTS / bandwidth)
    elements = ELEMENT_ROWS * ELEMENT_COLUMNS
    element_s = {op: max(seconds - per_op, floor) / elements for op, seconds in per_call.items()}
    return MachineRates(per_op_s=per_op, flop_rate=flop_rate, bandwidth=bandwidth, parallel_s=parallel, threads=count,
                        element_s=element_s, fitted=fitted, settle_tries=settled)


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


def kernel_calls(op: str, args: tuple[Any, ...]) -> int:
    """The kernel calls of one op of :attr:`MachineRates.fitted`, by its :func:`element_key` and fx arguments: a
    convolution's backward makes one per gradient of its input and its weight that its output mask asks for (its bias's
    is a sum), at least 1; any other op, 1."""
    if op != "aten.convolution_backward" or len(args) < 11 or not isinstance(args[10], (list, tuple)):
        return 1
    return max(1, sum(bool(wanted) for wanted in args[10][:2]))


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


__all__ = [
    "GRAIN_SIZE",
    "MachineRates",
    "PerThreadCalibration",
    "best_seconds",
    "calibrate",
    "convolution_fits",
    "element_key",
    "element_recipes",
    "fit_per_call",
    "forget_rates",
    "host_costs",
    "host_costs_enabled",
    "kernel_calls",
    "machine_rates",
    "pooled_seconds",
    "settle_pool",
    "within_one_thread",
]
