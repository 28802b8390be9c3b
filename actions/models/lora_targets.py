"""Which modules ``model.lora.target_modules`` names, and how large ``model.lora.r`` may be,
checked at the CLI (without torch, but for a model folder of pickled weights).

PEFT matches a listed name against every module path: ``q_proj`` matches
``model.layers.0.self_attn.q_proj`` (the path equals the name or ends with ``.`` + name). A
name that matches nothing would be silently ignored when other names match, so each one is
checked here, against the weight matrices of the model's safetensors headers (``model.path``;
for a folder of ``pytorch_model.bin`` weights, of the model its ``config.json`` builds on
torch's meta device) or of the tiny default Llama, before anything is written.

A model that ties its output head to the input embedding (Qwen2.5-0.5B, Gemma, GPT-2, the tiny
default) does not save the head's weight, yet has the module: ``lm_head`` is added for it.

The rank: an adapter ``B @ A`` on a ``d_out x d_in`` matrix has rank at most ``min(d_out,
d_in)``, so an ``r`` above that side on every targeted matrix only adds parameters that cannot
change what the adapter can learn, and a very large one does not finish a step. Such an ``r``
is refused; one that some targeted matrices can use (a wide ``q_proj`` besides a narrow
grouped-query ``k_proj``) is not.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from actions.config.workload import ModelConfig, WorkloadConfig

TINY_LLAMA_LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""Module paths, under ``model.layers.<i>.``, of each decoder layer's weight matrices in the
tiny default model (its others: ``model.embed_tokens`` and ``lm_head``)."""
HEAD = "lm_head"
"""The output head's module name in Hugging Face causal LMs."""


Shape = tuple[int | None, int | None]
"""A weight matrix's (rows, columns); None for a side not known without loading the model."""


def matrix_shapes(model_dir: str) -> dict[str, Shape]:
    """Paths of the modules that own a 2-D ``.weight`` in the folder's safetensors files, with
    the weight's shape; plus ``lm_head`` where the model ties it to the input embedding."""
    shapes: dict[str, Shape] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with file.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        shapes.update({k[: -len(".weight")]: tuple(v["shape"]) for k, v in header.items()  # type: ignore[misc]
                       if k.endswith(".weight") and isinstance(v, dict) and len(v.get("shape", [])) == 2})
    if not shapes:  # pickled weights: no header to read without loading them
        shapes = _built_shapes(model_dir)
    if shapes and HEAD not in shapes and _ties_head(model_dir):
        config = _config(model_dir)
        shapes[HEAD] = tuple(v if isinstance(v, int) else None  # type: ignore[assignment]
                             for v in (config.get("vocab_size"), config.get("hidden_size")))
    return shapes


def _built_shapes(model_dir: str) -> dict[str, Shape]:
    """The 2-D ``.weight`` matrices of the model ``config.json`` builds (shapes only, nothing
    allocated); empty where it cannot be built here (the loader reports that)."""
    from actions.models.weight_shapes import built_shapes

    built = built_shapes(Path(model_dir), "AutoModelForCausalLM")
    return {k[: -len(".weight")]: (v[0], v[1]) for k, v in (built or {}).items()
            if k.endswith(".weight") and len(v) == 2}


def _config(model_dir: str) -> dict:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):  # validate_model_dir names what is wrong with the folder
        return {}
    return config if isinstance(config, dict) else {}


def _ties_head(model_dir: str) -> bool:
    """Whether the output head is the input embedding: ``tie_word_embeddings`` of config.json.
    Where it is absent the default is the architecture's own (True for GPT-2 and Gemma, False
    for Llama and Qwen2 in transformers 5), which only transformers (and torch) know; a folder
    whose weights have no ``lm_head`` then ties it, for the model could not load otherwise."""
    tied = _config(model_dir).get("tie_word_embeddings")
    return tied is not False


def _tiny_shapes(model: ModelConfig) -> dict[str, Shape]:
    """The tiny default Llama's matrices; the embedding's and the head's rows are its
    vocabulary, the task's characters, known only once the data is read."""
    h, m = model.hidden_size, model.intermediate_size
    shapes: dict[str, Shape] = {"model.embed_tokens": (None, h), HEAD: (None, h)}
    for i in range(model.num_layers):  # full paths, as a model folder's: a target may name one layer
        shapes.update({f"model.layers.{i}.{name}": (m, h) if "mlp." in name else (h, h) for name in TINY_LLAMA_LAYER})
    return shapes


def check_targets(cfg: WorkloadConfig) -> None:
    """Raise ValueError (one line: the field, the value, the fix) when a listed target module
    matches no weight matrix of the model, or when ``r`` exceeds every targeted matrix's smaller
    side; no LoRA passes, and so does a model that cannot be built here (the loader reports it)."""
    lora = cfg.model.lora
    if lora is None:
        return
    shapes = matrix_shapes(cfg.model.path) if cfg.model.path else _tiny_shapes(cfg.model)
    if not shapes:  # a model transformers cannot build here: the action's loader reports it
        return
    if isinstance(lora.target_modules, str):  # all-linear: every linear layer but the head
        targeted = {m: s for m, s in shapes.items() if m != HEAD and not _embedding(m)} or shapes
    else:
        targeted = {}
        for target in lora.target_modules:
            found = {m: s for m, s in shapes.items() if m == target or m.endswith("." + target)}
            if not found:
                known = sorted({m.rsplit(".", 1)[-1] for m in shapes})
                raise ValueError(f"model.lora.target_modules: {target[:80]!r} matches no module of the model (its "
                                 f"weight matrices are {', '.join(known[:12])}); use those names, or all-linear")
            targeted.update(found)
    _check_rank(lora.r, targeted)


def _embedding(module: str) -> bool:
    """An embedding table by its name (``embed_tokens``, GPT-2's ``wte``/``wpe``): PEFT's
    all-linear leaves them out."""
    name = module.rsplit(".", 1)[-1]
    return "embed" in name or name in ("wte", "wpe")


def _check_rank(r: int, targeted: dict[str, Shape]) -> None:
    """``r`` above the smaller side of every targeted matrix (a side not known bounds nothing)."""
    sides = {m: min(v for v in s if v is not None) for m, s in targeted.items() if any(v is not None for v in s)}
    if not sides:
        return
    widest = max(sides, key=lambda m: sides[m])
    limit = sides[widest]
    if r > limit:
        shape = " x ".join("vocabulary" if v is None else str(v) for v in targeted[widest])
        raise ValueError(f"model.lora.r={r} is above {limit}, the largest rank an adapter can have on the targeted "
                         f"layers (at most the smaller side of the layer's weight: {widest.rsplit('.', 1)[-1]} is "
                         f"{shape}); set model.lora.r to at most {limit}")
