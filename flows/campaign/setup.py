"""A campaign's set-up, record 0 of its state: prepare, profile, warm-up, critic, evaluation.

Also the two helpers every later step shares with it: the policy's :class:`ModelRef` of a
state and one held-out evaluation (:func:`evaluate`).
"""

from __future__ import annotations

from collections.abc import Callable

from actions.contracts import (
    DecodeSettings,
    EvaluateRequest,
    ModelRef,
    WarmupRequest,
    WarmupResult,
    reward_model_refs,
)
from flows.campaign.budget import evaluates
from flows.campaign.data_line import data_line
from flows.campaign.inputs import init_critic, prepare_inputs
from flows.campaign.live_profile import finish_profiling, start_profiling
from flows.campaign.overhead import StepClock
from flows.campaign.state import CampaignState, EvalRecord
from flows.step.context import RunContext
from flows.step.invoke import Ledger, accounted, invoke_action
from flows.step.metrics import BILLED, USD, USEFUL, cost_metrics

Progress = Callable[[str], None]


def model_ref(ctx: RunContext, state: CampaignState) -> ModelRef:
    """The policy a state continues from, as the actions load it. Under ``model.lora`` the
    backbone is policy version 0, which is also the KL reference."""
    lora = ctx.config.model.lora
    return ModelRef(store_uri=ctx.store.uri, base_key=state.prepared.base_key, policy_key=state.policy_key,
                    policy_version=state.policy_version, weights_sha256=state.weights_sha256 or None,
                    dtype=ctx.config.model.dtype, lora=lora, backbone_key=state.reference_key if lora else None)


def evaluate(ctx: RunContext, state: CampaignState, clock: StepClock | None = None) -> EvalRecord:
    """One held-out evaluation of the state's policy, with what its activations cost (failed
    attempts included: ``CampaignState.add_evaluation`` adds it to the spend); its busy time is
    work of ``clock``'s period."""
    req = EvaluateRequest(model=model_ref(ctx, state), dataset_key=state.prepared.eval_key,
                          rewards=ctx.config.reward_functions(),
                          reward_models=reward_model_refs(ctx.config, ctx.prefix),
                          # an evaluation request carries no algorithm: its counts are optimizer steps
                          step=state.step * ctx.config.algorithm.optimizer_steps_per_step,
                          max_steps=ctx.config.steps * ctx.config.algorithm.optimizer_steps_per_step,
                          max_new_tokens=ctx.config.generation.max_new_tokens,
                          **DecodeSettings.of(ctx.config.generation).model_dump(), output_key=f"{ctx.prefix}/evals/v{state.policy_version:06d}.json")
    with accounted() as ledger:
        out = invoke_action(action="evaluate", payload=req.model_dump(mode="json"),
                            shard=f"eval-v{state.policy_version}")
    if clock is not None:
        clock.add_work(out.record.busy_s)
    cost = ledger_cost(ctx, ledger)
    return EvalRecord(step=state.step, policy_version=state.policy_version, **out.result.model_dump(),
                      billed_gpu_seconds=cost[BILLED], useful_gpu_seconds=cost[USEFUL], usd=cost[USD])


def ledger_cost(ctx: RunContext, ledger: Ledger) -> dict[str, float]:
    """The billed and useful time and the USD of a :class:`Ledger`'s activations, counted as a
    step's are (``cost_metrics``: failed attempts billed, times ``scaling.gpus_per_actor``)."""
    cfg = ctx.config
    return cost_metrics(ledger.records, ledger.failed, gpus_per_actor=cfg.scaling.gpus_per_actor,
                        price=cfg.price_per_gpu_second)


RESUMED_SETUP = frozenset({"profile", "noop"})
"""The set-up a resume repeats: the profile action and the round-trip probes (``noop``)."""


