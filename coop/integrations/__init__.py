"""Thin adapters that run a training framework's forward + backward through a coop plan.

Each module imports its framework when it is imported itself (``import coop`` loads none of them), and the
frameworks are optional extras (``pip install coop-remat[transformers]``, ``coop-remat[lightning]``):

* :mod:`coop.integrations.transformers`: Hugging Face ``Trainer`` (``enable(trainer, 0.6)`` or ``CoopTrainer``),
  whose ``training_step`` replaces ``accelerator.backward``'s path;
* :mod:`coop.integrations.lightning`: a Lightning ``Callback`` for a ``LightningModule``'s ``training_step``;
* :mod:`coop.integrations.accelerate`: ``CoopBackward`` for a hand-written Accelerate loop (``accelerator.backward``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def rng_untouched() -> Iterator[None]:
    """The framework's random streams as they were after the block: capture and the plan's measuring run draw
    random numbers (the CPU generator and, where there is one, the current CUDA device's).

    Returns
    -------
    Iterator[None]
        A context manager (``torch.random.fork_rng`` over those devices).
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
