"""A KV cache the engine owns: preallocated buffers written in place, never grown.

The dynamic path (``kv_state.stack_states`` + Hugging Face ``DynamicCache``) concatenates one
column per decode step onto every layer's keys and values, so each step allocates and copies
the whole cache, and tensor addresses change from step to step. ``StaticKV`` allocates per
layer one ``[rows, kv_heads, cols, head_dim]`` buffer for keys and one for values, plus a
``[rows, cols]`` validity mask, once; a decode step writes its column in place. Fixed
addresses are what lets a CUDA graph replay a decode step (``static_decode.py``), and a warm
container keeps the buffers across calls (reallocated only when a call needs more rows or
columns than they hold).

Layout. Rows are stacked left-padded to the longest prompt (as ``stack_states`` does), so
every running row writes its next token into the same column; padding and unwritten columns
are masked out (``mask`` False). Rows that finish release their slots when the batch is
compacted (``compact``): the running rows move to the front, in order.

Shapes: ``keys[l]``, ``values[l]``: ``[rows, kv_heads, cols, head_dim]``; ``mask``: ``[rows, cols]``
(bool, True = a real token that may be attended to).
"""

from __future__ import annotations

import torch

from actions.engines.kv_state import PrefixState

__all__ = ["StaticKV", "round_up"]


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class StaticKV:
    """Per-layer key/value buffers and a validity mask of fixed shape on one device."""

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, rows: int, cols: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        # zeros, not empty: a masked column still enters the attention's value product as
        # 0 * V, and a NaN left in fresh memory would poison it
        shape = (rows, kv_heads, cols, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.mask = torch.zeros((rows, cols), dtype=torch.bool, device=device)
        self.rows, self.cols = rows, cols
        self.dtype, self.device = dtype, device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def fits(self, rows: int, cols: int, dtype: torch.dtype) -> bool:
        return rows <= self.rows and cols <= self.cols and dtype == self.dtype

    def load(self, states: list[PrefixState], rows: int) -> int:
        """Write each state's KV into rows ``[0, len(states))``, left-padded to the longest;
        rows ``[len(states), rows)`` become idle padding rows (one valid column each, so their
        attention never divides by an empty sum). Returns the width (the next column)."""
        n = len(states)
        width = max(st.length for st in states)
        groups: dict[int, tuple[PrefixState, list[int]]] = {}  # a GRPO group's rows share one state
        for r, st in enumerate(states):
            groups.setdefault(id(st), (st, []))[1].append(r)
        for li in range(len(self.keys)):
            for part, buf in ((0, self.keys[li]), (1, self.values[li])):
                buf[:rows, :, :width].zero_()
                for st, idx in groups.values():
                    src = st.kv[li][part].to(device=self.device, dtype=self.dtype)
                    buf[torch.tensor(idx, device=self.device), :, width - st.length:width] = src
        self.mask[:rows].zero_()
        lengths = torch.tensor([st.length for st in states], device=self.device)
        cols = torch.arange(width, device=self.device)
        self.mask[:n, :width] = cols[None, :] >= (width - lengths)[:, None]
        self.mask[n:rows, 0] = True
        return width

    def compact(self, keep: list[int], rows: int, used_cols: int) -> None:
        """Move rows ``keep`` (increasing slot indices) to ``[0, len(keep))``; rows
        ``[len(keep), rows)`` become idle padding rows. Only the first ``used_cols`` columns
        are copied (the rest are masked until written)."""
        m = len(keep)
        idx = torch.tensor(keep, device=self.device)
        for buf in (*self.keys, *self.values):
            # a gathered copy: source and target rows overlap
            buf[:m, :, :used_cols] = buf[:, :, :used_cols].index_select(0, idx)
        self.mask[:m] = self.mask.index_select(0, idx)
        self.mask[m:rows] = False
        self.mask[m:rows, 0] = True

    def pack(self, rows: int, used_cols: int) -> int:
        """Close the holes speculative rounds leave (rejected draft columns, masked): move each
        of rows ``[0, rows)``'s valid columns, in order, to the right end of ``[0, width)``,
        where ``width`` is the most valid columns any row has. Positions are explicit (rotary is
        applied before a key is cached), so moving a column changes nothing a row attends to.
        Returns ``width``, the next column to write."""
        mask = self.mask[:rows, :used_cols]
        width = int(mask.sum(1).max())
        # stable: invalid columns first, then each row's valid columns in their order
        idx = torch.argsort(mask.to(torch.int8), dim=1, stable=True)[:, used_cols - width:]
        for buf in (*self.keys, *self.values):
            gather = idx[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3])
            buf[:rows, :, :width] = buf[:rows, :, :used_cols].gather(2, gather)
        self.mask[:rows, :width] = mask.gather(1, idx)
        self.mask[:rows, width:used_cols] = False
        return width
