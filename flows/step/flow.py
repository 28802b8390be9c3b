"""One RLHF training step as a Prefect flow: plan -> prefill -> fan out -> drain -> score -> train.

The body reads like the paper's per-step workflow (paper §2); the plan comes from the planner
(``flows/planning/planner.py``), each phase is timed by one context manager
(``flows/step/timing.py``), and what happens as generation actions return -- cut samples batched
into continuations, scores submitted at once or packed after the phase -- is decided by the
pure drain (``flows/planning/drain.py``), which this module only executes. Every action's
result is validated against its contract on arrival (``flows/step/invoke.py``). Training waits for
every score. The step is not visible until the campaign commits it (flows/campaign/state.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture, as_completed

from actions.contracts import DecodeSettings, GenerateResult, PrefillResult, ScoreResult, TrainStepResult
from flows.invokers.base import Activation
from flows.planning.drain import GenerationDrain, ReturnedShard, SubmitContinuation, SubmitScore
from flows.planning.planner import PhasePlan
from flows.step.context import RunContext, current
from flows.step.invoke import Returned, failed_attempts, invoke_action, spare_gpu_slots
from flows.step.payloads import StepInputs, generate_payload, prefill_payload, score_payload, train_payload
from flows.step.prewarmer import PhasePrewarmer
from flows.step.timing import PhaseClock


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: every action's typed result and accounting. Committing is the
    campaign's job (``flows/campaign/run.py``)."""

    prefill: PrefillResult | None
    generate: tuple[GenerateResult, ...]
    """In arrival order, continuations included (``GenerateResult.kind``)."""
    score: tuple[ScoreResult, ...]
    train: TrainStepResult
    records: tuple[Activation, ...]
    """Each action's successful activation, in collection order (``Activation.shard`` names it)."""
    failed: tuple[Activation, ...]
    """The attempts that failed and were retried (a killed worker, a transient crash, an
    OpenWhisk developer error retried in place), as far as the invoker knows them
    (``ActionError.failed_attempts``): billed by the platform, not useful work."""
    num_continuations: int
    timing: dict[str, float]
    """Seconds per phase: prefill, generate, score, train, and the whole step."""
    prewarm: dict[str, float] = field(default_factory=dict)
    call_offsets: dict[str, float] = field(default_factory=dict)
    """Action -> its earliest submission, failed attempts included, seconds from the step's
    start (the next pre-warm)."""
    continued_from: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Continuation shard -> the generation shards whose cut samples it finished."""


@flow(name="rlhf-step", log_prints=False, validate_parameters=False)
def rlhf_step(inputs: StepInputs, phase: PhasePlan) -> StepOutcome:
    """Run one step on ``inputs`` following ``phase`` (the planner's plan). The attempts that
    failed on the way and were retried come back beside the results (``StepOutcome.failed``)."""
    with failed_attempts() as failed:
        return _run(current(), inputs, phase, failed)


def _run(ctx: RunContext, inputs: StepInputs, phase: PhasePlan, failed: list[Activation]) -> StepOutcome:
    clock = PhaseClock()
    records: list[Activation] = []
    with clock.phase("prefill"):
        prewarm = PhasePrewarmer(ctx.invoker, t0=clock.started, offset_s=phase.prewarm_offset_s, action="generate",
                                 count=phase.plan.num_actors, model=inputs.model.model_dump(mode="json"),
                                 decode=DecodeSettings.of(ctx.config.generation),
                                 slots=lambda n: spare_gpu_slots("generate", n, ctx.config))
        prefill = None
        if phase.prefill and phase.prefill.prefix_len:
            prefill = _collect(invoke_action(action="prefill", payload=prefill_payload(ctx, inputs, phase),
                                             shard="prefill"), records)
    with clock.phase("generate"):
        bundle_key = prefill.bundle_key if prefill else None
        fan_out = [invoke_action.submit(action="generate", shard=f"gen-{i}", payload=generate_payload(
                       ctx, inputs, f"gen-{i}", group, phase.cut_after[i], bundle_key))
                   for i, group in enumerate(phase.plan.assignments)]
        drain = GenerationDrain(phase.cut_after, window_s=ctx.config.generation.migrate_window_s,
                                overlap_scoring=ctx.config.overlap_scoring(),
                                score_bins=ctx.config.score_bins(phase.plan.num_actors))
        generated, scores = _drain(ctx, inputs, drain, fan_out, records)
    with clock.phase("score"):
        scores += [_submit_score(ctx, inputs, s) for s in drain.final_scores()]
        scored = [_collect(fut.result(), records) for fut in scores]
    with clock.phase("train"):
        ctx.before_train()
        train = _collect(invoke_action(action="train_step", shard="train",
                                       payload=train_payload(ctx, inputs, [s.scored_key for s in scored])), records)
    timing = clock.timing()
    offsets: dict[str, float] = {}
    for r in [*records, *failed]:  # every task has returned: ``failed`` is complete
        offsets[r.action] = min(offsets.get(r.action, float("inf")), r.submitted_at - clock.started)
    return StepOutcome(
        prefill=prefill, generate=tuple(generated), score=tuple(scored), train=train, records=tuple(records),
        num_continuations=drain.num_continuations, prewarm=prewarm.report(), call_offsets=offsets, timing=timing,
        continued_from=dict(drain.continued_from), failed=tuple(failed))


def _collect(returned: Returned, records: list[Activation]) -> Any:
    records.append(returned.record)
    return returned.result


def _drain(ctx: RunContext, inputs: StepInputs, drain: GenerationDrain, pending: list[PrefectFuture],
           records: list[Activation]) -> tuple[list[GenerateResult], list[PrefectFuture]]:
    """Wait for generation actions and execute the drain's decisions until the phase ends.
    Returns the generation results in arrival order and the score futures submitted."""
    generated: list[GenerateResult] = []
    scores: list[PrefectFuture] = []
    while not drain.finished:
        try:
            done = next(as_completed(pending, timeout=drain.wait_s(time.time())))
        except TimeoutError:
            done = None  # the batching window closed: the drain submits what has gathered
        returned = None
        if done is not None:
            pending.remove(done)
            result: GenerateResult = _collect(done.result(), records)
            generated.append(result)
            work = sum(s.length + 1 for s in result.samples if s.finish_reason != "cut")  # response + EOS
            returned = ReturnedShard(result.shard, result.rollout_key, result.partial_key, float(work))
        for submit in drain.on_return(returned, time.time()):
            if isinstance(submit, SubmitContinuation):
                pending.append(invoke_action.submit(action="generate", shard=submit.shard, payload=generate_payload(
                    ctx, inputs, submit.shard, [], None, None, partial_keys=list(submit.partial_keys))))
            else:
                scores.append(_submit_score(ctx, inputs, submit))
    return generated, scores


def _submit_score(ctx: RunContext, inputs: StepInputs, submit: SubmitScore) -> PrefectFuture:
    return invoke_action.submit(action="score", shard=f"score-{submit.shard}",
                                payload=score_payload(ctx, inputs, list(submit.rollout_keys), submit.shard))
