"""Export a committed policy version as a Hugging Face folder that ``from_pretrained`` loads.

In the store a version is a base artifact (config, tokenizer, generation settings) plus one
content-addressed blob per tensor (``weights.py``). Export joins them again: the base's
tokenizer files verbatim (so the chat template and special tokens are exactly the run's),
then ``save_pretrained`` of the model built from the version's tensors, in the dtype the run
computed in (``model.dtype``; ``auto``: the dtype they were published in, for a LoRA version its
adapter's, which the backbone was trained in): config.json, safetensors shards with an index
above ``max_shard_size``, and generation_config.json, whose EOS ids are every token the run's
generation stopped at and whose sampling settings are the run's (:class:`RunSettings`).

Adapters (``model.lora`` runs, :class:`LoraVersion`): the folder holds the backbone as the
model and the version's adapter in PEFT's format under ``adapter/`` (``PeftModel.from_pretrained
(AutoModelForCausalLM.from_pretrained(out), out + "/adapter")``), or, with ``merge_lora``, the
model with the adapter merged into its weights (``W + (alpha / r) B A`` in the stored dtype).
:func:`_model` is the one place that knows about adapters.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from actions.config.workload import LoraConfig
from actions.models.device import parse_dtype
from actions.models.lora import attach_adapter, attach_peft, merge_adapter
from actions.models.modeling import SLOW_TOKENIZER_FILES, TOKENIZER_FILES, build_model, read_base
from actions.store import ObjectStore, get_artifact
from actions.store.safe_paths import write_beneath
from actions.store.weights import load_tensors


@dataclass(frozen=True)
class ExportedFolder:
    path: str
    files: list[str]
    dtype: str


def _stored_dtype(tensors: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype the floating-point tensors were published in (fp32 when they disagree)."""
    kinds = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 else torch.float32


@dataclass(frozen=True)
class RunSettings:
    """What the run computed with beyond its weights, as its configuration records it.

    ``dtype``: ``model.dtype`` (``auto``: resolved by the device of each action, which the
    export does not know, so the dtype the version was stored in). ``temperature``, ``top_k``,
    ``top_p``: ``generation.*`` (0 is greedy; ``top_k`` None and ``top_p`` None: off).
    ``max_new_tokens``: ``generation.max_new_tokens``, the longest response the run drew
    (None: not known, and the export states no length limit of its own)."""

    dtype: str = "auto"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None

    def torch_dtype(self) -> torch.dtype | None:
        """The dtype every action computed in, or None for ``auto``."""
        return None if self.dtype == "auto" else parse_dtype(self.dtype, source="model.dtype")


@dataclass(frozen=True)
class LoraVersion:
    """A ``model.lora`` run's version: an adapter over the backbone stored at ``backbone_key``."""

    config: LoraConfig
    backbone_key: str


def _model(store: ObjectStore, base: Any, policy_key: str, weights_sha256: str | None, lora: LoraVersion | None,
           merge_lora: bool, run: str,
           trained: torch.dtype | None) -> tuple[torch.nn.Module, torch.nn.Module | None, torch.dtype]:
    """(the model to save, the PEFT-wrapped adapter to save beside it or None, the dtype:
    ``trained``, the run's, else the stored one). A full fine-tuning run has no adapter, so
    merging one is refused."""
    if lora is None:
        if merge_lora:
            raise ValueError(f"--merge-lora: run {run!r} trained every weight (no LoRA adapter) and is exported "
                             "whole; drop --merge-lora")
        tensors, _ = load_tensors(store, policy_key, expected_sha256=weights_sha256)
        # Versions 1 on are published in model.dtype; version 0 without warm-up is the model folder
        # as read (fp32), which the actions cast to model.dtype when they load it: so is the export.
        dtype = trained or _stored_dtype(tensors)
        return build_model(base, tensors, dtype=dtype), None, dtype
    backbone, _ = load_tensors(store, lora.backbone_key)
    dtype = trained or _stored_dtype(backbone)
    adapter = None  # version 0 is the backbone with the adapter's seeded (zero-update) start
    if policy_key != lora.backbone_key:
        adapter, _ = load_tensors(store, policy_key, expected_sha256=weights_sha256)
        # The adapter is published in the training dtype, and the learner ran the backbone in it
        # too (loading.py casts it): a backbone stored as read (fp32, no warm-up) is cast to match.
        dtype = trained or _stored_dtype(adapter)
    if merge_lora:
        with warnings.catch_warnings():
            # PEFT warns that an adapter on an output head tied to the input embedding "can lead to
            # complications, for example when merging": merge_adapter unties the two first (the
            # head gets its own copy, config tie_word_embeddings false), so the merge is exact.
            warnings.filterwarnings("ignore", message=r"Model (has|with) `tie_word_embeddings=True`",
                                    category=UserWarning)
            merged = merge_adapter(attach_adapter(build_model(base, backbone, dtype=dtype), lora.config, adapter))
        return merged, None, dtype
    peft_model = attach_peft(build_model(base, backbone, dtype=dtype), lora.config, adapter)
    return build_model(base, backbone, dtype=dtype), peft_model, dtype


