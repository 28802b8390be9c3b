"""A length-based reward for benchmarks on random-weight models (TRL's reward signature).

A random policy's completions carry no meaning, so a task reward would be 0 everywhere and
GRPO's advantages with it; the completion's length in tokens gives every group a spread
(lengths vary once the model can stop: ``bench_vs_trl.py --stop-rate``). Used by both systems
in ``bench_vs_trl.py``, so they optimise the same objective.
"""

from __future__ import annotations

MAX_TOKENS = 256
"""Lengths at or above this earn the full reward of 1."""


def length_reward(completions: list, completion_ids: list[list[int]], **kwargs: object) -> list[float]:
    """``min(len(ids), MAX_TOKENS) / MAX_TOKENS`` per completion (the stop token counts, as trained)."""
    return [min(len(ids), MAX_TOKENS) / MAX_TOKENS for ids in completion_ids]
