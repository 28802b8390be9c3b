"""One step of the campaign: the planner plans it, the step flow runs it, the planner observes
its record, and the record folds into the next state (not yet committed:
``flows/campaign/run.py`` commits it)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from actions.contracts import PromptTokens
from flows.campaign.drafts import keys_for, record_drafts
from flows.campaign.schedule import step_prompts
from flows.campaign.setup import model_ref
from flows.campaign.state import SEALED, CampaignState
from flows.planning.planner import Planner
from flows.planning.record import StepRecord
from flows.step.context import RunContext
from flows.step.flow import StepOutcome, rlhf_step
from flows.step.metrics import BILLED, HINDSIGHT_GENERATE, USD, USEFUL, step_metrics, step_record
from flows.step.payloads import StepInputs
from flows.step.phase import phase_inputs


def run_one_step(ctx: RunContext, state: CampaignState, planner: Planner, tokens: Mapping[int, PromptTokens],
                 step_flow: Any = rlhf_step) -> tuple[CampaignState, StepRecord]:
    """Plan, run and record one step: the state after it and the step's record (which
    ``planner`` has observed; its ``metrics`` are the state's last step's)."""
    cfg = ctx.config
    t0 = time.time()
    epoch, prompt_ids = step_prompts(sorted(tokens), cfg.algorithm.prompts_per_step, state.step, cfg.seed)
    phase = planner.plan(phase_inputs(tokens, prompt_ids, epoch))
    inputs = StepInputs(step=state.step, epoch=epoch, prompt_ids=prompt_ids, model=model_ref(ctx, state),
                        reference_key=state.reference_key, train_key=state.prepared.train_key,
                        optimizer_key=state.optimizer_key, critic_key=state.critic_key,
                        critic_optimizer_key=state.critic_optimizer_key,
                        draft_keys=tuple(keys_for(ctx.prefix, state.draft_index, prompt_ids)),
                        spec_priors=dict(planner.state.spec_rates))
    t_plan = time.time() - t0
    out = step_flow(inputs, phase)
    metrics = step_metrics(out, phase, cfg.price_per_gpu_second, cfg.scaling.gpus_per_actor, t_plan)
    # The step's index, as its inputs and store objects (steps/<index>/) name it; what reports
    # show is steps committed, index + 1 (README, summary.json). Committed histories are checked
    # against it (state.py, _check_history), so it stays the index.
    metrics["step"] = float(state.step)
    metrics.update(out.prewarm)
    record = step_record(out, phase, step=state.step, epoch=epoch, metrics=metrics)
    observed = planner.observe(record)  # times the phase again at the observed lengths: the hindsight
    if observed is not None and observed.hindsight_generate_s is not None:
        metrics[HINDSIGHT_GENERATE] = observed.hindsight_generate_s
    metrics["plan"] = phase.plan.to_dict() | {"cut_after": list(phase.cut_after)}  # type: ignore[assignment]
    return _next_state(ctx, state, planner, out, metrics), record


def _next_state(ctx: RunContext, state: CampaignState, planner: Planner, out: StepOutcome,
                metrics: dict[str, Any]) -> CampaignState:
    """``state`` advanced by the step ``out`` (its ``metrics``) and the planner's memory after it."""
    train = out.train
    # a deep copy of all but the history lists, whose entries never change once appended (a deep
    # copy of every step's metrics cost time growing with the run: 0.5 s a step at 10,000 steps)
    new = state.model_copy(update={name: [] for name in SEALED}).model_copy(deep=True)
    for name in SEALED:
        setattr(new, name, list(getattr(state, name)))
    new.step = state.step + 1
    new.policy_key, new.policy_version = train.policy_key, train.policy_version
    new.weights_sha256 = train.weights_sha256
    new.optimizer_key = train.optimizer_key
    new.critic_key = train.critic_key or state.critic_key
    new.critic_optimizer_key = train.critic_optimizer_key or state.critic_optimizer_key
    new.planner = planner.state.model_copy(deep=True)
    g = ctx.config.generation
    if g.speculation == "auto" and "history" in g.draft_strategies:  # the responses, the next epoch's drafts
        new.draft_index = record_drafts(ctx.store, ctx.prefix, state.step,
                                        [r.rollout_key for r in out.generate], state.draft_index)
    new.steps.append(metrics)
    new.add_spend("steps", metrics[BILLED], metrics[USEFUL], metrics[USD])
    return new