def export_policy(store: ObjectStore, base_key: str, policy_key: str, out: str | os.PathLike[str], *,
                  weights_sha256: str | None = None, merge_lora: bool = False, run: str = "",
                  lora: LoraVersion | None = None, max_shard_size: str = "5GB",
                  settings: RunSettings = RunSettings()) -> ExportedFolder:
    """Write the policy version ``policy_key`` of base ``base_key`` to the folder ``out``, in
    ``settings``' dtype and with its sampling settings (default: the configuration's defaults).

    The folder appears whole or not at all: it is written beside ``out`` and renamed. It gets
    the modes ``save_pretrained`` would give it (``0o777`` for folders and ``0o666`` for files,
    less the umask), not the owner-only ones of its temporary folder, so another user or a
    serving container can read it. A ``SystemExit`` or ``KeyboardInterrupt`` part-way removes
    the temporary folder; a caller that may get SIGTERM turns it into ``SystemExit`` (the CLI
    does), since SIGTERM's default action would end the process without any cleanup.

    Raises:
        ObjectNotFound: the version or a blob is gone (collected by ``store.keep_last``).
        IntegrityError: a tensor set whose fingerprint is not ``weights_sha256``.
        ValueError: ``merge_lora`` for a run without an adapter.
    """
    base_files, _ = get_artifact(store, base_key)
    model, adapter, dtype = _model(store, read_base(base_files), policy_key, weights_sha256, lora, merge_lora, run,
                                   settings.torch_dtype())
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in TOKENIZER_FILES + SLOW_TOKENIZER_FILES:
            if name in base_files:
                write_beneath(tmp, name, bytes(base_files[name]), where="exported model")
        _stop_as_trained(model, tmp)
        _sample_as_trained(model, settings)
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        if adapter is not None:
            _save_adapter(adapter, tmp, target)
        give_usual_modes(tmp)
        if target.exists():
            target.rmdir()  # the caller checked that it is an empty folder
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportedFolder(str(target), sorted(p.name for p in target.iterdir()), str(dtype).removeprefix("torch."))


def _save_adapter(adapter: Any, tmp: Path, target: Path) -> None:
    """Save the PEFT adapter under ``tmp/adapter``, naming ``target`` (where ``tmp`` becomes the
    export) as its base: PEFT records the folder the backbone was read from, here a deleted
    temporary one, and its auto classes load the backbone from the name. PEFT saves against the
    backbone just written in ``tmp`` (it compares their vocabularies); the name is moved to
    ``target`` after."""
    for peft_config in adapter.peft_config.values():
        peft_config.base_model_name_or_path = str(tmp)
    adapter.save_pretrained(tmp / "adapter", safe_serialization=True)
    config = tmp / "adapter" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": str(target.resolve())},
                                 indent=2, sort_keys=True))
    card = tmp / "adapter" / "README.md"  # the model card PEFT writes names it too
    if card.is_file():
        card.write_text(card.read_text().replace(str(tmp), str(target.resolve())))


