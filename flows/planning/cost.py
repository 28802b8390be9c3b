"""Per-actor time and cost estimates from a TPOT profile (paper §3.5, §3.8).

An actor decodes its samples as one continuously batched group; a finished sample leaves the
batch at once, so the batch shrinks as samples finish. With ``alive(t)`` the number of samples
whose length is ``>= t`` and ``P`` the prompt length, the decode time is [I, paper §3.5]::

    T_decode = sum_{t=1..max_len} TPOT(alive(t), P + t)

Between two consecutive distinct sorted lengths ``lo < hi`` the batch is constant, so the sum
over ``t = lo+1..hi`` is ``(hi - lo) * TPOT(batch, P + (lo + hi + 1) / 2)`` (context taken at
the segment midpoint; exact where TPOT is linear in context, as the roofline is within one
regime). That makes the estimate O(#distinct lengths) instead of O(tokens), which is what keeps
a full planning sweep within milliseconds. Prefill adds ``prefill_tokens / prefill_tokens_per_s``.

Cost is the paper's proxy [P §3.8]: ``GPU-seconds = time * GPUs``, money = GPU-s * price.
"""

from __future__ import annotations

from functools import cached_property
from itertools import chain, islice
from typing import Callable, Sequence

import numpy as np

from flows.planning.tpot import CONTEXT_BUCKET, TpotFn, TpotProfile

# (grid, group_size) -> bucket table; a few profiles at most per process. Keyed by the grid's
# values, not the object: the live flow reloads its profile file every step.
_TABLES: dict[tuple, np.ndarray] = {}
_MAX_TABLES = 8


def bucket_table(profile: TpotProfile, group_size: int, max_groups: int,
                 max_context: float) -> np.ndarray:
    """``table[j][k]`` = ``profile.bucket_row((j + 1) * group_size, max_context)[k]``.

    The same numbers bit for bit (same interpolation, the same float operations; additions
    commute exactly; test_planning_cost checks it), computed for every batch size in one pass
    instead of ~10^5 Python-level evaluations: building 512 rows row by row took ~20 ms, two
    thirds of a 512-prompt planning call on a new profile. Cached per grid; a cached table
    may be larger than asked (rows and columns beyond the request are never read by the
    planner, as with ``bucket_row``'s cache).
    """
    need = int(max_context) // CONTEXT_BUCKET + 2
    key = (profile.batch_sizes, profile.contexts, profile.seconds, group_size)
    table = _TABLES.get(key)
    if table is None or table.shape[0] < max_groups or table.shape[1] < need:
        if table is not None:  # grow what is too small geometrically, as bucket_row does
            rows, cols = table.shape
            max_groups = rows if max_groups <= rows else max(max_groups, 2 * rows)
            need = cols if need <= cols else max(need, 2 * cols)
        bs = np.asarray(profile.batch_sizes, dtype=np.int64)
        cs = np.asarray(profile.contexts, dtype=np.float64)
        grid = np.asarray(profile.seconds, dtype=np.float64)
        batch = np.arange(1, max_groups + 1, dtype=np.int64) * group_size
        # TpotProfile._row for every batch: interpolated values and per-cell context slopes
        i = np.clip(np.searchsorted(bs, batch, side="right") - 1, 0, len(bs) - 2)
        w = (batch - bs[i]) / (bs[i + 1] - bs[i])
        lo, hi = grid[i], grid[i + 1]
        vals = lo + (hi - lo) * w[:, None]
        slopes = (vals[:, 1:] - vals[:, :-1]) / (cs[1:] - cs[:-1])
        # TpotProfile._bucket_cells: grid cell and offset of every bucket centre
        centre = (np.arange(need) + 0.5) * CONTEXT_BUCKET
        j = np.clip(np.searchsorted(cs, centre, side="right") - 1, 0, len(cs) - 2)
        offset = centre - cs[j]
        # value + slope * offset, floored; filled one grid cell (a run of columns) at a time,
        # in place (x + y == y + x exactly in IEEE arithmetic, so the order is free)
        table = np.empty((max_groups, need))
        first = np.searchsorted(j, np.arange(len(cs)), side="left").tolist()
        for cell in range(len(cs) - 1):
            cols = slice(first[cell], first[cell + 1])
            if cols.start < cols.stop:
                np.multiply(slopes[:, cell, None], offset[None, cols], out=table[:, cols])
                table[:, cols] += vals[:, cell, None]
        np.maximum(table, grid.min(), out=table)
        if len(_TABLES) >= _MAX_TABLES and key not in _TABLES:
            del _TABLES[next(iter(_TABLES))]
        _TABLES[key] = table
    return table


