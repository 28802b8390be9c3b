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

__all__ = ["PrefixState", "sliding_window", "stack_logits", "stack_states"]


@dataclass
class PrefixState:
    """KV of one token sequence: per layer (keys, values), each [kv_heads, len, head_dim]."""

    tokens: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    last_logits: torch.Tensor  # [V] logits after the final token

    @property
    def length(self) -> int:
        return len(self.tokens)


def sliding_window(model: torch.nn.Module) -> int | None:
    """The window of the model's sliding-window attention layers (Mistral v0.1, Gemma 2 and 3,
    Qwen2 or Qwen3 with ``use_sliding_window``); None where every layer sees the whole context.

    Hugging Face applies the window by cache column, not by position: a token sees the columns
    less than ``window`` to its left. It counts tokens only while each row's tokens sit in
    consecutive columns (padding on the left alone), so the engine keeps them so for these models
    (``TorchEngine._extend``, ``speculative._Batch``)."""
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config(decoder=True)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)  # None (Mistral): the window applies to every layer
    if not window or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def stack_states(states: list[PrefixState]) -> tuple[DynamicCache, torch.Tensor]:
    """Left-pad each row's KV to the longest and stack into one cache plus a padding mask.

    Each layer's keys and values are written once into a zeroed [rows, kv_heads, width,
    head_dim] tensor that the cache then holds as it is, and rows sharing one state object (a
    GRPO group's samples after deduplicated prefill) are written with one indexed copy. Padding
    and stacking row by row, then handing the cache the stack (which copies it again), cost
    ~3 ms of host work per 64-row call on the CPU, mostly first touches of the fresh memory."""
    width = max(st.length for st in states)
    unique, take = _unique(states)
    rows_of: list[list[int]] = [[] for _ in unique]
    for r, j in enumerate(take if take is not None else range(len(states))):
        rows_of[j].append(r)
    device = states[0].kv[0][0].device
    index = [torch.tensor(rs, device=device) for rs in rows_of]
    layers = []
    for li in range(len(states[0].kv)):
        pair = []
        for part in (0, 1):  # keys, values
            first = unique[0].kv[li][part]
            # zeros, not empty: padding columns are masked, but a NaN there would still
            # poison the attention output (0 * NaN)
            out = torch.zeros((len(states), first.shape[0], width, first.shape[2]), dtype=first.dtype, device=device)
            for st, idx in zip(unique, index):
                out[idx, :, width - st.length:] = st.kv[li][part]
            pair.append(out)
        layers.append(pair)
    # The cache built from zero-length slices, then given the tensors: building it from the
    # tensors themselves would concatenate each onto an empty one, a full copy. Without a config
    # every layer keeps all its columns, sliding-window ones too (the mask applies the window)
    cache = DynamicCache(ddp_cache_data=[(k[:, :, :0], v[:, :, :0]) for k, v in layers])
    for layer, (k, v) in zip(cache.layers, layers):
        layer.keys, layer.values = k, v
    lengths = torch.tensor([st.length for st in states], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= (width - lengths)[:, None]).long()
    return cache, mask


def stack_logits(states: list[PrefixState]) -> torch.Tensor:
    """Each row's ``last_logits`` stacked: [rows, V] (shared states read once)."""
    unique, take = _unique(states)
    stacked = torch.stack([st.last_logits for st in unique])
    return stacked if take is None else stacked.index_select(0, torch.tensor(take, device=stacked.device))


def _unique(states: list[PrefixState]) -> tuple[list[PrefixState], list[int] | None]:
    """The distinct state objects in first-seen order, and each row's index among them (None
    when every row has its own)."""
    slot: dict[int, int] = {}
    unique: list[PrefixState] = []
    take = []
    for st in states:
        j = slot.setdefault(id(st), len(unique))
        if j == len(unique):
            unique.append(st)
        take.append(j)
    return unique, (None if len(unique) == len(states) else take)
