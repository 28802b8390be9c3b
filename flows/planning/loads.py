"""Per-actor loads of candidate plans: the ranking, its slices, and their predicted decode times.

``scaling.plan_generation`` times many candidate assignments per call. Each is reduced to a
``Loads``: per actor, the decode seconds (``cost.DecodeEstimator``, plus the prefill of the
prompt suffixes the action computes itself after a dedup prefill, ``Env.own_s``), the prompt
tokens (which set its KV transfer, ``timeline.actor_start``), the longest predicted group
length and the number of groups. Contiguous slices of the ranking (equal counts, budget-sized, or a striped
permutation of it) are timed in numpy sweeps, many plans at once; explicit assignments
(round-robin, contiguous in the given order) group by group.

Budget-sized slices (``budget_slices``): the ranking cut into ``n`` contiguous slices, filled
longest first within a time budget; ``scaling.py``'s module docstring says when and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from flows.planning.assignment import assign_contiguous, assign_ranked, assign_round_robin, rank_prompts, split_sizes
from flows.planning.cost import DecodeEstimator
from flows.planning.plan import ClusterSpec
from flows.planning.timeline import actor_start, prefill_seconds
from flows.planning.tpot import CONTEXT_BUCKET, TpotProfile


class Loads(NamedTuple):
    """Per actor of one plan (actor 0 first)."""

    decode: list[float]
    """Predicted decode seconds; with a robust tail (``robust.stress_plans``) the stressed ones."""
    tokens: list[float]
    """Prompt tokens."""
    longest: list[float]
    """Longest predicted group length (tokens)."""
    groups: list[int]
    """Number of prompt groups."""
    point: list[float] | None = None
    """The point estimate's decode seconds where ``decode`` is stressed (the §3.6 feasibility
    check is made on it, ``timeline.evaluate_candidate``); None: ``decode`` is the point estimate."""


@dataclass(frozen=True)
class Env:
    """Per-call constants of the time/cost model."""

    decode: DecodeEstimator
    prefill_s: float
    own_s: Mapping[int, float]
    """Prompt id -> seconds its generation action prefills before decoding (the prompt suffix
    after the dedup prefix); empty: none (``PlannerSettings.own_prefill_tokens``)."""


def sorted_lengths(pids: Sequence[int], predicted: Mapping[int, float]) -> list[float]:
    return sorted((float(predicted[p]) for p in pids), reverse=True)


def ranked_loads(ns: range, ranking: "Ranking", env: Env) -> list[Loads]:
    """Per actor (decode seconds, prompt tokens, longest predicted length, group count) for
    ranked slices, for every N in ``ns`` (the fast path: all candidates' slices at once, in
    numpy; the same numbers as slicing with ``split_sizes`` and timing each with ``slice_timer``)."""
    starts, sizes = equal_slices(ns, len(ranking.order))
    sums = np.asarray(ranking.token_sums)
    tokens = sums[starts + sizes] - sums[starts]
    decode = _with_own(env.decode.sweep(ranking.lengths, starts, starts + sizes, tokens / sizes),
                       ranking.own_sums, starts, starts + sizes)
    tokens_l, out, j = tokens.tolist(), [], 0
    longest, sizes_l = np.asarray(ranking.lengths)[starts].tolist(), sizes.tolist()
    for count in ns:
        out.append(Loads(decode[j:j + count], tokens_l[j:j + count], longest[j:j + count],
                         sizes_l[j:j + count]))
        j += count
    return out


def equal_slices(ns: range, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) of the equal-count slices of a ranking of ``m`` groups (``split_sizes``:
    the first ``m % N`` slices get one more), for every N in ``ns``, one N after another."""
    counts = np.arange(ns.start, ns.stop)
    n = np.repeat(counts, counts)  # the N of each slice
    i = np.arange(len(n)) - np.repeat(np.cumsum(counts) - counts, counts)  # index within its N
    base, extra = m // n, m % n
    return i * base + np.minimum(i, extra), base + (i < extra)


