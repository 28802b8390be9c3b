"""Prompt-to-actor assignment (paper §3.3, §3.6).

- ``assign_ranked``: sort prompts by predicted length, longest first (ties broken by prompt
  id so the plan is deterministic), and cut the sorted list into ``N`` contiguous slices whose
  sizes differ by at most one (the first ``len % N`` slices get the extra prompt). Actor 0 gets
  the longest slice and is the one co-located with the learner/prefill actor (§3.6), so the
  longest-running actor pays no weight or KV transfer. Actors with short prompts finish and are
  released early.
- ``assign_round_robin``: the ablation baseline ("no ranked assignment"): prompt ``k`` of the
  given order goes to actor ``k % N``. (A third-party re-implementation round-robins the
  *sorted* list; that contradicts the paper's grouping idea and is not done here.)
- ``assign_contiguous``: equal contiguous slices of the given order, used by ``fixed:N`` /
  the static serverful baseline (a plain data-parallel split of the batch, as VERL does).

Assignment is per prompt: all ``n`` samples of a GRPO prompt stay on one actor, so one KV
transfer serves them all [I]. ``num_actors`` is capped at ``len(prompt_ids)`` so that no slice
is empty.
"""

from __future__ import annotations

from typing import Mapping, Sequence

Assignment = tuple[tuple[int, ...], ...]


def _check(prompt_ids: Sequence[int], num_actors: int) -> int:
    if not prompt_ids:
        raise ValueError("prompt_ids: empty; a generation phase needs at least one prompt")
    if num_actors < 1:
        raise ValueError(f"num_actors={num_actors}: must be >= 1")
    if len(set(prompt_ids)) != len(prompt_ids):
        raise ValueError("prompt_ids: duplicates; each prompt is assigned once with all its "
                         "samples")
    return min(num_actors, len(prompt_ids))


def rank_prompts(prompt_ids: Sequence[int], predicted: Mapping[int, float]) -> list[int]:
    """Prompt ids sorted by predicted length, longest first, ties by ascending id."""
    return sorted(prompt_ids, key=lambda pid: (-predicted[pid], pid))


def split_sizes(num_items: int, num_parts: int) -> list[int]:
    """Near-equal part sizes, larger parts first (sizes differ by at most one)."""
    base, extra = divmod(num_items, num_parts)
    return [base + (1 if i < extra else 0) for i in range(num_parts)]


def assign_contiguous(prompt_ids: Sequence[int], num_actors: int) -> Assignment:
    """Contiguous near-equal slices of ``prompt_ids`` in the given order."""
    n = _check(prompt_ids, num_actors)
    out, start = [], 0
    for size in split_sizes(len(prompt_ids), n):
        out.append(tuple(prompt_ids[start:start + size]))
        start += size
    return tuple(out)


def assign_ranked(prompt_ids: Sequence[int], predicted: Mapping[int, float],
                  num_actors: int) -> Assignment:
    """Contiguous slices of the length ranking; actor 0 gets the longest prompts."""
    _check(prompt_ids, num_actors)
    return assign_contiguous(rank_prompts(prompt_ids, predicted), num_actors)


def assign_round_robin(prompt_ids: Sequence[int], num_actors: int) -> Assignment:
    """Baseline: prompt ``k`` of the given order goes to actor ``k % num_actors``. Given the
    length ranking (longest first), it is the striped plan: every actor holds a like mix of
    predicted lengths (``robust.py``)."""
    n = _check(prompt_ids, num_actors)
    return tuple(tuple(prompt_ids[i::n]) for i in range(n))

