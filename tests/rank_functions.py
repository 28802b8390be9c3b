"""Functions run on spawned ranks by tests/test_sharded_learner.py (a small module: every rank imports it)."""

from __future__ import annotations

import json
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


SHAPES = [(151, 7), (2, 3), (1,), (5,), (300, 64)]


def _publish_state(rank: int, store_root: str):
    """Rank 0 publishes an optimizer-like tensor set: moments of every shape in ``SHAPES``, a
    ``p99.step`` blob of no parameter and a scalar step in the meta. Every rank gets the tensors."""
    from actions.store import open_store
    from actions.store.weights import publish_tensors

    tensors = {f"p{i}.exp_avg": torch.randn(shape, generator=torch.Generator().manual_seed(i))
               for i, shape in enumerate(SHAPES * 2)}
    tensors["p99.step"] = torch.arange(3.0)
    tensors["p0.step"] = torch.tensor(7.0)
    store = open_store(store_root)
    if rank == 0:
        publish_tensors(store, "opt/manifest.json", tensors, scalars_in_meta=True)
    dist.barrier()
    return store, tensors


def _counted(store) -> list[int]:
    """Bytes of every blob this rank fetches from ``store`` from now on."""
    fetched: list[int] = []
    get_buffer = store.get_buffer
    store.get_buffer = lambda key, size=None: fetched.append(size) or get_buffer(key, size=size)
    return fetched


def scattered_state_reads(rank: int, world: int, store_root: str) -> tuple[list[str], list[int]]:
    """``state_scatter.scattered`` against ``distribute_tensor`` on this rank, for even, uneven
    and empty shards, replicated and unsharded parameters, a tensor of no parameter and a
    scalar. Returns what failed on any rank and the blob bytes each rank fetched."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from actions.rl.state_scatter import scattered
    from actions.store.weights import StoredTensors

    mesh = init_device_mesh("cpu", (world,))
    store, tensors = _publish_state(rank, store_root)
    layout, want = {}, {}
    for i, shape in enumerate(SHAPES * 2):
        name = f"p{i}.exp_avg"
        if i == 3:  # an unsharded parameter: the whole tensor
            layout[name], want[name] = torch.zeros(shape), tensors[name]
            continue
        placements = [Replicate()] if i >= len(SHAPES) else [Shard(0)]
        layout[name] = distribute_tensor(torch.zeros(shape), mesh, placements)
        want[name] = distribute_tensor(tensors[name], mesh, placements, src_data_rank=None).to_local()
    want["p99.step"], want["p0.step"] = tensors["p99.step"], tensors["p0.step"]
    fetched = _counted(store)
    failed, seen = [], []
    for name, got in scattered(StoredTensors(store, "opt/manifest.json"), layout.get, rank=rank, world=world,
                               device=torch.device("cpu")):
        seen.append(name)
        if got.shape != want[name].shape or not torch.equal(got, want[name]):
            failed.append(f"rank {rank}: {name} {tuple(got.shape)} != {tuple(want[name].shape)}")
    if sorted(seen) != sorted(want):
        failed.append(f"rank {rank}: saw {seen}")
    every: list = [None] * world
    dist.all_gather_object(every, (failed, sum(fetched)))
    return [f for part, _ in every for f in part], [count for _, count in every]


def scattered_read_fails(rank: int, world: int, store_root: str, how: str) -> None:
    """Iterate ``scattered`` over a set whose second blob (owned by rank 1) is corrupt
    (``how="corrupt"``) or has another shape than its parameter (``how="shape"``). Rank 0 writes
    the ``PeerReadFailed`` it raises to ``peer.json`` in ``store_root``."""
    from pathlib import Path

    from actions.rl.state_scatter import PeerReadFailed, scattered
    from actions.store.weights import StoredTensors

    store, tensors = _publish_state(rank, store_root)
    state = StoredTensors(store, "opt/manifest.json")
    second = [n for n in state if not state.is_scalar(n)][1]
    layout = {}
    if how == "shape":
        layout[second] = torch.zeros(tensors[second].numel() + 1)
    elif rank == 0:
        digest = state.manifest["files"][second]["sha256"]
        blob = next(p for p in Path(store_root).rglob(digest) if p.is_file())
        data = bytearray(blob.read_bytes())
        data[-1] ^= 0xFF
        blob.write_bytes(bytes(data))
    dist.barrier()
    try:
        for _ in scattered(state, layout.get, rank=rank, world=world, device=torch.device("cpu"), where="opt"):
            pass
    except PeerReadFailed as exc:  # what the rank that does not own the tensor was told
        Path(store_root, "peer.json").write_text(json.dumps({"rank": rank, "text": str(exc),
                                                            "transient": exc.transient}))
        raise
