"""One decode forward of a Llama-family model over a ``StaticKV``, with no host work inside.

The model's own modules do the arithmetic (embedding, RMSNorm, q/k/v/o projections, rotary
embedding, MLP, output head): only the attention's cache handling differs from the Hugging
Face forward. New keys and values are written in place at a column given as a device tensor,
and attention reads the grouped cache as it is: the ``G = heads / kv_heads`` query heads that
share a key/value head are folded into the query length (``[b, kv_heads, G * w, head_dim]``),
so no ``repeat_kv`` copy of the cache is made and the attention reads each cached key and value
once. Nothing in ``forward`` reads a value back to the host or allocates by data-dependent
size, so a CUDA graph can capture it.

Supported: decoder-only models whose layers are Llama-shaped (``llama``, ``qwen2``,
``mistral``, ``qwen3`` with its q/k norms) and attend to the whole context. Anything else --
another layer structure, sliding-window layers, a missing module -- is reported by
``unsupported_reason`` and decodes on the dynamic path.

Attention (``ATTENTIONS``). ``sdpa`` (the default) is PyTorch's scaled-dot-product
attention over the whole window with a boolean mask: on a GPU, cuDNN's or the flash kernel,
one thread block per row and key/value head walking every column of the window, masked or
not. ``flex`` is ``torch.nn.attention.flex_attention`` with a block mask built on the device
from the write column: blocks of ``FLEX_KV_BLOCK`` columns past the last written one are
skipped, not masked. It is for the compiled plain step (``generation.compile_decode``), where
inductor generates one Triton kernel for it; without the compiler flex attention runs an
unfused reference that materialises the scores, so verification rounds (never compiled)
attend with ``sdpa`` whatever the setting (``__call__``'s ``attention``). Which Triton kernel:
inductor picks its split-KV decoding kernel (a row's columns spread over thread blocks, as
flash-decoding does) only where the batch and the heads are fixed at compile time, the query
is shorter than 128, and each key/value head serves a power-of-two number of query heads
(``torch/_inductor/kernel/flex/flex_decoding.py``, ``_use_flex_decoding``). So ``flex`` folds
the grouped heads into the query length as ``sdpa``'s masked path does (``[b, kv_heads, G * w,
head_dim]`` against ``[b, kv_heads, window, head_dim]``: one query head per key/value head,
whatever ``G``; Qwen2.5 groups 7), and the compiled flex step is compiled per batch bucket
(``compiled_step``). Every kernel computes the same attention as ``sdpa``; they
round differently (another order of additions).

Shapes: ids and positions ``[b, w]``; ``col``: ``[w]`` int64 cache columns of the w new
tokens (the same for every row); logits ``[b, w, V]``.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from actions.engines.preflight import STATIC_MODEL_TYPES as SUPPORTED_TYPES
from actions.engines.preflight import sliding_window_reason
from actions.engines.static_kv import StaticKV

__all__ = ["ATTENTIONS", "FLEX_KV_BLOCK", "StaticForward", "unsupported_reason"]

ATTENTIONS = ("sdpa", "flex")
"""The decode step's attention kernels (module docstring)."""

