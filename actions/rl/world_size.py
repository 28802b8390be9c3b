"""How many ranks the learner runs on (``train.world_size``), and whether this machine has them.

Imports no torch at module level: the CLI's preflight calls :func:`check_world_size` for local
actions and refuses in a fraction of a second; the train action checks again where it runs
(an OpenWhisk invoker's machine is not the one the flow runs on).
"""

from __future__ import annotations

import os


def device_kind() -> str:
    """``cuda`` or ``cpu``: the device the actions of this environment use (``RLHFLESS_DEVICE``)."""
    device = os.environ.get("RLHFLESS_DEVICE", "cpu").strip().lower()
    return "cuda" if device.startswith("cuda") or device == "auto" else "cpu"


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


def check_world_size(world_size: int | None, gpus_per_actor: int, kind: str | None = None) -> int:
    """The learner's rank count, checked against the devices present; returns it.

    Raises:
        ValueError: more ranks than devices (one line naming the key, the value and the fix).
    """
    kind = kind or device_kind()
    world = resolve_world_size(world_size, gpus_per_actor, kind)
    if world > 1:
        present = devices_present(kind)
        if world > present:
            what = "CUDA devices" if kind == "cuda" else "processors (one gloo rank each)"
            key = "train.world_size" if world_size is not None else "scaling.gpus_per_actor (train.world_size unset)"
            raise ValueError(f"{key}={world} needs {world} {what}, but this machine has {present}; set "
                             f"train.world_size to at most {present}")
    return world
