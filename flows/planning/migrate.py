"""Cut-and-migrate bookkeeping (paper §3.4).

Each decode actor has a cutting threshold ``cut_threshold in (0, 1]`` (``generation.cut_threshold``;
the paper's tau). When ``cut_point(n, cut_threshold)`` of its
``n`` samples have finished, the actor is cut: its unfinished samples are moved elsewhere and
its GPUs are released. Definitions [I]:

- ``cut_point(n, cut_threshold) = ceil(cut_threshold * n)`` computed with a small tolerance (``0.28 * 25`` is
  ``7.000000000000001`` in floating point and must give 7, not 8). The cut only happens while
  some samples are unfinished, so a threshold of 1 never cuts, and an actor with a single sample is
  never cut (its cut point is 1 = all done).
- Which actors get a cut point (``plan_cut_points``): a cut pays only where another actor is
  still decoding when this one reaches its cut point. Its cut samples then share decode steps
  with others (a running actor's free slots, or one continuation that batches several actors'
  stragglers), so the source's tail is billed once instead of twice. An actor predicted to reach
  its cut point after every other actor has finished (a tie counts as still running; under
  ranked assignment, typically the one holding the longest groups; always a lone actor) would
  move its tail, unshortened, into a continuation that starts only after a start-up and a
  re-prefill: the same GPU-seconds plus the start-up, and a longer phase. It runs to
  completion instead.
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

from flows.planning import charges
from flows.planning.cost import decode_time
from flows.planning.tpot import TpotProfile


def cut_point(num_samples: int, cut_threshold: float) -> int:
    """Number of finished samples at which an actor of ``num_samples`` is cut."""
    if not 0.0 < cut_threshold <= 1.0:
        raise ValueError(f"generation.cut_threshold={cut_threshold}: must be in (0, 1] (1 = never cut)")
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples}: must be >= 1")
    return max(1, min(num_samples, math.ceil(cut_threshold * num_samples - 1e-9)))


def should_cut(num_samples: int, num_finished: int, cut_threshold: float) -> bool:
    """True when the actor has reached its cut point and still has unfinished samples."""
    return num_finished < num_samples and num_finished >= cut_point(num_samples, cut_threshold)


def plan_cut_points(actor_lengths: Sequence[Sequence[float]], prompt_lens: Sequence[float],
                    cut_threshold: float | None, profile: TpotProfile,
                    ready_s: Sequence[float] | None = None, migration: str | None = None,
                    kv_s_per_token: float = 0.0) -> list[int | None]:
    """Per actor, the finished-sample count at which it is cut, or None (it runs to the end).

    Args:
        actor_lengths: predicted response length (tokens) of every sample, per actor.
        prompt_lens: mean prompt length (tokens) per actor.
        cut_threshold: the cut threshold; None or 1 never cuts.
        profile: TPOT profile the predicted times come from.
        ready_s: when each actor starts decoding (default: all at 0).
        migration: how cut samples move (``charges.migration_s``: 'reprefill' or 'kv', with
            ``kv_s_per_token``); the cut pays only where the moved samples can decode at their
            destination (cut time + the move's delay) while another actor is still decoding.
            None: the move is free (the live flow's continuations, which the window batches).
    Returns:
        ``cut_point(n, cut_threshold)`` where the cut pays (module docstring), else None.
    """
    if cut_threshold is None or cut_threshold >= 1.0:
        return [None] * len(actor_lengths)
    ready = list(ready_s) if ready_s is not None else [0.0] * len(actor_lengths)
    ends, cuts, points = [], [], []
    for lengths, prompt_len, start in zip(actor_lengths, prompt_lens, ready, strict=True):
        n = len(lengths)
        point = cut_point(n, cut_threshold) if n > 1 else None
        ends.append(start + decode_time(lengths, prompt_len, profile))
        if point is None:
            cuts.append(math.inf)
        else:  # decoding until the point-th shortest sample finishes
            at = sorted(lengths)[point - 1]
            cut_s = start + decode_time([min(x, at) for x in lengths], prompt_len, profile)
            if migration is not None:  # the unfinished samples' context moves: shared charge
                moved = sum(prompt_len + at for x in lengths if x > at)
                cut_s += charges.migration_s(moved, migration, profile, kv_s_per_token).delay_s
            cuts.append(cut_s)
        points.append(point)
    out: list[int | None] = []
    for i, (point, cut_s) in enumerate(zip(points, cuts)):
        others = max((e for j, e in enumerate(ends) if j != i), default=-math.inf)
        out.append(point if point is not None and cut_s <= others else None)
    return out


def plan_cut_points_of(assignments: Sequence[Sequence[int]], predicted: Mapping[int, float],
                       samples_per_prompt: Mapping[int, int], prompt_lengths: Mapping[int, float],
                       cut_threshold: float | None, profile: TpotProfile,
                       ready_s: Sequence[float] | None = None, migration: str | None = None,
                       kv_s_per_token: float = 0.0) -> list[int | None]:
    """``plan_cut_points`` of a plan: prompt ids per actor, every sample of a prompt at the
    prompt's predicted length, each actor at the mean prompt length of its prompts."""
    return plan_cut_points(
        [[predicted[p] for p in pids for _ in range(samples_per_prompt[p])] for pids in assignments],
        [sum(prompt_lengths[p] for p in pids) / len(pids) for pids in assignments],
        cut_threshold, profile, ready_s, migration, kv_s_per_token)


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
        raise ValueError(f"plan_continuations: max_batch={max_batch}; pass 1 or more samples per continuation")
    if window_s < 0:
        raise ValueError(f"generation.migrate_window_s={window_s}: must be >= 0 seconds")
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
