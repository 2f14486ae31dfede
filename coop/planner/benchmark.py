"""``plan.benchmark(batch)``: a plan's step timed against eager PyTorch's on the same model, the fair way.

The two sides alternate step by step (plan, eager, plan, eager, ...), so a neighbour's load on a shared machine
lands on both alike; warm-up pairs run first and are not timed; each side's time is the median of its timed steps.
Gradients are released (``.grad = None``) before every step, as a training loop's ``zero_grad()`` does, so each
step allocates what the plan's budget assumes. Afterwards the model is as it was: its parameters, gradients,
buffers (BatchNorm statistics the steps update) and random generators (``torch.random.fork_rng``), and torch's
CPU thread count where ``threads`` set it.

The eager step is what ``coop.plan`` captured: ``loss_fn(model, *batch)`` or ``model(*batch)`` (through the
DistributedDataParallel wrapper where the plan has one), then ``loss.backward()``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coop.errors import OptionError
from coop.graph_capture.batch import Batch, read_step_batch

#: A clock in seconds (``time.perf_counter``; a test passes a fake one).
Timer = Callable[[], float]


@dataclass(frozen=True)
class StepBenchmark:
    """A plan's step time against eager PyTorch's, measured by :func:`benchmark_step`.

    ``measured_overhead`` is ``plan_ms / eager_ms - 1``, on the scale of ``predicted_overhead`` (the plan's predicted
    step against the predicted eager step, autograd's work included, at the thread count the benchmark ran:
    :mod:`coop.planner.prediction`; None for a plan that decides its evictions while it runs).
    ``plan_times_ms`` and ``eager_times_ms`` are the timed steps, in the order they ran. ``priced_threads`` is the
    thread count the plan's costs were measured at (``graph.meta["host_cost"]``, :mod:`coop.graph_capture.host_cost`;
    None where the costs are nominal): a prediction holds at that count (:meth:`priced_elsewhere` says where it differs).
    """

    plan_ms: float
    eager_ms: float
    measured_overhead: float
    predicted_overhead: float | None
    threads: int
    steps: int
    warmup: int
    plan_times_ms: tuple[float, ...] = ()
    eager_times_ms: tuple[float, ...] = ()
    priced_threads: int | None = None

    def __str__(self) -> str:
        predicted = "n/a" if self.predicted_overhead is None else f"{100 * self.predicted_overhead:.1f} %"
        return (f"predicted {predicted}, measured {100 * self.measured_overhead:.1f} % (plan {self.plan_ms:.1f} ms, "
                f"eager {self.eager_ms:.1f} ms: median of {self.steps} alternating steps after {self.warmup} "
                f"warm-up, {self.threads} thread{'s' if self.threads != 1 else ''})")

    def priced_elsewhere(self) -> str:
        """``" (costs measured at N threads)"`` where the plan's costs were measured at another thread count than this
        benchmark ran at, else ``""``."""
        if self.priced_threads is None or self.priced_threads == self.threads:
            return ""
        return f" (costs measured at {self.priced_threads} thread{'s' if self.priced_threads != 1 else ''})"

    def as_dict(self) -> dict[str, Any]:
        """The numbers as a JSON-ready dict (what ``plan.summary()["benchmark"]`` shows)."""
        return {"plan_ms": self.plan_ms, "eager_ms": self.eager_ms, "measured_overhead": self.measured_overhead,
                "predicted_overhead": self.predicted_overhead, "threads": self.threads, "steps": self.steps,
                "warmup": self.warmup, "plan_times_ms": list(self.plan_times_ms),
                "eager_times_ms": list(self.eager_times_ms), "priced_threads": self.priced_threads}


def check_arguments(steps: int, warmup: int, threads: int | None) -> None:
    """Refuse, in one line naming the fix, a benchmark that cannot run as asked.

    Parameters
    ----------
    steps : int
        Timed steps per side: a whole number, at least 1.
    warmup : int
        Untimed pairs first: a whole number, at least 0.
    threads : int or None
        torch's CPU threads while it runs: None (as they are) or a whole number, at least 1.

    Raises
    ------
    OptionError
        For a value out of its range or not a whole number.
    """
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(steps) or steps < 1:
        raise OptionError(f"steps={steps!r}: the benchmark times at least one step per side; pass steps=1 or more "
                          "(the default 9 takes the median of 9)")
    if not whole(warmup) or warmup < 0:
        raise OptionError(f"warmup={warmup!r}: warm-up steps are a whole number, 0 or more; pass warmup=0 to time "
                          "from the first step (the default is 2)")
    if threads is not None and (not whole(threads) or threads < 1):
        raise OptionError(f"threads={threads!r}: torch needs at least one CPU thread; pass threads=1 or more, or "
                          "threads=None to keep torch's current count")


def alternate(plan_step: Callable[[], Any], eager_step: Callable[[], Any], *, steps: int, warmup: int,
              timer: Timer = time.perf_counter, before: Callable[[], None] = lambda: None,
              synchronize: Callable[[], None] = lambda: None) -> tuple[list[float], list[float]]:
    """Run ``warmup`` untimed pairs, then ``steps`` timed pairs, each pair ``plan_step`` then ``eager_step``.

    Each step is timed alone: ``before()`` (release the gradients) and ``synchronize()`` run first, outside the
    time; ``synchronize()`` runs again before the clock stops (a CUDA step's kernels finish inside its time).

    Parameters
    ----------
    steps, warmup : int
        Timed pairs, untimed pairs before them.
    timer : callable
        The clock, in seconds; read twice per timed step (start, end) and never in warm-up.
    before, synchronize : callable
        Run before every step, and around each timed one.

    Returns
    -------
    tuple of (list of float, list of float)
        The plan's and eager's timed steps, in seconds, in the order they ran.
    """
    def timed(step: Callable[[], Any]) -> float:
        before()
        synchronize()
        start = timer()
        step()
        synchronize()
        return timer() - start

    for _ in range(warmup):
        for step in (plan_step, eager_step):
            before()
            step()
    synchronize()
    plan_times: list[float] = []
    eager_times: list[float] = []
    for _ in range(steps):
        plan_times.append(timed(plan_step))
        eager_times.append(timed(eager_step))
    return plan_times, eager_times


def benchmark_step(plan: Any, batch: Any, *, steps: int = 9, warmup: int = 2, threads: int | None = None,
                   timer: Timer = time.perf_counter) -> StepBenchmark:
    """Time ``plan.step(batch)`` against the eager step on the same model and batch (:func:`alternate`).

    The model's parameters, gradients, buffers and random generators are put back afterwards, and torch's thread
    count where ``threads`` set it: a benchmark does not change training. The gradients a step would add to are
    held aside while it runs; call it after ``zero_grad()`` for steps within the plan's budget.

    Parameters
    ----------
    plan : BasePlan
        The plan (static or dynamic) whose step is timed; its ``model``, ``wrapper`` and ``loss_fn`` make the eager
        step.
    batch : Any
        A batch as ``plan.step`` takes it in one argument (as ``coop.plan`` got it, or a :class:`Batch`).
    steps, warmup, threads : int, int, int or None
        Timed steps per side, untimed pairs first, torch's CPU threads while it runs (None: as they are).
    timer : callable
        The clock in seconds (a test's fake one).

    Returns
    -------
    StepBenchmark
        The medians, their ratio as the measured overhead beside the predicted one, and how they were measured.

    Raises
    ------
    OptionError
        For ``steps < 1``, ``warmup < 0`` or ``threads < 1`` (:func:`check_arguments`).
    CoopError
        For a batch ``plan.step`` refuses.
    """
    check_arguments(steps, warmup, threads)
    read = read_step_batch((batch,), {}, plan.captured.layout)
    model: nn.Module = plan.model
    cuda = _cuda_indices(model, read)
    with model_put_back(model, cuda), torch_threads(threads):
        plan_times, eager_times = alternate(
            lambda: plan.step(read), _eager_step(plan, read), steps=steps, warmup=warmup, timer=timer,
            before=lambda: _release_gradients(model), synchronize=_synchronizer(cuda))
        used = torch.get_num_threads()
    plan_s, eager_s = statistics.median(plan_times), statistics.median(eager_times)
    return StepBenchmark(plan_ms=1e3 * plan_s, eager_ms=1e3 * eager_s,
                         measured_overhead=plan_s / eager_s - 1 if eager_s > 0 else float("nan"),
                         predicted_overhead=_predicted_at(plan, used), threads=used, steps=steps,
                         warmup=warmup, plan_times_ms=tuple(1e3 * t for t in plan_times),
                         eager_times_ms=tuple(1e3 * t for t in eager_times), priced_threads=_priced_threads(plan))


def _predicted_at(plan: Any, threads: int) -> float | None:
    """The plan's predicted overhead against eager at the thread count the benchmark ran at (a static plan's
    ``predicted_overhead_at``), its ``predicted_overhead`` for another kind of plan, or None."""
    at = getattr(plan, "predicted_overhead_at", None)
    return at(threads) if callable(at) else getattr(plan, "predicted_overhead", None)


def _priced_threads(plan: Any) -> int | None:
    """The thread count the plan's node costs were measured at (its graph's ``meta["host_cost"]``), or None."""
    graph = getattr(plan, "graph", None)
    threads = (getattr(graph, "meta", None) or {}).get("host_cost", {}).get("threads")
    return threads if isinstance(threads, int) else None


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to ``threads`` inside the block (None: left as it is), restored after it.

    Parameters
    ----------
    threads : int or None
        The count to run with.

    Returns
    -------
    Iterator[None]
        A context manager.
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads is not None:
            torch.set_num_threads(previous)


@contextlib.contextmanager
def model_put_back(model: nn.Module, cuda_devices: list[int]) -> Iterator[None]:
    """``model``'s parameters, gradients and buffers, and the CPU's and ``cuda_devices``' random generators, as they
    were before the block, whatever it did (values copied back in place, the same tensor objects).

    Parameters
    ----------
    model : nn.Module
        The model the block trains.
    cuda_devices : list of int
        The CUDA devices whose generators to restore (``torch.random.fork_rng``).

    Returns
    -------
    Iterator[None]
        A context manager.
    """
    params = list(model.parameters())
    # copies on the host: the device holds no more during the block than the steps themselves allocate
    values = [p.detach().to("cpu", copy=True) for p in params]
    grads = [p.grad for p in params]  # held aside: the steps start from None and never write into these
    buffers = [(b, b.detach().to("cpu", copy=True)) for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=cuda_devices):
            yield
    finally:
        with torch.no_grad():
            for param, value, grad in zip(params, values, grads, strict=True):
                param.copy_(value)
                param.grad = grad
            for buffer, value in buffers:
                buffer.copy_(value)


def _eager_step(plan: Any, batch: Batch) -> Callable[[], None]:
    """The step ``coop.plan`` captured, run by PyTorch: the loss (``loss_fn`` or the model's call) and its backward."""
    caller: nn.Module = plan.wrapper if plan.wrapper is not None else plan.model
    loss_fn = plan.loss_fn

    def step() -> None:
        if loss_fn is not None:
            loss = batch.layout.call(loss_fn, (caller,), batch.tensors)
        else:
            loss = batch.layout.call(caller, (), batch.tensors)
        loss.backward()

    return step


def _release_gradients(model: nn.Module) -> None:
    """``zero_grad(set_to_none=True)``: the next step allocates its gradients afresh, as the budget assumes."""
    for param in model.parameters():
        param.grad = None


def _cuda_indices(model: nn.Module, batch: Batch) -> list[int]:
    """The CUDA devices the model's tensors and the batch live on."""
    tensors = [*model.parameters(), *model.buffers(), *batch.tensors]
    found = {t.device.index if t.device.index is not None else torch.cuda.current_device()
             for t in tensors if t.device.type == "cuda"}
    return sorted(found)


def _synchronizer(devices: list[int]) -> Callable[[], None]:
    """Wait for the CUDA ``devices``' queued kernels (nothing to wait for on a CPU step)."""

    def synchronize() -> None:
        for index in devices:
            torch.cuda.synchronize(index)

    return synchronize


__all__ = ["StepBenchmark", "Timer", "alternate", "benchmark_step", "check_arguments", "model_put_back",
           "torch_threads"]
