"""Which modules ``model.lora.target_modules`` names, checked without torch (at the CLI).

PEFT matches a listed name against every module path: ``q_proj`` matches
``model.layers.0.self_attn.q_proj`` (the path equals the name or ends with ``.`` + name). A
name that matches nothing would be silently ignored when other names match, so each one is
checked here, against the weight names of the model's safetensors headers (``model.path``)
or of the tiny default Llama, before anything is written.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from actions.config.workload import WorkloadConfig

TINY_LLAMA_LINEAR = ("model.embed_tokens", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "lm_head")
"""Module paths (suffixes) of the tiny default model's weight matrices."""


def matrix_modules(model_dir: str) -> list[str]:
    """Paths of the modules that own a 2-D ``.weight`` in the folder's safetensors files."""
    names: list[str] = []
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with file.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        names += [k[: -len(".weight")] for k, v in header.items()
                  if k.endswith(".weight") and isinstance(v, dict) and len(v.get("shape", [])) == 2]
    return names


def check_targets(cfg: WorkloadConfig) -> None:
    """Raise ValueError (one line: the field, the name, the fix) when a listed target module
    matches no weight matrix of the model; ``all-linear`` and no LoRA pass."""
    lora = cfg.model.lora
    if lora is None or isinstance(lora.target_modules, str):
        return
    modules = matrix_modules(cfg.model.path) if cfg.model.path else list(TINY_LLAMA_LINEAR)
    if not modules:  # weights in another format: PEFT checks it when the model is built
        return
    for target in lora.target_modules:
        if not any(m == target or m.endswith("." + target) for m in modules):
            known = sorted({m.rsplit(".", 1)[-1] for m in modules})
            raise ValueError(f"model.lora.target_modules: {target[:80]!r} matches no module of the model (its weight "
                             f"matrices are {', '.join(known[:12])}); use those names, or all-linear")
