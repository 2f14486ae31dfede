"""One schedule for every rank of an FSDP-sharded model: rank 0 solves, the others replay what it chose.

The schedule of a sharded step decides when each unit is all-gathered and its gradients
reduce-scattered, and every rank must issue those collectives in the same order. A solver with a
time limit (CP-SAT, a MILP) can return different schedules on two ranks of the same graph, so the
planner solves on the shard group's first rank only and broadcasts the result
(:func:`solved_on_rank_zero`); each other rank validates it on its own capture before replaying it.
The ranks' graphs are compared first (:func:`require_same_graph`): a rank whose step differs (another
batch shape) is refused on every rank in one line, not left waiting in a collective.

A cluster's plan can also be made before renting it: :func:`fake_cluster` opens a process group of the
cluster's world size that runs no collective, under which a model built on the meta device is sharded and
planned as one rank of that cluster.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from coop.errors import CaptureError, CoopError
from coop.graph_capture import Captured


@contextlib.contextmanager
def fake_cluster(world_size: int, rank: int = 0) -> Iterator[None]:
    """A process group of ``world_size`` ranks that runs no collective: plan a cluster's FSDP step on one machine.

    Inside it, a model built on the meta device (no weights) can be ``fully_shard``-ed as on the
    cluster, and ``coop.plan(model, budget, meta_batch, device=...)`` makes the plan of one rank (every rank
    of the cluster has the same step); ``plan.save`` it and ``coop.load_plan`` it on each rank of the real
    cluster, which captures the real sharded step and checks it is the same graph. It is PyTorch's fake
    backend (``torch.testing._internal.distributed.fake_pg``), which hallucinates every collective.

    Parameters
    ----------
    world_size : int
        Ranks of the cluster the plan is for.
    rank : int
        The rank this process stands for (every rank plans the same step).

    Yields
    ------
    None
        While the fake process group is the default one.

    Raises
    ------
    CoopError
        When a process group is already initialized here (plan in a process without one).
    """
    if dist.is_initialized():
        raise CoopError("a process group is already initialized in this process; plan for a fake cluster in a "
                        "process without one (the fake one replaces the default group while it is open)")
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers PyTorch's "fake" backend

    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def require_same_graph(captured: Captured) -> None:
    """Refuse, on every rank, a sharded step whose Graph is not the same on all ranks of its shard group.

    Parameters
    ----------
    captured : Captured
        This rank's capture; without ``sharding`` there is nothing to compare.

    Raises
    ------
    CaptureError
        Naming the ranks whose graphs differ from rank 0's.
    """
    sharding = captured.sharding
    if sharding is None:
        return
    group = sharding.process_group
    digests: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, captured.graph.sha256, group=group)
    differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    if differing:
        raise CaptureError(f"the FSDP ranks captured different steps (ranks {differing} differ from rank 0: another "
                           "batch shape, model or flag?); every rank plans the same step, on its own batch of the "
                           "same shapes")


def solved_on_rank_zero(solve: Callable[[Captured, int], Any], build: Callable[..., Any]) -> Callable[[Captured, int], Any]:
    """``solve`` run on the shard group's rank 0 only, its plan rebuilt on every other rank from the broadcast result.

    Parameters
    ----------
    solve : callable
        ``solve(captured, budget_bytes)`` returning a plan with ``schedule``, ``formulation``, ``result`` and
        ``note``.
    build : callable
        ``build(captured, schedule, budget_bytes, formulation, result, note)``: the plan on another rank, which
        validates the schedule on that rank's own graph and budget.

    Returns
    -------
    callable
        ``solve``'s signature; for a capture without sharding, ``solve`` itself runs.
    """

    def agreed(captured: Captured, budget_bytes: int) -> Any:
        sharding = captured.sharding
        if sharding is None:
            return solve(captured, budget_bytes)
        group = sharding.process_group
        rank = dist.get_rank(group)
        chosen = None
        payload: list[Any] = [None]
        if rank == 0:
            try:
                chosen = solve(captured, budget_bytes)
                payload = [(chosen.schedule, chosen.formulation, chosen.result, chosen.note)]
            except CoopError as exc:  # every rank raises it, none waits for a schedule
                payload = [exc]
        dist.broadcast_object_list(payload, src=dist.get_global_rank(group, 0), group=group)
        if isinstance(payload[0], CoopError):
            raise payload[0]
        if chosen is not None:
            return chosen
        schedule, formulation, result, note = payload[0]
        return build(captured, schedule, budget_bytes, formulation, result, note)

    return agreed


__all__ = ["fake_cluster", "require_same_graph", "solved_on_rank_zero"]
