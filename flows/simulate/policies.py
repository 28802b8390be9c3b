"""Policies compared by the simulator and how each one starts its actors (paper §4.1, §4.4).

- ``rlhfless``: ranked assignment + cost-aware scaling (``objective``) + cut-and-migrate (``cut_threshold``),
  prefill actor on the learner node's GPUs, the first decode actors co-located there once
  prefill is done (``colocated_actors``), serverless release.
- ``static:N`` (VERL-like serverful baseline, paper default N = 3): N actors, contiguous
  slices of the batch in the given order, each prefills its own prompts once (vLLM parallel
  sampling shares a prompt across its n samples) and decodes, with no weight transfer and no
  cold start; every actor is held for the whole phase, one given no prompts (a step of fewer
  than N) idle: GPU-s = N * GPUs * phase time. Where its actors live matters only to the
  whole step (``ClusterModel.learner_tokens_per_s``),
  which models the standalone placement (paper §4.9): the N actors hold GPUs of their own,
  billed through the learner's phases too, and the weight sync to them after each step is not
  charged (it favours the baseline). A hybrid engine instead runs them on the learner's GPUs:
  then they cost nothing beyond the learner's own GPU-s, and the only whole-step saving left
  to a serverless policy is its generation phase's (``ClusterModel.learner_gpus``).
- ``round-robin:N``: N serverless actors (released when done), round-robin assignment, no
  cut: the naive baseline of ranked assignment + cut-and-migrate at the same fan-out
  (``no-scale:N``).
- Ablations: ``no-assign`` (round-robin over the given order instead of ranking),
  ``no-scale[:N]`` (N = 3 actors, ranked, serverless release, cut), ``no-cut`` (no cut threshold),
  ``oracle`` (rlhfless with predictions equal to the true group max lengths).

Pre-warm [I]: a step's predictions use only earlier epochs, so its plan can be made while the
previous step trains, and the planned actors are pre-warmed in time (paper §3.7): planned
actors pay no cold start, each remote one is billed ``prewarm_idle_s`` of waiting. Only an
unplanned continuation actor can be cold; it is warm if the pool kept from the previous step
(``prewarm.warm_actor_count``) has a spare actor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from flows.planning.migrate import plan_cut_points_of
from flows.planning.plan import ClusterSpec, GenerationPlan
from flows.planning.planner import Planner, PlannerRules
from flows.planning.registry import ScalingStrategy, parse_scaling_policy
from flows.planning.robust import MeasuredError
from flows.planning.scaling import CostAware, Fixed, plan_generation
from flows.planning.settings import PlannerSettings
from flows.planning.timeline import actor_start, prefill_seconds
from flows.planning.tpot import TpotProfile
from flows.simulate.cluster import ActorSpec, Sample, SimConfig

DEFAULT_POLICIES = ("rlhfless", "static:3", "no-assign", "no-scale", "no-cut", "oracle")


@dataclass(frozen=True)
class Policy:
    name: str
    serverful: bool
    scaling: ScalingStrategy  # the planner's: cost_aware or fixed:N
    assignment: str  # 'ranked' | 'round_robin'
    cut: bool
    oracle: bool = False


def parse_policy(name: str) -> Policy:
    """Policy from its CLI name; ValueError naming the accepted forms otherwise."""
    base, _, arg = name.partition(":")
    count = arg if arg.isdigit() and int(arg) >= 1 else None
    if base == "static" and count:
        return Policy(name, True, Fixed(int(count), f"fixed:{count}"), "contiguous", cut=False)
    if base == "round-robin" and count:
        return Policy(name, False, Fixed(int(count), f"fixed:{count}"), "round_robin", cut=False)
    if base == "no-scale" and (count or not arg):
        return Policy(name, False, Fixed(int(count or 3), f"fixed:{count or 3}"), "ranked", cut=True)
    simple = {"rlhfless": Policy(name, False, CostAware(), "ranked", cut=True),
              "no-assign": Policy(name, False, CostAware(), "round_robin", cut=True),
              "no-cut": Policy(name, False, CostAware(), "ranked", cut=False),
              "oracle": Policy(name, False, CostAware(), "ranked", cut=True, oracle=True)}
    if not arg and base in simple:
        return simple[base]
    if base in ("static", "round-robin", "no-scale") and arg:  # a known fan-out policy, a bad N
        raise ValueError(f"policy={name!r}: N must be a whole number >= 1 (the actors it holds), e.g. {base}:3")
    raise ValueError(f"policy={name!r}: unknown; use rlhfless, static:N, round-robin:N, "
                     f"no-assign, no-scale[:N], no-cut or oracle{_live_hint(name)}")


def _live_hint(name: str) -> str:
    """Where ``name`` is a live ``scaling.policy`` (``registry.parse_scaling_policy``), the
    simulator's name of what it runs: ``cost_aware`` is ``rlhfless``; ``fixed:N`` (N serverless
    actors, ranked, released when done, cut) is ``no-scale:N``, while ``static:N`` is a held
    serverful allocation."""
    try:
        strategy = parse_scaling_policy(name)
    except ValueError:
        return ""
    if isinstance(strategy, CostAware):
        return f" (the live scaling.policy {name!r} is 'rlhfless' here)"
    if isinstance(strategy, Fixed):
        n = strategy.num_actors
        return (f" (the live scaling.policy {name!r} is 'no-scale:{n}' here: {n} serverless actors, ranked, "
                f"released when done; 'static:{n}' is {n} serverful actors held for the whole phase)")
    return ""


@dataclass(frozen=True, kw_only=True)
class ClusterModel:
    """The simulated cluster and the planner settings shared by every policy."""

    profile: TpotProfile
    num_nodes: int = 20
    gpus_per_node: int = 8
    gpus_per_actor: int = 2
    weight_bytes: float
    kv_bytes_per_token: float
    bandwidth_bytes_per_s: float
    cold_start_s: float = 30.0
    prewarm_idle_s: float = 0.0
    lam: float = 0.7
    objective: str = "budget"
    value_of_time_usd_per_s: float | None = None
    """Objective ``value``: GPU-s one second of phase time is worth; None: the price of the
    learner's GPUs, which wait for the phase (``value_of_time``)."""
    time_slack: float = 0.05
    budget_actors: int = 3  # objective budget: the held fixed allocation bounding the bill
    tail_error_steps: int = 2
    """Steps of measured prediction error (each policy's own predictions against the trace)
    that scale the planner's robust tail (``robust.MeasuredError``); 0: every actor may run to
    the step's longest prediction, as without a measurement."""
    tail_quantile: float = 0.5
    """Quantile of an actor's longest observed group its robust tail runs to."""
    colocated_actors: int | None = None
    """Decode actors on the learner node's GPUs after prefill (no weight or KV transfer), as a
    hybrid engine shares them; None: as many as fit, gpus_per_node // gpus_per_actor
    (``ClusterSpec.colocated_actors``); 1 is the paper's actor 0 alone."""
    cut_threshold: float = 0.7
    rank_slack: float | None = 0.1  # ranked slices within this fraction of the balanced time
    n_min: int = 1
    n_max: int = 64
    continuation: bool = False
    migration: str = "kv"
    prefer: str = "most_free"
    first_epoch: str = "learned"
    """Length predictor of prompts without history: 'learned' (``flows/planning/first_epoch.py``)
    or 'reference' (the paper's rule), as ``generation.first_epoch_predictor`` live."""
    learner_tokens_per_s: float | None = None
    """None: simulate the generation phase only (as the paper's simulator does). A rate: each
    step also runs the learner's scoring and training on its rollout (prompt + response tokens
    of every sample / this rate, in seconds) after generation. Every policy's step time includes
    it. static:N is then the standalone baseline (module docstring): its actors stay allocated,
    and billed, through the learner's phases (paper §4.9), while serverless actors are already
    released. A policy's GPU-s count its actors only; the learner's are counted beside them
    (``learner_gpus``, ``replay.StepRecord.learner_gpu_seconds``)."""
    learner_gpus: int | None = None
    """GPUs the learner holds through every step, generation included (it waits for the
    rollout); None: one node, ``gpus_per_node``. They give each step's learner GPU-s, this
    count x the step's time; where they cover the node (>= ``gpus_per_node``), a serverless
    policy's prefill actor and co-located decode actors run on them and are counted once
    (``learner_node_gpu_seconds``)."""

    def cut_threshold_of(self, policy: Policy) -> float | None:
        """The cut threshold ``policy`` runs with (its strategy's rule, as live)."""
        return policy.scaling.cut_threshold(self.objective, self.cut_threshold) if policy.cut else None

    @property
    def max_actors(self) -> int:
        """Actors the cluster holds: an actor's GPUs are on one node, so each node holds
        gpus_per_node // gpus_per_actor of them and its remaining GPUs hold none."""
        return max(1, self.num_nodes * (self.gpus_per_node // self.gpus_per_actor))

    @property
    def num_learner_gpus(self) -> int:
        """``learner_gpus``, or one node's GPUs where it is None."""
        return self.learner_gpus if self.learner_gpus is not None else self.gpus_per_node

    @property
    def value_of_time(self) -> float:
        """``value_of_time_usd_per_s``, or where it is None the price of the learner's GPUs
        (``num_learner_gpus`` x the cluster's price per GPU-s), as the live planner prices the
        GPUs that wait for the phase (``scaling.default_value_of_time``). Passed to the planner
        resolved, since its own default counts the prefill actor's GPUs (one node here), not
        ``learner_gpus``."""
        if self.value_of_time_usd_per_s is not None:
            return self.value_of_time_usd_per_s
        return self.num_learner_gpus * self.cluster_spec().price_per_gpu_second

    def planner_settings(self, policy: Policy, tail_error: MeasuredError | None = None) -> PlannerSettings:
        """What the planner is told under ``policy`` (the live hook builds the same object), with
        the predictor's measured error where there is one."""
        return PlannerSettings(policy=policy.scaling, n_min=self.n_min, n_max=self.n_max, lam=self.lam,
                               assignment=policy.assignment, profile=self.profile, cluster=self.cluster_spec(),
                               cut_threshold=self.cut_threshold_of(policy), rank_slack=self.rank_slack,
                               objective=self.objective, value_of_time_usd_per_s=self.value_of_time,
                               time_slack=self.time_slack, budget_actors=self.budget_actors,
                               tail_error=tail_error)

    def planner(self, policy: Policy, *, group_size: int, max_length: float, window: int = 1) -> Planner:
        """The planner ``policy`` runs with on this cluster: the live planner's object, with
        predictions capped at ``max_length`` (the trace's generation cap), the predictor's
        error measured over ``tail_error_steps`` steps, and neither calibration, speculation,
        dedup prefill plan nor pre-warm (the simulator models those itself: its prefill actor
        computes every prompt in full, ``build_actors``)."""
        return Planner(PlannerRules(settings=self.planner_settings(policy), group_size=group_size,
                                    length_window=window, max_length=max_length, first_epoch=self.first_epoch,
                                    cut_threshold=self.cut_threshold_of(policy), full_prefill_action=True,
                                    tail_error_steps=self.tail_error_steps, tail_quantile=self.tail_quantile))

    def cluster_spec(self) -> ClusterSpec:
        """Planned actors are pre-warmed (see module docstring): all of them count as warm."""
        return ClusterSpec(gpus_per_actor=self.gpus_per_actor, max_actors=self.max_actors,
                           cold_start_s=self.cold_start_s, num_warm_actors=self.max_actors,
                           weight_bytes=self.weight_bytes,
                           kv_bytes_per_token=self.kv_bytes_per_token,
                           transfer_bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
                           num_prefill_gpus=self.gpus_per_node,
                           prewarm_idle_s=self.prewarm_idle_s,
                           colocated_actors=max(1, min(self.colocated_actors or self.gpus_per_node,
                                                       self.gpus_per_node // self.gpus_per_actor)))


def make_plan(policy: Policy, prompt_ids: Sequence[int], predicted: Mapping[int, float],
              prompt_lengths: Mapping[int, int], group_size: int,
              model: ClusterModel, tail_error: MeasuredError | None = None) -> GenerationPlan:
    return plan_generation(prompt_ids, predicted, group_size=group_size, prompt_lengths=prompt_lengths,
                           settings=model.planner_settings(policy, tail_error))


def serverful_ready_s(prompt_tokens: float, profile: TpotProfile) -> float:
    """When a serverful actor, invoked at t = 0, can decode: after it has prefilled its own
    ``prompt_tokens`` (each prompt once, shared by its samples) at the profile's prefill rate."""
    return prompt_tokens / profile.prefill_tokens_per_s


def held_actors(policy: Policy, plan: GenerationPlan) -> int:
    """Actors ``policy`` holds for ``plan``'s phase: a serverful ``static:N`` holds its N
    whether or not each has prompts (the planner caps a fixed N at the step's prompt count,
    ``scaling._actor_range``); any other policy, the plan's."""
    if policy.serverful and policy.scaling.num_actors is not None:
        return max(plan.num_actors, policy.scaling.num_actors)
    return plan.num_actors


def build_actors(policy: Policy, plan: GenerationPlan, samples: Mapping[int, list[Sample]],
                 prompt_lengths: Mapping[int, int], model: ClusterModel,
                 predicted: Mapping[int, float] | None = None) -> tuple[list[ActorSpec], float]:
    """Actor start-ups for ``plan`` and the GPU-s billed outside the decode actors. A
    serverful policy's specs are its ``held_actors``: the plan's, then idle ones, with no samples.

    With ``predicted`` (prompt id -> length the plan was made with) and a cutting policy, only
    the actors ``migrate.plan_cut_points`` gives a cut point can be cut, as in the live flow
    (which starts all its actions together; here each actor's ready time counts).
    """
    if policy.serverful:
        specs = []
        for pids in plan.assignments:
            ready = serverful_ready_s(sum(prompt_lengths[p] for p in pids), model.profile)
            specs.append(ActorSpec(tuple(s for p in pids for s in samples[p]), 0.0, ready,
                                   holds_until_end=True))
        # the planner gives a step of fewer prompts than N fewer actors; the allocation still
        # holds all N, so the rest are held idle and billed for the phase
        idle = held_actors(policy, plan) - len(specs)
        return specs + [ActorSpec((), 0.0, 0.0, holds_until_end=True)] * idle, 0.0
    cluster = model.cluster_spec()
    all_tokens = sum(prompt_lengths[p] for pids in plan.assignments for p in pids)
    prefill_s = prefill_seconds(all_tokens, model.profile, cluster)
    specs, extra = [], prefill_s * cluster.prefill_gpus
    starts = [actor_start(i, cluster, prefill_s, sum(prompt_lengths[p] for p in pids))
              for i, pids in enumerate(plan.assignments)]
    cuttable = [True] * len(starts)
    if model.cut_threshold_of(policy) is not None and predicted is not None:
        points = plan_cut_points_of(plan.assignments, predicted, {p: len(s) for p, s in samples.items()},
                                    prompt_lengths, model.cut_threshold, model.profile, [st.ready_s for st in starts],
                                    model.migration, model.kv_bytes_per_token / model.bandwidth_bytes_per_s)
        cuttable = [point is not None for point in points]
    for pids, st, cut in zip(plan.assignments, starts, cuttable):
        specs.append(ActorSpec(tuple(s for p in pids for s in samples[p]), st.invoked_s,
                               st.ready_s, cuttable=cut))
        extra += st.prewarm_idle_s * cluster.gpus_per_actor
    return specs, extra


def learner_node_gpu_seconds(policy: Policy, plan: GenerationPlan, specs: Sequence[ActorSpec],
                             release_s: Sequence[float], prompt_lengths: Mapping[int, int],
                             model: ClusterModel) -> float:
    """GPU-s ``policy`` billed on the learner node's GPUs in one generation phase: a serverless
    policy's prefill actor (every GPU of the node, for the prefill time) and its first
    ``colocated_actors`` decode actors (GPUs x invoke to release, ``release_s`` being the
    phase's per-actor release times, planned actors first); 0 for a serverful policy, whose
    actors hold GPUs of their own (module docstring). Continuations count as remote."""
    if policy.serverful:
        return 0.0
    cluster = model.cluster_spec()
    all_tokens = sum(prompt_lengths[p] for pids in plan.assignments for p in pids)
    billed = prefill_seconds(all_tokens, model.profile, cluster) * cluster.prefill_gpus
    for spec, release in list(zip(specs, release_s))[:cluster.colocated_actors]:
        billed += (release - spec.invoked_s) * cluster.gpus_per_actor
    return billed


def sim_config(policy: Policy, model: ClusterModel, spare_warm_actors: int) -> SimConfig:
    return SimConfig(profile=model.profile, gpus_per_actor=model.gpus_per_actor,
                     cut_threshold=model.cut_threshold_of(policy), continuation=model.continuation,
                     cold_start_s=model.cold_start_s,
                     weight_transfer_s=model.weight_bytes / model.bandwidth_bytes_per_s,
                     spare_warm_actors=spare_warm_actors, migration=model.migration,
                     kv_transfer_s_per_token=model.kv_bytes_per_token / model.bandwidth_bytes_per_s,
                     prefer=model.prefer)
