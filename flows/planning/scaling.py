"""Cost-aware actor scaling with the locality feasibility check (paper §3.5-3.6).

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
(``loads.budget_slices``): ``T_bal``, the smallest predicted phase time any contiguous slicing of
the ranking reaches, is found by bisection, and the slices are then filled longest first, each
with as many groups as keep its actor's predicted end within ``(1 + s) * T_bal`` (and within
the equal-count plan's time). Short slices still release early, while the phase stays within
``s`` of the fastest ranked plan. ``None`` keeps equal counts. ``cost_aware`` keeps equal counts
too: its sweep already trades time against cost through N, by ``lam``; re-slicing the chosen N
would trade again behind the objective's back, and on the traces (simulator, many actors per
step) the uneven slices lost more time to mispredicted groups than the sweep had bought.

Speed per fan-out (``PlannerSettings.decode_scale_by_n``): where N actors share one machine's
cores, each decodes at its share's speed; a candidate of N actors has its decode seconds (and
its robust tail) multiplied by N's factor before it is evaluated, so every objective weighs
each N at its own speed.

Policies: ``cost_aware``; ``fixed:N`` (N actors, the configured assignment);
``module:function`` (a user function with this signature returning a
``GenerationPlan``; its output is validated).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from flows.planning.assignment import assign_contiguous, assign_round_robin
from flows.planning.loads import (Loads, assign_groups, budget_slices, candidate_loads, equal_slices,
                                  group_loads, make_env, make_ranking, slice_ends, slice_loads)
from flows.planning.objective import check_objective, choose
from flows.planning.plan import Candidate, ClusterSpec, GenerationPlan, PlannerSettings
from flows.planning.robust import (STRIPED_MAX_N, MeasuredError, TailModel, held_budget, split_plans,
                                   stress_plans, striped_layout)
from flows.planning.timeline import evaluate_candidate
from flows.planning.tpot import TpotProfile

ASSIGNMENTS = ("ranked", "round_robin", "contiguous")



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
    bad = [(n, f) for n, f in s.decode_scale_by_n if not (n >= 1 and f > 0.0 and np.isfinite(f))]
    if bad:
        raise ValueError(f"scaling.decode_scale_by_n: {bad[:3]}; each entry is (actors >= 1, factor > 0)")
    kwargs = dict(group_size=group_size, prompt_lengths=prompt_lengths, policy=policy,
                  n_min=n_min, n_max=n_max, lam=lam, assignment=assignment, profile=profile,
                  cluster=cluster, cut_threshold=cut_threshold, prefill_tokens=prefill_tokens)
    if policy == "cost_aware" or policy.startswith("fixed:"):
        value = (default_value_of_time(cluster) if value_of_time_usd_per_s is None
                 else value_of_time_usd_per_s)
        plan = _plan_builtin(list(prompt_ids), predicted, rank_slack=rank_slack,
                             objective=objective, value_of_time=value, time_slack=time_slack,
                             budget_actors=s.budget_actors, tail_error=s.tail_error,
                             decode_scale_by_n=dict(s.decode_scale_by_n),
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
"""``cost_aware`` also times budget-sized ranked slices (``loads.budget_slices``) for N up to
this: each N costs a bisection (~1 ms at 512 prompts), and the sized plans chosen on the traces
have 2-4 actors."""


def _plan_builtin(prompt_ids: list[int], predicted: Mapping[int, float], *, group_size: int,
                  prompt_lengths: Mapping[int, int], policy: str, n_min: int, n_max: int,
                  lam: float, assignment: str, profile: TpotProfile, cluster: ClusterSpec,
                  cut_threshold: float | None, prefill_tokens: float | None,
                  rank_slack: float | None, objective: str, value_of_time: float,
                  time_slack: float, budget_actors: int = 3,
                  tail_error: MeasuredError | None = None,
                  decode_scale_by_n: Mapping[int, float] | None = None) -> GenerationPlan:
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
    env = make_env(prompt_ids, predicted, prompt_lengths, group_size, profile, cluster,
               prefill_tokens, max_groups)
    ranking = make_ranking(prompt_ids, predicted, prompt_lengths)
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
        factor = (decode_scale_by_n or {}).get(n, 1.0)  # decode times are linear in the profile's
        if factor != 1.0:
            loads = loads._replace(decode=[x * factor for x in loads.decode],
                                   point=None if loads.point is None else [x * factor for x in loads.point])
        t, gs, reason = evaluate_candidate(loads.decode, loads.tokens, cluster, env.prefill_s, loads.point)
        return Candidate(n, t, gs, gs * price, None, not reason, reason, kind)

    # one candidate per N: equal slices of the ranking (the paper), or the configured split
    cands = [candidate(n, loads, assignment) for n, loads in zip(ns, stress(
        candidate_loads(ns, prompt_ids, ranking, assignment, predicted, prompt_lengths, env),
        lambda: tail.slices(*equal_slices(ns, len(prompt_ids)), list(ns))))]
    builders = [lambda n=n: (assign_contiguous(ranking.order, n) if ranked
                             else assign_groups(n, prompt_ids, predicted, assignment)) for n in ns]
    if sized:  # budget-sized slices: fixed:N at its slack; cost_aware the fastest per N
        slack = rank_slack if fixed else 0.0
        ends_from = None if fixed else slice_ends(ranking, env, cluster)
        sized_ns = [n for n in (ns if fixed else range(max(n_lo, 2), min(n_hi, SIZED_MAX_N) + 1)) if n >= 2]
        sized_groups = [budget_slices(ranking, n, env, cluster, slack, ends_from) for n in sized_ns]
        # fixed:N times its own slices' contexts; cost_aware's are contiguous slices of the
        # ranking, timed as the equal slices are (one sweep each)
        sized_loads = [group_loads(g, predicted, prompt_lengths, env) if fixed
                       else slice_loads([len(x) for x in g], ranking, env) for g in sized_groups]
        if fixed and sized_ns:  # the sized slices replace the equal ones
            cands, builders = [], []
        per_plan = [np.asarray([len(x) for x in g], dtype=np.int64) for g in sized_groups]
        if per_plan:  # one tail solve for every N
            sizes = np.concatenate(per_plan)
            starts = np.concatenate([np.cumsum(x) - x for x in per_plan])
            for n, groups, loads in zip(sized_ns, sized_groups, stress(
                    sized_loads, lambda: tail.slices(starts, sizes, sized_ns))):
                cands.append(candidate(n, loads, "sized"))
                builders.append(lambda g=groups: g)
    striped = range(max(n_lo, 2), min(n_hi, STRIPED_MAX_N) + 1) if robust else range(0)
    if striped:  # the ranking dealt round-robin, every actor a like mix of lengths: one sweep
        layouts = [striped_layout(len(ranking.order), n) for n in striped]
        joined = slice_loads([x for sizes, _ in layouts for x in sizes], ranking, env,
                              [i for _, perm in layouts for i in perm])
        for n, loads in zip(striped, stress(split_plans(joined, list(striped)),
                                           lambda: tail.striped(striped))):
            cands.append(candidate(n, loads, "striped"))
            builders.append(lambda n=n: assign_round_robin(ranking.order, n))
    if extras and ranked and n_lo <= BASELINE_N <= n_hi:  # a fixed-N plan of the given order
        groups = assign_round_robin(prompt_ids, BASELINE_N)
        position = {pid: i for i, pid in enumerate(ranking.order)}
        cands.append(candidate(BASELINE_N, stress(
            [group_loads(groups, predicted, prompt_lengths, env)],
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

