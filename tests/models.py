"""Small test models (defined in :mod:`coop.zoo` so the package never imports ``tests``)."""

from coop.zoo import CNN, MLP, Block, Transformer, build

__all__ = ["CNN", "MLP", "Block", "Transformer", "build"]
