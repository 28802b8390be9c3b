"""Building each action's payload for a step: object keys derived from (run, step, shard).

Deterministic keys are what make a replayed or retried step idempotent: the same step writes
the same objects, whichever attempt or fan-out produced them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actions.contracts import (
    DecodeSettings,
    GenerateRequest,
    ModelRef,
    PrefillRequest,
    ScoreRequest,
    TrainStepRequest,
    reward_model_refs,
)
from flows.step.context import RunContext


@dataclass(frozen=True)
class StepInputs:
    step: int
    epoch: int
    prompt_ids: list[int]
    model: ModelRef
    reference_key: str
    train_key: str
    optimizer_key: str | None
    critic_key: str | None
    critic_optimizer_key: str | None
    draft_keys: tuple[str, ...] = ()
    """Draft-history objects of this step's prompts (``flows/campaign/drafts.py``)."""
    spec_priors: dict[str, float] | None = None
    """Strategy -> acceptance rate measured by earlier steps."""


def step_prefix(ctx: RunContext, step: int) -> str:
    return f"{ctx.prefix}/steps/{step:06d}"


def prefill_payload(ctx: RunContext, inputs: StepInputs, phase: Any) -> dict[str, Any]:
    return PrefillRequest(
        model=inputs.model, dataset_key=inputs.train_key, prompt_ids=inputs.prompt_ids,
        prefix_len=phase.prefill.prefix_len,
        output_key=f"{step_prefix(ctx, inputs.step)}/kv/v{inputs.model.policy_version:06d}/manifest.json",
    ).model_dump(mode="json")


def generate_payload(ctx: RunContext, inputs: StepInputs, shard: str, prompt_ids: list[int] | tuple[int, ...],
                     cut_after: int | None, bundle_key: str | None, partial_keys: list[str] | None = None
                     ) -> dict[str, Any]:
    g = ctx.config.generation
    return GenerateRequest(
        model=inputs.model, dataset_key=inputs.train_key, run_seed=ctx.config.seed, step=inputs.step, shard=shard,
        prompt_ids=list(prompt_ids), group_size=ctx.config.algorithm.group_size, partial_keys=partial_keys or [],
        max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
        dedup_prefill=g.dedup_prefill, **DecodeSettings.of(g).model_dump(),
        kv_bundle_key=bundle_key, cut_after=cut_after,
        speculation=g.speculation, draft_strategies=list(g.draft_strategies), max_draft_len=g.max_draft_len,
        draft_keys=list(inputs.draft_keys), spec_priors=dict(inputs.spec_priors or {}),
        output_key=f"{step_prefix(ctx, inputs.step)}/rollouts/{shard}.json",
    ).model_dump(mode="json")


def score_payload(ctx: RunContext, inputs: StepInputs, rollout_keys: list[str], shard: str) -> dict[str, Any]:
    return ScoreRequest(
        policy=inputs.model, reference_key=inputs.reference_key, critic_key=inputs.critic_key,
        dataset_key=inputs.train_key, rollout_keys=rollout_keys, rewards=ctx.config.reward_functions(),
        reward_models=reward_model_refs(ctx.config, ctx.prefix), step=inputs.step, max_steps=ctx.config.steps,
        algorithm=ctx.config.algorithm, temperature=ctx.config.generation.temperature,
        output_key=f"{step_prefix(ctx, inputs.step)}/scored/{shard}/manifest.json",
    ).model_dump(mode="json")


def train_payload(ctx: RunContext, inputs: StepInputs, scored_keys: list[str]) -> dict[str, Any]:
    return TrainStepRequest(
        policy=inputs.model, optimizer_key=inputs.optimizer_key, critic_key=inputs.critic_key,
        critic_optimizer_key=inputs.critic_optimizer_key, scored_keys=sorted(scored_keys),
        algorithm=ctx.config.algorithm, seed=ctx.config.seed, step=inputs.step,
        output_prefix=f"{step_prefix(ctx, inputs.step)}/train",
        gradient_checkpointing=ctx.config.model.gradient_checkpointing,
        world_size=ctx.config.train.world_size, gpus_per_actor=ctx.config.scaling.gpus_per_actor,
        temperature=ctx.config.generation.temperature,
        max_new_tokens=(ctx.config.generation.max_new_tokens
                        if ctx.config.algorithm.loss_agg == "seq_mean_token_sum_norm" else None),
    ).model_dump(mode="json")
