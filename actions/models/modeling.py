"""Causal LMs and tokenizers: build the tiny default, load any local Hugging Face model.

Any ``transformers`` causal LM stored as a local directory (``config.json``,
``*.safetensors``, tokenizer files) works. The embedded default is a tiny Llama built from a
config with a character-level tokenizer -- nothing is downloaded.

In the object store a model is split in two: the *base* artifact (config and tokenizer files,
small, never changes during a campaign) and *policy versions* (tensors only, see
``weights.py``). Actions rebuild a model from both and cache it while warm.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)
from transformers.initialization import no_init_weights

from actions.models.special_tokens import SpecialTokens, special_tokens
from actions.store.safe_paths import write_beneath

TINY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;?!=+-*\n"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
# A slow tokenizer's files (Qwen ships them beside tokenizer.json, Llama 2 and Mistral its
# tokenizer.model): kept with the base whatever else it has, so an export holds them too, where
# converters (llama.cpp's) and slow tokenizers look for them.
SLOW_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.model")
# Generation settings: the list of EOS ids real instruct models stop at (special_tokens.py).
GENERATION_CONFIG = "generation_config.json"


def build_char_tokenizer(extra_chars: str = "") -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, then one id per
    char of ``TINY_CHARS`` and then of ``extra_chars`` (a task's own, e.g. ``#``: appended, so
    the default vocabulary and model are unchanged by tasks that need none)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for ch in TINY_CHARS + "".join(c for c in dict.fromkeys(extra_chars) if c not in TINY_CHARS):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_tiny_model(
    *, hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int, max_positions: int, seed: int,
    extra_chars: str = "",
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A randomly initialised Llama with the char tokenizer (deterministic for a seed)."""
    tokenizer = build_char_tokenizer(extra_chars)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    return model, tokenizer


def check_model_dir(path: str | os.PathLike[str]) -> Path:
    """The directory as a Path; ValueError naming ``model.path`` when it holds no config.json."""
    root = Path(path)
    if not (root / "config.json").is_file():
        raise ValueError(
            f"model.path {str(root)!r} has no config.json; point it at a local Hugging Face model directory"
        )
    return root


def read_model_dir(path: str | os.PathLike[str]) -> tuple[dict[str, bytes], dict[str, torch.Tensor]]:
    """Split a local HF model directory into (base files: config, generation settings and every
    tokenizer file it has, ``TOKENIZER_FILES`` and ``SLOW_TOKENIZER_FILES``; tensors). The
    model's own code (``auto_map``) is never run.

    Raises:
        ValueError: the directory or a required file is missing, or the weights lack a tensor
            of the causal LM other than a tied output head (names ``model.path``).
    """
    root = check_model_dir(path)
    model, info = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32, trust_remote_code=False,
                                                       output_loading_info=True)
    check_loaded(root, info["missing_keys"])
    files = {"config.json": (root / "config.json").read_bytes()}
    for name in TOKENIZER_FILES + SLOW_TOKENIZER_FILES + (GENERATION_CONFIG,):
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    if "tokenizer.json" not in files and "tokenizer_config.json" not in files:
        raise ValueError(f"model.path {str(root)!r} has no tokenizer files; save the tokenizer next to the model")
    return files, {k: v.detach().clone() for k, v in model.state_dict().items()}


