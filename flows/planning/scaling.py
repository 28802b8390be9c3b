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

Prediction error (``robust.py``): outside the ``paper`` objective, ``cost_aware`` over a ranked
assignment times every candidate with ``robust.tail_stress`` (any actor may hold a group as
long as the step's longest prediction or, given the predictor's measured error, as long as its
own groups could run: ``robust.TailModel``) and adds striped candidates (the ranking dealt
round-robin, ``assign_round_robin`` of the ranking) for N = 2..``STRIPED_MAX_N``. A stressed
candidate's feasibility (§3.6) is checked on its point estimate (``timeline.py``).

Slice sizes of a ranked plan (``rank_slack``). The sweep over N times equal-count slices of
the ranking (the paper's "evenly"). Where TPOT grows with batch and context, the slice of the
longest groups then decodes slowest of all and sets the phase time: on a trace of long code
answers (lcb), equal slices made the phase about 1.2x longer than a length-oblivious split.
With a fixed fan-out (``fixed:N``) and ``rank_slack = s`` the N slices are sized instead
(``_budget_slices``): ``T_bal``, the smallest predicted phase time any contiguous slicing of
the ranking reaches, is found by bisection, and the slices are then filled longest first, each
with as many groups as keep its actor's predicted end within ``(1 + s) * T_bal`` (and within
the equal-count plan's time). Short slices still release early, while the phase stays within
``s`` of the fastest ranked plan. ``None`` keeps equal counts. ``cost_aware`` keeps equal counts
too: its sweep already trades time against cost through N, by ``lam``; re-slicing the chosen N
would trade again behind the objective's back, and on the traces (simulator, many actors per
step) the uneven slices lost more time to mispredicted groups than the sweep had bought.

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
                                       rank_prompts, split_sizes)
from flows.planning.robust import (STRIPED_MAX_N, Loads, MeasuredError, TailModel, held_budget,
                                   split_plans, stress_plans, striped_layout)
from flows.planning.cost import DecodeEstimator
from flows.planning.objective import check_objective, choose
from flows.planning.plan import Candidate, ClusterSpec, GenerationPlan, PlannerSettings
from flows.planning.tpot import CONTEXT_BUCKET, TpotProfile
from flows.planning.timeline import actor_start, evaluate_candidate, prefill_seconds

ASSIGNMENTS = ("ranked", "round_robin", "contiguous")


@dataclass(frozen=True)
class _Env:
    """Per-call constants of the time/cost model."""

    decode: DecodeEstimator
    prefill_s: float


def _sorted_lengths(pids: Sequence[int], predicted: Mapping[int, float]) -> list[float]:
    return sorted((float(predicted[p]) for p in pids), reverse=True)


def _ranked_loads(ns: range, ranking: "_Ranking", env: _Env) -> list[Loads]:
    """Per actor (decode seconds, prompt tokens, longest predicted length, group count) for
    ranked slices, for every N in ``ns`` (the fast path: all candidates' slices at once, in
    numpy; the same numbers as slicing with ``split_sizes`` and timing each with ``slice_timer``)."""
    starts, sizes = _equal_slices(ns, len(ranking.order))
    sums = np.asarray(ranking.token_sums)
    tokens = sums[starts + sizes] - sums[starts]
    decode = env.decode.sweep(ranking.lengths, starts, starts + sizes, tokens / sizes)
    tokens_l, out, j = tokens.tolist(), [], 0
    longest, sizes_l = np.asarray(ranking.lengths)[starts].tolist(), sizes.tolist()
    for count in ns:
        out.append((decode[j:j + count], tokens_l[j:j + count], longest[j:j + count],
                    sizes_l[j:j + count]))
        j += count
    return out


