"""The pad id and the EOS ids of a loaded model, from every place a checkpoint may state them.

Real checkpoints disagree with themselves: Qwen2.5-Instruct's tokenizer says ``eos_token``
``<|im_end|>``, its ``config.json`` says ``eos_token_id: 151645`` and ``pad_token_id`` is
absent (null), and its ``generation_config.json`` lists two EOS ids ``[151645, 151643]``;
Llama 3.1 lists three in ``config.json``. Generation must stop at any of them, and a batch
needs *some* pad id even when the model has none.

* EOS ids: the tokenizer's ``eos_token_id`` first (the token a chat turn or a warm-up target
  ends with), then ``generation_config.eos_token_id``, then ``config.eos_token_id`` (each an
  int or a list), in that order, duplicates dropped.
* Pad id: the tokenizer's ``pad_token_id``, else ``generation_config``'s, else ``config``'s,
  else the first EOS id. Padding is always masked out of attention and losses, so which id
  fills it changes no result; it only has to be a valid row of the embedding.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any


@dataclass(frozen=True)
class SpecialTokens:
    pad_id: int
    eos_ids: tuple[int, ...]  # non-empty; eos_ids[0] is the primary one

    @property
    def eos_id(self) -> int:
        """The primary EOS id: what a supervised target or a stop without a recorded token ends with."""
        return self.eos_ids[0]


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, Iterable):
        return [int(v) for v in value if v is not None]
    return []


def special_tokens(model: Any, tokenizer: Any) -> SpecialTokens:
    """Pad and EOS ids of (model, tokenizer) as the module docstring orders them.

    Raises:
        ValueError: nothing names an EOS token (generation could never stop).
    """
    config = getattr(model, "config", None)
    gen = getattr(model, "generation_config", None)
    sources = (getattr(tokenizer, "eos_token_id", None), getattr(gen, "eos_token_id", None),
               getattr(config, "eos_token_id", None))
    eos = tuple(dict.fromkeys(i for s in sources for i in _ids(s)))
    if not eos:
        raise ValueError("the model names no EOS token (tokenizer eos_token, config.json or generation_config.json "
                         "eos_token_id); set eos_token_id in config.json")
    pads = [getattr(tokenizer, "pad_token_id", None), getattr(gen, "pad_token_id", None),
            getattr(config, "pad_token_id", None)]
    pad = next((p for p in pads if isinstance(p, int)), eos[0])
    return SpecialTokens(pad_id=pad, eos_ids=eos)


def special_tokens_of_dir(model_dir: str | os.PathLike[str], tokenizer: Any) -> SpecialTokens:
    """``special_tokens`` for a model folder that is not loaded here (the vLLM engine's):
    reads ``config.json`` and, when present, ``generation_config.json``."""
    from transformers import AutoConfig, GenerationConfig

    root = Path(model_dir)
    gen = GenerationConfig.from_pretrained(root) if (root / "generation_config.json").is_file() else None
    config = AutoConfig.from_pretrained(root, trust_remote_code=False)  # a model's own code never runs
    return special_tokens(SimpleNamespace(config=config, generation_config=gen), tokenizer)
