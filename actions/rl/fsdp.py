"""FSDP2 over one train activation's ranks: sharding a model, and moving tensors between the
rank-independent store format (whole tensors) and the ranks' shards.

Layout: every decoder layer (the classes a transformers model lists in ``_no_split_modules``) is
its own FSDP unit, and the module the caller calls (``root``) holds the rest (embeddings, final
norm, output head, value head), so tied embeddings stay in one unit. Parameters that do not
train (a LoRA run's frozen backbone) are not sharded: every rank holds them whole, as the warm
one-rank path does, and only the trainable ones (the adapter) are split.

Precision: the sharded parameters are fp32 on every rank and ``MixedPrecisionPolicy`` casts them
to the training dtype for each forward, so they are the fp32 master copy that the one-rank
optimizer keeps beside its low-precision model (``optimizer.py``); gradients are reduced in
fp32. Gradients are *summed* over ranks (divide factor 1): each rank's loss already carries its
share of the whole mini-batch's tokens (``sharded_update.py``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset


def layer_classes(model: torch.nn.Module) -> tuple[type, ...]:
    """The decoder-layer classes of ``model`` (and of any transformers model inside it)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return tuple({type(m) for m in model.modules() if type(m).__name__ in names})


def make_mesh(device: torch.device) -> DeviceMesh:
    """A one-dimensional mesh over every rank of the process group."""
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard(root: torch.nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype) -> torch.nn.Module:
    """Apply ``fully_shard`` to each decoder layer inside ``root`` and to ``root``, in place.

    Trainable floating parameters are made fp32 (the master copy) one unit at a time, just
    before the unit is sharded, so a rank holds one unit whole in fp32 beside the rest of the
    model in its own dtype, never the whole model in fp32 (16 B/param on the node per rank
    otherwise, for a bf16 7B: 30 GB). Frozen parameters are left whole and in their dtype.
    Returns ``root``.
    """
    frozen = {p for p in root.parameters() if not p.requires_grad}
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    classes = layer_classes(root)
    for m in root.modules():
        if classes and isinstance(m, classes) and any(p.requires_grad for p in m.parameters()):
            _to_fp32(m)
            fully_shard(m, mesh=mesh, mp_policy=policy, ignored_params=frozen)
    _to_fp32(root)
    fully_shard(root, mesh=mesh, mp_policy=policy, ignored_params=frozen)
    for m in root.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-scaled sum
    return root


def _to_fp32(module: torch.nn.Module) -> None:
    """Make ``module``'s trainable floating parameters that are not sharded yet fp32, in place."""
    for p in module.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32 and not isinstance(p, DTensor):
            p.data = p.data.float()


def assign(param: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy ``whole`` (the same on every rank, ``param``'s global shape, any dtype and device)
    into ``param`` in place: this rank's part of it, cut where ``whole`` lies, into a sharded
    parameter's local shard; all of it otherwise. No communication; ``whole`` can be dropped
    as soon as this returns."""
    with torch.no_grad():
        if isinstance(param, DTensor):
            param.to_local().copy_(_local_part(whole, param))
        else:
            param.data.copy_(whole)


def _local_part(whole: torch.Tensor, param: DTensor) -> torch.Tensor:
    """The view of ``whole`` that is this rank's shard of ``param``'s layout."""
    shape, offset = compute_local_shape_and_global_offset(whole.shape, param.device_mesh, param.placements)
    local = whole
    for dim, (size, start) in enumerate(zip(shape, offset)):
        local = local.narrow(dim, start, size)
    return local


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a shard (a collective: every rank calls it in the same order);
    an unsharded tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def like(whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``whole`` (the same on every rank) laid out as ``param``: this rank's shard for a
    sharded parameter, ``whole`` itself otherwise. No communication.

    The shard is cut where ``whole`` lies (the host, for stored state) and only the shard is
    copied to the parameter's device, into memory of its own: ``distribute_tensor`` would
    first move the whole tensor there (on a GPU, a whole-tensor transient per moment and N
    times the host-to-device traffic)."""
    if isinstance(param, DTensor):
        local = _local_part(whole, param)
        own = torch.empty(local.shape, dtype=local.dtype, device=param.device)
        own.copy_(local)
        return DTensor.from_local(own, param.device_mesh, param.placements, run_check=False, shape=whole.shape,
                                  stride=torch.empty(whole.shape, device="meta").stride())
    return whole.to(param.device)


def all_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Every rank's ``values`` summed key by key (all ranks pass the same keys, in any order)."""
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))
