"""Stored optimizer state and weights read once per sharded step, not once per rank.

Every rank of a sharded step needs its shard of each AdamW moment and fp32 master (12 B/param
under bf16: 91 GB for a 7B model). Streaming the whole set on every rank reads it ``world``
times from the store (728 GB per step on 8 GPUs, through one node's network link). Here each
stored tensor has one *owner* (:func:`owners`: the blobs dealt out largest first, each to the
rank with the fewest bytes so far, so the ranks fetch near equal shares): the owner fetches it
(size- and sha256-verified, fetched ahead within ``StoredTensors.stream``'s budget while the
other ranks fetch theirs) and scatters it. A rank
receives only its shard of a sharded parameter's tensor, and the whole tensor where the
parameter is not sharded. So the store serves the set once, and no rank but the owner ever
holds a whole sharded tensor. Weights that every rank needs whole (the policy it builds its
model from, before sharding) go through the same path with no layout (:func:`read_whole`).

Per stored tensor, in the set's order, every rank takes part in:

1. a header broadcast from the owner: whether its fetch succeeded, the dtype and the shape;
2. after a failure, the owner's crash description (an object broadcast): the owner raises its
   own error and every other rank :class:`PeerReadFailed` with the same text and transience,
   which the rank supervisor (``ranks.py``) ranks below the owner's report;
3. the scatter of the shards (each rank's box of the tensor, padded to the largest box), or
   the broadcast of the whole tensor.

Before the first tensor the ranks check that they opened the same set (one object gather of
its fingerprint and names, with the shards' boxes): a set re-published between two ranks'
reads would otherwise pair tensors with the wrong names or leave a rank waiting in a
collective. Whole tensors travel as their bytes, so any stored dtype does; a scattered one must
be of a dtype both gloo and NCCL carry. Collectives run on ``device`` (NCCL takes CUDA tensors
only): the owner holds one whole tensor there, cut into its boxes, while it scatters. Scalars
kept in the manifest's meta (AdamW's ``step``) are read by every rank and need no collective.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from actions.rl.ranks import PEER_MARKER
from actions.runtime.errors import describe_crash
from actions.store.safe_paths import shown
from actions.store.weights import STORED_DTYPES, IntegrityError, StoredTensors

_MAX_DIMS = 8
_CARRIED = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
            torch.int8, torch.uint8, torch.bool)  # what gloo and NCCL both scatter

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (local shape, global offset) of one rank's shard


class PeerReadFailed(RuntimeError):
    """The rank that owns a stored tensor could not read it; ``transient`` is its classification."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def read_whole(state: StoredTensors, *, rank: int, world: int, device: torch.device,
               what: str = "tensor set") -> dict[str, torch.Tensor]:
    """Every tensor of ``state``, whole and on the host, on every rank (a collective), each
    fetched from the store by its owner only and broadcast: the policy's weights that every
    rank builds its model from (2 B/param under bf16) are served once per step, not
    ``world`` times. Failures are shared as in :func:`scattered`."""
    return dict(scattered(state, lambda name: None, rank=rank, world=world, device=device,
                          where=state.manifest_key, what=what))


def scattered(state: StoredTensors, layout: Callable[[str], torch.Tensor | None], *, rank: int, world: int,
              device: torch.device, where: str = "", misshapen: Callable[[str], str] | None = None,
              what: str = "optimizer state") -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of ``state``, in its order, each read from the store
    by one rank only (a collective: every rank iterates to the end, or raises at the same name).

    ``layout(name)`` is the parameter a stored tensor is laid out as (None: none). For a
    sharded parameter (a ``DTensor``) the tensor given is this rank's local shard on
    ``device``, the shard ``distribute_tensor`` would place there; for an unsharded one, the
    whole tensor on ``device``;
    for a tensor of no parameter, the whole tensor on the host.
    Scalars in the manifest's meta are given whole, on the host, without communication.

    Raises:
        ValueError: a stored tensor's shape is not its parameter's: ``misshapen(name)``'s
            message, else one naming both shapes and ``where`` (the manifest key).
        PeerReadFailed: on every rank but the owner, where the owner's fetch or check failed (the
            owner raises its own error).
    """
    names = list(state)
    blobs = [n for n in names if not state.is_scalar(n)]
    owner_of = owners(state, blobs, world)
    boxes = _agreed_boxes(state, names, {n: p for n in blobs if isinstance(p := layout(n), DTensor)}, world, what)
    mine = state.renamed({n: n for n in blobs if owner_of[n] == rank}).stream()
    try:
        for name in names:
            if name not in owner_of:
                yield name, state[name]
                continue
            owner, param = owner_of[name], layout(name)
            whole = _fetch_checked(mine, name, param, device, where, misshapen, what) if owner == rank else None
            if isinstance(whole, BaseException):
                _header(None, owner, device)
                _share_failure(whole, owner, device)
                raise whole
            dtype, shape = _header(whole, owner, device)
            if dtype is None:
                crash = _share_failure(None, owner, device)
                raise PeerReadFailed(f"{crash['type']}: {crash['message']} {PEER_MARKER}{owner})",
                                     transient=bool(crash.get("transient")))
            if name in boxes:
                yield name, _scatter(whole, boxes[name], dtype, owner, rank, device)
            else:  # an unsharded parameter's tensor on the device; one of no parameter (a step) on the host
                whole = _broadcast(whole, dtype, shape, owner, device)
                yield name, whole if param is not None else whole.cpu()
            del whole
    finally:
        mine.close()


def owners(state: StoredTensors, blobs: list[str], world: int) -> dict[str, int]:
    """Each blob's owning rank: the largest first, each to the rank with the fewest bytes so far
    (ties: the lower rank, then the name), so that the ranks fetch near equal bytes although a
    few tensors (the embedding, an untied output head: a fifth of a 0.5B model) hold much of the
    set. Every rank computes the same from the manifest alone."""
    load = [0] * world
    out = {}
    for name in sorted(blobs, key=lambda n: (-state.size(n), n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[name] = rank
        load[rank] += state.size(name)
    return out


def _fetch_checked(stream: Iterator[tuple[str, torch.Tensor]], name: str, param: torch.Tensor | None,
                   device: torch.device, where: str, misshapen: Callable[[str], str] | None,
                   what: str) -> torch.Tensor | BaseException:
    """The owner's next tensor (which must be ``name``) on ``device``, or the exception its
    fetch, its check or its copy to the device (out of memory) raised: every failure of the
    owner's comes before the header, so the other ranks learn of it."""
    try:
        got, whole = next(stream)
        assert got == name, (got, name)  # both iterate the set's order
        if param is not None and tuple(whole.shape) != tuple(param.shape):
            raise ValueError(misshapen(name) if misshapen else
                             f"{what} {where!r}: tensor {shown(name)} has shape {list(whole.shape)}, its "
                             f"parameter has shape {list(param.shape)}; re-publish the {what}")
        if whole.dim() > _MAX_DIMS or (isinstance(param, DTensor) and whole.dtype not in _CARRIED):
            raise ValueError(f"{what} {where!r}: tensor {shown(name)} is a {whole.dtype} tensor of "
                             f"{whole.dim()} dimensions, which the ranks cannot exchange; re-publish the {what} "
                             f"in one of {', '.join(str(d).removeprefix('torch.') for d in _CARRIED)}, of "
                             f"at most {_MAX_DIMS} dimensions")
        return whole.to(device)
    except Exception as exc:  # noqa: BLE001 - shared with the other ranks, then raised
        return exc


