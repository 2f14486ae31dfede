"""Saved generator states: how a random op is recomputed without drawing new numbers.

Both replaying engines use it: the static executor (a plan that recomputes a dropout mask) and
the dynamic fallback (an evicted random value recomputed on demand). The first draw of every
random op runs in the captured program's order, so it draws what eager PyTorch draws; the state
of its generator right before that draw is saved, and a recomputation sets it, reruns the op and
restores the generator, so the recomputed value has the same bits and later draws are unaffected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import fx

from coop.runtime.meter import host_pool


@dataclass
class RngState:
    """The state of the generator a random op draws from, saved right before its first draw.

    Replaying the op inside :meth:`replayed` (generator set to the saved state, then restored)
    draws exactly the numbers of the first run (same generator state, same op, same shapes) and
    leaves the program's generator where it was, so later random ops still draw what eager
    PyTorch draws. The saved state is host memory (a CPU byte tensor, for CUDA generators too),
    allocated in the meter's host pool: it never counts against the device budget.
    """

    device: torch.device
    state: torch.Tensor

    @classmethod
    def save(cls, device: torch.device | str = "cpu") -> RngState:
        """The current state of the default generator of ``device``."""
        device = torch.device(device)
        return cls(device, _generator_state(device))

    @classmethod
    def capture(cls, fx_node: fx.Node) -> RngState:
        """The state of the generator that the random op ``fx_node`` is about to draw from."""
        return cls.save(output_device(fx_node))

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        previous = swap_generator_state(self)
        try:
            yield
        finally:
            _set_generator_state(self.device, previous)


def _generator_state(device: torch.device) -> torch.Tensor:
    with host_pool():
        return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_generator_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def output_device(fx_node: fx.Node) -> torch.device:
    """The device of an fx node's (first) output: where its random op draws.

    Parameters
    ----------
    fx_node : fx.Node
        The random op's node; its ``meta["val"]`` is read.

    Returns
    -------
    torch.device
        The device of its (first) output tensor; CPU when it has no tensor value.
    """
    value = fx_node.meta.get("val")
    first = value[0] if isinstance(value, (tuple, list)) else value
    return first.device if isinstance(first, torch.Tensor) else torch.device("cpu")


# ---------------------------------------------------------------- in a generated replay program
def save_generator_state(device: str) -> RngState:
    """The state of ``device``'s default generator now (called right before a random op's first draw).

    Parameters
    ----------
    device : str
        The device whose default generator is read.

    Returns
    -------
    RngState
        The device and a copy of its generator's state.
    """
    return RngState.save(device)


def swap_generator_state(saved: RngState) -> torch.Tensor:
    """Set the generator to ``saved`` and return the state it had (for :func:`restore_generator_state`).

    Parameters
    ----------
    saved : RngState
        The state to set, on its device's default generator.

    Returns
    -------
    torch.Tensor
        The generator's state before the swap.
    """
    current = _generator_state(saved.device)
    _set_generator_state(saved.device, saved.state)
    return current


def restore_generator_state(previous: torch.Tensor, saved: RngState, value: object) -> object:
    """Put the generator back to ``previous`` once ``value`` (the replayed draw) exists; returns ``value``.

    Taking ``value`` as an argument orders this call after the replayed op in a generated program.

    Parameters
    ----------
    previous : torch.Tensor
        The state to restore (from :func:`swap_generator_state`).
    saved : RngState
        The saved state that was swapped in; names the device whose generator is restored.
    value : object
        The replayed draw.

    Returns
    -------
    object
        ``value``, unchanged.
    """
    _set_generator_state(saved.device, previous)
    return value
