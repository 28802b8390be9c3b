"""One RLHF training step as a Prefect flow: plan -> prefill -> generate -> score -> train.

The body reads like the paper's per-step workflow (PAPER §2). Scoring of a shard is submitted
the moment its generation returns where actions have accelerators of their own
(``CampaignConfig.overlap_scoring``); on the local pool's shared ones every rollout is scored
after generation, packed into at most one score activation per generation action; cut
samples are continued in continuation actions as soon as their shard returns (batched over
``generation.migrate_window_s``, or until no action that can be cut is pending); training waits
for every score. The step is not visible until the
campaign commits it (flows/state.py).
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.futures import as_completed

from flows.context import current
from flows.hooks import PhasePlan
from flows.planning.score_batches import pack_score_batches
from flows.prewarming import PhasePrewarmer
from flows.step_payloads import StepInputs, generate_payload, prefill_payload, score_payload, train_payload
from flows.tasks import invoke_action


@flow(name="rlhf-step", log_prints=False, validate_parameters=False)
def rlhf_step(inputs: StepInputs, phase: PhasePlan) -> dict[str, Any]:
    """Run one step on ``inputs`` following ``phase`` (the hook's plan). Returns the action
    results and accounting records; committing is the caller's job."""
    ctx = current()
    t0 = time.time()
    records: list[dict[str, Any]] = []
    bundle_key, prefill = None, None
    prewarm = PhasePrewarmer(ctx.invoker, t0=t0, offset_s=phase.prewarm_offset_s, action="generate",
                             count=phase.plan.num_actors, model=inputs.model.model_dump(mode="json"))
    if phase.prefill and phase.prefill.prefix_len:
        pre = invoke_action(action="prefill", payload=prefill_payload(ctx, inputs, phase), shard="prefill")
        records.append(pre["accounting"])
        prefill = pre["result"]
        bundle_key = prefill["bundle_key"]
    t_gen = time.time()
    gens = [invoke_action.submit(action="generate", shard=f"gen-{i}",
                                 payload=generate_payload(ctx, inputs, f"gen-{i}", group, phase.cut_after[i], bundle_key))
            for i, group in enumerate(phase.plan.assignments)]
    scores, gen_results, num_cont = [], [], 0
    pending = list(gens)
    # actions with a cut point: only these can still return cut samples (continuations and
    # the actions the planner lets run to the end never do)
    cuttable = [g for g, after in zip(gens, phase.cut_after) if after is not None]
    partials: list[str] = []  # cut samples waiting to be batched into one continuation
    # shard -> (its rollout, the rollout's scoring work), for rollouts with finished samples
    # whose score is not submitted yet
    to_score: dict[str, tuple[str, float]] = {}

    def shard_of(rollout_key: str) -> str:
        return rollout_key.rsplit("/", 1)[-1].removesuffix(".json")

    def submit_score(rollout_keys: list[str]):
        shard = shard_of(rollout_keys[0])
        return invoke_action.submit(action="score", shard=f"score-{shard}",
                                    payload=score_payload(ctx, inputs, rollout_keys, shard))

    window_end = 0.0
    while pending or partials:
        try:
            done = next(as_completed(pending, timeout=max(0.0, window_end - time.time()) if partials else None))
        except TimeoutError:
            done = None  # the batching window closed: submit what has gathered
        res = None
        if done is not None:
            pending.remove(done)
            out = done.result()
            records.append(out["accounting"])
            res = out["result"]
            gen_results.append(res)
            if res.get("partial_key"):
                if not partials:  # cut samples arriving within the window share one continuation
                    window_end = time.time() + ctx.config.generation.migrate_window_s
                partials.append(res["partial_key"])
        if partials and (time.time() >= window_end or not any(g in pending for g in cuttable)):
            # Migrate the batched stragglers into one continuation action (a free worker),
            # before this shard's score: the continuation is what the phase waits for. The
            # window closes early once no pending action can be cut: nothing more can join,
            # and waiting would only delay the phase's tail.
            name = f"cont-{num_cont}"
            num_cont += 1
            pending.append(invoke_action.submit(
                action="generate", shard=name,
                payload=generate_payload(ctx, inputs, name, [], None, None, partial_keys=partials)))
            partials = []
        if res is not None and any(s["finish_reason"] != "cut" for s in res["samples"]):
            if ctx.config.overlap_scoring():
                scores.append(submit_score([res["rollout_key"]]))
            else:  # response tokens: the prompts of one task are alike, responses are not
                key = res["rollout_key"]
                to_score[shard_of(key)] = (key, float(sum(s["length"] + 1 for s in res["samples"]
                                                          if s["finish_reason"] != "cut")))
    t_gen_end = time.time()
    # scores not overlapped (overlap_scoring): every rollout is known, so pack them into at
    # most one activation per generation action (flows/planning/score_batches.py). In
    # submission order (gen-0.., then cont-0..), not arrival order: the same step then packs
    # alike every time, and a pack is named after its first generation shard.
    if to_score:
        submitted = [f"gen-{i}" for i in range(len(gens))] + [f"cont-{i}" for i in range(num_cont)]
        work = dict(to_score[shard] for shard in submitted if shard in to_score)
        scores += [submit_score(keys) for keys in pack_score_batches(work, phase.plan.num_actors)]
    score_results = []
    for fut in scores:
        out = fut.result()
        records.append(out["accounting"])
        score_results.append(out["result"])
    t_score_end = time.time()
    train = invoke_action(action="train_step", shard="train",
                          payload=train_payload(ctx, inputs, [r["scored_key"] for r in score_results]))
    records.append(train["accounting"])
    t_end = time.time()
    offsets: dict[str, float] = {}
    for r in records:  # call history for the next step's pre-warm
        offsets[r["action"]] = min(offsets.get(r["action"], float("inf")), r["submitted_at"] - t0)
    return {
        "prewarm": prewarm.report(), "call_offsets": offsets,
        "prefill": prefill, "generate": gen_results, "score": score_results, "train": train["result"], "records": records,
        "num_continuations": num_cont,
        "timing": {"prefill": t_gen - t0, "generate": t_gen_end - t_gen, "score": t_score_end - t_gen_end,
                   "train": t_end - t_score_end, "step": t_end - t0},
    }
