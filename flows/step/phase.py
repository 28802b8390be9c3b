"""The flow-level hook that runs before every generation phase (the RLHFless planner).

``plan_generation_phase`` reads the response-length history, predicts each prompt's length
(EWMA; reference-answer length in the first epoch), picks the dedup prefix length, and asks
the planner for the fan-out and the prompt->action assignment. It is the only place the
step flow decides how generation is split; the flow executes exactly the returned plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from actions.common.contracts import PromptTokens

from flows.step.context import RunContext
from flows.campaign.live_profile import pool_cores
from flows.planning.calibration import Calibration
from flows.planning.lengths import LengthHistory, predict_lengths
from flows.planning.migrate import cut_threshold_for, plan_cut_points_of
from flows.planning.plan import ClusterSpec, GenerationPlan, PlannerSettings
from flows.planning.prefix import PrefillPlan, plan_prefill, prefill_action_pays
from flows.planning.prewarm import prewarm_offset
from flows.planning.tpot import CPU_TINY_PROFILE, TpotProfile
from flows.planning.scaling import plan_generation
from flows.planning.timeline import prefill_seconds
from flows.planning.speculation import speculative_profile


@dataclass(frozen=True)
class PhasePlan:
    plan: GenerationPlan
    prefill: PrefillPlan | None
    predicted: dict[int, float]
    cut_after: tuple[int | None, ...]  # per actor: samples finished before it is cut (None: never)
    prewarm_offset_s: float | None = None
    """Seconds after the step starts to pre-warm the generation actions (None: no history)."""
    predicted_prefill_s: float = 0.0
    """The planner's prefill time P (``timeline.prefill_seconds``): ``plan.predicted_time_s``
    minus this is its prediction of the generation actions' phase."""
    calibration: Calibration = Calibration()
    """The corrections the plan was timed with (recorded per step, learned from them)."""
    activation_s: float = 0.0
    """The per-activation fixed cost the plan was timed with."""


def load_profile(ctx: RunContext) -> TpotProfile:
    """The campaign's profile (measured, cached or its file: ``ctx.live``); outside a campaign
    ``scaling.profile`` or the built-in estimate."""
    if ctx.live is not None:
        return ctx.live.profile
    path = ctx.config.scaling.profile
    return TpotProfile.load(path) if path else CPU_TINY_PROFILE


