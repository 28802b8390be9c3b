"""KV state of token sequences on the torch engine, and stacking rows into one batch cache.

Below both ``torch_engine`` (plain decoding) and ``speculative`` (draft-and-verify decoding),
which each build a batch from per-row prefix states.

Shapes: KV per layer ``[kv_heads, positions, head_dim]`` per row; the stacked cache
``[rows, kv_heads, positions, head_dim]``; the mask ``[rows, positions]`` (1 = real token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

__all__ = ["PrefixState", "stack_states"]


@dataclass
class PrefixState:
    """KV of one token sequence: per layer (keys, values), each [kv_heads, len, head_dim]."""

    tokens: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    last_logits: torch.Tensor  # [V] logits after the final token

    @property
    def length(self) -> int:
        return len(self.tokens)


def stack_states(states: list[PrefixState]) -> tuple[DynamicCache, torch.Tensor]:
    """Left-pad each row's KV to the longest and stack into one cache plus a padding mask."""
    width = max(st.length for st in states)
    num_layers = len(states[0].kv)
    layers = []
    for li in range(num_layers):
        ks, vs = [], []
        for st in states:
            k, v = st.kv[li]
            pad = width - st.length
            ks.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            vs.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        layers.append((torch.stack(ks), torch.stack(vs)))
    mask = torch.zeros((len(states), width), dtype=torch.long)
    for r, st in enumerate(states):
        mask[r, width - st.length:] = 1
    return DynamicCache(ddp_cache_data=layers), mask.to(layers[0][0].device)