class DecodeEstimator:
    """Shrinking-batch decode time of groups of ``group_size`` samples, for the planner.

    Rows of TPOT per batch size ``(j + 1) * group_size`` come from one cached table
    (``bucket_table``), so one segment costs a table read and a multiply-add.
    """

    def __init__(self, profile: TpotProfile, group_size: int, max_groups: int,
                 max_context: float) -> None:
        self.profile = profile
        self.group_size = group_size
        self.table = bucket_table(profile, group_size, max_groups, max_context + 1)[:max_groups]

    @cached_property
    def rows(self) -> list[memoryview]:
        """The table's rows; indexing a memoryview gives a plain Python float."""
        return [memoryview(row) for row in self.table]

    def time_desc(self, lengths_desc: Sequence[float], context0: float) -> float:
        """Seconds to decode groups with these lengths (tokens, longest first) from a prompt
        of ``context0`` tokens; each segment's context is taken at its midpoint."""
        if len(lengths_desc) > len(self.rows):
            raise ValueError(f"DecodeEstimator: {len(lengths_desc)} groups but rows for "
                             f"{len(self.rows)}; raise max_groups")
        inv = 1.0 / CONTEXT_BUCKET
        c0 = context0 + 0.5
        total = 0.0
        try:
            for row, hi, lo in zip(self.rows, lengths_desc,
                                   chain(islice(lengths_desc, 1, None), (0.0,))):
                if hi > lo:  # ties add no segment: the batch only changes at distinct lengths
                    total += (hi - lo) * row[int((c0 + 0.5 * (hi + lo)) * inv)]
        except IndexError:  # context beyond the prepared rows: take the exact (slow) path
            return decode_time_desc(lengths_desc, self.group_size, context0,
                                    self.profile.tpot_fn())
        return total

    def slice_timer(self, lengths_desc: Sequence[float]) -> Callable[[int, int, float], float]:
        """``timer(start, end, context0)`` = ``time_desc(lengths_desc[start:end], context0)``.

        Neighbour differences and scaled midpoints of the whole ranking are computed once, so
        the planner's sweep over N (contiguous slices of one ranking) pays only a list index
        and a multiply-add per segment.
        """
        inv = 1.0 / CONTEXT_BUCKET
        lengths = list(lengths_desc)
        diffs = [a - b for a, b in zip(lengths, lengths[1:])]
        # Bucket of each segment midpoint; adding the actor's own bucket offset later may land
        # one bucket (16 tokens of context) low, which is well inside the estimate's accuracy.
        mids = [int(0.5 * (a + b + 1.0) * inv) for a, b in zip(lengths, lengths[1:])]
        rows = self.rows

        def timer(start: int, end: int, context0: float) -> float:
            if end - start > len(rows):
                raise ValueError(f"slice of {end - start} groups but rows for {len(rows)}")
            base = int(context0 * inv)
            total = 0.0
            for row, d, m in zip(rows, diffs[start:end - 1], mids[start:end - 1]):
                total += d * row[base + m]
            last = lengths[end - 1]  # the shortest group ends the last segment at length 0
            return total + last * rows[end - 1 - start][base + int(0.5 * (last + 1.0) * inv)]
        return timer

    def sweep(self, lengths_desc: Sequence[float], starts: Sequence[int], ends: Sequence[int],
              context0: Sequence[float]) -> list[float]:
        """``[slice_timer(lengths_desc)(s, e, c) for s, e, c in zip(starts, ends, context0)]``,
        vectorised.

        Bit for bit the same numbers: every term is the same float product, and each slice's
        terms are added left to right as the timer does (a row-wise ``cumsum``, which
        accumulates sequentially; slices of one size form one 2-D block). The planner's sweep
        over N = 1..64 for 512 prompts is ~32k terms: ~6 ms in a Python loop, ~1 ms here.
        """
        inv = 1.0 / CONTEXT_BUCKET
        lengths = np.asarray(lengths_desc, dtype=np.float64)
        starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        sizes = ends - starts
        if len(sizes) and (int(sizes.max()) > self.table.shape[0] or int(sizes.min()) < 1):
            raise ValueError(f"slices of {int(sizes.min())}..{int(sizes.max())} groups; rows "
                             f"for 1..{self.table.shape[0]}")
        base = (np.asarray(context0, dtype=np.float64) * inv).astype(np.int64)
        # per segment k: length drop to the next group and its midpoint's bucket; the last
        # group of a slice runs down to length 0 instead
        diffs = np.append(lengths[:-1] - lengths[1:], 0.0)
        mids = np.append((0.5 * (lengths[:-1] + lengths[1:] + 1.0) * inv).astype(np.int64), 0)
        last_mids = (0.5 * (lengths + 1.0) * inv).astype(np.int64)
        # slices ordered by size, so the terms of equal-size slices are one contiguous block
        order = np.argsort(sizes, kind="stable")
        sizes_o = sizes[order]
        offsets = np.cumsum(sizes_o) - sizes_o
        slice_of = np.repeat(np.arange(len(sizes)), sizes_o)
        pos = np.arange(int(sizes_o.sum())) - offsets[slice_of]  # group index within its slice
        k = starts[order][slice_of] + pos  # index in the ranking
        is_last = pos == sizes_o[slice_of] - 1
        coef = np.where(is_last, lengths[k], diffs[k])
        col = base[order][slice_of] + np.where(is_last, last_mids[k], mids[k])
        terms = coef * self.table[pos, col]
        totals = np.empty(len(sizes))
        bounds = np.flatnonzero(np.diff(sizes_o, prepend=-1, append=-1)).tolist()
        sizes_l, offsets_l = sizes_o.tolist(), offsets.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            block = terms[offsets_l[a]:offsets_l[a] + (b - a) * sizes_l[a]].reshape(b - a, -1)
            totals[order[a:b]] = np.cumsum(block, axis=1)[:, -1]
        return totals.tolist()


