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


def shards_cut_where_they_lie(rank: int, world: int) -> list[str]:
    """``fsdp.like`` against ``distribute_tensor`` on this rank, for even, uneven and empty
    shards and a replicated parameter: the same shard, in memory of its own. Returns what
    failed (an empty list when nothing did), gathered from every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from actions.rl.fsdp import like

    mesh = init_device_mesh("cpu", (world,))
    failed = []
    for shape in [(151, 7), (2, 3), (1,), (5,), (300, 64)]:
        whole = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
        for placements in ([Shard(0)], [Replicate()]):
            param = distribute_tensor(torch.zeros(shape), mesh, placements)
            want = distribute_tensor(whole, mesh, placements, src_data_rank=None)
            got = like(whole, param)
            ok = (got.shape == want.shape and got.stride() == want.stride()
                  and torch.equal(got.to_local(), want.to_local()) and torch.equal(got.full_tensor(), whole)
                  and got.to_local().untyped_storage().data_ptr() != whole.untyped_storage().data_ptr())
            if not ok:
                failed.append(f"rank {rank}: {shape} {placements}")
    every: list = [None] * world
    dist.all_gather_object(every, failed)
    return [f for part in every for f in part]
