"""coop inside ``torch.compile``: the joint graph planned and split as a coop schedule (layer 8)."""

from coop.compiled.api import CompileRound, compile, partitioner
from coop.compiled.partitioner import CompiledPlan, CoopPartitioner

__all__ = ["CompileRound", "CompiledPlan", "CoopPartitioner", "compile", "partitioner"]
