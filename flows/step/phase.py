"""The live planner's construction from the campaign's configuration, and its phase inputs.

The planner itself -- ``plan(inputs) -> PhasePlan`` before every generation phase,
``observe(record)`` after every step -- is ``flows/planning/planner.py``; this module turns
``scaling.*`` and ``generation.*``, the measured profile (``ctx.live``) and the pool's size into
its :class:`PlannerRules`, once per campaign (``flows/campaign/run.py``). The step flow
executes exactly the plan it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from actions.contracts import PromptTokens
from flows.invokers.cores import pool_cores
from flows.invokers.openwhisk.invoker import PREWARM_HOLD_S
from flows.planning.calibration import Calibration
from flows.planning.engine_starts import EngineStarts
from flows.planning.lengths import LengthHistory
from flows.planning.plan import ClusterSpec
from flows.planning.planner import PhaseInputs, PhasePlan, Planner, PlannerRules, PlannerState
from flows.planning.settings import PlannerSettings
from flows.planning.tpot import CPU_TINY_PROFILE, TpotProfile
from flows.step.context import RunContext

if TYPE_CHECKING:
    from actions.config.workload import GenerationConfig

__all__ = ["PhasePlan", "build_planner", "cluster_spec", "engine_starts", "load_profile", "phase_inputs",
           "plan_generation_phase", "planner_rules", "planner_settings", "runs_prefill_action"]


def load_profile(ctx: RunContext) -> TpotProfile:
    """The campaign's profile (measured, cached or its file: ``ctx.live``); outside a campaign
    ``scaling.profile`` or the built-in estimate."""
    if ctx.live is not None:
        return ctx.live.profile
    path = ctx.config.scaling.profile
    return TpotProfile.load(path, "scaling.profile") if path else CPU_TINY_PROFILE


def cluster_spec(ctx: RunContext, num_workers: int, calibration: Calibration = Calibration()) -> ClusterSpec:
    """The decode cluster as the planner sees it. With measured inputs: weights and prefix KV
    travel through the store at its measured read rate, every activation pays the measured
    round trip and the prefill action its fixed cost learned from the campaign's steps
    (``flows/planning/calibration.py``); on the local pool at most one action per ``threads`` cores (the share the
    profile was measured with) decodes at the measured speed, so that is the capacity (more
    would share cores the profile measured alone). Without ``dedup_prefill``, and on the vLLM
    engine, no prefill action runs (``runs_prefill_action``): the cluster has none, so no
    prefill time is planned and no prefix KV travels. On the vLLM engine an action beyond the
    workers known to hold an engine pays an engine start (``engine_starts``), as ``calibration``
    learned it."""
    s, live = ctx.config.scaling, ctx.live
    capacity = max(1, num_workers)
    transfer: dict[str, float] = {}
    if live is not None:
        transfer = dict(weight_bytes=live.weight_bytes, kv_bytes_per_token=live.kv_bytes_per_token,
                        transfer_bandwidth_bytes_per_s=live.transfer_bandwidth_bytes_per_s,
                        activation_s=live.activation_s, prefill_fixed_s=calibration.prefill_fixed_s)
        if ctx.config.invoker.kind != "openwhisk":
            capacity = max(1, min(capacity, pool_cores(ctx.config) // max(1, live.threads)))
    prefill_action = runs_prefill_action(ctx.config.generation)
    if not prefill_action:
        transfer["kv_bytes_per_token"] = 0.0
    # no container starts mid-phase on this machine: the local pool's workers start with it (an
    # actor beyond them, a fixed fan-out above invoker.num_workers, queues for one instead) and
    # the in-process invoker runs each action as a call in a thread of its own; a vLLM engine
    # may still have to start in the worker (engine_starts)
    kind = ctx.config.invoker.kind
    spec = ClusterSpec(gpus_per_actor=s.gpus_per_actor, max_actors=capacity,
                       price_per_gpu_second=ctx.config.price_per_gpu_second,
                       cold_start_s=s.cold_start_s if kind == "openwhisk" else 0.0,
                       num_warm_actors=max(1, num_workers),
                       max_concurrent_actors=max(1, num_workers) if kind == "local" else 0,
                       prefill_action=prefill_action, **transfer)
    starts = engine_starts(ctx, num_workers)
    return spec if starts is None else starts.cluster(spec, calibration)


def engine_starts(ctx: RunContext, num_workers: int) -> EngineStarts | None:
    """How the planner prices the vLLM engine's starts (``flows/planning/engine_starts.py``):
    on the ``num_workers`` workers of the local pool or OpenWhisk, whose new container pays its
    own start (``scaling.cold_start_s``) first and outlives the flow's process (a resume finds
    its engines; the local pool's start anew). None, no start priced: the torch engine, and the
    in-process invoker, whose actions share the flow process's one engine."""
    kind = ctx.config.invoker.kind
    if ctx.config.generation.engine != "vllm" or kind == "inprocess":
        return None
    return EngineStarts(workers=max(1, num_workers), outlives_process=kind == "openwhisk",
                        container_s=ctx.config.scaling.cold_start_s if kind == "openwhisk" else 0.0)


