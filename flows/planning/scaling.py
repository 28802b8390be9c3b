"""Cost-aware actor scaling with the locality feasibility check (PAPER §3.5-3.6).

For every candidate ``N in [n_min, min(n_max, #prompts, max_actors)]`` (exhaustive sweep, as in
the paper) the planner builds the assignment, estimates each actor's time and picks::

    N' = argmin_N  lam * T~(N) + (1 - lam) * C~(N)      (min-max normalised over feasible N)

``T(N)`` (latest actor end), ``C(N)`` (GPU-s x price) and the §3.6 feasibility check come
from ``timeline.evaluate_candidate``; each actor's decode time from the shrinking-batch
estimate (cost.py) with every sample of a prompt at the prompt's predicted length. The min-max
ranges are taken over feasible candidates; a zero range normalises to 0. Infeasible candidates
stay in the table with their reason but are not chosen; if no N is feasible the smallest N is
used and ``note`` says so. Ties go to the smaller N.

Assignments: ``ranked`` (the paper), ``round_robin`` (ablation baseline) and ``contiguous``
(equal slices of the given order: the static serverful baseline's data-parallel split).

Policies: ``cost_aware``; ``fixed:N`` (N actors, the configured assignment);
``module:function`` (a user function with this signature returning a
``GenerationPlan``; its output is validated).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from flows.planning.assignment import (assign_contiguous, assign_ranked, assign_round_robin,
                                       rank_prompts)
from flows.planning.cost import DecodeEstimator
from flows.planning.plan import Candidate, ClusterSpec, GenerationPlan
from flows.planning.profile import TpotProfile
from flows.planning.timeline import evaluate_candidate, prefill_seconds

ASSIGNMENTS = ("ranked", "round_robin", "contiguous")


@dataclass(frozen=True)
class _Env:
    """Per-call constants of the time/cost model."""

    decode: DecodeEstimator
    prefill_s: float


def _sorted_lengths(pids: Sequence[int], predicted: Mapping[int, float]) -> list[float]:
    return sorted((float(predicted[p]) for p in pids), reverse=True)


def _ranked_loads(ns: range, ranking: "_Ranking",
                  env: _Env) -> list[tuple[list[float], list[float]]]:
    """Decode seconds and prompt tokens per actor for ranked slices, for every N in ``ns``
    (the fast path: all candidates' slices at once, in numpy; the same numbers as slicing
    with ``split_sizes`` and timing each slice with ``slice_timer``)."""
    m, counts = len(ranking.order), np.arange(ns.start, ns.stop)
    n = np.repeat(counts, counts)  # the N of each slice
    i = np.arange(len(n)) - np.repeat(np.cumsum(counts) - counts, counts)  # index within its N
    base, extra = m // n, m % n
    starts = i * base + np.minimum(i, extra)  # split_sizes: the first m % N slices get one more
    sizes = base + (i < extra)
    sums = np.asarray(ranking.token_sums)
    tokens = sums[starts + sizes] - sums[starts]
    decode = env.decode.sweep(ranking.lengths, starts, starts + sizes, tokens / sizes)
    tokens_l, out, j = tokens.tolist(), [], 0
    for count in ns:
        out.append((decode[j:j + count], tokens_l[j:j + count]))
        j += count
    return out


def _group_loads(groups: Sequence[Sequence[int]], predicted: Mapping[int, float],
                 prompt_lengths: Mapping[int, int], env: _Env) -> tuple[list[float], list[float]]:
    """Decode seconds and prompt tokens per actor for an explicit assignment."""
    decode, tokens = [], []
    for pids in groups:
        tok = float(sum(prompt_lengths[p] for p in pids))
        decode.append(env.decode.time_desc(_sorted_lengths(pids, predicted), tok / len(pids)))
        tokens.append(tok)
    return decode, tokens


def _normalise(value: float, lo: float, hi: float) -> float:
    return 0.0 if hi - lo <= 1e-12 * max(abs(hi), 1.0) else (value - lo) / (hi - lo)


def _score(rows: list[tuple[int, float, float, str]], lam: float,
           price: float) -> tuple[list[Candidate], int | None]:
    """Candidates with normalised scores, and the chosen N (None if none is feasible)."""
    ok = [r for r in rows if not r[3]]
    t_lo, t_hi = min((r[1] for r in ok), default=0.0), max((r[1] for r in ok), default=0.0)
    c_lo, c_hi = min((r[2] for r in ok), default=0.0), max((r[2] for r in ok), default=0.0)
    cands, best, best_score = [], None, 0.0
    for n, t, gs, reason in rows:  # ascending N: strict '<' keeps the smaller N on ties
        score = None
        if not reason:
            score = lam * _normalise(t, t_lo, t_hi) + (1 - lam) * _normalise(gs, c_lo, c_hi)
            if best is None or score < best_score - 1e-12:
                best, best_score = n, score
        cands.append(Candidate(n, t, gs, gs * price, score, not reason, reason))
    return cands, best


def _check_args(prompt_ids: Sequence[int], predicted: Mapping[int, float], group_size: int,
                n_min: int, n_max: int, lam: float, assignment: str,
                cut_threshold: float | None) -> None:
    if not prompt_ids:
        raise ValueError("scaling.prompt_ids: empty; plan a phase with at least one prompt")
    if n_min < 1:
        raise ValueError(f"scaling.n_min={n_min}: must be >= 1")
    if n_min > n_max:
        raise ValueError(f"scaling.n_max={n_max}: smaller than n_min={n_min}; "
                         "set n_max >= n_min")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"scaling.lam={lam}: must be in [0, 1] (1 = fastest, 0 = cheapest)")
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"scaling.assignment={assignment!r}: use one of {ASSIGNMENTS}")
    if cut_threshold is not None and not 0.0 < cut_threshold <= 1.0:
        raise ValueError(f"scaling.cut_threshold={cut_threshold}: must be in (0, 1] "
                         "(1 = never cut) or None")
    if group_size < 1:
        raise ValueError(f"scaling.group_size={group_size}: must be >= 1 (samples per prompt)")
    missing = [p for p in prompt_ids if p not in predicted]
    if missing:
        raise ValueError(f"scaling.predicted: no length for prompts {missing[:5]}; predict "
                         "every prompt (lengths.predict_lengths)")


def _env(prompt_ids: Sequence[int], predicted: Mapping[int, float],
         prompt_lengths: Mapping[int, int], group_size: int, profile: TpotProfile,
         cluster: ClusterSpec, prefill_tokens: float | None, max_groups: int) -> _Env:
    tokens = (float(sum(prompt_lengths[p] for p in prompt_ids)) if prefill_tokens is None
              else float(prefill_tokens))
    max_context = (max(prompt_lengths[p] for p in prompt_ids)
                   + max(predicted[p] for p in prompt_ids))
    decode = DecodeEstimator(profile, group_size, max_groups, max_context)
    return _Env(decode, prefill_seconds(tokens, profile, cluster))


@dataclass(frozen=True)
class _Ranking:
    order: list[int]
    token_sums: list[float]  # prefix sums of prompt tokens along the ranking
    lengths: list[float]  # predicted length along the ranking (non-increasing)


def _ranking(prompt_ids: Sequence[int], predicted: Mapping[int, float],
             prompt_lengths: Mapping[int, int]) -> _Ranking:
    order = rank_prompts(prompt_ids, predicted)
    sums = [0.0]
    for pid in order:
        sums.append(sums[-1] + prompt_lengths[pid])
    return _Ranking(order, sums, [float(predicted[p]) for p in order])


def _candidate_loads(ns: range, prompt_ids: Sequence[int], ranking: _Ranking, assignment: str,
                     predicted: Mapping[int, float], prompt_lengths: Mapping[int, int],
                     env: _Env) -> list[tuple[list[float], list[float]]]:
    if assignment == "ranked":
        return _ranked_loads(ns, ranking, env)
    return [_group_loads(_groups(n, prompt_ids, predicted, assignment), predicted,
                         prompt_lengths, env) for n in ns]


def _groups(n: int, prompt_ids: Sequence[int], predicted: Mapping[int, float],
            assignment: str) -> tuple[tuple[int, ...], ...]:
    if assignment == "ranked":
        return assign_ranked(prompt_ids, predicted, n)
    if assignment == "contiguous":
        return assign_contiguous(prompt_ids, n)
    return assign_round_robin(prompt_ids, n)


def _load_policy(policy: str):
    module_name, _, func_name = policy.partition(":")
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"scaling.policy={policy!r}: cannot import ({exc}); use "
                         "'cost_aware', 'fixed:N' or 'package.module:function'") from exc


def _parse_fixed(policy: str) -> int:
    text = policy.split(":", 1)[1]
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"scaling.policy={policy!r}: fixed needs a positive actor count, "
                         "e.g. 'fixed:3'")
    return int(text)


def plan_generation(prompt_ids: Sequence[int], predicted: Mapping[int, float], *,
                    group_size: int, prompt_lengths: Mapping[int, int], policy: str,
                    n_min: int, n_max: int, lam: float, assignment: str,
                    profile: TpotProfile, cluster: ClusterSpec,
                    cut_threshold: float | None = None,
                    prefill_tokens: float | None = None) -> GenerationPlan:
    """Decide how many decode actors to run and which prompts each gets.

    Args:
        prompt_ids: prompts of this phase (each carries ``group_size`` samples).
        predicted: prompt id -> predicted response length (tokens).
        prompt_lengths: prompt id -> prompt length (tokens).
        policy: 'cost_aware' | 'fixed:N' | 'package.module:function'.
        n_min, n_max: candidate actor-count range (inclusive).
        lam: weight of time in the objective (PAPER default 0.7).
        assignment: 'ranked' (paper), 'round_robin' (ablation baseline) or 'contiguous'.
        profile, cluster: the time and cost model.
        cut_threshold: tau, validated and passed on to user policies (the built-in estimate
            assumes exact predictions, so nothing is cut).
        prefill_tokens: prefill work (``PrefillPlan.tokens_computed``); default: every prompt.
    Returns:
        the plan; ``candidates`` holds every evaluated N.
    """
    start = time.perf_counter()
    _check_args(prompt_ids, predicted, group_size, n_min, n_max, lam, assignment, cut_threshold)
    kwargs = dict(group_size=group_size, prompt_lengths=prompt_lengths, policy=policy,
                  n_min=n_min, n_max=n_max, lam=lam, assignment=assignment, profile=profile,
                  cluster=cluster, cut_threshold=cut_threshold, prefill_tokens=prefill_tokens)
    if policy == "cost_aware" or policy.startswith("fixed:"):
        plan = _plan_builtin(list(prompt_ids), predicted, **kwargs)
    elif ":" in policy:
        plan = _load_policy(policy)(prompt_ids, predicted, **kwargs)
        if not isinstance(plan, GenerationPlan):
            raise ValueError(f"scaling.policy={policy!r}: returned {type(plan).__name__}, "
                             "expected a GenerationPlan")
        plan.validate(list(prompt_ids))
    else:
        raise ValueError(f"scaling.policy={policy!r}: unknown; use 'cost_aware', 'fixed:N' "
                         "or 'package.module:function'")
    return replace(plan, planning_ms=(time.perf_counter() - start) * 1e3)


def _plan_builtin(prompt_ids: list[int], predicted: Mapping[int, float], *, group_size: int,
                  prompt_lengths: Mapping[int, int], policy: str, n_min: int, n_max: int,
                  lam: float, assignment: str, profile: TpotProfile, cluster: ClusterSpec,
                  cut_threshold: float | None, prefill_tokens: float | None) -> GenerationPlan:
    fixed = policy.startswith("fixed:")
    note = ""
    if fixed:
        n_lo = n_hi = min(_parse_fixed(policy), len(prompt_ids))
    else:
        n_hi = min(n_max, len(prompt_ids), cluster.max_actors)
        n_lo = min(n_min, n_hi)
        if n_lo < n_min:
            note = f"n_min={n_min} capped to {n_lo} (prompts/cluster capacity). "
    max_groups = -(-len(prompt_ids) // n_lo)  # the largest actor of the smallest N
    env = _env(prompt_ids, predicted, prompt_lengths, group_size, profile, cluster,
               prefill_tokens, max_groups)
    ranking = _ranking(prompt_ids, predicted, prompt_lengths)
    ns = range(n_lo, n_hi + 1)
    rows = [(n, *evaluate_candidate(*loads, cluster, env.prefill_s)) for n, loads in zip(
        ns, _candidate_loads(ns, prompt_ids, ranking, assignment, predicted, prompt_lengths, env))]
    cands, best = _score(rows, lam, cluster.price_per_gpu_second)
    if best is None:
        best = n_lo
        note += "no feasible actor count: using the smallest; transfers will not be hidden."
    chosen = cands[best - n_lo]
    # ranked: slices of the ranking already made (assign_ranked would sort again)
    groups = (assign_contiguous(ranking.order, best) if assignment == "ranked"
              else _groups(best, prompt_ids, predicted, assignment))
    return GenerationPlan(policy, best, groups, chosen.time_s, chosen.gpu_seconds, tuple(cands),
                          note=note.strip())