def slice_loads(sizes: Sequence[int], ranking: "Ranking", env: Env,
                 perm: Sequence[int] | None = None) -> Loads:
    """Per actor: decode seconds, prompt tokens, longest predicted length and group count for
    consecutive slices of these sizes of the ranking (``DecodeEstimator.sweep``, as
    ``ranked_loads`` times equal slices), or of the ranking reordered by ``perm`` (striped
    plans: each actor's groups made contiguous, still longest first; the permutations of
    several plans may be concatenated, their slices then cover them one after another)."""
    sizes_a = np.asarray(sizes, dtype=np.int64)
    starts = np.cumsum(sizes_a) - sizes_a
    lengths = np.asarray(ranking.lengths)
    prompt = np.diff(np.asarray(ranking.token_sums))
    if perm is not None:
        lengths, prompt = lengths[perm], prompt[perm]
    sums = np.concatenate(([0.0], np.cumsum(prompt)))
    tokens = sums[starts + sizes_a] - sums[starts]
    decode = env.decode.sweep(lengths, starts, starts + sizes_a, tokens / sizes_a)
    own = ranking.own_sums
    if own is not None and perm is not None:
        own = np.concatenate(([0.0], np.cumsum(np.diff(np.asarray(own))[perm])))
    decode = _with_own(decode, own, starts, starts + sizes_a)
    return Loads(decode, tokens.tolist(), lengths[starts].tolist(), sizes_a.tolist())


def _with_own(decode: list[float], own_sums, starts, ends) -> list[float]:
    """``decode`` plus each slice's own prefill seconds (prefix sums ``own_sums`` along the
    ranking; None: none, ``decode`` unchanged)."""
    if own_sums is None:
        return decode
    own = np.asarray(own_sums)
    return (np.asarray(decode) + own[np.asarray(ends)] - own[np.asarray(starts)]).tolist()



def group_loads(groups: Sequence[Sequence[int]], predicted: Mapping[int, float],
                 prompt_lengths: Mapping[int, int], env: Env) -> Loads:
    """Per actor, for an explicit assignment: decode seconds, prompt tokens, longest predicted
    length and group count."""
    decode, tokens, longest = [], [], []
    for pids in groups:
        tok = float(sum(prompt_lengths[p] for p in pids))
        lengths = sorted_lengths(pids, predicted)
        own = sum(env.own_s.get(p, 0.0) for p in pids) if env.own_s else 0.0
        decode.append(env.decode.time_desc(lengths, tok / len(pids)) + own)
        tokens.append(tok)
        longest.append(lengths[0])
    return Loads(decode, tokens, longest, [len(g) for g in groups])


def make_env(prompt_ids: Sequence[int], predicted: Mapping[int, float],
         prompt_lengths: Mapping[int, int], group_size: int, profile: TpotProfile,
         cluster: ClusterSpec, prefill_tokens: float | None, max_groups: int,
         own_prefill_tokens: Mapping[int, int] | None = None) -> Env:
    """The call's constants: ``prefill_tokens`` on the prefill action (default: every prompt),
    ``own_prefill_tokens`` per prompt on its generation action (``PlannerSettings``)."""
    tokens = (float(sum(prompt_lengths[p] for p in prompt_ids)) if prefill_tokens is None
              else float(prefill_tokens))
    max_context = (max(prompt_lengths[p] for p in prompt_ids)
                   + max(predicted[p] for p in prompt_ids))
    decode = DecodeEstimator(profile, group_size, max_groups, max_context)
    rate = profile.prefill_tokens_per_s
    own = {p: own_prefill_tokens.get(p, 0) / rate for p in prompt_ids} if own_prefill_tokens else {}
    return Env(decode, prefill_seconds(tokens, profile, cluster), own)


@dataclass(frozen=True)
class Ranking:
    order: list[int]
    token_sums: list[float]  # prefix sums of prompt tokens along the ranking
    lengths: list[float]  # predicted length along the ranking (non-increasing)
    own_sums: list[float] | None = None  # prefix sums of Env.own_s along the ranking; None: none


def make_ranking(prompt_ids: Sequence[int], predicted: Mapping[int, float],
             prompt_lengths: Mapping[int, int], own_s: Mapping[int, float] | None = None) -> Ranking:
    order = rank_prompts(prompt_ids, predicted)
    sums = [0.0]
    for pid in order:
        sums.append(sums[-1] + prompt_lengths[pid])
    own = np.concatenate(([0.0], np.cumsum([own_s.get(p, 0.0) for p in order]))).tolist() if own_s else None
    return Ranking(order, sums, [float(predicted[p]) for p in order], own)