def _umask() -> int:
    """The process's umask. Reading it means setting it: restored at once, and nothing else in
    this process creates files while an export writes its folder."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_usual_modes(folder: Path) -> None:
    """Folders ``0o777`` and files ``0o666`` less the umask, as a plain ``save_pretrained``
    leaves them (``mkdtemp`` and ``write_beneath`` create owner-only ones, and safetensors writes
    its weights owner-only). Symlinks are left alone."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for name, mode in [(d, 0o777) for d in dirs] + [(f, 0o666) for f in files]:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, mode & ~mask)


def _stop_as_trained(model: torch.nn.Module, tokenizer_dir: Path) -> None:
    """Make the saved ``generation_config.json`` stop at every token the run's generation
    stopped at (``special_tokens``: the tokenizer's EOS, such as a chat template's end of turn,
    and the config's), and pad with the run's pad id: ``generate`` on the exported folder then
    ends a response where the trained policy's ended."""
    from transformers import AutoTokenizer

    from actions.models.special_tokens import special_tokens

    ids = special_tokens(model, AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False))
    gen = model.generation_config
    gen.eos_token_id = ids.eos_ids[0] if len(ids.eos_ids) == 1 else list(ids.eos_ids)
    gen.pad_token_id = ids.pad_id


_UNAPPLIED_SETTINGS = (
    # filters and penalties
    "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty", "encoder_repetition_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "renormalize_logits",
    "guidance_scale", "watermarking_config", "sequence_bias",
    # tokens banned, suppressed or forced (suppress_tokens: such an id can never be drawn)
    "suppress_tokens", "begin_suppress_tokens", "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
    # lengths and stops other than the run's (min_new_tokens: EOS cannot be drawn before it)
    "min_length", "min_new_tokens", "max_length", "max_time", "stop_strings",
    # decoding strategies other than sampling token by token
    "num_beams", "num_beam_groups", "diversity_penalty", "length_penalty", "early_stopping", "constraints",
    "force_words_ids", "penalty_alpha", "dola_layers", "token_healing")
"""``GenerationConfig`` settings that change which tokens ``generate`` draws, or where it stops,
and that the run's sampler (``actions/engines/sampling.py``) never applied: cleared, so that
transformers' neutral default applies (no penalty, no other filter, nothing banned or forced,
no minimum length, one beam). Its one length limit is ``max_new_tokens``, the run's."""


def _sample_as_trained(model: torch.nn.Module, settings: RunSettings) -> None:
    """Make the saved ``generation_config.json`` sample as the run's generation did, not as the
    base folder's settings say (an instruct model's temperature 0.7, top_p 0.8, ...): its
    temperature, ``top_k`` and ``top_p``, and its ``max_new_tokens`` (where ``settings`` knows
    it; else none, ``generate``'s default). A filter the run had off is written as
    transformers' neutral value (``top_k`` 0, ``top_p`` 1.0), since an absent ``top_k`` is 50 to
    ``generate``; temperature 0 (greedy) is ``do_sample`` false, the filters then unused. The
    folder's other settings that the run never applied (``_UNAPPLIED_SETTINGS``) are cleared."""
    gen = model.generation_config
    for name in _UNAPPLIED_SETTINGS:
        if hasattr(gen, name):
            setattr(gen, name, None)
    gen.max_new_tokens = settings.max_new_tokens
    if settings.temperature == 0:
        gen.do_sample, gen.temperature, gen.top_k, gen.top_p = False, None, None, None
    else:
        gen.do_sample, gen.temperature = True, float(settings.temperature)
        gen.top_k, gen.top_p = settings.top_k or 0, settings.top_p or 1.0


def describe(folder: ExportedFolder, **extra: Any) -> dict[str, Any]:
    return {"path": folder.path, "files": folder.files, "dtype": folder.dtype, **extra}
