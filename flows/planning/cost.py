"""Per-actor time and cost estimates from a TPOT profile (PAPER §3.5, §3.8).

An actor decodes its samples as one continuously batched group; a finished sample leaves the
batch at once, so the batch shrinks as samples finish. With ``alive(t)`` the number of samples
whose length is ``>= t`` and ``P`` the prompt length, the decode time is [I, PAPER §3.5]::

    T_decode = sum_{t=1..max_len} TPOT(alive(t), P + t)

Between two consecutive distinct sorted lengths ``lo < hi`` the batch is constant, so the sum
over ``t = lo+1..hi`` is ``(hi - lo) * TPOT(batch, P + (lo + hi + 1) / 2)`` (context taken at
the segment midpoint; exact where TPOT is linear in context, as the roofline is within one
regime). That makes the estimate O(#distinct lengths) instead of O(tokens), which is what keeps
a full planning sweep within milliseconds. Prefill adds ``prefill_tokens / prefill_tokens_per_s``.

Cost is the paper's proxy [P §3.8]: ``GPU-seconds = time * GPUs``, money = GPU-s * price.
"""

from __future__ import annotations

from itertools import chain, islice
from typing import Callable, Sequence

from flows.planning.profile import CONTEXT_BUCKET, TpotFn, TpotProfile


class DecodeEstimator:
    """Shrinking-batch decode time of groups of ``group_size`` samples, for the planner.

    Rows of TPOT per batch size ``(j + 1) * group_size`` are fetched once per planning call
    (``TpotProfile.bucket_row``), so one segment costs a list index and a multiply-add.
    """

    def __init__(self, profile: TpotProfile, group_size: int, max_groups: int,
                 max_context: float) -> None:
        self.profile = profile
        self.group_size = group_size
        self.rows = [profile.bucket_row((j + 1) * group_size, max_context + 1)
                     for j in range(max_groups)]

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
    """Money for holding ``gpus`` GPUs for ``time_s`` seconds (PAPER §3.5 C = rho * T * G)."""
    return time_s * gpus * price_per_gpu_second
