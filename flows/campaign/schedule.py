"""Which prompts a step trains on: epochs of seeded permutations, consumed in order.

Pure and deterministic: step s takes the next ``per_step`` prompts of an endless sequence made
of one seeded permutation per epoch, so a resumed campaign sees exactly the prompts an
uninterrupted one would. The epoch of a step (for the length history) is the epoch of its
first prompt.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def epoch_order(prompt_ids: Sequence[int], epoch: int, seed: int) -> list[int]:
    order = sorted(prompt_ids)
    random.Random(seed * 7_919 + epoch).shuffle(order)
    return order


def step_prompts(prompt_ids: Sequence[int], per_step: int, step: int, seed: int) -> tuple[int, list[int]]:
    """(epoch, prompt ids) of ``step``; prompts never repeat within a step."""
    n = len(prompt_ids)
    if not 0 < per_step <= n:
        raise ValueError(f"per_step={per_step} must be in 1..{n} (the number of prompts)")
    start = step * per_step
    epoch = start // n
    out: list[int] = []
    orders: dict[int, list[int]] = {}  # a step spans at most two epochs: one shuffle each, not one per prompt
    pos = start
    while len(out) < per_step:
        e, i = divmod(pos, n)
        if e not in orders:
            orders[e] = epoch_order(prompt_ids, e, seed)
        pid = orders[e][i]
        if pid not in out:
            out.append(pid)
        pos += 1
    return epoch, out
