"""Which sequences share a padded prefill call: one call per length bucket, where it pays.

A prefill call pads its sequences to the longest one, so a call that mixes a 40-token and a
600-token prompt computes 560 tokens for nothing; splitting every sequence into its own call
wastes nothing on padding but pays a call's fixed cost each time (on a GPU a forward's kernel
launches, tens of milliseconds for a 24-layer model; on the CPU a fraction of a millisecond).
``plan_prefill_calls`` picks the split that minimises

    calls x call_tokens + padded tokens computed

where ``call_tokens`` prices one call in tokens of compute (``CALL_TOKENS`` by device type).
Sequences are taken in length order, so each call is a run of similar lengths; an exact
dynamic programme over the distinct lengths finds the best split. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CALL_TOKENS", "plan_prefill_calls"]

CALL_TOKENS = {"cpu": 64, "cuda": 16384}
"""What one more prefill call costs, in tokens of padded compute, per device type. On the CPU
a forward's fixed cost is close to a few dozen tokens' arithmetic of a small model; on a GPU a
forward is launch-bound until it holds thousands of tokens. Other device types use ``cuda``'s."""


def plan_prefill_calls(lengths: Sequence[int], call_tokens: float) -> list[list[int]]:
    """Indices of ``lengths`` grouped into prefill calls (each group: increasing indices;
    groups in increasing length). ``call_tokens``: the price of one call in tokens (0: one call
    per distinct length; ``float("inf")``: one call for all). Empty input: no calls.

    Minimises ``len(groups) * call_tokens + sum(len(g) * max length in g)`` over splits of the
    length-sorted sequences into contiguous runs (any optimal split is such a run: moving a
    sequence into the run of its length neighbours never pads more)."""
    if not lengths:
        return []
    if call_tokens == float("inf"):
        return [list(range(len(lengths)))]
    distinct = sorted(set(lengths))
    count = {n: 0 for n in distinct}
    for n in lengths:
        count[n] += 1
    before = [0]  # sequences shorter than distinct[i]
    for n in distinct:
        before.append(before[-1] + count[n])
    # best[j]: the cheapest split of the sequences of the j shortest distinct lengths
    best = [0.0] + [float("inf")] * len(distinct)
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        longest = distinct[j - 1]
        for i in range(j):
            cost = best[i] + call_tokens + (before[j] - before[i]) * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], len(distinct)
    while j > 0:
        runs.append((distinct[cut[j]], distinct[j - 1]))
        j = cut[j]
    runs.reverse()
    return [[k for k, n in enumerate(lengths) if lo <= n <= hi] for lo, hi in runs]