def _equal_slices(ns: range, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, sizes) of the equal-count slices of a ranking of ``m`` groups (``split_sizes``:
    the first ``m % N`` slices get one more), for every N in ``ns``, one N after another."""
    counts = np.arange(ns.start, ns.stop)
    n = np.repeat(counts, counts)  # the N of each slice
    i = np.arange(len(n)) - np.repeat(np.cumsum(counts) - counts, counts)  # index within its N
    base, extra = m // n, m % n
    return i * base + np.minimum(i, extra), base + (i < extra)


def _slice_loads(sizes: Sequence[int], ranking: "_Ranking", env: _Env,
                 perm: Sequence[int] | None = None) -> Loads:
    """Per actor: decode seconds, prompt tokens, longest predicted length and group count for
    consecutive slices of these sizes of the ranking (``DecodeEstimator.sweep``, as
    ``_ranked_loads`` times equal slices), or of the ranking reordered by ``perm`` (striped
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
    return decode, tokens.tolist(), lengths[starts].tolist(), sizes_a.tolist()



def _group_loads(groups: Sequence[Sequence[int]], predicted: Mapping[int, float],
                 prompt_lengths: Mapping[int, int], env: _Env) -> Loads:
    """Per actor, for an explicit assignment: decode seconds, prompt tokens, longest predicted
    length and group count."""
    decode, tokens, longest = [], [], []
    for pids in groups:
        tok = float(sum(prompt_lengths[p] for p in pids))
        lengths = _sorted_lengths(pids, predicted)
        decode.append(env.decode.time_desc(lengths, tok / len(pids)))
        tokens.append(tok)
        longest.append(lengths[0])
    return decode, tokens, longest, [len(g) for g in groups]


def _check_args(prompt_ids: Sequence[int], predicted: Mapping[int, float], group_size: int,
                n_min: int, n_max: int, lam: float, assignment: str,
                cut_threshold: float | None, rank_slack: float | None = None) -> None:
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
    if rank_slack is not None and not 0.0 <= rank_slack <= 10.0:
        raise ValueError(f"generation.rank_slack={rank_slack}: must be in [0, 10] (a fraction "
                         "of the balanced phase time) or None for equal-count slices")
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
                     env: _Env) -> list[Loads]:
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
                    group_size: int, prompt_lengths: Mapping[int, int], settings: PlannerSettings,
                    prefill_tokens: float | None = None) -> GenerationPlan:
    """Decide how many decode actors to run and which prompts each gets.

    Args:
        prompt_ids: prompts of this phase (each carries ``group_size`` samples).
        predicted: prompt id -> predicted response length (tokens).
        prompt_lengths: prompt id -> prompt length (tokens).
        settings: the policy, candidate range, objective and cost model (``PlannerSettings``).
        prefill_tokens: prefill work (``PrefillPlan.tokens_computed``); default: every prompt.
    Returns:
        the plan; ``candidates`` holds every evaluated N.
    """
    s = settings
    policy, n_min, n_max, lam, assignment = s.policy, s.n_min, s.n_max, s.lam, s.assignment
    profile, cluster, cut_threshold, rank_slack = s.profile, s.cluster, s.cut_threshold, s.rank_slack
    objective, value_of_time_usd_per_s, time_slack = s.objective, s.value_of_time_usd_per_s, s.time_slack
    start = time.perf_counter()
    _check_args(prompt_ids, predicted, group_size, n_min, n_max, lam, assignment, cut_threshold,
                rank_slack)
    check_objective(objective, lam, value_of_time_usd_per_s, time_slack, s.budget_actors)
    kwargs = dict(group_size=group_size, prompt_lengths=prompt_lengths, policy=policy,
                  n_min=n_min, n_max=n_max, lam=lam, assignment=assignment, profile=profile,
                  cluster=cluster, cut_threshold=cut_threshold, prefill_tokens=prefill_tokens)
    if policy == "cost_aware" or policy.startswith("fixed:"):
        value = (default_value_of_time(cluster) if value_of_time_usd_per_s is None
                 else value_of_time_usd_per_s)
        plan = _plan_builtin(list(prompt_ids), predicted, rank_slack=rank_slack,
                             objective=objective, value_of_time=value, time_slack=time_slack,
                             budget_actors=s.budget_actors, tail_error=s.tail_error,
                             **kwargs)
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


