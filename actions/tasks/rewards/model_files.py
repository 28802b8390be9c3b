"""A reward model's folder: the checks that need no torch, and the files ``prepare`` stores.

``prepare`` copies each ``reward.models`` folder into the store once (content-addressed, like
the policy's base), so the score and evaluate actions never read the user's file system.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actions.config.reward import DEFAULT_MAX_LENGTH

_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
          # the vocabularies of BERT/RoBERTa-style (WordPiece), DeBERTa-v3, XLM-R and T5/ALBERT tokenizers
          "vocab.txt", "spm.model", "sentencepiece.bpe.model", "spiece.model")
_PROBE = "Question: what is 12 + 30? Answer: 42, because 12 + 30 = 42."
"""Text the stored tokenizer must encode as the folder's does."""
UNSET_MAX_LENGTH = 1e9
"""A tokenizer's ``model_max_length`` at or above this is transformers' 'no limit known'."""
_WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
                    "pytorch_model.bin.index.json")


def check_classifier(path: str, field: str, label: int | str | None = None) -> int:
    """The index of the logit that scores (``label_index``) of a folder whose ``config.json``
    names a ``*ForSequenceClassification`` architecture.

    Args:
        field: ``reward.models[i]``; label: its ``label`` setting.
    Raises:
        ValueError: one line naming the field, the path, what it is, and the fix.
    """
    config = json.loads((Path(path) / "config.json").read_text())  # validate_model_dir read it already
    archs = config.get("architectures") or []
    if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in archs):
        what = ", ".join(map(str, archs)) if archs else f"a {config.get('model_type', 'model')} with no architectures"
        raise ValueError(f"{field}.path {path!r} is {what}, not a sequence-classification reward model; point it at "
                         "an AutoModelForSequenceClassification folder, e.g. `rlhfless tiny-model --reward`")
    id2label = config.get("id2label") or {str(i): f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))}
    return label_index(id2label, label, field, path)


def label_index(id2label: Mapping[Any, str], label: int | str | None, field: str, path: str) -> int:
    """Which logit of a classifier with labels ``id2label`` (keys: indices, as ints or as the
    strings of config.json) is the score: ``label`` by name or index; None only where the model
    has a single label (its logit, TRL's rule).

    Raises:
        ValueError: one line naming ``field``, the value, the model's labels and the fix.
    """
    names = {int(i): str(name) for i, name in id2label.items()}
    listed = ", ".join(f"{i}: {names[i]}" for i in sorted(names))
    if label is None and len(names) == 1:
        return next(iter(names))
    if isinstance(label, int) and label in names:
        return label
    by_name = [i for i, name in names.items() if name == label]
    if isinstance(label, str) and len(by_name) == 1:
        return by_name[0]
    if label is None:
        why = f"is not set, and the model in {path!r} has {len(names)} labels ({listed})"
        fix = "name the one to score, e.g. label: " + names[max(names)] + " (label: 0 keeps TRL's first logit)"
    else:
        why = f"{label!r} is not one of the labels of the model in {path!r} ({listed})"
        fix = "give one of those names or indices"
    raise ValueError(f"{field}.label {why}; {fix}")


def folder_files(path: str, weights: bool = True) -> dict[str, bytes]:
    """The files ``from_pretrained`` needs (config, tokenizer and, with ``weights``, the
    weights), by name; nothing else of the folder (READMEs, optimizer states) is copied."""
    root = Path(path)
    return {n: (root / n).read_bytes() for n in folder_names(path, weights)}


def folder_names(path: str, weights: bool = True) -> list[str]:
    """The names of the files ``folder_files`` reads, sorted."""
    root = Path(path)
    names = {n for n in _FILES if (root / n).is_file()}
    for pattern in _WEIGHT_PATTERNS if weights else ():
        names.update(p.name for p in root.glob(pattern) if p.is_file())
    return sorted(names)


POSITION_OFFSET_TYPES = frozenset({
    "roberta", "xlm-roberta", "xlm-roberta-xl", "roberta-prelayernorm", "camembert", "data2vec-text", "longformer",
    "ibert", "mpnet", "xmod", "luke", "markuplm", "lilt", "layoutlmv3", "esm"})
"""``model_type``s whose position ids start after the padding id (transformers'
``create_position_ids_from_input_ids``, RoBERTa's family): ``pad_token_id + 1`` of their
``max_position_embeddings`` positions are never a token's, so RoBERTa's 514 take 512 tokens."""


