"""Tiny random models of the Llama-shaped families the static decode path supports, with the
char tokenizer: shared by the static-cache tests (plain and speculative)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from actions.models.modeling import build_char_tokenizer


def tiny_causal_lm(cls, *, seed: int = 0, **extra):
    """(model, tokenizer): 2 layers, hidden 48, 4 heads, fp32, eval mode; ``extra`` goes to the
    config (grouped KV heads, head_dim, ...)."""
    tok = build_char_tokenizer("")
    cfg = cls(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=256, pad_token_id=tok.pad_token_id,
              eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, **extra)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval(), tok


SHAPES = {
    "llama": (LlamaConfig, {"num_key_value_heads": 4}),
    "qwen2-gqa": (Qwen2Config, {"num_key_value_heads": 2}),
    "qwen3-gqa": (Qwen3Config, {"num_key_value_heads": 1, "head_dim": 16}),
    "mistral-gqa": (MistralConfig, {"num_key_value_heads": 2, "sliding_window": None}),
}
"""Name -> (config class, config arguments): plain and grouped KV heads, Qwen3's q/k norms."""