def add_setup_spend(ctx: RunContext, state: CampaignState, ledger: Ledger, *, resumed: bool = False) -> None:
    """Add the set-up activations of ``ledger`` to ``state``'s spend, and record what the next
    resume's set-up should cost (``CampaignState.resume_setup_s``): all of a resume's set-up
    (its profile, read from the store's cache, and its probes); a new run's profile and probes,
    less the seconds its profile spent measuring the grid that the next one reads instead."""
    cost = ledger_cost(ctx, ledger)
    state.add_spend("setup", cost[BILLED], cost[USEFUL], cost[USD])
    if resumed:
        state.resume_setup_s = cost[BILLED]
        return
    mine = Ledger([r for r in ledger.records if r.action in RESUMED_SETUP],
                  [r for r in ledger.failed if r.action in RESUMED_SETUP])
    measured = (ctx.live.measure_s if ctx.live is not None else 0.0) * ctx.config.scaling.gpus_per_actor
    state.resume_setup_s = max(0.0, ledger_cost(ctx, mine)[BILLED] - measured)


def set_up(ctx: RunContext, progress: Progress) -> CampaignState:
    """Record 0 of a new run (``docs/architecture.md``, Set-up); sets ``ctx.live``. Its spend
    holds what set-up's activations and the first evaluation cost."""
    with accounted() as ledger:
        state = _set_up(ctx, progress)
    add_setup_spend(ctx, state, ledger)
    return state


def _set_up(ctx: RunContext, progress: Progress) -> CampaignState:
    cfg = ctx.config
    progress("prepare: model, initial weights and datasets -> store")
    if not ctx.invoker.sees_local_files and not ctx.store.uri.startswith("s3://"):
        # a test cluster on this machine may mount it; a real one's containers cannot see it,
        # and would fail at their first read of the store, after set-up began
        progress(f"warning: store.uri {ctx.store.uri!r} is a folder on this machine: the actions' containers "
                 "see it only where it is mounted at the same path; on a cluster use s3://bucket/prefix")
    prepared = prepare_inputs(ctx)
    progress(data_line(prepared.data))
    for line in prepared.data.get("warnings", ()):  # build.Datasets.warnings: once, as a new run prepares
        progress(line)
    policy_key = prepared.init_key
    # OpenWhisk profiles the engine beside warm-up and the first evaluation, in containers of
    # their own (speed does not depend on the weights' values, so the initial ones do; it does on
    # a LoRA adapter's structure: version 0 with its seeded adapter, as model_ref gives it). On
    # this machine's cores it runs alone, after warm-up: measured beside it, the steps came out
    # 3-6x slower on 2 cores (60x in-process), and the store's cache keeps a profile for good.
    lora = cfg.model.lora
    init = ModelRef(store_uri=ctx.store.uri, base_key=prepared.base_key, policy_key=prepared.init_key,
                    policy_version=0, dtype=cfg.model.dtype, lora=lora,
                    backbone_key=prepared.init_key if lora else None)
    alone = cfg.invoker.kind != "openwhisk"
    profiling = None if alone else start_profiling(ctx, init, ctx.token_table(prepared.tokens_key))
    if cfg.warmup.steps:
        progress(f"warmup: {cfg.warmup.steps} supervised steps")
        req = WarmupRequest(store_uri=ctx.store.uri, base_key=prepared.base_key, init_key=prepared.init_key,
                            dataset_key=prepared.train_key, output_key=f"{ctx.prefix}/policy/v000000/manifest.json",
                            warmup=cfg.warmup, task=None if cfg.data.train_path else cfg.data.task, seed=cfg.seed,
                            dtype=cfg.model.dtype, gradient_checkpointing=cfg.model.gradient_checkpointing)
        warm: WarmupResult = invoke_action(action="warmup", payload=req.model_dump(mode="json"), shard="warmup").result
        policy_key, sha = warm.policy_key, warm.weights_sha256
    else:
        sha = ""
    state = CampaignState(run_id=ctx.run_id, fingerprint=cfg.fingerprint(), identity=cfg.identity(),
                          policy_key=policy_key, reference_key=policy_key, prepared=prepared,
                          weights_sha256=sha)
    if cfg.algorithm.name == "ppo":
        state.critic_key = init_critic(ctx, model_ref(ctx, state))
    if alone:
        ctx.live = finish_profiling(ctx, start_profiling(ctx, init, ctx.token_table(prepared.tokens_key)), progress)
    if evaluates(state):
        state.add_evaluation(evaluate(ctx, state))  # its own ledger: an evaluation's cost, not set-up's
    if not alone:
        ctx.live = finish_profiling(ctx, profiling, progress)
    return state
