"""Cost-aware actor scaling with the locality feasibility check (paper §3.5-3.6).

For every candidate ``N in [n_min, min(n_max, #prompts, max_actors)]`` (exhaustive sweep, as in
the paper) the planner builds the assignment, estimates each actor's time and picks::

    N' = argmin_N  lam * T~(N) + (1 - lam) * C~(N)      (min-max normalised over feasible N)

``T(N)`` (latest actor end), ``C(N)`` (GPU-s x price) and the §3.6 feasibility check come
from ``timeline.evaluate_candidate``; each actor's decode time from the shrinking-batch
estimate (cost.py) with every sample of a prompt at the prompt's predicted length. The min-max
ranges are taken over feasible candidates; a zero range normalises to 0. Infeasible candidates
stay in the table with their reason but are not chosen; if no N is feasible the smallest N is
used and ``note`` says so. Ties go to the smaller N. The check applies only where a prefill
action runs (``ClusterSpec.prefill_action``; ``timeline.py`` says why): without one every
candidate is feasible, and the plan run is one no other candidate beats on both time and cost.

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

Policies (``scaling.policy``, parsed once into a strategy by ``flows/planning/registry.py``):
``cost_aware`` (:class:`CostAware`); ``fixed:N`` (:class:`Fixed`: N actors, the configured
assignment); a registered name or ``module:function`` (a user function with this signature
returning a ``GenerationPlan``; its output is validated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from flows.planning.assignment import assign_contiguous, assign_round_robin
from flows.planning.loads import (Env, Loads, Ranking, assign_groups, budget_slices, candidate_loads, equal_slices,
                                  group_loads, make_env, make_ranking, slice_ends, slice_loads)
from flows.planning.objective import check_objective, choose
from flows.planning.plan import Candidate, ClusterSpec, GenerationPlan
from flows.planning.settings import PlannerSettings
from flows.planning.registry import ScalingStrategy, parse_scaling_policy, register_scaling_policy
from flows.planning.robust import (STRIPED_MAX_N, TailModel, held_budget, split_plans, stress_plans,
                                   striped_layout)
from flows.planning.timeline import evaluate_candidate

ASSIGNMENTS = ("ranked", "round_robin", "contiguous")


def _check_args(prompt_ids: Sequence[int], predicted: Mapping[int, float], group_size: int,
                settings: PlannerSettings) -> None:
    s = settings
    if not prompt_ids:
        raise ValueError("algorithm.batch_size: a phase has no prompt; plan one with at least one prompt")
    if s.n_min < 1:
        raise ValueError(f"scaling.n_min={s.n_min}: must be >= 1")
    if s.n_min > s.n_max:
        raise ValueError(f"scaling.n_max={s.n_max}: smaller than n_min={s.n_min}; set n_max >= n_min")
    if not 0.0 <= s.lam <= 1.0:
        raise ValueError(f"scaling.lam={s.lam}: must be in [0, 1] (1 = fastest, 0 = cheapest)")
    if s.assignment not in ASSIGNMENTS:
        raise ValueError(f"generation.assignment={s.assignment!r}: use one of {ASSIGNMENTS}")
    if s.cut_threshold is not None and not 0.0 < s.cut_threshold <= 1.0:
        raise ValueError(f"generation.cut_threshold={s.cut_threshold}: must be in (0, 1] (1 = never cut) or None")
    if group_size < 1:
        raise ValueError(f"algorithm.group_size={group_size}: must be >= 1 (samples per prompt)")
    if s.rank_slack is not None and not 0.0 <= s.rank_slack <= 10.0:
        raise ValueError(f"generation.rank_slack={s.rank_slack}: must be in [0, 10] (a fraction "
                         "of the balanced phase time) or None for equal-count slices")
    missing = [p for p in prompt_ids if p not in predicted]
    if missing:
        raise ValueError(f"generation.length_window: no predicted length for prompts {missing[:5]}; predict "
                         "every prompt (lengths.predict_lengths)")
    bad = [(n, f) for n, f in s.decode_scale_by_n if not (n >= 1 and f > 0.0 and np.isfinite(f))]
    if bad:
        raise ValueError(f"PlannerSettings.decode_scale_by_n: {bad[:3]}; each entry is (actors >= 1, factor > 0)")


def strategy_of(settings: PlannerSettings) -> ScalingStrategy:
    """The settings' strategy (a text policy is parsed by the registry)."""
    policy = settings.policy
    return parse_scaling_policy(policy) if isinstance(policy, str) else policy


