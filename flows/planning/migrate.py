"""Cut-and-migrate bookkeeping (PAPER §3.4).

Each decode actor has a cutting threshold ``tau in (0, 1]``. When ``cut_point(n, tau)`` of its
``n`` samples have finished, the actor is cut: its unfinished samples are moved elsewhere and
its GPUs are released. Definitions [I]:

- ``cut_point(n, tau) = ceil(tau * n)`` computed with a small tolerance (``0.7 * 10`` is
  ``7.000000000000001`` in floating point and must give 7, not 8). The cut only happens while
  some samples are unfinished, so ``tau = 1`` never cuts, and an actor with a single sample is
  never cut (its cut point is 1 = all done).
- Destinations (the paper's rule): other still-running actors with free slots, where an
  actor's slots are the samples it was planned for; slots free up as over-estimated samples
  finish. ``choose_destinations`` fills the actors with the most free slots first and is
  all-or-nothing: a partial move would not let the source actor release its GPUs, so the cut
  waits (the paper: no free slots, no cut).
- Live flows run cut samples as separate continuation actions. ``plan_continuations`` batches
  partial samples that arrive within ``window_s`` of the first one of a batch into actions of at
  most ``max_batch`` samples, in arrival order.

What a migration moves (token ids + re-prefill, or KV blocks) is the executor's choice; the
bookkeeping here is the same for both. All functions are pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


def cut_point(num_samples: int, tau: float) -> int:
    """Number of finished samples at which an actor of ``num_samples`` is cut."""
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"cut_threshold={tau}: must be in (0, 1] (1 = never cut)")
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples}: must be >= 1")
    return max(1, min(num_samples, math.ceil(tau * num_samples - 1e-9)))


def should_cut(num_samples: int, num_finished: int, tau: float) -> bool:
    """True when the actor has reached its cut point and still has unfinished samples."""
    return num_finished < num_samples and num_finished >= cut_point(num_samples, tau)


def choose_destinations(num_to_move: int, free_slots: Mapping[int, int],
                        prefer: Sequence[int] | None = None) -> dict[int, int] | None:
    """Spread ``num_to_move`` samples over actors' free slots.

    Args:
        num_to_move: unfinished samples of the actor being cut.
        free_slots: running actor id -> free slots.
        prefer: actor ids in the order to fill; default: most free slots first (ties by id).
    Returns:
        actor id -> number of samples, or None when the free slots cannot take them all.
    """
    if num_to_move <= 0:
        return {}
    if sum(max(0, s) for s in free_slots.values()) < num_to_move:
        return None
    if prefer is None:
        prefer = sorted(free_slots, key=lambda a: (-free_slots[a], a))
    out: dict[int, int] = {}
    left = num_to_move
    for actor_id in prefer:
        slots = free_slots.get(actor_id, 0)
        take = min(slots, left)
        if take > 0:
            out[actor_id] = take
            left -= take
        if left == 0:
            break
    return out if left == 0 else None


@dataclass(frozen=True)
class PartialSample:
    """An unfinished sample cut from an actor (ids only; state lives in the object store)."""

    actor_id: int
    sample_id: int
    arrival_s: float
    remaining_tokens: float


@dataclass(frozen=True)
class Continuation:
    """One continuation action: the samples it resumes and when it can start."""

    start_s: float
    sample_ids: tuple[int, ...]
    predicted_tokens: float  # the longest predicted remainder: what the action will run for


def plan_continuations(partials: Sequence[PartialSample], *, window_s: float,
                       max_batch: int) -> list[Continuation]:
    """Greedy batching of cut samples into continuation actions.

    A batch opens at the earliest pending arrival and takes every later sample arriving within
    ``window_s`` of it, up to ``max_batch``; it starts when its last sample has arrived.
    """
    if max_batch < 1:
        raise ValueError(f"migrate.max_batch={max_batch}: must be >= 1")
    if window_s < 0:
        raise ValueError(f"migrate.window_s={window_s}: must be >= 0")
    pending = sorted(partials, key=lambda p: (p.arrival_s, p.actor_id, p.sample_id))
    out: list[Continuation] = []
    i = 0
    while i < len(pending):
        first = pending[i].arrival_s
        batch = [pending[i]]
        i += 1
        while (i < len(pending) and len(batch) < max_batch
               and pending[i].arrival_s - first <= window_s):
            batch.append(pending[i])
            i += 1
        out.append(Continuation(batch[-1].arrival_s, tuple(p.sample_id for p in batch),
                                max(p.remaining_tokens for p in batch)))
    return out
