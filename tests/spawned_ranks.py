"""Run a function on several gloo ranks (torch.multiprocessing, forked from a fork server) and collect what each rank reports.

Each rank runs ``body(rank, out)`` in a process of its own, with ``MASTER_ADDR``/``MASTER_PORT`` set to a free
loopback port and one intra-op thread; the body initialises (and destroys) its process group itself, so it can
do work before joining it. What the body returns is the rank's report, ``"ok <its text>"``; a rank that raises
reports its traceback instead, which the test prints: ``mp.spawn`` itself only says that a process failed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp

RankBody = Callable[[int, Path], str]
#: What the fork server imports before it forks any rank (a rank's body imports the rest itself): FSDP2's modules and
#: inductor (coop's capture imports it) too, which each rank imported again, 1.8-1.9 s apiece: test_fsdp.py and
#: test_ddp.py took 25.4 s with them preloaded against 47.8 s without (2026-11-29, load 3.9)
PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "torch._inductor", "coop", "coop.planner")


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, body: RankBody, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        Path(out, f"rank{rank}").write_text(f"ok {body(rank, Path(out))}")
    except BaseException:
        Path(out, f"rank{rank}").write_text(traceback.format_exc())
        raise


def run_ranks(body: RankBody, out: Path, world_size: int) -> list[str]:
    """Each rank's report (``"ok ..."``, a traceback, or ``"no report"``), in rank order; ``body`` must be a
    module-level function (the fork server's children unpickle it)."""
    # Forked from a fork server that imported torch and coop once (for every run_ranks of this process), not spawned:
    # two spawned ranks each imported torch and coop again, about half of a DDP or FSDP test's time on 2 cores.
    mp.set_forkserver_preload(list(PRELOAD))  # read when the server starts: the first call of the process
    with contextlib.suppress(Exception):  # a failed rank raises here; its report says why
        mp.start_processes(_rank_main, args=(body, free_port(), str(out)), nprocs=world_size, join=True,
                           start_method="forkserver")
    return [(out / f"rank{rank}").read_text() if (out / f"rank{rank}").exists() else "no report"
            for rank in range(world_size)]