def plan_generation(prompt_ids: Sequence[int], predicted: Mapping[int, float], *,
                    group_size: int, prompt_lengths: Mapping[int, int], settings: PlannerSettings,
                    prefill_tokens: float | None = None) -> GenerationPlan:
    """Decide how many decode actors to run and which prompts each gets.

    Args:
        prompt_ids: prompts of this phase (each carries ``group_size`` samples).
        predicted: prompt id -> predicted response length (tokens).
        prompt_lengths: prompt id -> prompt length (tokens).
        settings: the policy, candidate range, objective and cost model (``PlannerSettings``).
        prefill_tokens: the prefill action's work (``PrefillPlan.prefix_tokens``; the suffixes
            each generation action prefills itself are ``settings.own_prefill_tokens``);
            default: every prompt.
    Returns:
        the plan; ``candidates`` holds every evaluated N.
    """
    s = settings
    start = time.perf_counter()
    _check_args(prompt_ids, predicted, group_size, s)
    check_objective(s.objective, s.lam, s.value_of_time_usd_per_s, s.time_slack, s.budget_actors)
    plan = strategy_of(s).plan(prompt_ids, predicted, group_size=group_size, prompt_lengths=prompt_lengths,
                               settings=s, prefill_tokens=prefill_tokens)
    return replace(plan, planning_ms=(time.perf_counter() - start) * 1e3)


@dataclass(frozen=True)
class CostAware:
    """``cost_aware``: the sweep over N, chosen by ``scaling.objective`` (module docstring)."""

    name: str = "cost_aware"
    times_fan_outs: bool = True
    num_actors: int | None = None

    def plan(self, prompt_ids: Sequence[int], predicted: Mapping[int, float], *, group_size: int,
             prompt_lengths: Mapping[int, int], settings: PlannerSettings,
             prefill_tokens: float | None) -> GenerationPlan:
        return _plan_builtin(self, list(prompt_ids), predicted, group_size, prompt_lengths, settings, prefill_tokens)

    def cut_threshold(self, objective: str, cut_threshold: float | None) -> float | None:
        """``cut_threshold``, except under the ``budget`` objective, which does not cut
        (``objective.py``: a cut moves an actor's longest samples into another actor's batch;
        the budget has already bounded the cost, and the cut would spend the phase's tail on
        saving more)."""
        return None if objective == "budget" else cut_threshold


@dataclass(frozen=True)
class Fixed:
    """``fixed:N``: N actors (fewer with fewer prompts), the configured assignment."""

    num_actors: int
    name: str = ""
    times_fan_outs: bool = True

    def plan(self, prompt_ids: Sequence[int], predicted: Mapping[int, float], *, group_size: int,
             prompt_lengths: Mapping[int, int], settings: PlannerSettings,
             prefill_tokens: float | None) -> GenerationPlan:
        return _plan_builtin(self, list(prompt_ids), predicted, group_size, prompt_lengths, settings, prefill_tokens)

    def cut_threshold(self, objective: str, cut_threshold: float | None) -> float | None:
        return cut_threshold


@register_scaling_policy("cost_aware")
def _cost_aware(arg: str) -> CostAware:
    if arg:
        raise ValueError(f"scaling.policy='cost_aware:{arg}': cost_aware takes no argument; use cost_aware")
    return CostAware()


@register_scaling_policy("fixed")
def _fixed(arg: str) -> Fixed:
    if not arg.isdigit() or int(arg) < 1:
        raise ValueError(f"scaling.policy='fixed:{arg}': fixed:N needs a positive integer N (actors), e.g. 'fixed:3'")
    return Fixed(int(arg), f"fixed:{arg}")


def default_value_of_time(cluster: ClusterSpec) -> float:
    """Dollars per second of phase time when none is configured: the price of the prefill
    (learner) GPUs, which sit idle until the phase ends. So an actor is worth adding when the
    seconds it saves would cost the learner more than the actor bills."""
    return cluster.prefill_gpus * cluster.price_per_gpu_second


SIZED_MAX_N = 4
"""``cost_aware`` also times budget-sized ranked slices (``loads.budget_slices``) for N up to
this: each N costs a bisection (~1 ms at 512 prompts), and the sized plans chosen on the traces
have 2-4 actors."""


