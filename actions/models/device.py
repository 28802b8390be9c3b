"""Where an action runs its model: ``RLHFLESS_DEVICE`` (and ``RLHFLESS_DTYPE``) from the environment.

The runtime image sets these (``runtime_images/gpu``: ``cuda``), the local warm pool and CI
leave them unset, so actions default to fp32 on the CPU -- the configuration every
bit-for-bit reproducibility test is written against.

* ``RLHFLESS_DEVICE``: ``cpu`` (default), ``cuda``, ``cuda:N`` or ``auto`` (CUDA when present).
* ``RLHFLESS_DTYPE``: ``float32``, ``bfloat16`` or ``float16``: the dtype a model is loaded in
  when the campaign's ``model.dtype`` is ``auto`` (unset: bfloat16 on CUDA, float32 on the
  CPU). An explicit ``model.dtype`` wins. Weights are published in the dtype they are trained
  in, so a campaign keeps one.

Both are read on every call (cheap), so a test may change them between invocations; the warm
model cache keys on them.
"""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DeviceSettingError(ValueError):
    """A bad ``RLHFLESS_DEVICE``/``RLHFLESS_DTYPE``; ``field`` names the setting for the
    action's application error (retrying will not fix the container's environment)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def parse_device(text: str, *, source: str = "RLHFLESS_DEVICE") -> torch.device:
    """``cpu`` | ``cuda`` | ``cuda:N`` | ``auto`` -> a device this process can use.

    Raises:
        DeviceSettingError (a ValueError): an unknown name, or CUDA asked for where none is.
    """
    name = text.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise DeviceSettingError(f"{source}={text!r} is not a device; use cpu, cuda, cuda:N or auto", source)
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceSettingError(f"{source}={text!r} but this process sees no CUDA device; use cpu or auto",
                                     source)
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise DeviceSettingError(f"{source}={text!r} but only {torch.cuda.device_count()} CUDA device(s) exist",
                                     source)
    return torch.device(name)


def parse_dtype(text: str, *, source: str = "RLHFLESS_DTYPE") -> torch.dtype:
    """``float32`` | ``bfloat16`` | ``float16`` -> torch dtype; ValueError naming the choices."""
    try:
        return DTYPES[text.strip().lower()]
    except KeyError:
        raise DeviceSettingError(f"{source}={text!r} is not a model dtype; use {', '.join(DTYPES)}", source) from None


def action_device() -> torch.device:
    return parse_device(os.environ.get("RLHFLESS_DEVICE", "cpu"))


def action_dtype(setting: str = "auto", device: torch.device | None = None) -> torch.dtype:
    """The dtype an action computes in: ``model.dtype`` (``setting``) when it names one; for
    ``auto``, ``RLHFLESS_DTYPE`` when the environment sets it, else bfloat16 on CUDA and
    float32 on the CPU (``device``: default ``action_device()``)."""
    if setting != "auto":
        return parse_dtype(setting, source="model.dtype")
    if os.environ.get("RLHFLESS_DTYPE"):
        return parse_dtype(os.environ["RLHFLESS_DTYPE"])
    device = device if device is not None else action_device()
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op off CUDA), so a wall-clock reading
    after it includes that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
