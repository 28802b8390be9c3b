"""How many ranks the learner runs on (``train.world_size``), and whether this machine has them.

Imports no torch at module level: the CLI's preflight calls :func:`check_world_size` for local
actions and refuses in a fraction of a second; the train action checks again where it runs
(an OpenWhisk invoker's machine is not the one the flow runs on).
"""

from __future__ import annotations

import os


def device_kind() -> str:
    """``cuda`` or ``cpu``: the device the actions of this environment use (``RLHFLESS_DEVICE``),
    resolved as ``actions/models/device.py: parse_device`` resolves it: ``auto`` is CUDA only
    where torch sees a CUDA device (torch is imported for that setting alone). ValueError for a
    name that is no device (``gpu``), as ``parse_device`` refuses it."""
    raw = os.environ.get("RLHFLESS_DEVICE", "cpu")
    device = raw.strip().lower()
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"RLHFLESS_DEVICE={raw!r} is not a device; use cpu, cuda, cuda:N or auto")
    return "cuda" if device.startswith("cuda") else "cpu"


def resolve_world_size(world_size: int | None, gpus_per_actor: int, kind: str) -> int:
    """``train.world_size``, or its default: ``gpus_per_actor`` on CUDA, 1 on the CPU."""
    if world_size is not None:
        return world_size
    return gpus_per_actor if kind == "cuda" else 1


def devices_present(kind: str) -> int:
    """CUDA devices torch sees, or this process's usable processors for gloo ranks on the CPU."""
    if kind == "cuda":
        import torch

        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_world_size(world_size: int | None, gpus_per_actor: int, kind: str | None = None, *,
                     num_cores: int = 0) -> int:
    """The learner's rank count, checked against the devices present; returns it.

    ``num_cores``: ``invoker.num_cores`` where the actions run on this machine (the local pool,
    in-process), the cores they share; 0 (unset, or on OpenWhisk): this machine's processors
    alone limit CPU ranks. A CPU rank is a process of its own, with at least one thread, so more
    ranks than those cores would oversubscribe them: refused, as ranks beyond the processors are.

    On CUDA the ranks are also held to ``gpus_per_actor`` (:func:`check_ranks_within_gpus`).

    Raises:
        ValueError: more ranks than devices, or than ``num_cores`` on the CPU, or than
            ``gpus_per_actor`` on CUDA, or CUDA asked for where none is visible, whatever the
            rank count (one line naming the keys, the values and the fix).
    """
    kind = kind or device_kind()
    world = resolve_world_size(world_size, gpus_per_actor, kind)
    if kind == "cuda" and world == 1 and devices_present(kind) == 0:  # every action would fail at its start
        raise ValueError(f"RLHFLESS_DEVICE={os.environ.get('RLHFLESS_DEVICE', '')!r} but no CUDA device is visible; "
                         "set RLHFLESS_DEVICE to cpu or auto")
    if world > 1:
        present = devices_present(kind)
        key = "train.world_size" if world_size is not None else "scaling.gpus_per_actor (train.world_size unset)"
        if kind == "cpu" and 0 < num_cores < world:
            more = f", or invoker.num_cores to {world} or more (this machine has {present})" if world <= present else ""
            raise ValueError(f"{key}={world} needs {world} cores (one gloo rank each), but invoker.num_cores="
                             f"{num_cores} gives the actions {num_cores}; set train.world_size to at most "
                             f"{num_cores}{more}")
        if kind == "cuda" and present == 0:
            setting = os.environ.get("RLHFLESS_DEVICE", "") or "cuda"
            raise ValueError(f"{key}={world} needs {world} CUDA devices: RLHFLESS_DEVICE={setting} but no CUDA "
                             "device is visible; set RLHFLESS_DEVICE to cpu or auto (gloo ranks on the CPU)")
        if kind == "cuda":
            check_ranks_within_gpus(world, gpus_per_actor, "on CUDA (one GPU each)")
        if world > present:
            what = "CUDA devices" if kind == "cuda" else "processors (one gloo rank each)"
            raise ValueError(f"{key}={world} needs {world} {what}, but this machine has {present}; set "
                             f"train.world_size to at most {present}")
    return world


def check_ranks_within_gpus(world_size: int | None, gpus_per_actor: int, where: str) -> None:
    """Refuse more learner ranks than ``scaling.gpus_per_actor`` where each rank takes a GPU:
    billing (``flows/step/metrics.py: cost_metrics``, wall time x ``gpus_per_actor``) and the
    Prefect GPU slots (``flows/step/invoke.py: gpu_slots``) count that many GPUs per activation,
    and an OpenWhisk container holds that many. ``where``: the words saying why (the device, or
    the invoker). None (``train.world_size`` unset) defaults to ``gpus_per_actor`` on CUDA
    (:func:`resolve_world_size`) and to 1 on the CPU: never above it.

    Raises:
        ValueError: one line naming both settings, their values and the fix.
    """
    if world_size is not None and world_size > gpus_per_actor:
        raise ValueError(f"train.world_size={world_size} is above scaling.gpus_per_actor={gpus_per_actor} {where}: "
                         f"each activation is billed and reserved as {gpus_per_actor} GPU(s) but its ranks would "
                         f"use {world_size}; raise scaling.gpus_per_actor to {world_size}, or lower "
                         f"train.world_size to at most {gpus_per_actor}")