def default_value_of_time(cluster: ClusterSpec) -> float:
    """Dollars per second of phase time when none is configured: the price of the prefill
    (learner) GPUs, which sit idle until the phase ends. So an actor is worth adding when the
    seconds it saves would cost the learner more than the actor bills."""
    return cluster.prefill_gpus * cluster.price_per_gpu_second


SIZED_MAX_N = 4
"""``cost_aware`` also times budget-sized ranked slices (``_budget_slices``) for N up to
this; each N costs a bisection, and the sized plans chosen on the traces have 2-4 actors (each N costs ~1 ms at 512 prompts)."""


def _plan_builtin(prompt_ids: list[int], predicted: Mapping[int, float], *, group_size: int,
                  prompt_lengths: Mapping[int, int], policy: str, n_min: int, n_max: int,
                  lam: float, assignment: str, profile: TpotProfile, cluster: ClusterSpec,
                  cut_threshold: float | None, prefill_tokens: float | None,
                  rank_slack: float | None, objective: str, value_of_time: float,
                  time_slack: float, budget_actors: int = 3,
                  tail_error: MeasuredError | None = None) -> GenerationPlan:
    fixed = policy.startswith("fixed:")
    note = ""
    if fixed:
        n_lo = n_hi = min(_parse_fixed(policy), len(prompt_ids))
    else:
        n_hi = min(n_max, len(prompt_ids), cluster.max_actors)
        n_lo = min(n_min, n_hi)
        if n_lo < n_min:
            note = f"n_min={n_min} capped to {n_lo} (prompts/cluster capacity). "
    ranked = assignment == "ranked"
    extras = not fixed and objective != "paper"  # the paper sweeps equal slices only
    robust = extras and assignment == "ranked"
    sized = ranked and (fixed and rank_slack is not None or extras)
    max_groups = len(prompt_ids) if sized else -(-len(prompt_ids) // n_lo)
    env = _env(prompt_ids, predicted, prompt_lengths, group_size, profile, cluster,
               prefill_tokens, max_groups)
    ranking = _ranking(prompt_ids, predicted, prompt_lengths)
    ns = range(n_lo, n_hi + 1)
    price = cluster.price_per_gpu_second

    top = ranking.lengths[0]
    tail = TailModel(ranking.lengths, tail_error) if robust and tail_error is not None else None

    def stress(loads: list[Loads], targets) -> list[Loads]:
        """Any actor may run to ``top``, or to its target (``targets()``, one array per plan)."""
        if not robust:
            return loads
        return stress_plans(loads, top if tail is None else targets(), env.decode.table[0])

    def candidate(n: int, loads: Loads, kind: str) -> Candidate:
        # stressed loads carry the point estimate (loads[4]), on which feasibility is checked
        t, gs, reason = evaluate_candidate(loads[0], loads[1], cluster, env.prefill_s, *loads[4:])
        return Candidate(n, t, gs, gs * price, None, not reason, reason, kind)

    # one candidate per N: equal slices of the ranking (the paper), or the configured split
    cands = [candidate(n, loads, assignment) for n, loads in zip(ns, stress(
        _candidate_loads(ns, prompt_ids, ranking, assignment, predicted, prompt_lengths, env),
        lambda: tail.slices(*_equal_slices(ns, len(prompt_ids)), list(ns))))]
    builders = [lambda n=n: (assign_contiguous(ranking.order, n) if ranked
                             else _groups(n, prompt_ids, predicted, assignment)) for n in ns]
    if sized:  # budget-sized slices: fixed:N at its slack; cost_aware the fastest per N
        slack = rank_slack if fixed else 0.0
        ends_from = None if fixed else _slice_ends(ranking, env, cluster)
        for n in (ns if fixed else range(max(n_lo, 2), min(n_hi, SIZED_MAX_N) + 1)):
            if n < 2:
                continue
            groups = _budget_slices(ranking, n, env, cluster, slack, ends_from)
            if fixed:
                loads = _group_loads(groups, predicted, prompt_lengths, env)
            else:  # contiguous slices of the ranking: timed as the equal slices are (sweep)
                loads = _slice_loads([len(g) for g in groups], ranking, env)
            if fixed:  # the sized slices replace the equal ones
                cands, builders = [], []
            sizes = np.asarray([len(g) for g in groups])
            targets = lambda: tail.slices(np.cumsum(sizes) - sizes, sizes, [n])  # noqa: E731
            cands.append(candidate(n, stress([loads], targets)[0], "sized"))
            builders.append(lambda g=groups: g)
    striped = range(max(n_lo, 2), min(n_hi, STRIPED_MAX_N) + 1) if robust else range(0)
    if striped:  # the ranking dealt round-robin, every actor a like mix of lengths: one sweep
        layouts = [striped_layout(len(ranking.order), n) for n in striped]
        joined = _slice_loads([x for sizes, _ in layouts for x in sizes], ranking, env,
                              [i for _, perm in layouts for i in perm])
        for n, loads in zip(striped, stress(split_plans(joined, list(striped)),
                                           lambda: tail.striped(striped))):
            cands.append(candidate(n, loads, "striped"))
            builders.append(lambda n=n: assign_round_robin(ranking.order, n))
    if extras and ranked and n_lo <= BASELINE_N <= n_hi:  # a fixed-N plan of the given order
        groups = assign_round_robin(prompt_ids, BASELINE_N)
        position = {pid: i for i, pid in enumerate(ranking.order)}
        cands.append(candidate(BASELINE_N, stress(
            [_group_loads(groups, predicted, prompt_lengths, env)],
            lambda: [tail.groups([[position[p] for p in g] for g in groups])])[0], "round_robin"))
        builders.append(lambda g=groups: g)
    budget = (held_budget(cands, min(budget_actors, n_hi), cluster, env.prefill_s)
              if objective == "budget" else None)
    best, scores = choose(cands, objective, lam=lam, value_of_time_usd_per_s=value_of_time,
                          time_slack=time_slack, budget_usd=budget)
    cands = [replace(c, score=sc) for c, sc in zip(cands, scores)]
    if best is None:
        best = 0
        note += "no feasible actor count: using the smallest; transfers will not be hidden."
    chosen = cands[best]
    return GenerationPlan(policy, chosen.n, builders[best](), chosen.time_s, chosen.gpu_seconds,
                          tuple(cands), note=note.strip(), chosen=best)


BASELINE_N = 3
"""``cost_aware`` always times round-robin over this many actors with early release (the
paper's static fan-out, served serverlessly), so it never runs a plan its own estimate says
loses to that one in both time and cost."""


def _budget_slices(ranking: _Ranking, n: int, env: _Env, cluster: ClusterSpec,
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

    ``ends_from`` (``cost_aware``'s extra candidates, timed exactly afterwards: ``_slice_ends``
    of the ranking, shared by every N): every slice starts
    from the step's mean prompt length (``_slice_ends``), which makes the search a few numpy
    passes instead of ~10^5 table reads; ``fixed:N`` sizes with each slice's own context.
    """
    m = len(ranking.order)
    sums = ranking.token_sums
    if ends_from is not None:
        cache: dict[tuple[int, int], list[float]] = {}  # the bisection revisits most starts

        def end(actor: int, i: int, j: int) -> float:
            row = cache.get((actor, i))
            if row is None:
                row = cache[(actor, i)] = ends_from(actor, i)
            return row[j - i - 1]
    else:
        timer = env.decode.slice_timer(ranking.lengths)
        memo: dict[tuple[int, int, int], float] = {}

        def end(actor: int, i: int, j: int) -> float:
            value = memo.get((actor, i, j))
            if value is None:
                tokens = sums[j] - sums[i]
                ready = actor_start(actor, cluster, env.prefill_s, tokens).ready_s
                value = memo[(actor, i, j)] = ready + timer(i, j, tokens / (j - i))
            return value

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


def _slice_ends(ranking: _Ranking, env: _Env, cluster: ClusterSpec):
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
            out = rows_out[key] = (ready + decode).tolist()
        return out
    return ends_from
