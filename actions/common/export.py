"""Export a committed policy version as a Hugging Face folder that ``from_pretrained`` loads.

In the store a version is a base artifact (config, tokenizer, generation settings) plus one
content-addressed blob per tensor (``weights.py``). Export joins them again: the base's
tokenizer files verbatim (so the chat template and special tokens are exactly the run's),
then ``save_pretrained`` of the model built from the version's tensors, in the dtype they
were published in (config.json, safetensors shards with an index above ``max_shard_size``,
generation_config.json).

Adapters: a run that trains a LoRA adapter exports it, or merges it into the base, in
:func:`_apply_adapter`, the one place that knows about adapters; until runs train one, asking
to merge is refused there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from actions.common.modeling import TOKENIZER_FILES, SLOW_TOKENIZER_FILES, build_model, read_base
from actions.common.safe_paths import write_beneath
from actions.common.store import ObjectStore, get_artifact
from actions.common.weights import load_tensors


@dataclass(frozen=True)
class ExportedFolder:
    path: str
    files: list[str]
    dtype: str


def _stored_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype the floating-point tensors were published in (fp32 when they disagree)."""
    kinds = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 else torch.float32


def _apply_adapter(model: torch.nn.Module, *, merge_lora: bool, run: str) -> torch.nn.Module:
    """Where a LoRA run's adapter is exported (PEFT format) or merged into the model; a full
    fine-tuning run has none, so merging one is refused."""
    if merge_lora:
        raise ValueError(f"--merge-lora: run {run!r} trained every weight (no LoRA adapter) and is exported whole; "
                         "drop --merge-lora")
    return model


def export_policy(store: ObjectStore, base_key: str, policy_key: str, out: str | os.PathLike[str], *,
                  weights_sha256: str | None = None, merge_lora: bool = False, run: str = "",
                  max_shard_size: str = "5GB") -> ExportedFolder:
    """Write the policy version ``policy_key`` of base ``base_key`` to the folder ``out``.

    The folder appears whole or not at all: it is written beside ``out`` and renamed.

    Raises:
        ObjectNotFound: the version or a blob is gone (collected by ``store.keep_last``).
        IntegrityError: a tensor set whose fingerprint is not ``weights_sha256``.
        ValueError: ``merge_lora`` for a run without an adapter.
    """
    base_files, _ = get_artifact(store, base_key)
    tensors, _ = load_tensors(store, policy_key, expected_sha256=weights_sha256)
    dtype = _stored_dtype(tensors)
    model = _apply_adapter(build_model(read_base(base_files), tensors).to(dtype), merge_lora=merge_lora, run=run)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in TOKENIZER_FILES + SLOW_TOKENIZER_FILES:
            if name in base_files:
                write_beneath(tmp, name, bytes(base_files[name]), where="exported model")
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        if target.exists():
            target.rmdir()  # the caller checked that it is an empty folder
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportedFolder(str(target), sorted(p.name for p in target.iterdir()), str(dtype).removeprefix("torch."))


def describe(folder: ExportedFolder, **extra: Any) -> dict[str, Any]:
    return {"path": folder.path, "files": folder.files, "dtype": folder.dtype, **extra}