def decode_time_desc(lengths_desc: Sequence[float], group_size: int, context0: float,
                     tpot: TpotFn) -> float:
    """Shrinking-batch decode time of groups sorted by length, longest first.

    Args:
        lengths_desc: one length (tokens) per group, non-increasing.
        group_size: samples per group; every sample of a group has the group's length.
        context0: prompt length (tokens) the context starts from.
        tpot: ``tpot(batch, context) -> seconds`` (see ``TpotProfile.tpot_fn``).
    Returns:
        seconds of decoding until the longest group finishes.
    """
    total = 0.0
    n = len(lengths_desc)
    for j in range(n):
        hi = lengths_desc[j]
        lo = lengths_desc[j + 1] if j + 1 < n else 0.0
        if hi > lo:
            total += (hi - lo) * tpot((j + 1) * group_size, context0 + 0.5 * (hi + lo + 1.0))
    return total


def decode_time(lengths: Sequence[float], prompt_len: float, profile: TpotProfile) -> float:
    """Shrinking-batch decode time for one actor; ``lengths`` has one entry per SAMPLE."""
    if not lengths:
        return 0.0
    counts: dict[float, int] = {}
    for length in lengths:
        counts[length] = counts.get(length, 0) + 1
    tpot = profile.tpot_fn()
    total, alive = 0.0, len(lengths)
    distinct = sorted(counts)
    lo = 0.0
    for hi in distinct:  # ascending: the batch holds every sample not yet finished
        if hi > lo:
            total += (hi - lo) * tpot(alive, prompt_len + 0.5 * (hi + lo + 1.0))
        alive -= counts[hi]
        lo = hi
    return total


def estimate_actor_time(lengths: Sequence[float], prompt_len: float, profile: TpotProfile,
                        *, prefill_tokens: float = 0.0) -> float:
    """Seconds for one actor to prefill ``prefill_tokens`` and decode ``lengths``.

    Args:
        lengths: predicted response length (tokens) of every sample on the actor.
        prompt_len: mean prompt length (tokens) of those samples.
        profile: TPOT profile for the actor's GPU count.
        prefill_tokens: prompt tokens this actor computes itself (0 when it receives the
            prefix KV from the prefill actor).
    """
    return prefill_tokens / profile.prefill_tokens_per_s + decode_time(lengths, prompt_len, profile)


def brute_force_decode_time(lengths: Sequence[int], prompt_len: float,
                            profile: TpotProfile) -> float:
    """Reference O(tokens) sum of TPOT per decode step (tests and checks only)."""
    total = 0.0
    for t in range(1, int(max(lengths, default=0)) + 1):
        alive = sum(1 for length in lengths if length >= t)
        total += profile.tpot(alive, prompt_len + t)
    return total


def actor_cost(time_s: float, gpus: int, price_per_gpu_second: float) -> float:
    """Money for holding ``gpus`` GPUs for ``time_s`` seconds (paper §3.5 C = rho * T * G)."""
    return time_s * gpus * price_per_gpu_second
