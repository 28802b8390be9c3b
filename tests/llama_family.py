"""Tiny random models of the Llama-shaped families the static decode path supports, with the
char tokenizer: shared by the static-cache tests (plain and speculative)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from actions.models.modeling import build_char_tokenizer


def tiny_causal_lm(cls, *, seed: int = 0, **extra):
    """(model, tokenizer): 2 layers, hidden 48, 4 heads, fp32, eval mode; ``extra`` goes to the
    config (grouped KV heads, head_dim, ...) and may replace those."""
    tok = build_char_tokenizer("")
    shape = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "max_position_embeddings": 256, **extra}
    cfg = cls(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
              bos_token_id=tok.eos_token_id, **shape)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval(), tok


SHAPES = {
    "llama": (LlamaConfig, {"num_key_value_heads": 4}),
    "qwen2-gqa": (Qwen2Config, {"num_key_value_heads": 2}),
    "qwen3-gqa": (Qwen3Config, {"num_key_value_heads": 1, "head_dim": 16}),
    "mistral-gqa": (MistralConfig, {"num_key_value_heads": 2, "sliding_window": None}),
}
"""Name -> (config class, config arguments): plain and grouped KV heads, Qwen3's q/k norms."""


def cut_then_continue(gen, specs: list, want: dict) -> tuple[dict, object]:
    """Cut a call after as many rows as end first in ``want`` (``cut_after``), continue the
    cut rows in a second call, and return the two merged, keyed as ``want``, with the second
    call's stats. ``gen(specs, **params)`` -> ({(prompt_id, sample_index): (tokens, reason,
    ...)}, stats)."""
    from actions.engines.base import SampleSpec

    ends = sorted(len(v[0]) for v in want.values())
    first, _ = gen(specs, cut_after=sum(e == ends[0] for e in ends))
    cut = [k for k, v in first.items() if v[1] == "cut"]
    assert cut, "nothing was cut"
    prompts = {(s.prompt_id, s.sample_index): s.prompt_tokens for s in specs}
    rest, stats = gen([SampleSpec(p, i, prompts[(p, i)], tuple(first[(p, i)][0])) for p, i in cut])
    return {**{k: v for k, v in first.items() if v[1] != "cut"}, **rest}, stats