FLEX_KV_BLOCK = 128
"""Columns per key/value block of ``flex`` attention: the unit it skips unwritten columns by
(a window is a multiple of it wherever ``flex`` runs: ``static_decode.window_step``)."""


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why ``StaticForward`` cannot run this model (None: it can)."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model_type {kind!r} is not one of {SUPPORTED_TYPES}"
    inner = getattr(model, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return f"the model has no model.{name}"
    if not hasattr(model, "lm_head"):
        return "the model has no lm_head"
    if (sliding := sliding_window_reason(cfg)) is not None:
        return sliding
    attn = inner.layers[0].self_attn
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(attn, name):
            return f"the attention has no {name}"
    return None


class StaticForward:
    """The decode forward of one loaded model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, attention: str = "sdpa") -> None:
        """``attention``: one of ``ATTENTIONS``.

        Raises:
            ValueError: an unsupported model, or an unknown ``attention``."""
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the static decode path cannot run this model: {reason}")
        if attention not in ATTENTIONS:
            raise ValueError(f"decode attention {attention!r} is not one of {ATTENTIONS}")
        self.attention = attention
        cfg = model.config
        # submodules only, never the model: the runtime that holds this forward is kept in a
        # weak map keyed by the model (static_decode.runtime_for)
        self.lm_head = model.lm_head
        self.inner = model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.layers = list(self.inner.layers)
        attn = self.layers[0].self_attn
        self.scaling = getattr(attn, "scaling", self.head_dim ** -0.5)
        self.rotate = importlib.import_module(type(attn).__module__).apply_rotary_pos_emb
        self.qk_norm = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
        # the rotary's unused second input: empty, and broadcastable against [b, 1, w, head_dim]
        self._none = torch.empty(1, 0, 1, self.head_dim, device=self.lm_head.weight.device)

    def attention_mask(self, kv: StaticKV, b: int, window: int, col: torch.Tensor) -> torch.Tensor:
        """``[b, 1, G * w, window]`` bool: each new token sees the valid columns up to itself."""
        valid = kv.mask[:b, :window]
        w = col.shape[0]
        if w == 1:
            return valid[:, None, None, :]
        causal = torch.arange(window, device=col.device)[None, :] <= col[:, None]  # [w, window]
        mask = valid[:, None, None, :] & causal[None, None, :, :]  # [b, 1, w, window]
        return mask.repeat(1, 1, self.groups, 1)  # query index g * w + j, as q is folded below

    def block_mask(self, kv: StaticKV, b: int, window: int, col: torch.Tensor):
        """``flex`` attention's ``BlockMask`` over ``[b, kv_heads, G * w, window]`` (the grouped
        heads folded into the query length, as ``_attend`` folds them), built on the device
        with no host read (a graph replays it with each step's column): the key/value blocks up
        to the one holding the last new column are visited, every later block of the window is
        skipped, and inside the visited blocks a new token sees what ``attention_mask`` lets
        it see (the row's valid columns, up to its own). One mask for every row and head:
        every row writes the same columns."""
        from torch.nn.attention.flex_attention import BlockMask

        torch._check(window % FLEX_KV_BLOCK == 0)  # else the tail columns would never be visited
        blocks = window // FLEX_KV_BLOCK
        w = col.shape[0]
        q_blocks = -(-self.groups * w // FLEX_KV_BLOCK)  # one for a plain step (G < 128)
        used = (col.max() // FLEX_KV_BLOCK + 1).to(torch.int32).reshape(1, 1, 1).expand(1, 1, q_blocks).contiguous()
        indices = torch.arange(blocks, dtype=torch.int32, device=col.device).expand(1, 1, q_blocks, blocks).contiguous()
        # the mask read flat: inductor's CPU template for flex attention fails to compile a
        # two-index read of a captured tensor once the shapes are symbolic (torch 2.13)
        valid, stride = kv.mask.view(-1), kv.mask.shape[1]

        def visible(row, head, q, k):  # noqa: ARG001 -- flex_attention's mask_mod signature
            # query index q = g * w + j (the grouped heads folded, as ``_attend`` does): new token j
            return valid[row * stride + k] & (k <= col[q % w])

        whole = ()
        if col.device.type == "cpu":
            # no block is known whole (padding and speculation's holes are per row); inductor's
            # CPU decoding template reads that count, so it is stated there, as zero (with
            # indices unlike the visited ones: the template names one buffer once). Not on a
            # GPU: the Triton kernel would then size its splits by the whole window
            whole = (torch.zeros_like(used), torch.zeros_like(indices))
        return BlockMask.from_kv_blocks(used, indices, *whole, BLOCK_SIZE=(FLEX_KV_BLOCK, FLEX_KV_BLOCK),
                                        mask_mod=visible, seq_lengths=(self.groups * w, window),
                                        compute_q_blocks=False)

    def __call__(self, kv: StaticKV, ids: torch.Tensor, pos: torch.Tensor, col: torch.Tensor,
                 window: int, dense: bool = False, attention: str | None = None) -> torch.Tensor:
        """Logits ``[b, w, V]`` of tokens ``ids`` at model positions ``pos``, their keys and
        values written to columns ``col``; attention over the first ``window`` columns (which
        must cover ``col``). Marks ``col`` valid in ``kv.mask`` for all ``b`` rows.

        ``dense`` (one new token, every column of the window valid): attend without a mask, as
        Hugging Face's forward does when nothing is padded, so that on the CPU the sums are the
        dynamic path's to the last bit (the caller checks; a graph never passes it).
        ``attention``: this call's kernel, where it is not the forward's own."""
        b, w = ids.shape
        flex = (attention or self.attention) == "flex"
        if torch.compiler.is_compiling():  # in place on the whole mask, as ``_write`` says why
            kv.mask.index_put_((torch.arange(b, device=col.device)[:, None], col[None, :]),
                               torch.ones((), dtype=torch.bool, device=col.device))
        else:
            kv.mask[:b].index_fill_(1, col, True)
        if flex:
            amask = self.block_mask(kv, b, window, col)
        else:
            amask = None if dense and w == 1 else self.attention_mask(kv, b, window, col)
        x = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(x, pos)
        for i, layer in enumerate(self.layers):
            x = x + self._attend(layer.self_attn, layer.input_layernorm(x), kv, i, cos, sin, col, amask, window,
                                 flex)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.inner.norm(x))

    @staticmethod
    def _write(buf: torch.Tensor, new: torch.Tensor, col: torch.Tensor, b: int) -> torch.Tensor:
        """Write ``new`` ``[b, kv_heads, w, head_dim]`` into columns ``col`` of ``buf``'s first
        ``b`` rows, in place; returns ``buf[:b]``.

        Under ``torch.compile`` the write indexes the whole buffer (rows, heads and columns as
        index tensors) instead of writing into the view ``buf[:b]``: with ``b`` symbolic the
        compiler does not make a write into that view in place, but copies the whole view,
        writes the copy and copies it back -- two passes over every row's keys and values per
        layer and step (2.7 ms of a 9.6 ms step of the Qwen2.5-7B shape at 64 rows, one H200)."""
        if torch.compiler.is_compiling():
            rows = torch.arange(b, device=buf.device)[:, None, None]
            heads = torch.arange(buf.shape[1], device=buf.device)[None, :, None]
            buf.index_put_((rows, heads, col[None, None, :]), new.to(buf.dtype))
            return buf[:b]
        out = buf[:b]
        out.index_copy_(2, col, new.to(buf.dtype))
        return out

    def _attend(self, attn, h: torch.Tensor, kv: StaticKV, i: int, cos: torch.Tensor, sin: torch.Tensor,
                col: torch.Tensor, amask, window: int, flex: bool) -> torch.Tensor:
        b, w, _ = h.shape
        q = attn.q_proj(h).view(b, w, self.heads, self.head_dim)
        k = attn.k_proj(h).view(b, w, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        v = attn.v_proj(h).view(b, w, self.kv_heads, self.head_dim).transpose(1, 2)
        # one rotary over queries and keys together: the same elementwise arithmetic per head
        # as rotating each, in half the kernels (a decode step is launch-bound on a GPU)
        qk, _ = self.rotate(torch.cat([q, k], dim=2).transpose(1, 2), self._none, cos, sin)
        q, k = qk[:, : self.heads], qk[:, self.heads:]
        keys, values = self._write(kv.keys[i], k, col, b), self._write(kv.values[i], v, col, b)
        if amask is None:  # nothing masked: grouped heads natively, as the dynamic path then does
            out = F.scaled_dot_product_attention(q.contiguous(), keys[:, :, :window], values[:, :, :window],
                                                 scale=self.scaling, enable_gqa=self.groups > 1)
        else:
            # heads h = kv * G + g share kv head kv (Hugging Face's repeat_kv order), folded into
            # the query length; contiguous, as the dynamic path's packed query is. For flex, the
            # fold is what lets inductor pick its split-KV decoding kernel (module docstring)
            q = q.reshape(b, self.kv_heads, self.groups * w, self.head_dim).contiguous()
            if flex:
                from torch.nn.attention.flex_attention import flex_attention

                out = flex_attention(q, keys[:, :, :window], values[:, :, :window], block_mask=amask,
                                     scale=self.scaling)
            else:
                out = F.scaled_dot_product_attention(q, keys[:, :, :window], values[:, :, :window],
                                                     attn_mask=amask, scale=self.scaling)
        out = out.reshape(b, self.heads, w, self.head_dim).transpose(1, 2).reshape(b, w, self.heads * self.head_dim)
        return attn.o_proj(out)
