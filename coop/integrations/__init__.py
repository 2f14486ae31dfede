"""Thin adapters that run a training framework's forward + backward through a coop plan.

Each module imports its framework when it is imported itself (``import coop`` loads none of them), and the
frameworks are optional extras (``pip install coop-remat[transformers]``, ``coop-remat[lightning]``):

* :mod:`coop.integrations.transformers`: Hugging Face ``Trainer`` (``enable(trainer, 0.6)`` or ``CoopTrainer``),
  whose ``training_step`` replaces ``accelerator.backward``'s path;
* :mod:`coop.integrations.lightning`: a Lightning ``Callback`` for a ``LightningModule``'s ``training_step``;
* :mod:`coop.integrations.accelerate`: ``CoopBackward`` for a hand-written Accelerate loop (``accelerator.backward``).
"""