def candidate_loads(ns: range, prompt_ids: Sequence[int], ranking: Ranking, assignment: str,
                     predicted: Mapping[int, float], prompt_lengths: Mapping[int, int],
                     env: Env) -> list[Loads]:
    if assignment == "ranked":
        return ranked_loads(ns, ranking, env)
    return [group_loads(assign_groups(n, prompt_ids, predicted, assignment), predicted,
                         prompt_lengths, env) for n in ns]


def assign_groups(n: int, prompt_ids: Sequence[int], predicted: Mapping[int, float],
            assignment: str) -> tuple[tuple[int, ...], ...]:
    if assignment == "ranked":
        return assign_ranked(prompt_ids, predicted, n)
    if assignment == "contiguous":
        return assign_contiguous(prompt_ids, n)
    return assign_round_robin(prompt_ids, n)


def budget_slices(ranking: Ranking, n: int, env: Env, cluster: ClusterSpec,
                   slack: float, ends_from=None) -> tuple[tuple[int, ...], ...]:
    """``n`` contiguous slices of the ranking, filled longest first within a time budget.

    Each actor's predicted end is its start (``timeline.actor_start``: prefill, transfers)
    plus its slice's decode time. ``fill(cap)`` gives every actor but the last the most groups
    whose end stays within ``cap`` (at least one group each, leaving one for every later actor);
    it fails when the last actor's rest ends after ``cap``. The balanced time is the smallest
    ``cap`` that ``fill`` meets (bisection to 0.1%, starting from equal counts, which it always
    meets); the slices returned are ``fill(min((1 + slack) * balanced, equal-count time))``.

    Moving a boundary towards the short end moves one group to the longer slice, where it
    decodes alongside longer groups, and takes the longest group off the shorter slice, which
    then runs fewer steps; with a TPOT that grows linearly in the batch the total GPU-s does
    not rise, which is why filling the long slices first is the cheap way to use the budget.

    ``ends_from`` (``cost_aware``'s extra candidates, timed exactly afterwards: ``slice_ends``
    of the ranking, shared by every N): every slice starts
    from the step's mean prompt length (``slice_ends``), which makes the search a few numpy
    passes instead of ~10^5 table reads; ``fixed:N`` sizes with each slice's own context.
    """
    m = len(ranking.order)
    end = _slice_end(ranking, env, cluster, ends_from)
    fill = _filler(end, n, m)
    equal = [0]
    for size in split_sizes(m, n):
        equal.append(equal[-1] + size)
    hi = equal_end = max(end(a, i, j) for a, (i, j) in enumerate(zip(equal, equal[1:])))
    if fill(hi) is None:  # only where a slice's time is not monotone in its size
        return assign_contiguous(ranking.order, n)
    lo = end(0, 0, 1)  # no slicing beats the longest group alone on actor 0
    while hi - lo > (1e-3 if ends_from is None else 5e-3) * hi:  # candidates are timed exactly after
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fill(mid) is not None else (mid, hi)
    bounds = fill(min(hi * (1.0 + slack), equal_end)) or fill(hi)
    return tuple(tuple(ranking.order[i:j]) for i, j in zip(bounds, bounds[1:]))


EndFn = Callable[[int, int, int], float]


def _slice_end(ranking: Ranking, env: Env, cluster: ClusterSpec, ends_from=None) -> EndFn:
    """``end(actor, i, j)``: predicted end of ``actor`` holding ranking slice ``i:j``, memoised
    (``budget_slices``: from ``ends_from`` where given, else each slice timed with its own context)."""
    sums = ranking.token_sums
    if ends_from is not None:
        cache: dict[tuple[int, int], list[float]] = {}  # the bisection revisits most starts

        def end(actor: int, i: int, j: int) -> float:
            row = cache.get((actor, i))
            if row is None:
                row = cache[(actor, i)] = ends_from(actor, i)
            return row[j - i - 1]
        return end
    timer = env.decode.slice_timer(ranking.lengths)
    memo: dict[tuple[int, int, int], float] = {}

    def timed(actor: int, i: int, j: int) -> float:
        value = memo.get((actor, i, j))
        if value is None:
            tokens = sums[j] - sums[i]
            ready = actor_start(actor, cluster, env.prefill_s, tokens).ready_s
            own = 0.0 if ranking.own_sums is None else ranking.own_sums[j] - ranking.own_sums[i]
            value = memo[(actor, i, j)] = ready + timer(i, j, tokens / (j - i)) + own
        return value
    return timed


