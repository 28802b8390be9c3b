"""One step of the campaign: the planner plans it, the step flow runs it, the planner observes
its record, and the record folds into the next state (not yet committed:
``flows/campaign/run.py`` commits it)."""

from __future__ import annotations

import time
from typing import Any

from actions.contracts import PromptTokens
from flows.campaign.drafts import keys_for, record_drafts
from flows.campaign.schedule import step_prompts
from flows.campaign.setup import evaluates, model_ref
from flows.campaign.state import CampaignState
from flows.config import CampaignConfig
from flows.planning.planner import Planner
from flows.planning.record import StepRecord
from flows.step.context import RunContext
from flows.step.flow import StepOutcome, rlhf_step
from flows.step.metrics import BILLED, USD, USEFUL, step_metrics, step_record
from flows.step.payloads import StepInputs
from flows.step.phase import phase_inputs


def evaluation_due(cfg: CampaignConfig, state: CampaignState, stop: str | None = None) -> bool:
    """Whether ``state``'s policy is evaluated before its step is committed: where the run
    evaluates, every ``eval_every`` steps, after the last step, and after the step a budget
    ``stop`` ends the run with."""
    periodic = bool(cfg.eval_every) and state.step % cfg.eval_every == 0
    return evaluates(state) and (periodic or state.step == cfg.steps or stop is not None)


def budget_stop(cfg: CampaignConfig, state: CampaignState, *, before_evaluation: bool = False) -> str | None:
    """Why the next step may not run, or None: it may, or ``state`` is the campaign's last step
    anyway (``steps``), which stops no run early. ``before_evaluation``: ``state``'s step has
    just run and is not evaluated yet (``_loop`` judges it so); a committed state has had the
    evaluations it gets.

    A ``budget.*`` stops the run when the spend so far (steps, evaluations and set-up: every
    activation, ``CampaignState.spend``) plus the estimate of what is still to come before the
    next step's commit would exceed it. The estimate is the last step's cost plus, where the run
    evaluates, the last evaluation's for each evaluation to come: the one ``eval_every`` asks of
    ``state``'s step, ``before_evaluation``, and the one after the next step, due then
    (``eval_every``, the last step) or made whenever the budget stops the run there; reserving it
    keeps that final evaluation within the budget too. The first step has no cost to judge it
    by: it always runs."""
    if not state.steps or state.step >= cfg.steps:
        return None
    last, b = state.steps[-1], cfg.budget
    ev = state.evals[-1] if evaluates(state) and state.evals else None
    owed = before_evaluation and ev is not None and evaluation_due(cfg, state)  # this step's, still to make
    evals = 0 if ev is None else 2 if owed else 1
    what = ("this step's evaluation, the next step and the evaluation after it" if owed else
            "the next step and the evaluation after it" if evals else "the next step")
    next_usd = last[USD] + evals * (ev.usd if ev is not None else 0.0)
    if b.usd is not None and state.spend["usd"] + next_usd > b.usd:
        return (f"budget.usd={b.usd} would be exceeded by {what} (spent {state.spend['usd']:.6f}, "
                f"next about {next_usd:.6f})")
    next_billed = last[BILLED] + evals * (ev.billed_gpu_seconds if ev is not None else 0.0)
    if b.gpu_seconds is not None and state.spend["billed_gpu_seconds"] + next_billed > b.gpu_seconds:
        return (f"budget.gpu_seconds={b.gpu_seconds} would be exceeded by {what} "
                f"(spent {state.spend['billed_gpu_seconds']:.1f}, next about {next_billed:.1f})")
    return None


def runs_a_step(cfg: CampaignConfig, state: CampaignState) -> bool:
    """Whether the campaign runs another step from ``state``: ``steps`` not reached, and no budget stops it."""
    return state.step < cfg.steps and budget_stop(cfg, state) is None


def run_one_step(ctx: RunContext, state: CampaignState, planner: Planner, tokens: dict[int, PromptTokens],
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
    t_commit0 = time.time()
    metrics = step_metrics(out, phase, cfg.price_per_gpu_second, cfg.scaling.gpus_per_actor, t_plan,
                           time.time() - t_commit0)
    # The step's index, as its inputs and store objects (steps/<index>/) name it; what reports
    # show is steps committed, index + 1 (README, summary.json). Committed histories are checked
    # against it (state.py, _check_history), so it stays the index.
    metrics["step"] = float(state.step)
    metrics.update(out.prewarm)
    record = step_record(out, phase, step=state.step, epoch=epoch, metrics=metrics)
    planner.observe(record)
    metrics["plan"] = phase.plan.to_dict() | {"cut_after": list(phase.cut_after)}  # type: ignore[assignment]
    return _next_state(ctx, state, planner, out, metrics), record


def _next_state(ctx: RunContext, state: CampaignState, planner: Planner, out: StepOutcome,
                metrics: dict[str, Any]) -> CampaignState:
    """``state`` advanced by the step ``out`` (its ``metrics``) and the planner's memory after it."""
    train = out.train
    new = state.model_copy(deep=True)
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
