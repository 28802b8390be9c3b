"""The training campaign: set up once, then loop over RLHF steps, committing each one.

``rlhf_campaign`` resumes from the last committed step of its run, evaluates on the held-out
set before RL, every ``eval_every`` steps and at the end, stops cleanly before a step that
would exceed the budget, and returns the JSON summary the CLI writes.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from prefect import flow

from flows.config import CampaignConfig
from actions.common.contracts import (EvaluateRequest, ModelRef, PromptTokens, WarmupRequest, WarmupResult,
                                      parse_token_table)
from actions.common.store import ObjectStore, get_json, open_store
from flows.campaign.artifacts import publish_step_artifacts, start_progress, update_progress
from flows.step.context import RunContext, set_context
from flows.step.phase import plan_generation_phase
from flows.campaign.inputs import init_critic, prepare_inputs
from flows.campaign.live_profile import finish_profiling, start_profiling
from flows.invokers.factory import make_invoker, pool_size
from flows.step.metrics import billing, planner_fidelity, step_metrics
from flows.campaign.overhead import Background, StepClock, open_gate_when_running, quiet_step_flows
from flows.campaign.prestart import FlowRunStarter
from flows.planning.calibration import Calibration, calibrate
from flows.planning.lengths import LengthHistory
from flows.step.flow import StepOutcome, rlhf_step
from flows.step.prewarmer import prewarm_in_background
from flows.campaign.schedule import step_prompts
from flows.campaign.drafts import drop_unreferenced, keys_for, record_drafts
from flows.campaign.collect import collect_garbage
from flows.planning.speculation import acceptance_rates, decode_speedup, running_speedup
from flows.campaign.lease import RunLease, held_lease
from flows.planning.retention import Retention
from flows.campaign.state import CampaignRefused, CampaignState, EvalRecord, check_resume, commit_state, load_state
from flows.step.payloads import StepInputs
from flows.step.invoke import invoke_action
from flows.campaign.trackers import Trackers

Progress = Callable[[str], None]
CALL_HISTORY = 8
"""Steps of call history kept for pre-warming (the earliest offset over them is used)."""
SETTLE_S = 0.25
"""Longest wait, before training, for a background job in flight to end."""


def _evaluate(ctx: RunContext, state: CampaignState, clock: StepClock | None = None) -> EvalRecord:
    req = EvaluateRequest(model=_model_ref(ctx, state), dataset_key=state.prepared.eval_key,
                          rewards=ctx.config.reward_functions(),
                          max_new_tokens=ctx.config.generation.max_new_tokens, engine=ctx.config.generation.engine,
                          kv_cache=ctx.config.generation.kv_cache, cuda_graphs=ctx.config.generation.cuda_graphs,
                          compile_decode=ctx.config.generation.compile_decode,
                          output_key=f"{ctx.prefix}/evals/v{state.policy_version:06d}.json")
    out = invoke_action(action="evaluate", payload=req.model_dump(mode="json"), shard=f"eval-v{state.policy_version}")
    if clock is not None:
        clock.add_work(out.record.busy_s)
    return EvalRecord(step=state.step, policy_version=state.policy_version, **out.result.model_dump())


def _evaluates(state: CampaignState) -> bool:
    """False where the data has no eval set (``data.eval_path`` unset, no ``eval_fraction``)."""
    return state.prepared.data.get("evaluation") != "none"


def _model_ref(ctx: RunContext, state: CampaignState) -> ModelRef:
    lora = ctx.config.model.lora  # the backbone is policy version 0, the KL reference
    return ModelRef(store_uri=ctx.store.uri, base_key=state.prepared.base_key, policy_key=state.policy_key,
                    policy_version=state.policy_version, weights_sha256=state.weights_sha256 or None,
                    dtype=ctx.config.model.dtype, lora=lora, backbone_key=state.reference_key if lora else None)


def _setup(ctx: RunContext, progress: Progress) -> CampaignState:
    cfg = ctx.config
    progress("prepare: model, initial weights and datasets -> store")
    prepared = prepare_inputs(ctx)
    policy_key = prepared.init_key
    # the pool profiles the engine beside warm-up and the first evaluation (speed does not
    # depend on the weights' values, so the initial ones do)
    init = ModelRef(store_uri=ctx.store.uri, base_key=prepared.base_key, policy_key=prepared.init_key,
                    policy_version=0, dtype=cfg.model.dtype)
    profiling = start_profiling(ctx, init, parse_token_table(get_json(ctx.store, prepared.tokens_key)))
    if cfg.warmup.steps:
        progress(f"warmup: {cfg.warmup.steps} supervised steps")
        req = WarmupRequest(store_uri=ctx.store.uri, base_key=prepared.base_key, init_key=prepared.init_key,
                            dataset_key=prepared.train_key, output_key=f"{ctx.prefix}/policy/v000000/manifest.json",
                            warmup=cfg.warmup, task=None if cfg.data.train_path else cfg.data.task, seed=cfg.seed)
        warm: WarmupResult = invoke_action(action="warmup", payload=req.model_dump(mode="json"), shard="warmup").result
        policy_key, sha = warm.policy_key, warm.weights_sha256
    else:
        sha = ""
    state = CampaignState(run_id=ctx.run_id, fingerprint=cfg.fingerprint(), identity=cfg.identity(),
                          policy_key=policy_key, reference_key=policy_key, prepared=prepared,
                          weights_sha256=sha)
    if cfg.algorithm.name == "ppo":
        state.critic_key = init_critic(ctx, _model_ref(ctx, state))
    if _evaluates(state):
        state.evals.append(_evaluate(ctx, state))
    ctx.live = finish_profiling(ctx, profiling, progress)
    return state


def _budget_stop(cfg: CampaignConfig, state: CampaignState) -> str | None:
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


def _run_one_step(ctx: RunContext, state: CampaignState, tokens: dict[int, PromptTokens],
                  num_workers: int, step_flow: Any = rlhf_step) -> CampaignState:
    cfg = ctx.config
    t0 = time.time()
    epoch, prompt_ids = step_prompts(sorted(tokens), cfg.algorithm.prompts_per_step, state.step, cfg.seed)
    history = LengthHistory.from_dict(state.length_history)
    calibration = calibrate(state.steps) if ctx.live is not None else Calibration()  # measured inputs only
    phase = plan_generation_phase(ctx, history, tokens, prompt_ids, num_workers, state.call_history,
                                  spec_speedup=state.spec_speedup, calibration=calibration)
    inputs = StepInputs(step=state.step, epoch=epoch, prompt_ids=prompt_ids, model=_model_ref(ctx, state),
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


def run_campaign(cfg: CampaignConfig, *, resume: bool = False, progress: Progress = print,
                 store: ObjectStore | None = None, break_lease: bool = False) -> dict[str, Any]:
    """Run (or resume) a campaign to ``cfg.steps`` steps and return its summary.

    Holds the run's lease throughout (``flows/campaign/lease.py``): adopts the one this process already
    holds (the CLI takes it before Prefect starts), else takes it, refusing with ``LeaseHeld``
    when a live process has it. Every commit and collection checks the lease first.
    """
    started = time.time()
    store = store or open_store(cfg.store.uri)
    run_id = cfg.resolved_run_id()
    lease = held_lease(store, run_id)
    owned = lease is None
    if lease is None:
        lease = RunLease.acquire(store, run_id, ttl_s=cfg.store.lease_ttl_s, break_lease=break_lease,
                                 progress=progress)
    try:
        return _run_leased(cfg, store, run_id, lease, resume, progress, started)
    finally:
        if owned:
            lease.release()


def _run_leased(cfg: CampaignConfig, store: ObjectStore, run_id: str, lease: RunLease, resume: bool,
                progress: Progress, started: float) -> dict[str, Any]:
    existing = load_state(store, run_id)
    check_resume(existing, cfg, resume)
    retention = Retention(cfg.store.keep_last, cfg.store.checkpoint_every)
    board = Trackers.open(cfg, run_id)  # observability.report_to: TensorBoard, wandb, MLflow, trackio
    num_workers = pool_size(cfg)
    invoker = make_invoker(cfg, num_workers)
    ctx = RunContext(config=cfg, store=store, invoker=invoker, run_id=run_id)
    set_context(ctx)
    warming: threading.Thread | None = None  # the next step's policy, loading in generation workers
    gc_total = {"collections": 0, "deleted_objects": 0, "deleted_blobs": 0, "freed_bytes": 0, "seconds": 0.0}
    # Prefect artifacts and each step's flow run (flows/campaign/prestart.py), off the steps'
    # critical path: made in the generation phase of a step, never beside its training
    quiet_api = threading.Event()
    publisher = Background(quiet_api)
    step_flow = FlowRunStarter(open_gate_when_running(rlhf_step, quiet_api), publisher)
    ctx.before_train = functools.partial(_hold_for_training, quiet_api, publisher)

    def collect(state: CampaignState) -> None:
        report = collect_garbage(store, state, retention, lease=lease)
        gc_total["collections"] += 1
        for k in ("deleted_objects", "deleted_blobs", "freed_bytes", "seconds"):
            gc_total[k] += getattr(report, k)

    try:
        state = existing
        if state is None:
            state = _setup(ctx, progress)
            lease.check()
            commit_state(store, state)
        else:  # finish a collection a crash may have cut short
            collect(state)
        tokens = parse_token_table(get_json(store, state.prepared.tokens_key))
        if ctx.live is None:  # a resumed run: the store's cached profile, usually
            ctx.live = finish_profiling(ctx, start_profiling(ctx, _model_ref(ctx, state), tokens), progress)
        state.stopped_reason = None
        if state.step < cfg.steps and cfg.invoker.kind == "local":
            # The pool's workers exist already: each loads the policy and the generation code
            # now, so the first step's activations start warm (the later steps' pre-warm is
            # planned from the call history, flows/step/phase.py).
            invoker.prewarm("generate", num_workers, model=_model_ref(ctx, state).model_dump(mode="json"))
        progress_id = start_progress(run_id, state.step, cfg.steps)
        clock = StepClock()
        with quiet_step_flows():
            if state.step < cfg.steps:
                step_flow.prepare()
            while state.step < cfg.steps:
                reason = _budget_stop(cfg, state)
                if reason:
                    state.stopped_reason = reason
                    progress(f"stopping before step {state.step}: {reason}")
                    break
                lease.check()
                old_drafts = state.draft_index
                state = _run_one_step(ctx, state, tokens, num_workers,
                                      functools.partial(step_flow.run, prepare_next=state.step + 1 < cfg.steps))
                last = state.steps[-1]
                if cfg.invoker.kind == "local" and state.step < cfg.steps:
                    # The next step generates with the version just trained: its workers load it
                    # while this step is committed and the next step's flow run starts.
                    warming = prewarm_in_background(invoker, "generate", int(last["actors/n"]),
                                                    _model_ref(ctx, state).model_dump(mode="json"))
                if _evaluates(state) and (cfg.eval_every and state.step % cfg.eval_every == 0
                                          or state.step == cfg.steps):
                    state.evals.append(_evaluate(ctx, state, clock))
                last["timing_s/period"], last["timing_s/overhead"] = clock.close_period(last["timing_s/work"])
                lease.check()
                t_commit = time.time()
                commit_state(store, state)
                collect(state)  # after the commit, never before
                drop_unreferenced(store, ctx.prefix, old_drafts, state.draft_index)
                clock.add_work(time.time() - t_commit)
                quiet_api.clear()  # published once the next step's flow run is running (or at the end)
                publisher.submit(_publish, run_id, list(state.steps), list(state.evals), progress_id, state.step,
                                 cfg.steps)
                board.add_step(state.step, last, state.evals)
                progress(_progress_line(state, cfg.steps))
    finally:
        set_context(None)
        if warming is not None:
            warming.join()
        invoker.close()
        board.close()
        try:
            step_flow.close()  # a flow run prepared for a step that did not come
        finally:
            publisher.wait()
    return summarize(state, time.time() - started) | {"billing": billing(cfg.invoker.kind), "gc": gc_total,
                                                      "profile": ctx.live.describe() if ctx.live else None}


def _hold_for_training(gate: threading.Event, background: Background) -> None:
    """Keep the background queue's jobs to the generation phase, where a generate activation
    leaves them a core (``flows/invokers/cores.py``): close the gate (the next step's flow run
    opens it again once it is Running) and let the job in flight, if any, end first."""
    gate.clear()
    background.settle(SETTLE_S)


def _publish(run_id: str, steps: list[dict[str, Any]], evals: list[dict[str, Any]], progress_id: Any,
             done: int, total: int) -> None:
    publish_step_artifacts(run_id, steps, evals)
    update_progress(progress_id, run_id, done, total)


def _progress_line(state: CampaignState, total: int, width: int = 20) -> str:
    """A text progress bar for the campaign plus the phases of the step just finished."""
    last = state.steps[-1]
    done = int(width * state.step / max(1, total))
    phases = " ".join(f"{p} {last[f'timing_s/{p}']:.1f}s" for p in ("plan", "prefill", "generate", "score", "train", "overhead",
                                                                      "commit"))
    acc = f" | eval acc {state.evals[-1].accuracy:.3f}" if state.evals and state.evals[-1].step == state.step else ""
    return (f"[{'#' * done}{'.' * (width - done)}] step {state.step}/{total} | {phases} | "
            f"actions {int(last['actors/n'])} cut {int(last['actors/migrated'])} | "
            f"reward {last['reward/mean']:.3f} len {last['response_length/mean']:.1f}{acc}")


def summarize(state: CampaignState, wall: float) -> dict[str, Any]:
    steps = [{k: v for k, v in s.items() if k != "plan"} for s in state.steps]
    return {
        "run_id": state.run_id,
        "steps_completed": state.step,
        "eval_accuracy_first": state.evals[0].accuracy if state.evals else None,
        "eval_accuracy_last": state.evals[-1].accuracy if state.evals else None,
        "reward_mean_first": steps[0]["reward/mean"] if steps else None,
        "reward_mean_last": steps[-1]["reward/mean"] if steps else None,
        "billed_gpu_seconds": state.spend["billed_gpu_seconds"],
        "useful_gpu_seconds": state.spend["useful_gpu_seconds"],
        "usd": state.spend["usd"],
        "wall_seconds": wall,
        "policy_version": state.policy_version,
        "data": state.prepared.data,
        "weights_sha256": state.weights_sha256,
        "stopped_reason": state.stopped_reason,
        "length_history": state.length_history,  # per prompt: [epoch, longest response of its group]
        "evals": [e.model_dump(mode="json") for e in state.evals],
        "planner_fidelity": planner_fidelity(steps),
        "steps": steps,
    }


@flow(name="rlhf-campaign", log_prints=True)
def rlhf_campaign(config: CampaignConfig, resume: bool = False, break_lease: bool = False) -> dict[str, Any]:
    """Prefect entrypoint. ``config`` arrives as a dict (deployment parameters, the CLI) and is
    validated by Prefect with pydantic before the run starts: a bad value fails the run with
    ``ParameterTypeError`` naming the field (``config.algorithm.batch_size``), and a deployment
    rejects it when the run is created (the parameter schema is CampaignConfig's JSON schema)."""
    return run_campaign(config, resume=resume, break_lease=break_lease)


__all__ = ["rlhf_campaign", "run_campaign", "CampaignRefused", "check_resume"]
