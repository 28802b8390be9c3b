"""Functions run on spawned ranks by tests/test_sharded_learner.py (a small module: every rank imports it)."""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist


def raise_on_rank_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("bad shard")
    dist.barrier()  # rank 0 waits here for a peer that never comes
    return rank


def killed_on_rank_one(rank: int, world: int) -> int:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return rank


def sum_of_ranks(rank: int, world: int) -> float:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return float(t)
