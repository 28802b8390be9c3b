"""Where an action runs its model: ``RLHFLESS_DEVICE`` (and ``RLHFLESS_DTYPE``) from the environment.

The runtime image sets these (``runtime_images/gpu``: ``cuda``), the local warm pool and CI
leave them unset, so actions default to fp32 on the CPU -- the configuration every
bit-for-bit reproducibility test is written against.

* ``RLHFLESS_DEVICE``: ``cpu`` (default), ``cuda``, ``cuda:N`` or ``auto`` (CUDA when present).
* ``RLHFLESS_DTYPE``: ``float32`` (default), ``bfloat16`` or ``float16``: the dtype a model is
  loaded in. Weights are published in the dtype they are trained in, so a campaign keeps one.

Both are read on every call (cheap), so a test may change them between invocations; the warm
model cache keys on them.
"""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_device(text: str, *, source: str = "RLHFLESS_DEVICE") -> torch.device:
    """``cpu`` | ``cuda`` | ``cuda:N`` | ``auto`` -> a device this process can use.

    Raises:
        ValueError: an unknown name, or CUDA asked for where none is available.
    """
    name = text.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise ValueError(f"{source}={text!r} is not a device; use cpu, cuda, cuda:N or auto")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{source}={text!r} but this process sees no CUDA device; use cpu or auto")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"{source}={text!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return torch.device(name)


def parse_dtype(text: str, *, source: str = "RLHFLESS_DTYPE") -> torch.dtype:
    """``float32`` | ``bfloat16`` | ``float16`` -> torch dtype; ValueError naming the choices."""
    try:
        return DTYPES[text.strip().lower()]
    except KeyError:
        raise ValueError(f"{source}={text!r} is not a model dtype; use {', '.join(DTYPES)}") from None


def action_device() -> torch.device:
    return parse_device(os.environ.get("RLHFLESS_DEVICE", "cpu"))


def action_dtype() -> torch.dtype:
    return parse_dtype(os.environ.get("RLHFLESS_DTYPE", "float32"))