def check_loaded(root: Path, missing: list[str]) -> None:
    """Refuse weights that lack tensors the causal LM needs (``missing``: the loader's
    ``missing_keys``, which leave out a tied output head): ``from_pretrained`` would initialise
    them at random and only log it, so a sequence classifier's folder (no ``lm_head.weight``,
    a ``score`` head instead) or a bare base model's with an untied head would train from a
    random head.

    Raises:
        ValueError: one line naming ``model.path``, the missing tensors, the folder's
            ``architectures`` and the fix.
    """
    if not missing:
        return
    try:
        archs = ", ".join(map(str, json.loads((root / "config.json").read_text()).get("architectures") or []))
    except (OSError, ValueError, AttributeError):
        archs = ""
    names = ", ".join(sorted(missing)[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    raise ValueError(f"model.path {str(root)!r}: its weights have no {names} (config.json architectures: "
                     f"{archs or 'none'}), which AutoModelForCausalLM would initialise at random; point model.path "
                     "at a causal language model saved whole with save_pretrained (architectures ...ForCausalLM), "
                     "not a classifier's or a bare base model's folder")


def base_files(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> dict[str, bytes]:
    """The config and tokenizer files of an in-memory model, as saved by ``save_pretrained``."""
    with tempfile.TemporaryDirectory() as tmp:
        model.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}


@dataclass(frozen=True)
class BaseParts:
    """What a model's base files parse into, shared by every policy version of that base: the
    config (copied for each model built from it, which sets its dtype), the tokenizer (read
    only: nothing here sets its padding or truncation) and the generation settings (None
    without ``generation_config.json``)."""

    config: Any
    tokenizer: Any
    generation: GenerationConfig | None

    def special_tokens(self) -> SpecialTokens:
        """``special_tokens`` of any model built from these parts, without building one."""
        return special_tokens(SimpleNamespace(config=self.config, generation_config=self.generation), self.tokenizer)


def read_base(files: dict[str, bytes]) -> BaseParts:
    """Parse base files (config, tokenizer, generation settings) without any download."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():  # names come from a manifest: never a path outside tmp
            write_beneath(tmp, name, data, where="base model")
        config = AutoConfig.from_pretrained(tmp, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
        generation = GenerationConfig.from_pretrained(tmp) if GENERATION_CONFIG in files else None
    return BaseParts(config, tokenizer, generation)


def untied_head_keys(model: torch.nn.Module) -> list[str]:
    """The state-dict keys of ``model``'s output head where it has weights of its own (untied
    embeddings, e.g. ``["lm_head.weight"]``); ``[]`` where the head is the input embedding
    (tied) or the model has none."""
    return _head_keys(model, tied=False)


def stored_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a policy version of a full model stores: its ``state_dict`` less a tied output head,
    which is the input embedding under a second name (``save_pretrained`` leaves it out too;
    ``build_model`` and an in-place version swap tie it back). Stored, it would be a second blob
    of the embedding's bytes in every version (its header names it otherwise, so content
    addressing never shares the two): 545 MB a version for a Qwen2.5-0.5B in fp32."""
    tied = tied_head_keys(model)
    return {k: t for k, t in model.state_dict().items() if k not in tied}


def tied_head_keys(model: torch.nn.Module) -> list[str]:
    """The state-dict keys of ``model``'s output head that are its input embedding (tied), e.g.
    ``["lm_head.weight"]``; ``[]`` where the head has weights of its own or there is none."""
    return _head_keys(model, tied=True)


def _head_keys(model: torch.nn.Module, *, tied: bool) -> list[str]:
    """The output head's state-dict keys whose parameter is (``tied``) or is not the input embedding's."""
    head = model.get_output_embeddings()
    if head is None:
        return []
    shared = {id(p) for p in model.get_input_embeddings().parameters()}
    name = next(n for n, m in model.named_modules() if m is head)
    return [f"{name}.{k}" for k, p in head.named_parameters() if (id(p) in shared) == tied]


def build_model(base: BaseParts, tensors: dict[str, torch.Tensor], *, share: bool = False,
                dtype: torch.dtype = torch.float32, output_head: bool = True) -> torch.nn.Module:
    """A model of ``base``'s shape holding ``tensors`` (in ``dtype``, eval mode).

    The model is built in ``dtype`` as ``from_pretrained(..., dtype=dtype)`` builds it, not
    built in fp32 and cast: transformers keeps buffers it computes in fp32 (the rotary
    ``inv_freq`` and ``original_inv_freq``) in fp32 whatever the dtype, and a cast with
    ``Module.to(dtype)`` would round them to bf16 and turn the RoPE angles further the longer
    the sequence (on a Qwen2 shape about 0.2 rad at position 1,000, 0.7 rad at 4,000). The
    weights are cast to ``dtype`` as they are copied in (``share``: they must already be in it).

    ``generation_config.json``, when the base has one, becomes ``model.generation_config``
    (its EOS list is what generation stops at, see ``special_tokens``). ``share``: the model's
    parameters *are* ``tensors`` (their device and dtype, no copy), for a frozen backbone
    that several LoRA versions hold at once (``lora.py``); the caller must never write them.
    ``output_head=False``: ``tensors`` may lack an untied output head (``untied_head_keys``),
    which is then left unset, for a caller that drops it (the PPO critic, ``actions/rl/critic.py``).
    """
    config = copy.deepcopy(base.config)  # from_config writes the dtype into the config it is given
    # Every weight is overwritten below, so the random init is skipped: a 0.5B model spends
    # most of a minute in it on a CPU, on every new policy version an action loads. The
    # tensors are copied into the model's own (aligned) storage, not adopted: kernels may
    # round differently on the stored blobs' offsets, and the caller keeps its tensors.
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
    if base.generation is not None:
        model.generation_config = copy.deepcopy(base.generation)
    model.tie_weights()  # part of the skipped init: a tied output head is the embedding itself
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=share)
    if share:
        model.tie_weights()  # assign replaced the embedding the head was tied to
    # Tied embeddings legitimately omit lm_head.weight; anything else is a broken checkpoint.
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if not output_head:
        missing = [m for m in missing if m not in untied_head_keys(model)]
    if missing or unexpected:
        raise ValueError(f"weights do not match the model config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.eval()
    return model


def instantiate(files: dict[str, bytes], tensors: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, Any]:
    """Rebuild (model, tokenizer) from base files and a tensor set, without any download
    (``read_base`` then ``build_model``)."""
    base = read_base(files)
    return build_model(base, tensors), base.tokenizer


def model_summary(files: dict[str, bytes]) -> dict[str, Any]:
    """Small facts about a base model for manifests and refusal-to-resume checks."""
    config = json.loads(files["config.json"])
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    return {k: config.get(k) for k in keys}


def random_model_from_config(config_json: str | os.PathLike[str], device: torch.device, dtype: torch.dtype, *,
                             source: str = "model config") -> torch.nn.Module:
    """A randomly initialised causal LM of the shape a Hugging Face ``config.json`` describes,
    built directly on ``device`` in ``dtype`` (a 7B model never passes through host memory).
    For timing and profiling: nothing is downloaded, and speed does not depend on the values.

    Raises:
        ValueError: the file is missing or is not a config with a ``model_type`` (names ``source``).
    """
    try:
        data = json.loads(Path(config_json).read_text())
        config = AutoConfig.for_model(data.pop("model_type"), **data)
    except FileNotFoundError:
        raise ValueError(f"{source} {str(config_json)!r} does not exist; pass a Hugging Face config.json") from None
    except (json.JSONDecodeError, KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source} {str(config_json)!r} is not a Hugging Face config.json with a "
                         f"model_type ({exc}); fix the file") from None
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False).eval()
