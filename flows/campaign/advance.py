"""One step of the campaign: plan it, run the step flow, fold what it measured into the next
state (not yet committed: ``flows/campaign/run.py`` commits it)."""

from __future__ import annotations

import time
from typing import Any

from actions.common.contracts import PromptTokens
from flows.campaign.drafts import keys_for, record_drafts
from flows.campaign.schedule import step_prompts
from flows.campaign.setup import model_ref
from flows.campaign.state import CampaignState
from flows.config import CampaignConfig
from flows.planning.calibration import Calibration, calibrate
from flows.planning.lengths import LengthHistory
from flows.planning.speculation import acceptance_rates, decode_speedup, running_speedup
from flows.step.context import RunContext
from flows.step.flow import StepOutcome, rlhf_step
from flows.step.metrics import step_metrics
from flows.step.payloads import StepInputs
from flows.step.phase import plan_generation_phase

CALL_HISTORY = 8
"""Steps of call history kept for pre-warming (the earliest offset over them is used)."""


def budget_stop(cfg: CampaignConfig, state: CampaignState) -> str | None:
    """Why the next step may not run (``budget.*``: the last step's cost would exceed it), or None."""
    if not state.steps:
        return None
    last = state.steps[-1]
    b = cfg.budget
    if b.usd is not None and state.spend["usd"] + last["cost/usd"] > b.usd:
        return f"budget.usd={b.usd} would be exceeded by the next step (spent {state.spend['usd']:.6f})"
    if b.gpu_seconds is not None and state.spend["billed_gpu_seconds"] + last["cost/billed_gpu_seconds"] > b.gpu_seconds:
        return (f"budget.gpu_seconds={b.gpu_seconds} would be exceeded by the next step "
                f"(spent {state.spend['billed_gpu_seconds']:.1f})")
    return None


def _record_speculation(ctx: RunContext, state: CampaignState, new: CampaignState, out: StepOutcome) -> None:
    """Keep the step's responses as history drafts and its measured acceptance and speed-up."""
    g = ctx.config.generation
    if g.speculation == "auto" and "history" in g.draft_strategies:
        new.draft_index = record_drafts(ctx.store, ctx.prefix, state.step,
                                        [r.rollout_key for r in out.generate], state.draft_index)
    reports = [r.spec for r in out.generate]
    if any(reports):
        new.spec_rates = acceptance_rates(reports, state.spec_rates)
        new.spec_speedup = running_speedup(state.spec_speedup, decode_speedup([r for r in reports if r]))


def run_one_step(ctx: RunContext, state: CampaignState, tokens: dict[int, PromptTokens],
                 num_workers: int, step_flow: Any = rlhf_step) -> CampaignState:
    cfg = ctx.config
    t0 = time.time()
    epoch, prompt_ids = step_prompts(sorted(tokens), cfg.algorithm.prompts_per_step, state.step, cfg.seed)
    history = LengthHistory.from_dict(state.length_history)
    calibration = calibrate(state.steps) if ctx.live is not None else Calibration()  # measured inputs only
    phase = plan_generation_phase(ctx, history, tokens, prompt_ids, num_workers, state.call_history,
                                  spec_speedup=state.spec_speedup, calibration=calibration)
    inputs = StepInputs(step=state.step, epoch=epoch, prompt_ids=prompt_ids, model=model_ref(ctx, state),
                        reference_key=state.reference_key, train_key=state.prepared.train_key,
                        optimizer_key=state.optimizer_key, critic_key=state.critic_key,
                        critic_optimizer_key=state.critic_optimizer_key,
                        draft_keys=tuple(keys_for(ctx.prefix, state.draft_index, prompt_ids)),
                        spec_priors=dict(state.spec_rates))
    t_plan = time.time() - t0
    out = step_flow(inputs, phase)
    t_commit0 = time.time()
    lengths: dict[int, list[int]] = {}
    for g in out.generate:
        for s in g.samples:
            if s.finish_reason != "cut":
                lengths.setdefault(s.prompt_id, []).append(s.length)
    for pid, lens in lengths.items():
        history.record(pid, epoch, lens, tokens[pid].answer_len, len(tokens[pid].prompt))
    train = out.train
    new = state.model_copy(deep=True)
    new.step = state.step + 1
    new.policy_key, new.policy_version = train.policy_key, train.policy_version
    new.weights_sha256 = train.weights_sha256
    new.optimizer_key = train.optimizer_key
    new.critic_key = train.critic_key or state.critic_key
    new.critic_optimizer_key = train.critic_optimizer_key or state.critic_optimizer_key
    new.length_history = history.to_dict()
    _record_speculation(ctx, state, new, out)
    for action, offset in out.call_offsets.items():  # the last CALL_HISTORY steps
        new.call_history[action] = [*state.call_history.get(action, []), offset][-CALL_HISTORY:]
    metrics = step_metrics(out, phase, cfg.price_per_gpu_second, cfg.scaling.gpus_per_actor, t_plan,
                           time.time() - t_commit0)
    metrics["step"] = float(state.step)
    metrics.update(out.prewarm)
    metrics["plan"] = phase.plan.to_dict() | {"cut_after": list(phase.cut_after)}  # type: ignore[assignment]
    new.steps.append(metrics)
    new.spend = {"billed_gpu_seconds": state.spend["billed_gpu_seconds"] + metrics["cost/billed_gpu_seconds"],
                 "useful_gpu_seconds": state.spend["useful_gpu_seconds"] + metrics["cost/gpu_seconds"],
                 "usd": state.spend["usd"] + metrics["cost/usd"]}
    return new