@dataclass
class _Sweep:
    """The candidates of one call and how to build each one's assignment."""

    env: Env
    ranking: Ranking
    cluster: ClusterSpec
    robust: bool
    tail: TailModel | None
    scale_by_n: Mapping[int, float]
    cands: list[Candidate] = field(default_factory=list)
    builders: list[Callable[[], Sequence[Sequence[int]]]] = field(default_factory=list)

    def stress(self, loads: list[Loads], targets: Callable[[], object]) -> list[Loads]:
        """Any actor may run to the longest prediction, or to its target (``targets()``, one
        array per plan)."""
        if not self.robust:
            return loads
        top = self.ranking.lengths[0]
        return stress_plans(loads, top if self.tail is None else targets(), self.env.decode.table[0])

    def add(self, n: int, loads: Loads, kind: str, build: Callable[[], Sequence[Sequence[int]]]) -> None:
        factor = self.scale_by_n.get(n, 1.0)  # decode times are linear in the profile's
        if factor != 1.0:
            loads = loads._replace(decode=[x * factor for x in loads.decode],
                                   point=None if loads.point is None else [x * factor for x in loads.point])
        t, gs, reason = evaluate_candidate(loads.decode, loads.tokens, self.cluster, self.env.prefill_s, loads.point)
        self.cands.append(Candidate(n, t, gs, gs * self.cluster.price_per_gpu_second, None, not reason, reason, kind))
        self.builders.append(build)


def _actor_range(strategy: ScalingStrategy, num_prompts: int, s: PlannerSettings) -> tuple[int, int, str]:
    """(smallest N, largest N, note) of the sweep."""
    if strategy.num_actors is not None:
        n = min(strategy.num_actors, num_prompts)
        return n, n, ""
    n_hi = min(s.n_max, num_prompts, s.cluster.max_actors)
    n_lo = min(s.n_min, n_hi)
    note = f"n_min={s.n_min} capped to {n_lo} (prompts/cluster capacity). " if n_lo < s.n_min else ""
    return n_lo, n_hi, note