def _filler(end: EndFn, n: int, m: int) -> Callable[[float], list[int] | None]:
    """``fill(cap)`` of ``budget_slices``: the slice bounds, or None where ``cap`` is not met."""

    def fill(cap: float) -> list[int] | None:
        bounds, i = [0], 0
        for actor in range(n - 1):
            lo, hi = i + 1, m - (n - 1 - actor)
            if end(actor, i, lo) > cap:
                return None
            step = 1  # gallop first: slices of the long groups are short, and short is cheap
            while lo + step <= hi and end(actor, i, lo + step) <= cap:
                lo, step = lo + step, 2 * step
            hi = min(hi, lo + step - 1)
            while lo < hi:  # the largest end index within the cap (end grows with the slice)
                mid = (lo + hi + 1) // 2
                if end(actor, i, mid) <= cap:
                    lo = mid
                else:
                    hi = mid - 1
            bounds.append(lo)
            i = lo
        if end(n - 1, i, m) > cap:
            return None
        return bounds + [m]
    return fill


def slice_ends(ranking: Ranking, env: Env, cluster: ClusterSpec):
    """``ends_from(actor, i)``: predicted end of ``actor`` holding ranking slice ``i:j``, for
    every ``j`` in ``i + 1 .. m`` (one numpy pass per start; the budget slicing asks for many
    ends of few starts). The decode part is ``DecodeEstimator.slice_timer``'s sum with the
    step's mean prompt length as every slice's starting context (one context bucket for all
    slices, so one ``cumsum`` serves every end; the chosen slices are then timed exactly)."""
    inv = 1.0 / CONTEXT_BUCKET
    lengths = np.asarray(ranking.lengths, dtype=np.float64)
    sums = np.asarray(ranking.token_sums, dtype=np.float64)
    m = len(lengths)
    table = env.decode.table
    base = int(sums[-1] / m * inv)
    diffs = lengths[:-1] - lengths[1:]
    cols = base + (0.5 * (lengths[:-1] + lengths[1:] + 1.0) * inv).astype(np.int64)
    last_cols = base + (0.5 * (lengths + 1.0) * inv).astype(np.int64)
    rows = np.arange(m)
    kv_per_token = cluster.kv_bytes_per_token / cluster.transfer_bandwidth_bytes_per_s
    own = None if ranking.own_sums is None else np.asarray(ranking.own_sums, dtype=np.float64)

    decodes: dict[int, np.ndarray] = {}  # start -> decode time of every end; shared by all N
    rows_out: dict[tuple[float, int], list[float]] = {}  # (actor's zero-token ready, start)

    def ends_from(actor: int, i: int) -> list[float]:
        local = actor < cluster.colocated_actors  # no KV transfer
        ready0 = actor_start(actor, cluster, env.prefill_s, 0.0).ready_s
        key = (ready0 if not local else -1.0, i)
        out = rows_out.get(key)
        if out is None:
            decode = decodes.get(i)
            if decode is None:
                partial = np.concatenate(([0.0], np.cumsum(diffs[i:] * table[rows[:m - 1 - i], cols[i:]])))
                pos = rows[:m - i]  # slice i:j has j - i groups; its last is at pos j - 1 - i
                decode = decodes[i] = partial[pos] + lengths[i:] * table[pos, last_cols[i:]]
            ready = ready0
            if not local:  # the slice's prompts' KV arrives after the prefill (timeline.actor_start)
                ready = ready0 + kv_per_token * (sums[i + 1:] - sums[i])
            if own is not None:  # the suffixes the action prefills itself
                ready = ready + (own[i + 1:] - own[i])
            out = rows_out[key] = (ready + decode).tolist()
        return out
    return ends_from
