"""One measured training step of a compiled module: the bytes it held beyond what existed before it.

The meter is not coop's: on CPU the allocator's own reports to ``torch.profiler``
(:func:`coop.runtime.meter.cpu_allocation_peak`), on CUDA the caching allocator's peak reserved bytes. The step
runs forward and backward on the real model, then puts back what it changed: the gradients (as they were, None
included), the buffers (batch norm's running statistics) and the RNG state. :func:`extern_calls` profiles one more
such step for the scratch extern kernels take inside themselves (:mod:`coop.compiled.extern_scratch`);
:func:`step_seconds` times a few more, the step a plan's predicted overhead is a share of.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from coop.compiled.extern_scratch import KernelCall, profiled_calls
from coop.runtime.meter import cpu_allocation_peak

__all__ = ["extern_calls", "held_bytes", "step_loss", "step_seconds", "warm_up"]

#: steps :func:`step_seconds` times (the median is returned)
TIMED_STEPS = 5


def step_loss(module: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None) -> torch.Tensor:
    """The loss of one forward: ``loss_fn(output)``, else the output (summed), its ``loss`` or its first element.

    Parameters
    ----------
    module : nn.Module
        The (compiled) model.
    batch : Any
        A tensor, a tuple of positional arguments or a dict of keyword arguments.
    loss_fn : callable or None
        Maps the output to the loss.

    Returns
    -------
    torch.Tensor
        The loss.
    """
    if isinstance(batch, dict):
        out = module(**batch)
    elif isinstance(batch, (tuple, list)):
        out = module(*batch)
    else:
        out = module(batch)
    if loss_fn is not None:
        return loss_fn(out)
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.sum()
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    return out[0]


@contextlib.contextmanager
def _put_back(module: nn.Module) -> Iterator[None]:
    """Inside, the gradients start as None; after, the gradients and buffers are as they were before."""
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in module.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    for p in module.parameters():
        p.grad = None
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.grad = grads[name]
            for name, b in module.named_buffers():
                b.copy_(buffers[name])


def _rng_kept(module: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Inside, the step's random draws; after, the CPU generator (and, for a model with CUDA parameters, the CUDA
    generators) as they were."""
    cuda = any(p.device.type == "cuda" for p in module.parameters())
    return torch.random.fork_rng(devices=None if cuda else [])


def warm_up(module: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
            compilations: Callable[[], int], most: int = 3) -> list[int]:
    """Unmetered steps until one compiles nothing new (at most ``most``); per step that compiled, how many graphs.

    A compiled module compiles its forward at the first call and its backward at the first backward, and a first
    call can change what its guards read (Hugging Face's loss sets ``config.problem_type``), so that the second
    call compiles the graph again: bench_compile's ResNet compiled two plans in its first two steps (2026-11-29).
    What the steps after those run, and hold, is the last compilation's; and the kernels' one-off allocations
    (oneDNN's primitive cache) are made by then. Gradients, buffers and the RNG are put back.

    Parameters
    ----------
    module, batch, loss_fn
        As :func:`held_bytes` takes them.
    compilations : callable
        How many graphs have been compiled so far (the partitioner's plans).
    most : int
        At most this many steps.

    Returns
    -------
    list of int
        For each step that compiled, in order, the graphs it compiled (empty: none compiled).
    """
    compiled: list[int] = []
    with _put_back(module):
        for _ in range(most):
            before = compilations()
            with _rng_kept(module):
                step_loss(module, batch, loss_fn).backward()
            module.zero_grad(set_to_none=True)
            if compilations() == before:
                break
            compiled.append(compilations() - before)
    return compiled


def held_bytes(module: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None) -> int | None:
    """Peak bytes one forward+backward of ``module`` allocated above what was allocated when it started.

    Parameters
    ----------
    module : nn.Module
        The (compiled) model; its gradients and buffers are put back afterwards.
    batch, loss_fn
        As :func:`step_loss` takes them.

    Returns
    -------
    int or None
        The bytes; None while another profiler runs (CPU).
    """

    def run() -> None:
        step_loss(module, batch, loss_fn).backward()

    with _put_back(module):
        if any(p.device.type == "cuda" for p in module.parameters()):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_reserved()
            with torch.random.fork_rng():
                run()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_reserved() - start
        return cpu_allocation_peak(run)


def extern_calls(module: nn.Module, batch: Any,
                 loss_fn: Callable[[Any], torch.Tensor] | None) -> list[list[KernelCall]] | None:
    """One more step of ``module`` on ``batch``, profiled: per compiled graph call, the ATen calls and their scratch.

    A step like :func:`held_bytes`'s (gradients, buffers and the RNG put back), on the real batch; its allocator
    events are read by :func:`coop.compiled.extern_scratch.profiled_calls`.

    Parameters
    ----------
    module, batch, loss_fn
        As :func:`held_bytes` takes them.

    Returns
    -------
    list of list of KernelCall or None
        Per compiled graph call, in order, its ATen calls; None while another profiler runs.
    """
    device = next((p.device.type for p in module.parameters()), "cpu")
    with _put_back(module), _rng_kept(module):
        return profiled_calls(lambda: step_loss(module, batch, loss_fn).backward(), device)


def step_seconds(module: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
                 steps: int = TIMED_STEPS) -> float:
    """The median wall seconds of ``steps`` forward+backward steps of ``module`` (already warmed up:
    :func:`warm_up`), each ended when the device's queued kernels have run; gradients, buffers and the RNG are put
    back.

    Parameters
    ----------
    module, batch, loss_fn
        As :func:`held_bytes` takes them.
    steps : int
        How many steps to time; their median is returned.

    Returns
    -------
    float
        Seconds.
    """
    times = []
    with _put_back(module), _rng_kept(module):
        for _ in range(steps):
            start = time.perf_counter()
            loss = step_loss(module, batch, loss_fn)
            loss.backward()
            loss.item()  # one path on every device: the read waits for the kernels queued before it on its stream
            times.append(time.perf_counter() - start)
            module.zero_grad(set_to_none=True)
    return statistics.median(times)