def _plan_builtin(strategy: ScalingStrategy, prompt_ids: list[int], predicted: Mapping[int, float],
                  group_size: int, prompt_lengths: Mapping[int, int], s: PlannerSettings,
                  prefill_tokens: float | None) -> GenerationPlan:
    fixed = strategy.num_actors is not None
    n_lo, n_hi, note = _actor_range(strategy, len(prompt_ids), s)
    ranked = s.assignment == "ranked"
    extras = not fixed and s.objective != "paper"  # the paper sweeps equal slices only
    robust = extras and ranked
    sized = ranked and (fixed and s.rank_slack is not None or extras)
    max_groups = len(prompt_ids) if sized else -(-len(prompt_ids) // n_lo)
    env = make_env(prompt_ids, predicted, prompt_lengths, group_size, s.profile, s.cluster, prefill_tokens, max_groups,
                   s.own_prefill_tokens)
    ranking = make_ranking(prompt_ids, predicted, prompt_lengths, env.own_s)
    tail = TailModel(ranking.lengths, s.tail_error) if robust and s.tail_error is not None else None
    sweep = _Sweep(env, ranking, s.cluster, robust, tail, dict(s.decode_scale_by_n))
    ns = range(n_lo, n_hi + 1)
    # one candidate per N: equal slices of the ranking (the paper), or the configured split
    for n, loads in zip(ns, sweep.stress(
            candidate_loads(ns, prompt_ids, ranking, s.assignment, predicted, prompt_lengths, env),
            lambda: tail.slices(*equal_slices(ns, len(prompt_ids)), list(ns)))):
        sweep.add(n, loads, s.assignment, lambda n=n: (assign_contiguous(ranking.order, n) if ranked
                                                      else assign_groups(n, prompt_ids, predicted, s.assignment)))
    if sized:  # budget-sized slices: fixed:N at its slack; cost_aware the fastest per N
        _add_sized(sweep, fixed, ns, n_lo, n_hi, s, predicted, prompt_lengths)
    if robust:  # the ranking dealt round-robin, every actor a like mix of lengths: one sweep
        _add_striped(sweep, range(max(n_lo, 2), min(n_hi, STRIPED_MAX_N) + 1))
    if extras and ranked and n_lo <= BASELINE_N <= n_hi:  # a fixed-N plan of the given order
        _add_baseline(sweep, prompt_ids, predicted, prompt_lengths)
    value = default_value_of_time(s.cluster) if s.value_of_time_usd_per_s is None else s.value_of_time_usd_per_s
    budget = (held_budget(sweep.cands, min(s.budget_actors, n_hi), s.cluster, env.prefill_s)
              if s.objective == "budget" else None)
    best, scores = choose(sweep.cands, s.objective, lam=s.lam, value_of_time_usd_per_s=value,
                          time_slack=s.time_slack, budget_usd=budget)
    cands = [replace(c, score=sc) for c, sc in zip(sweep.cands, scores)]
    if best is None:
        best = 0
        note += "no feasible actor count: using the smallest; transfers will not be hidden."
    chosen = cands[best]
    return GenerationPlan(strategy.name, chosen.n, sweep.builders[best](), chosen.time_s, chosen.gpu_seconds,
                          tuple(cands), note=note.strip(), chosen=best)


def _add_sized(sweep: _Sweep, fixed: bool, ns: range, n_lo: int, n_hi: int, s: PlannerSettings,
               predicted: Mapping[int, float], prompt_lengths: Mapping[int, int]) -> None:
    """Budget-sized slices of the ranking (``loads.budget_slices``); for ``fixed:N`` they
    replace the equal ones."""
    ranking, env = sweep.ranking, sweep.env
    slack = s.rank_slack if fixed else 0.0
    ends_from = None if fixed else slice_ends(ranking, env, s.cluster)
    sized_ns = [n for n in (ns if fixed else range(max(n_lo, 2), min(n_hi, SIZED_MAX_N) + 1)) if n >= 2]
    sized_groups = [budget_slices(ranking, n, env, s.cluster, slack, ends_from) for n in sized_ns]
    # fixed:N times its own slices' contexts; cost_aware's are contiguous slices of the
    # ranking, timed as the equal slices are (one sweep each)
    sized_loads = [group_loads(g, predicted, prompt_lengths, env) if fixed
                   else slice_loads([len(x) for x in g], ranking, env) for g in sized_groups]
    if fixed and sized_ns:  # the sized slices replace the equal ones
        sweep.cands, sweep.builders = [], []
    per_plan = [np.asarray([len(x) for x in g], dtype=np.int64) for g in sized_groups]
    if per_plan:  # one tail solve for every N
        sizes = np.concatenate(per_plan)
        starts = np.concatenate([np.cumsum(x) - x for x in per_plan])
        for n, groups, loads in zip(sized_ns, sized_groups, sweep.stress(
                sized_loads, lambda: sweep.tail.slices(starts, sizes, sized_ns))):
            sweep.add(n, loads, "sized", lambda g=groups: g)


def _add_striped(sweep: _Sweep, striped: range) -> None:
    """The ranking dealt round-robin over N actors, N in ``striped``."""
    if not striped:
        return
    ranking = sweep.ranking
    layouts = [striped_layout(len(ranking.order), n) for n in striped]
    joined = slice_loads([x for sizes, _ in layouts for x in sizes], ranking, sweep.env,
                         [i for _, perm in layouts for i in perm])
    for n, loads in zip(striped, sweep.stress(split_plans(joined, list(striped)),
                                              lambda: sweep.tail.striped(striped))):
        sweep.add(n, loads, "striped", lambda n=n: assign_round_robin(ranking.order, n))


def _add_baseline(sweep: _Sweep, prompt_ids: list[int], predicted: Mapping[int, float],
                  prompt_lengths: Mapping[int, int]) -> None:
    """Round-robin of the given order over ``BASELINE_N`` actors."""
    groups = assign_round_robin(prompt_ids, BASELINE_N)
    position = {pid: i for i, pid in enumerate(sweep.ranking.order)}
    loads = sweep.stress([group_loads(groups, predicted, prompt_lengths, sweep.env)],
                         lambda: [sweep.tail.groups([[position[p] for p in g] for g in groups])])[0]
    sweep.add(BASELINE_N, loads, "round_robin", lambda g=groups: g)


BASELINE_N = 3
"""``cost_aware`` always times round-robin over this many actors with early release (the
paper's static fan-out, served serverlessly), so it never runs a plan its own estimate says
loses to that one in both time and cost."""
