"""A model folder whose ``config.json`` and weights disagree, found before anything is written.

``from_pretrained`` refuses a checkpoint tensor whose shape differs from the parameter the
config builds (``ignore_mismatched_sizes``), but only when the model is loaded: for a reward
model, in the first evaluate or score action, after the run was prepared, warmed up and its
critic initialised. :func:`check_weight_shapes` answers the same question at start-up: it
builds the model from ``config.json`` on torch's meta device (shapes only: no memory, no
values) and compares its parameter and buffer shapes with the safetensors
headers, with the names matched as transformers matches them (``base_model_prefix`` added or
stripped). What the loader would rename or convert (legacy names, fused experts), or leave out
(a tied head, a buffer the checkpoint does not hold), has no counterpart under its own name and
is not compared, so it never raises a false alarm.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

_AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForSequenceClassification")


def check_weight_shapes(path: str, field: str, auto_class: str) -> None:
    """Refuse a folder whose weights ``from_pretrained`` would refuse for their shapes.

    Args:
        path: a local Hugging Face model folder that ``validate_model_dir`` accepted (its
            config.json parses, its safetensors headers are whole).
        field: the setting that names it (``model.path``, ``reward.models[0].path``).
        auto_class: ``AutoModelForCausalLM`` or ``AutoModelForSequenceClassification``, the
            class the actions load it with.
    Raises:
        ValueError: one line naming ``field``, the path, the first tensor (in the files' order)
            whose shape differs, the shape config.json gives and the one the file holds, and the fix;
            or ``check_config``'s (for ``AutoModelForCausalLM``, ``check_causal_lm``'s).

    Nothing is checked (the loader has the last word) for weights stored only as
    ``pytorch_model.bin`` (their shapes are in a pickle), a quantized model (its packed
    tensors have shapes of their own) or a config transformers cannot build here.
    """
    root = Path(path)
    if auto_class == "AutoModelForCausalLM":
        check_causal_lm(root, field)
    else:
        check_config(root, field)
    stored = checkpoint_shapes(root)
    built = _expected_shapes(root, auto_class) if stored else None
    if built is None:
        return
    expected, prefix = built
    for name, shape in stored.items():
        want = _expected_for(name, expected, prefix)
        if want is not None and want != shape:
            raise ValueError(
                f"{field} {path!r}: tensor {name} has shape {list(shape)} in the weights, but config.json gives "
                f"{list(want)}; config.json does not describe these weights: use the config.json saved with them "
                "(save_pretrained writes both)")


def check_config(root: Path, field: str) -> Any:
    """The transformers config of the folder ``root``; refuses a ``config.json`` the installed
    transformers cannot read: a ``model_type`` it does not know, or one whose code the model
    brings (``auto_map``), which the actions never run (they load with ``trust_remote_code``
    False), so its first load would fail after the run was written. None where config.json is
    not this check's to diagnose (missing or not JSON: ``validate_model_dir`` names it).

    Raises:
        ValueError: one line naming ``field``, the path, the model type and the fix.
    """
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(str(root), trust_remote_code=False)
    except (ValueError, KeyError, OSError) as exc:
        try:
            config = json.loads((root / "config.json").read_text())
        except (OSError, ValueError):
            return None  # not this check's to diagnose: validate_model_dir names the file
        own_code = ", with code of its own in auto_map" if "auto_map" in config else ""
        first = " ".join(str(exc).split(". ")[0].split())
        raise ValueError(f"{field} {str(root)!r}: its config.json (model_type {config.get('model_type')!r}{own_code}) "
                         f"cannot be read by transformers {transformers.__version__} ({first}); use a model whose "
                         "model_type this transformers knows: models that need trust_remote_code are not "
                         "supported") from None


def check_causal_lm(root: Path, field: str) -> None:
    """Refuse a folder that ``AutoModelForCausalLM`` does not load: ``check_config``, then a
    config class outside transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING`` (the test the loader
    applies), such as an encoder-decoder's (T5), which the loader would refuse in ``prepare``
    with its list of every causal model type. Reads config.json alone, in milliseconds once
    transformers is imported.

    Raises:
        ValueError: one line naming ``field``, the path, its architectures, its model type and the fix.
    """
    import transformers

    config = check_config(root, field)
    if config is None or type(config) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        return
    archs = ", ".join(str(a) for a in getattr(config, "architectures", None) or []) or f"a {config.model_type} model"
    raise ValueError(f"{field} {str(root)!r}: {archs} (model_type {config.model_type}) is not a causal language "
                     "model; use a decoder-only model (a folder AutoModelForCausalLM loads, config.json "
                     "architectures ...ForCausalLM, such as Qwen2 or Llama)")


def checkpoint_shapes(root: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the safetensors headers of a model folder, chosen as the loader
    chooses: ``model.safetensors`` where present (a plain ``save_pretrained`` over a sharded
    save leaves the old index beside it), else the shards its index lists, in file order. Empty
    when it has none, or when a file cannot be read as that (the loader reports it, naming it)."""
    index = root / "model.safetensors.index.json"
    try:
        if (root / "model.safetensors").is_file():
            files = ["model.safetensors"]
        elif index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            return {}
        shapes: dict[str, tuple[int, ...]] = {}
        for name in files:
            with (root / name).open("rb") as fh:
                (length,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(length))
            shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return {}  # not this check's to diagnose: validate_model_dir and the loader name the file
    return shapes


def built_shapes(root: Path, auto_class: str) -> dict[str, tuple[int, ...]] | None:
    """Parameter and buffer name -> shape of the model ``config.json`` builds (on the meta
    device); None where it cannot be built here."""
    built = _expected_shapes(root, auto_class)
    return None if built is None else built[0]


def _expected_shapes(root: Path, auto_class: str) -> tuple[dict[str, tuple[int, ...]], str] | None:
    """(parameter and buffer name -> shape, ``base_model_prefix``) of the model ``config.json``
    builds; None where it cannot be built here (a model
    type this transformers does not know, code of the model's own) or is quantized."""
    import transformers

    if auto_class not in _AUTO_CLASSES:
        raise ValueError(f"auto_class {auto_class!r} is not one of {', '.join(_AUTO_CLASSES)}")
    try:
        config = transformers.AutoConfig.from_pretrained(str(root), trust_remote_code=False)
        if getattr(config, "quantization_config", None):
            return None
        with torch.device("meta"):  # shapes only: nothing is allocated or initialised
            model = getattr(transformers, auto_class).from_config(config, trust_remote_code=False)
    except Exception:  # noqa: BLE001 -- the loader reports what it cannot build, in the action
        return None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, getattr(model, "base_model_prefix", "") or ""


def _expected_for(name: str, expected: dict[str, tuple[int, ...]], prefix: str) -> tuple[int, ...] | None:
    """The expected shape of checkpoint tensor ``name`` as transformers places it: the same name,
    or with the base model's prefix stripped (a head's checkpoint into a base model) or added
    (a base model's checkpoint into a model with a head); None where nothing matches."""
    if name in expected:
        return expected[name]
    if prefix and name.startswith(prefix + ".") and name[len(prefix) + 1:] in expected:
        return expected[name[len(prefix) + 1:]]
    if prefix:
        return expected.get(f"{prefix}.{name}")
    return None
