"""One measured training step of a compiled module: the bytes it held beyond what existed before it.

The meter is not coop's: on CPU the allocator's own reports to ``torch.profiler``
(:func:`coop.runtime.meter.cpu_allocation_peak`), on CUDA the caching allocator's peak reserved bytes. The step
runs forward and backward on the real model, then puts back what it changed: the gradients (as they were, None
included), the buffers (batch norm's running statistics) and the RNG state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from coop.runtime.meter import cpu_allocation_peak

__all__ = ["held_bytes", "step_loss"]


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


def held_bytes(module: nn.Module, batch: Any, loss_fn: Callable[[Any], torch.Tensor] | None,
               warm_up: bool = False) -> int | None:
    """Peak bytes one forward+backward of ``module`` allocated above what was allocated when it started.

    Parameters
    ----------
    module : nn.Module
        The (compiled) model; its gradients and buffers are put back afterwards.
    batch, loss_fn
        As :func:`step_loss` takes them.
    warm_up : bool
        Run one unmetered step first (its gradients dropped, the RNG forked): the step then measured is a later
        one, compiled already (a compiled module compiles its forward at the first call and its backward at the
        first backward, and what the compilation allocates is no step's) and past the kernels' one-off
        allocations (oneDNN's primitive cache: the first step of ResNet at 0.7 in bench_compile held 9,504 B more
        than the steps after it, 2026-11-29).

    Returns
    -------
    int or None
        The bytes; None while another profiler runs (CPU).
    """
    grads = {name: None if p.grad is None else p.grad.detach().clone() for name, p in module.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    for p in module.parameters():
        p.grad = None

    def run() -> None:
        step_loss(module, batch, loss_fn).backward()

    devices = {p.device.type for p in module.parameters()}
    try:
        if warm_up:
            with torch.random.fork_rng(devices=[] if "cuda" not in devices else None):
                run()
            with torch.no_grad():
                for p in module.parameters():
                    p.grad = None
                for name, b in module.named_buffers():
                    b.copy_(buffers[name])
        if "cuda" in devices:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_reserved()
            with torch.random.fork_rng():
                run()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_reserved() - start
        return cpu_allocation_peak(run)
    finally:
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.grad = grads[name]
            for name, b in module.named_buffers():
                b.copy_(buffers[name])