def runs_prefill_action(generation: GenerationConfig) -> bool:
    """Whether the step may run the separate prefill action: only for a dedup plan
    (``generation.dedup_prefill``; ``flows/step/flow.py`` runs it for no other), and not on the
    vLLM engine, which has no API to import the action's KV bundle; its prefix cache
    deduplicates a group's prompt inside the engine instead."""
    return generation.dedup_prefill and generation.engine != "vllm"


def planner_settings(ctx: RunContext, num_workers: int, profile: TpotProfile,
                     cluster: ClusterSpec) -> PlannerSettings:
    """The planner's settings from ``scaling.*`` and ``generation.*``, capped by the pool (the
    simulator builds the same object from its cluster model: ``ClusterModel.planner_settings``)."""
    s, g = ctx.config.scaling, ctx.config.generation
    return PlannerSettings(policy=s.strategy, n_min=s.n_min, n_max=max(s.n_min, min(s.n_max, num_workers)),
                           lam=s.lam, assignment=g.assignment, profile=profile, cluster=cluster,
                           cut_threshold=g.cut_threshold, rank_slack=g.rank_slack, objective=s.objective,
                           value_of_time_usd_per_s=s.value_of_time_usd_per_s, time_slack=s.time_slack,
                           budget_actors=s.budget_actors)


def planner_rules(ctx: RunContext, num_workers: int) -> PlannerRules:
    """Everything the live planner is configured with; calibrated where the inputs were
    measured (``ctx.live``)."""
    cfg = ctx.config
    g, s = cfg.generation, cfg.scaling
    settings = planner_settings(ctx, num_workers, load_profile(ctx), cluster_spec(ctx, num_workers))
    prefill = runs_prefill_action(g)
    # The EOS token is generated too, so no response runs past max_new_tokens.
    return PlannerRules(settings=settings, group_size=cfg.algorithm.group_size, length_window=g.length_window,
                        max_length=g.max_new_tokens, first_epoch=g.first_epoch_predictor,
                        cut_threshold=g.cut_threshold,
                        prefill_capacity=g.prefill_capacity if prefill else None,
                        prefill_action=g.prefill_action if prefill else "never",
                        speculative=g.speculation == "auto" and g.engine == "torch",
                        calibrated=ctx.live is not None,
                        prewarm_buffer_s=s.prewarm_buffer_s if s.prewarm else None,
                        prewarm_floor_s=PREWARM_HOLD_S if cfg.invoker.kind == "openwhisk" else 0.0,
                        tail_error_steps=s.tail_error_steps, tail_quantile=s.tail_quantile,
                        engine_starts=engine_starts(ctx, num_workers))


def build_planner(ctx: RunContext, num_workers: int, state: PlannerState | None = None) -> Planner:
    """The campaign's planner, continuing from ``state`` (a resumed run's) or new."""
    return Planner(planner_rules(ctx, num_workers), state)


def phase_inputs(tokens: Mapping[int, PromptTokens], prompt_ids: list[int], epoch: int) -> PhaseInputs:
    """The planner's inputs for a step's prompts (token ids from the token table)."""
    return PhaseInputs(prompt_ids=tuple(prompt_ids), epoch=epoch,
                       prompt_lengths={p: len(tokens[p].prompt) for p in prompt_ids},
                       reference_lengths={p: tokens[p].answer_len for p in prompt_ids},
                       prompts={p: tokens[p].prompt for p in prompt_ids})


def plan_generation_phase(ctx: RunContext, history: LengthHistory, tokens: Mapping[int, PromptTokens],
                          prompt_ids: list[int], num_workers: int,
                          call_history: dict[str, list[float]] | None = None,
                          spec_speedup: float = 1.0, calibration: Calibration | None = None) -> PhasePlan:
    """One phase planned outside a campaign's loop: a planner that remembers ``history``,
    ``call_history`` and ``spec_speedup``, planning with ``calibration`` (default: none
    learned yet)."""
    state = PlannerState(length_history=history.to_dict(), call_history=dict(call_history or {}),
                         spec_speedup=spec_speedup)
    return build_planner(ctx, num_workers, state).plan(phase_inputs(tokens, prompt_ids, 0),
                                                       calibration=calibration)
