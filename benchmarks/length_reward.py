"""A length-based reward for benchmarks on random-weight models (TRL's reward signature).

A random policy's completions carry no meaning, so a task reward would be 0 everywhere and
GRPO's advantages with it; the completion's length in tokens gives every group a spread
(lengths vary once the model can stop: ``bench_vs_trl.py --mean-length``). The reward peaks at
``TARGET_TOKENS`` rather than growing with length, so training does not drive every sample to
the length limit and the lengths keep varying from step to step. Used by both systems in
``bench_vs_trl.py``, so they optimise the same objective.
"""

from __future__ import annotations

TARGET_TOKENS = 128
"""The length (stop token included) that earns the full reward of 1: half of ``--size gpu``'s
limit of 256 new tokens."""


def length_reward(completions: list, completion_ids: list[list[int]], **kwargs: object) -> list[float]:
    """``max(0, 1 - |len(ids) - TARGET_TOKENS| / TARGET_TOKENS)`` per completion."""
    return [max(0.0, 1.0 - abs(len(ids) - TARGET_TOKENS) / TARGET_TOKENS) for ids in completion_ids]