def position_limit(config: Any) -> int | None:
    """The most tokens a model's position embeddings take, from its transformers config (or
    anything with its attributes): ``max_position_embeddings`` (GPT-2's ``n_positions``), less
    ``pad_token_id + 1`` for ``POSITION_OFFSET_TYPES`` (a missing pad id counts as RoBERTa's 1);
    None where the config states no positive count."""
    n = next((v for v in (getattr(config, a, None) for a in ("max_position_embeddings", "n_positions"))
              if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    if n is not None and getattr(config, "model_type", None) in POSITION_OFFSET_TYPES:
        pad = getattr(config, "pad_token_id", None)
        n -= (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
    return n if n is not None and n > 0 else None


def model_limit(tokenizer: Any, positions: int | None = None) -> tuple[int | None, str]:
    """(the most tokens the model takes, where that limit comes from, for a message): the lower
    of the tokenizer's ``model_max_length`` (where it knows one) and ``positions``
    (``position_limit``); (None, "") where neither is known."""
    known = getattr(tokenizer, "model_max_length", None)
    found = []
    if known is not None and known < UNSET_MAX_LENGTH:
        found.append((int(known), "its tokenizer's model_max_length"))
    if positions is not None:
        found.append((positions, "its position embeddings: config.json max_position_embeddings, of which "
                                "RoBERTa-style models lose pad_token_id + 1"))
    return min(found) if found else (None, "")


def input_limit(max_length: int | str | None, tokenizer: Any, positions: int | None = None) -> int | None:
    """The most tokens a reward model reads: ``max_length`` (``auto``: ``DEFAULT_MAX_LENGTH``),
    and never more than the model takes (``model_limit``: the tokenizer's ``model_max_length``,
    512 for BERT and RoBERTa, and its position embeddings, ``positions``)."""
    if max_length == "auto":
        max_length = DEFAULT_MAX_LENGTH
    known, _ = model_limit(tokenizer, positions)
    limits = [n for n in (max_length, known) if n is not None and n < UNSET_MAX_LENGTH]
    return int(min(limits)) if limits else None


def folder_positions(path: str) -> int | None:
    """``position_limit`` of the model in folder ``path`` (its config.json through
    ``AutoConfig``, which fills the defaults of its type); None where it cannot be read (the
    folder's own checks name that)."""
    from transformers import AutoConfig

    try:
        return position_limit(AutoConfig.from_pretrained(path, trust_remote_code=False))
    except Exception:  # noqa: BLE001 -- validate_model_dir and check_classifier report a bad config.json
        return None


def load_tokenizer(path: str, field: str) -> Any:
    """``AutoTokenizer.from_pretrained(path)``; a folder whose tokenizer files do not load, or
    load a tokenizer that encodes plain text as nothing or only its unknown token (a
    ``tokenizer_config.json`` without its ``tokenizer.json``: every prompt would be empty), is one
    ValueError naming ``field``, the path and the fix."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)  # its own code never runs
        ids = tokenizer(_PROBE, add_special_tokens=False)["input_ids"]
    except Exception as exc:  # tokenizer files of every kind of damage
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"{field} {path!r}: the tokenizer cannot be loaded ({type(exc).__name__}: {first}); save "
                         "it again with save_pretrained") from None
    if all(i == tokenizer.unk_token_id for i in ids):  # none, or unknown only
        raise ValueError(f"{field} {path!r}: its tokenizer ({len(tokenizer)} tokens) encodes {_PROBE!r} as "
                         f"{ids}; save the model's tokenizer into the folder with tokenizer.save_pretrained (it "
                         "writes tokenizer.json)")
    return tokenizer


def check_tokenizer(path: str, field: str, settings: Any, chat_prompts: bool) -> None:
    """Refuse what would fail or mislead only once scoring runs: a tokenizer the stored copy
    (``folder_files``) does not reproduce, one with neither a pad nor an EOS token, a chat
    template the settings need and the tokenizer lacks, an explicit ``max_length`` beyond what
    the model takes (``model_limit``: its tokenizer's ``model_max_length`` or its positions).

    Args:
        field: ``reward.models[i]``; settings: its ``RewardModelConfig``;
        chat_prompts: whether the datasets' prompts are chat messages.
    Raises:
        ValueError: one line naming the field, the value and the fix.
    """
    from transformers import AutoTokenizer

    where = f"{field}.path {path!r}"
    folder = load_tokenizer(path, f"{field}.path")
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in folder_files(path, weights=False).items():
            (Path(tmp) / name).write_bytes(data)
        try:
            stored = AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)(_PROBE)["input_ids"]
        except Exception:  # noqa: BLE001 -- a file it needs was not copied: the same answer as below
            stored = None
    if stored != folder(_PROBE)["input_ids"]:
        raise ValueError(f"{where}: its tokenizer needs files other than {', '.join(_FILES[1:])}; save it with "
                         "tokenizer.save_pretrained (which writes tokenizer.json) into the folder")
    if folder.pad_token_id is None and folder.eos_token_id is None:  # the scorer pads with the one or the other
        raise ValueError(f"{where}: its tokenizer has neither a pad token nor an EOS token, so a batch of texts "
                         "cannot be padded for scoring; set pad_token (or eos_token) in its tokenizer_config.json "
                         "to one of its special tokens")
    mode = settings.chat_template
    if folder.chat_template is None and (mode is True or (mode == "auto" and chat_prompts)):
        why = "true" if mode is True else "auto, and the prompts are chat messages"
        raise ValueError(f"{field}.chat_template is {why}, but the tokenizer in {path!r} has no chat template; set "
                         f"{field}.chat_template: false to score prompt and completion as plain text, or add a "
                         "template to its tokenizer_config.json")
    known, why = model_limit(folder, folder_positions(path))
    if settings.max_length != "auto" and known is not None:
        value = settings.max_length
        if value is None or value > known:
            raise ValueError(f"{field}.max_length {'null (no limit)' if value is None else value} is more than the "
                             f"{known} tokens the model in {path!r} takes ({why}); set it to {known} or less, or "
                             f"to auto (the default: {DEFAULT_MAX_LENGTH} or the model's limit, if lower)")
