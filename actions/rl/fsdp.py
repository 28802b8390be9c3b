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


def as_shard(local: torch.Tensor, param: DTensor) -> DTensor:
    """``local`` (this rank's shard of a tensor laid out as ``param``, already on its device, in
    memory of its own: ``state_scatter.scattered`` gives such shards) as a ``DTensor``. No
    communication; cutting a whole tensor where it lies and sending only the shard spares
    ``distribute_tensor``'s whole-tensor transient on the device and its N-fold traffic."""
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=torch.empty(param.shape, device="meta").stride())


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a shard (a collective: every rank calls it in the same order);
    an unsharded tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def all_sum(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Every rank's ``values`` summed key by key (all ranks pass the same keys, in any order)."""
    return _all_reduce(values, device, dist.ReduceOp.SUM)


def all_max(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """The largest of every rank's ``values``, key by key (the same keys on every rank)."""
    return _all_reduce(values, device, dist.ReduceOp.MAX)


def _all_reduce(values: dict[str, float], device: torch.device, op: dist.ReduceOp) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return dict(zip(keys, t.tolist()))
