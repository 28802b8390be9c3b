"""A reward model's folder: the checks that need no torch, and the files ``prepare`` stores.

``prepare`` copies each ``reward.models`` folder into the store once (content-addressed, like
the policy's base), so the score and evaluate actions never read the user's file system.
"""

from __future__ import annotations

import json
from pathlib import Path

_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")
_WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
                    "pytorch_model.bin.index.json")


def check_classifier(path: str, field: str) -> None:
    """Refuse a folder whose ``config.json`` names no ``*ForSequenceClassification`` architecture.

    Raises:
        ValueError: one line naming ``field``, the path, what it is, and the fix.
    """
    config = json.loads((Path(path) / "config.json").read_text())  # validate_model_dir read it already
    archs = config.get("architectures") or []
    if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in archs):
        what = ", ".join(map(str, archs)) if archs else f"a {config.get('model_type', 'model')} with no architectures"
        raise ValueError(f"{field} {path!r} is {what}, not a sequence-classification reward model; point it at an "
                         "AutoModelForSequenceClassification folder (num_labels 1), e.g. `rlhfless tiny-model --reward`")


def folder_files(path: str) -> dict[str, bytes]:
    """The files ``from_pretrained`` needs (config, tokenizer, weights), by name; nothing else
    of the folder (READMEs, optimizer states) is copied."""
    root = Path(path)
    names = {n for n in _FILES if (root / n).is_file()}
    for pattern in _WEIGHT_PATTERNS:
        names.update(p.name for p in root.glob(pattern) if p.is_file())
    return {n: (root / n).read_bytes() for n in sorted(names)}