def cluster_spec(ctx: RunContext, num_workers: int, calibration: Calibration = Calibration()) -> ClusterSpec:
    """The decode cluster as the planner sees it. With measured inputs: weights and prefix KV
    travel through the store at its measured read rate, every activation pays the measured
    round trip and the prefill action its fixed cost learned from the campaign's steps
    (``flows/planning/calibration.py``); on the local pool at most one action per ``threads`` cores (the share the
    profile was measured with) decodes at the measured speed, so that is the capacity (more
    would share cores the profile measured alone)."""
    s, live = ctx.config.scaling, ctx.live
    capacity = max(1, num_workers)
    transfer: dict[str, float] = {}
    if live is not None:
        transfer = dict(weight_bytes=live.weight_bytes, kv_bytes_per_token=live.kv_bytes_per_token,
                        transfer_bandwidth_bytes_per_s=live.transfer_bandwidth_bytes_per_s,
                        activation_s=live.activation_s, prefill_fixed_s=calibration.prefill_fixed_s)
        if ctx.config.invoker.kind != "openwhisk":
            capacity = max(1, min(capacity, pool_cores(ctx.config) // max(1, live.threads)))
    return ClusterSpec(gpus_per_actor=s.gpus_per_actor, max_actors=capacity,
                       price_per_gpu_second=ctx.config.price_per_gpu_second, cold_start_s=s.cold_start_s,
                       num_warm_actors=max(1, num_workers), **transfer)


def planner_settings(ctx: RunContext, num_workers: int, profile: TpotProfile,
                     cluster: ClusterSpec) -> PlannerSettings:
    """The planner's settings from ``scaling.*`` and ``generation.*``, capped by the pool (the
    simulator builds the same object from its cluster model: ``ClusterModel.planner_settings``)."""
    s, g = ctx.config.scaling, ctx.config.generation
    return PlannerSettings(policy=s.policy, n_min=s.n_min, n_max=max(s.n_min, min(s.n_max, num_workers)), lam=s.lam,
                           assignment=g.assignment, profile=profile, cluster=cluster,
                           cut_threshold=g.cut_threshold, rank_slack=g.rank_slack, objective=s.objective,
                           value_of_time_usd_per_s=s.value_of_time_usd_per_s, time_slack=s.time_slack,
                           budget_actors=s.budget_actors)


def _runs_prefill_action(setting: str, prefill: PrefillPlan, prompt_tokens: int, profile: TpotProfile,
                         cluster: ClusterSpec) -> bool:
    """``generation.prefill_action``; ``auto`` asks ``prefix.prefill_action_pays`` with the
    profile's prefill rate and the action's measured fixed costs (its round trip, and what the
    calibration learned of its policy read and bundle write)."""
    if setting != "auto":
        return setting == "always" and prefill.prefix_len is not None
    return prefill_action_pays(prefill, prompt_tokens, 1.0 / profile.prefill_tokens_per_s,
                               cluster.activation_s + cluster.prefill_fixed_s)


def plan_generation_phase(ctx: RunContext, history: LengthHistory, tokens: Mapping[int, PromptTokens],
                          prompt_ids: list[int], num_workers: int,
                          call_history: dict[str, list[float]] | None = None,
                          spec_speedup: float = 1.0, calibration: Calibration = Calibration()) -> PhasePlan:
    """The plan of one generation phase. ``call_history``: action -> its earliest invocation
    offset (seconds from step start) in each past step, for the pre-warm time;
    ``spec_speedup``: the measured decode speed-up of speculative decoding, which divides the
    profile's decode times (``flows/planning/speculation.py``); ``calibration``: the profile's
    and the prefill's corrections learned from the campaign's steps
    (``flows/planning/calibration.py``)."""
    cfg = ctx.config
    # The EOS token is generated too, so no response runs past max_new_tokens.
    prompts = {p: tokens[p].prompt for p in prompt_ids}
    prompt_lengths = {p: len(v) for p, v in prompts.items()}
    predicted = predict_lengths(history, prompt_ids, {p: tokens[p].answer_len for p in prompt_ids},
                                window=cfg.generation.length_window, max_length=cfg.generation.max_new_tokens,
                                first_epoch=cfg.generation.first_epoch_predictor, prompt_lengths=prompt_lengths)
    prefill = None
    if cfg.generation.dedup_prefill:
        prefill = plan_prefill(prompts, cfg.algorithm.group_size, cfg.generation.prefill_capacity)
    s = cfg.scaling
    profile = load_profile(ctx)
    if cfg.generation.speculation == "auto" and cfg.generation.engine == "torch":
        profile = speculative_profile(profile, spec_speedup)
    base = profile
    profile = calibration.profile(profile)
    cluster = cluster_spec(ctx, num_workers, calibration)
    if prefill is not None and not _runs_prefill_action(cfg.generation.prefill_action, prefill,
                                                        sum(prompt_lengths.values()), profile, cluster):
        prefill = None
        cluster = replace(cluster, prefill_action=False, kv_bytes_per_token=0.0)
    prefill_tokens = prefill.tokens_computed if prefill else sum(prompt_lengths.values())
    settings = planner_settings(ctx, num_workers, profile, cluster)

    per_fanout = bool(calibration.by_actors) and (s.policy == "cost_aware" or s.policy.startswith("fixed:"))
    if per_fanout:  # each fan-out timed at the speed measured at it, relative to the profile's scale
        settings = replace(settings, decode_scale_by_n=tuple(
            (n, scale / calibration.decode_scale) for n, scale in calibration.by_actors))
    plan = plan_generation(prompt_ids, predicted, group_size=cfg.algorithm.group_size,
                           prompt_lengths=prompt_lengths, settings=settings, prefill_tokens=prefill_tokens)
    if per_fanout:  # the plan was timed at its fan-out's speed: so are its cut points and its record
        calibration = calibration.for_actors(plan.num_actors)
        profile = calibration.profile(base)
    cut_after = tuple(plan_cut_points_of(
        plan.assignments, predicted, {p: cfg.algorithm.group_size for p in prompt_ids},
        prompt_lengths, cut_threshold_for(s.policy, s.objective, cfg.generation.cut_threshold), profile))
    offset = None
    if s.prewarm:
        offset = prewarm_offset((call_history or {}).get("generate", []), s.prewarm_buffer_s)
    return PhasePlan(plan, prefill, predicted, cut_after, offset,
                     predicted_prefill_s=prefill_seconds(prefill_tokens, profile, cluster),
                     calibration=calibration, activation_s=cluster.activation_s)