def _header(whole: torch.Tensor | None, owner: int, device: torch.device) -> tuple[torch.dtype | None, list[int]]:
    """Broadcast from ``owner``: ``[ok, dtype index, ndim, *shape]`` (ok 0 after a failure)."""
    head = torch.zeros(3 + _MAX_DIMS, dtype=torch.int64)
    if whole is not None:
        head[:3] = torch.tensor([1, STORED_DTYPES.index(whole.dtype), whole.dim()])
        head[3:3 + whole.dim()] = torch.tensor(whole.shape, dtype=torch.int64)
    head = head.to(device)
    dist.broadcast(head, src=owner)
    ok, dtype, ndim, *shape = head.tolist()
    return (STORED_DTYPES[dtype] if ok else None), shape[:ndim]


def _share_failure(exc: BaseException | None, owner: int, device: torch.device) -> dict:
    """The owner's crash description, on every rank (``describe_crash`` redacts secrets)."""
    box = [describe_crash(exc) if exc is not None else None]
    dist.broadcast_object_list(box, src=owner, device=device if device.type == "cuda" else None)
    return box[0]


def _agreed_boxes(state: StoredTensors, names: list[str], params: dict[str, DTensor], world: int,
                  what: str) -> dict[str, list[Box]]:
    """Every rank's box of each sharded parameter (one object all-gather: a rank computes only
    its own), after checking that every rank opened the same set under the same names.

    Raises:
        IntegrityError: on every rank, where a rank opened another set (re-published meanwhile).
    """
    own = {n: tuple(map(tuple, compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)))
           for n, p in params.items()}
    opened = (state.fingerprint, hashlib.sha256("\n".join(names).encode()).hexdigest())
    every: list = [None] * world
    dist.all_gather_object(every, (opened, own))
    other = next((r for r in range(world) if every[r][0] != every[0][0]), None)
    if other is not None:
        raise IntegrityError(f"{what} {state.manifest_key!r}: rank 0 opened weights_sha256 {every[0][0][0]}, rank "
                             f"{other} {every[other][0][0]} (or other names); it was re-published while the step read "
                             "it; run the step again once nothing writes it")
    return {n: [every[r][1][n] for r in range(world)] for n in params}


def _cut(whole: torch.Tensor, box: Box, numel: int) -> torch.Tensor:
    """``whole``'s part at ``box``, flat and zero-padded to ``numel`` elements."""
    part = whole
    for dim, (size, start) in enumerate(zip(*box)):
        part = part.narrow(dim, start, size)
    flat = part.reshape(-1)
    return torch.nn.functional.pad(flat, (0, numel - flat.numel())) if flat.numel() < numel else flat.contiguous()


def _scatter(whole: torch.Tensor | None, boxes: list[Box], dtype: torch.dtype, owner: int, rank: int,
             device: torch.device) -> torch.Tensor:
    """This rank's box of the owner's ``whole`` (on ``device``), on ``device`` in memory of its own."""
    numel = max(math.prod(shape) for shape, _ in boxes)
    out = torch.empty(numel, dtype=dtype, device=device)
    pieces = None if whole is None else [_cut(whole, box, numel) for box in boxes]
    dist.scatter(out, pieces, src=owner)
    shape = boxes[rank][0]
    return out[:math.prod(shape)].view(shape)


def _broadcast(whole: torch.Tensor | None, dtype: torch.dtype, shape: list[int], owner: int,
               device: torch.device) -> torch.Tensor:
    """The owner's ``whole`` (on ``device``) on every rank's ``device``, bit for bit: sent as its
    bytes, so every stored dtype travels (the owner's may be a copy, if not contiguous)."""
    out = whole if whole is not None else torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(out.reshape(-1).view(torch.uint8), src=owner)
    return out
