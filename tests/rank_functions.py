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


def spawn_times(rank: int, world: int) -> list[float]:
    """Every rank's ``spawn_seconds()``, in rank order."""
    from actions.rl.ranks import spawn_seconds

    seen = [None] * world
    dist.all_gather_object(seen, spawn_seconds())
    return seen


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
    """Iterate ``scattered`` over a set whose first blob owned by rank 1 is corrupt
    (``how="corrupt"``) or has another shape than its parameter (``how="shape"``). Rank 0 writes
    the ``PeerReadFailed`` it raises to ``peer.json`` in ``store_root``."""
    from pathlib import Path

    from actions.rl.state_scatter import PeerReadFailed, owners, scattered
    from actions.store.weights import StoredTensors

    store, tensors = _publish_state(rank, store_root)
    state = StoredTensors(store, "opt/manifest.json")
    blobs = [n for n in state if not state.is_scalar(n)]
    second = next(n for n, owner in owners(state, blobs, world).items() if owner == 1)
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


def weights_read_once(rank: int, world: int, store_root: str) -> tuple[list[str], list[int]]:
    """``sharded_train._read_once`` (the ranks' reader of the policy, backbone, adapter and
    critic) against the published tensors, then with a fingerprint the set does not have.
    Returns what failed on any rank and the blob bytes each rank fetched."""
    from actions.rl.sharded_train import _read_once
    from actions.store import open_store
    from actions.store.weights import IntegrityError, publish_tensors, weights_sha256

    g = torch.Generator().manual_seed(3)
    tensors = {f"model.layers.{i}.w": torch.randn(shape, generator=g).to(torch.bfloat16 if i % 2 else torch.float32)
               for i, shape in enumerate(SHAPES)}
    tensors["model.ids"] = torch.arange(11)
    # dtypes gloo and NCCL do not carry travel as bytes
    tensors["model.u16"] = torch.arange(7).to(torch.uint16)
    tensors["model.f8"] = torch.randn(4, 3, generator=g).to(torch.float8_e4m3fn)
    tensors["model.c64"] = torch.randn(5, generator=g, dtype=torch.complex64)
    store = open_store(store_root)
    if rank == 0:
        publish_tensors(store, "policy/manifest.json", tensors, {"version": 1})
    dist.barrier()
    fetched = _counted(store)
    failed = []
    told: list[int] = []
    got = _read_once(store, "policy/manifest.json", weights_sha256(tensors), rank=rank, world=world,
                     device=torch.device("cpu"), fetched=told)
    if told != [sum(fetched)]:  # what the step reports (train/state_read_bytes) is what was fetched
        failed.append(f"rank {rank}: reported {told}, fetched {sum(fetched)}")
    if got.keys() != tensors.keys():
        failed.append(f"rank {rank}: names {sorted(got)}")
    for name, want in tensors.items():
        have = got.get(name)
        same = have is not None and have.dtype == want.dtype and have.shape == want.shape and torch.equal(
            have.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))  # bit for bit, any dtype
        if not same or have.device.type != "cpu":
            failed.append(f"rank {rank}: {name}")
    try:
        _read_once(store, "policy/manifest.json", "0" * 64, rank=rank, world=world, device=torch.device("cpu"),
                   fetched=[])
        failed.append(f"rank {rank}: another fingerprint was accepted")
    except IntegrityError as exc:
        if "is not the committed one" not in str(exc):
            failed.append(f"rank {rank}: {exc}")
    every: list = [None] * world
    dist.all_gather_object(every, (failed, sum(fetched)))
    return [f for part, _ in every for f in part], [count for _, count in every]


def reopened_set_is_refused(rank: int, world: int, store_root: str) -> None:
    """Rank 0 opens one tensor set and the other ranks another under the same key, as where it
    was re-published between their reads: every rank must raise, none wait."""
    from actions.rl.state_scatter import read_whole
    from actions.store import open_store
    from actions.store.weights import StoredTensors, publish_tensors

    store = open_store(store_root)
    for i in range(2):
        if rank == 0:
            publish_tensors(store, f"w{i}/manifest.json", {"a": torch.full((3,), float(i)), "b": torch.zeros(2)})
    dist.barrier()
    state = StoredTensors(store, f"w{min(rank, 1)}/manifest.json")
    read_whole(state, rank=rank, world=world, device=torch.device("cpu"), what="weights")


LONG_FIX = "re-publish the artifact"


def raise_long_on_rank_one(rank: int, world: int) -> int:
    """Rank 1 raises an error that fits the crash line alone but not behind the rank's prefix,
    its fix at the end (as ``actions/store/artifacts.py`` words a corrupted blob)."""
    if rank == 1:
        digest = "ab" * 32
        raise ValueError(f"blob runs/r1/optimizer/blobs/{digest} (file 'model.layers.0.self_attn.q_proj.exp_avg') "
                         f"is corrupted (manifest "
                         f"'runs/r1/optimizer/step-000002/manifest.json'): expected sha256 {digest}, "
                         f"found {'62a2' * 16}; {LONG_FIX}")
    dist.barrier()
    return rank
