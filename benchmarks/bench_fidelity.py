"""Simulator fidelity: simulated vs measured generation time per step of the local campaign.

1. Measure this machine's TPOT profile of the default tiny model with the torch engine
   (the code behind ``rlhfless profile``).
2. Run the default campaign (fewer steps) on the local warm pool, planning with the measured
   profile.
3. Microbenchmarks, independent of the campaign's timings (they reuse its store only for the
   weights, dataset and prompts), each a median over repeats on an otherwise idle pool:
   - the invocation's waits: the direct round trip of ``noop`` (about 44 ms, almost all of it
     waiting -- the worker uses well under 1 ms of CPU --, hence modelled as latency that uses
     no processor, and subtracted from the probes below, whose remainder is processor work);
   - generation activation work beyond the decode steps, as a function of the request: a
     one-token generate (no decode step: request parsing, dataset / KV-bundle reads, prefill,
     output write, result transfer) of P prompts x group_size samples, P = 1, 2, 4, 8, on a
     worker holding the policy version; least squares ``fixed + per sample x samples``;
   - a continuation's start-up work: a one-token continuation of S synthetic partial samples
     (half of max_new_tokens generated each), S = 2, 8, 16: ``fixed + per token x (prompt +
     generated tokens)``;
   - score activation work: scoring a rollout of P prompts x group_size full-length samples
     (P = 1, 4): ``fixed + per sample x samples``;
   - task submission latency of the flow: a Prefect task that invokes ``noop`` (submit, then
     ``as_completed``) minus the direct invocation of ``noop``; and its processor cost: the CPU
     time of the flow process and the Prefect server per task, minus the direct invocation's;
     and the processors they keep busy while idle (2 s with nothing submitted).
   - co-run interference: one full generate activation alone vs two at once on a two-worker
     pool (processors busy at once share memory bandwidth and caches), and, as a check of the
     engine model in isolation, that activation measured vs simulated from the profile;
   - the task probe sends a request-sized payload and returns 32 sample records, like the
     live generate task.
4. Replay every step in the simulator's live-flow mode: the plan the flow executed, the true
   length of every sample (read back from the store), the measured profile, every primary
   action starting after the submission latency and the invocation's waits with its
   request's start-up work, cut
   samples batched into ONE continuation action (``migrate_window_s``, or when no generation
   action is pending) that pays submission + its start-up work (re-prefill) before decoding,
   one score activation per returned shard, the flow + server work of every submitted task,
   and all of it sharing this machine's processors.
   Compare with the measured ``timing_s/generate`` of the step.

Target: simulated within +-20% of measured, per step (median and worst reported; the
aggregate, total simulated over total measured, is printed too). For diagnosis each step also
shows, from the activation records of the live step, when the last primary (planned)
generation action returned and how long the phase then ran on (continuations of cut samples),
and how many score activations ran during the phase on the same processors.

    .venv/bin/python benchmarks/bench_fidelity.py [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from proc_cpu import process_cpu_s, tree_cpu_s

TOLERANCE = 0.20
WARM_STEPS = 1  # step 0 starts the workers' Python and torch: not a generation-time question


def measure_profile(cfg) -> "TpotProfile":  # noqa: F821
    """``rlhfless profile`` of the campaign's model on this CPU (one thread), for its grid."""
    import torch

    from actions.engines.profiling import measure_grid
    from flows.commands.measure import build_profile_model
    from flows.planning.tpot import TpotProfile

    model = build_profile_model(cfg, None, torch.device("cpu"), torch.float32)
    return TpotProfile.from_dict(measure_grid(model, model.config.vocab_size, [1, 4, 16, 64, 128], [16, 48]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    from actions.contracts import parse_token_table
    from actions.store import get_json, open_store
    from flows.campaign.run import run_campaign
    from flows.campaign.state import load_state
    from flows.config import load_config
    from flows.simulate.cluster import ActorSpec, Sample, SimConfig, simulate_phase

    tmp = tempfile.mkdtemp(prefix="bench-fidelity-")
    # scores overlapping generation, as the simulator's live mode models them; every step's
    # rollouts kept (no garbage collection), since the replay reads each step's samples back
    base_cfg = load_config(None, [f"steps={args.steps}", "eval_every=0", f"store.uri={tmp}/store",
                                  "generation.score_while_generating=true", "store.keep_last=null"])
    profile = measure_profile(base_cfg)
    profile_path = f"{tmp}/profile.json"
    profile.save(profile_path)
    print(f"profile: {profile_path}; TPOT batch 1 {profile.tpot(1, 32) * 1e3:.2f} ms, "
          f"batch 64 {profile.tpot(64, 32) * 1e3:.2f} ms, batch 128 {profile.tpot(128, 32) * 1e3:.2f} ms")
    cfg = base_cfg.model_copy(update={"scaling": base_cfg.scaling.model_copy(update={"profile": profile_path})})
    records = capture_records()
    with prefect_test_harness(server_startup_timeout=120):
        run_campaign(cfg, progress=lambda line: None)
        submit_s, latency, task_cpu, background, stagger = measure_submission()
    store = open_store(cfg.store.uri)
    state = load_state(store, cfg.resolved_run_id())
    tokens = parse_token_table(get_json(store, state.prepared.tokens_key))
    costs = measure_activation_costs(cfg, state, store, tokens, latency, profile)
    cores = os.cpu_count() or 1
    print(f"generate activation work: {costs['gen'][0] * 1e3:.1f} ms + {costs['gen'][1] * 1e3:.2f} ms/sample; "
          f"continuation: {costs['cont'][0] * 1e3:.1f} ms + {costs['cont'][1] * 1e6:.1f} us/token; "
          f"score: {costs['score'][0] * 1e3:.1f} ms + {costs['score'][1] * 1e3:.2f} ms/sample; "
          f"invocation wait (noop round trip) {latency * 1e3:.1f} ms; task submission {submit_s * 1e3:.1f} ms, "
          f"{task_cpu * 1e3:.1f} ms of flow + server CPU, tasks submitted together start {stagger * 1e3:.1f} ms "
          f"apart; idle load {background:.2f} processors; "
          f"processors shared: {cores}")
    tau, group = cfg.generation.cut_threshold, cfg.algorithm.group_size
    print(f"{'step':>4} {'N':>2} {'cut':>3} {'measured s':>10} {'simulated s':>11} {'error':>7} "
          f"{'last primary s':>14} {'(simulated)':>11} {'tail s':>6} {'(simulated)':>11} {'scores':>6}")
    errors, total_measured, total_sim = [], 0.0, 0.0
    for entry in state.steps[WARM_STEPS:]:
        k = int(entry["step"])
        prefix = f"runs/{state.run_id}/steps/{k:06d}/rollouts/"
        final: dict[tuple[int, int], dict] = {}
        for key in sorted(store.list(prefix)):
            if key.endswith(".json"):
                for s in get_json(store, key)["samples"]:
                    final[(s["prompt_id"], s["sample_index"])] = s
        actors, sid = [], 0
        plan = zip(entry["plan"]["assignments"], entry["plan"]["cut_after"], strict=True)
        for index, (pids, point) in enumerate(plan):
            samples = []
            for pid in pids:
                for i in range(group):
                    s = final[(pid, i)]
                    # a stopped sample also spent a decode step sampling its EOS
                    steps = len(s["tokens"]) + (1 if s["finish_reason"] == "stop" else 0)
                    samples.append(Sample(sid, pid, len(tokens[pid].prompt), steps))
                    sid += 1
            work = costs["gen"][0] + costs["gen"][1] * len(samples)
            actors.append(ActorSpec(tuple(samples), 0.0, submit_s + latency + index * stagger, work_s=work,
                                    cuttable=point is not None))  # the plan's cut points
        n = len(actors)
        sim = SimConfig(profile=profile, gpus_per_actor=1, cut_threshold=tau if tau is not None and tau < 1 else None,
                        continuation=True, spare_warm_actors=n + 1, shared_processors=cores,
                        migrate_to_running=False, migrate_window_s=cfg.generation.migrate_window_s,
                        submit_s=submit_s, activation_latency_s=latency, continuation_work_s=costs["cont"][0],
                        continuation_work_s_per_token=costs["cont"][1], score_work_s=costs["score"][0],
                        score_work_s_per_sample=costs["score"][1], task_work_s=task_cpu,
                        corun_slowdown=costs["corun"],
                        background_processors=background)
        result, _ = simulate_phase(actors, sim)
        measured = entry["timing_s/generate"]
        err = result.time_s / measured - 1
        errors.append(err)
        total_measured += measured
        total_sim += result.time_s
        last_primary, tail, scores = phase_breakdown(records[k], measured, n)
        sim_primary = max(result.release_s[:n])
        print(f"{k:>4} {n:>2} {result.num_cut:>3} {measured:>10.3f} {result.time_s:>11.3f} {err:>+7.1%} "
              f"{last_primary:>14.3f} {sim_primary:>11.3f} {tail:>6.3f} {result.time_s - sim_primary:>11.3f} "
              f"{scores:>6}")
    worst = max(errors, key=abs)
    med = statistics.median(abs(e) for e in errors)
    ok = abs(worst) <= TOLERANCE
    print(f"fidelity: median |error| {med:.1%} (median signed {statistics.median(errors):+.1%}), worst "
          f"{worst:+.1%}, aggregate {total_sim / total_measured - 1:+.1%} (target within "
          f"+-{TOLERANCE:.0%} per step): {'PASS' if ok else 'FAIL'}")
    return 0


def capture_records() -> dict[int, list[dict]]:
    """step -> the activation records of the live step (kept by wrapping the campaign's
    metrics function, which receives them and keeps only totals)."""
    import flows.campaign.advance as campaign

    records: dict[int, list[dict]] = {}
    metrics = campaign.step_metrics

    def keep(out, phase, *args, **kwargs):
        m = metrics(out, phase, *args, **kwargs)
        records[len(records)] = [r.accounting() for r in out.records]
        return m
    campaign.step_metrics = keep
    return records


def phase_breakdown(records: list[dict], measured: float, n: int) -> tuple[float, float, int]:
    """(seconds from the first generate submission to the end of the last of the ``n`` primary
    generate activations -- the first ``n`` submitted; continuations are submitted only after
    a primary returned --, the rest of the measured phase, score activations that started
    within the phase)."""
    gens = sorted((r for r in records if r["action"] == "generate"), key=lambda r: r["submitted_at"])
    t0 = gens[0]["submitted_at"]
    last = max(r["ended_at"] for r in gens[:n]) - t0
    scores = sum(1 for r in records if r["action"] == "score" and r["started_at"] - t0 < measured)
    return last, measured - last, scores


def _median_time(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_activation_costs(cfg, state, store, tokens: dict, latency: float, profile,
                             repeats: int = 5) -> dict[str, tuple[float, float] | float]:
    """Processor work of generation, continuation and score activations beyond the decode
    steps, as ``(fixed s, s per unit)`` under "gen", "cont" and "score": wall time of the probe
    minus ``latency`` (the noop round trip, which uses no processor), on a fresh one-worker
    pool holding the last step's policy version (see the module docstring); and under "corun"
    the co-run slowdown (``measure_corun``) on a two-worker pool. Also prints one full generate
    activation alone, measured vs simulated from ``profile`` (the engine model in isolation)."""
    from actions.contracts import GenerateRequest, ModelRef, PartialSample, ScoreRequest
    from actions.engines.profiling import fit_line
    from actions.store import put_json
    from flows.invokers.local_pool import LocalPoolInvoker
    from flows.simulate.cluster import ActorSpec, Sample, SimConfig, simulate_phase

    entry = state.steps[-1]
    k = int(entry["step"])
    # the policy the last step generated with (k >= 1: trained by step k - 1, version k)
    ref = ModelRef(store_uri=cfg.store.uri, base_key=state.prepared.base_key, policy_version=k,
                   policy_key=f"runs/{state.run_id}/steps/{k - 1:06d}/train/policy/manifest.json")
    bundle = f"runs/{state.run_id}/steps/{k:06d}/kv/v{k:06d}/manifest.json"
    bundle = bundle if store.exists(bundle) else None  # the step's KV bundle, if it had one
    pids = [p for group in entry["plan"]["assignments"] for p in group]
    group, g = cfg.algorithm.group_size, cfg.generation
    pool = LocalPoolInvoker(1)

    def generate(prompt_ids, *, new_tokens=1, partial_keys=(), key="bench/probe.json", kv=bundle, on=pool):
        req = GenerateRequest(model=ref, dataset_key=state.prepared.train_key, run_seed=0, step=k, shard="probe",
                              prompt_ids=list(prompt_ids), group_size=group, partial_keys=list(partial_keys),
                              max_new_tokens=new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                              dedup_prefill=g.dedup_prefill,
                              kv_bundle_key=kv, engine=g.engine, output_key=key)
        return on.invoke("generate", req.model_dump(mode="json"))

    try:
        generate(pids[:1])  # loads the version
        gen, cpu0, wall0 = [], _worker_cpu_s(pool), time.perf_counter()
        for p in (1, 2, 4, 8):
            gen.append((p * group, _median_time(lambda: generate(pids[:p]), repeats) - latency))
        # cross-check: the worker's CPU time over these probes vs their wall time minus the waits
        cpu = _worker_cpu_s(pool) - cpu0
        print(f"  generate probes: worker CPU {cpu:.2f} s, wall minus waits "
              f"{time.perf_counter() - wall0 - 4 * repeats * latency:.2f} s")
        cont, half = [], max(1, g.max_new_tokens // 2)
        for num in (2, 8, 16):
            parts, total = [], 0
            for j in range(num):
                pid = pids[j % len(pids)]
                prompt = tokens[pid].prompt
                gen_tokens = [prompt[(j + t) % len(prompt)] for t in range(half)]  # valid ids
                parts.append(PartialSample(prompt_id=pid, sample_index=j // len(pids), tokens=gen_tokens).model_dump())
                total += len(prompt) + half
            put_json(store, f"bench/partial-{num}.json", parts)
            cont.append((total, _median_time(lambda: generate([], new_tokens=half + 1, kv=None,
                                                              partial_keys=[f"bench/partial-{num}.json"]),
                                                 repeats) - latency))
        score = []
        for p in (1, 4):
            key = f"bench/rollout-{p}.json"
            generate(pids[:p], new_tokens=g.max_new_tokens, key=key)
            req = ScoreRequest(policy=ref, reference_key=state.reference_key, critic_key=state.critic_key,
                               dataset_key=state.prepared.train_key, rollout_keys=[key], rewards=cfg.reward_functions(),
                               algorithm=cfg.algorithm, temperature=g.temperature,
                               output_key=f"bench/scored-{p}/manifest.json")
            payload = req.model_dump(mode="json")
            pool.invoke("score", payload)  # loads the reference
            score.append((p * group, _median_time(lambda: pool.invoke("score", payload), repeats) - latency))
        print(f"  KV bundle: {bundle or 'none (the steps had no prefill)'}")
        for name, pts in (("generate", gen), ("continuation", cont), ("score", score)):
            print(f"  {name} probe: " + ", ".join(f"{x} -> {y * 1e3:.1f} ms" for x, y in pts))
        both = LocalPoolInvoker(2)  # started now: the probes above ran on an otherwise idle pool

        def full(i: int):  # one full generate of 4 prompts on the two-worker pool
            return generate(pids[:4], kv=bundle, new_tokens=g.max_new_tokens, key=f"bench/corun-{i}.json", on=both)
        try:
            corun = measure_corun(full, repeats)
            print(f"  co-run probe: one full generate of 4 prompts alone vs two at once: +{corun:.0%}")
            # calibration: the same full generate alone, measured vs simulated from the profile
            outs = full(0).result["samples"]
            alone = _median_time(lambda: full(0), repeats) - latency
            fixed, per = fit_line(gen)
            sim, _ = simulate_phase([ActorSpec(tuple(
                Sample(i, s["prompt_id"], len(tokens[s["prompt_id"]].prompt),
                       s["length"] + (1 if s["finish_reason"] == "stop" else 0)) for i, s in enumerate(outs)),
                0.0, 0.0, work_s=fixed + per * len(outs))], SimConfig(profile=profile, gpus_per_actor=1))
            print(f"  full generate alone (4 prompts x {group}, lengths {min(s['length'] for s in outs)}-"
                  f"{max(s['length'] for s in outs)}): measured {alone * 1e3:.1f} ms, simulated "
                  f"{sim.time_s * 1e3:.1f} ms")
        finally:
            both.close()
        return {"gen": fit_line(gen), "cont": fit_line(cont), "score": fit_line(score), "corun": corun}
    finally:
        pool.close()


def measure_corun(call, repeats: int) -> float:
    """How much slower one activation runs while a second one runs on the other processor:
    the median wall time of ``call`` alone vs of two started together, minus 1 (shared
    memory bandwidth and caches; processor sharing alone predicts no slowdown)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        list(ex.map(call, range(2)))  # both workers load the version

        def pair() -> None:
            list(ex.map(call, range(2)))
        alone = _median_time(lambda: call(0), repeats)
        together = _median_time(pair, repeats)
    return max(0.0, together / alone - 1.0)


def _worker_cpu_s(pool) -> float:
    """User + system CPU seconds of the pool's (one) worker process so far."""
    return process_cpu_s(pool._workers[0].proc.pid)


def _tree_cpu_s(exclude: set[int]) -> float:
    """CPU seconds of this process (all threads: the flow) and its descendants (the Prefect
    server) other than ``exclude`` (the pool's workers)."""
    return tree_cpu_s(os.getpid(), exclude)


def measure_submission(repeats: int = 15) -> tuple[float, float, float, float, float]:
    """(seconds a Prefect task adds to an invocation -- submit, run in the task runner, resolve
    through ``as_completed`` --: a task invoking ``noop`` minus the direct invocation; seconds
    of the direct ``noop`` invocation: the round trip's waits, which use no processor -- the
    worker spends well under a millisecond of CPU on it, see docs/results.md; processor
    seconds the task costs the flow process and the Prefect server, beyond the direct
    invocation's client side and the idle load; that idle load: processors the flow process and
    the Prefect server keep busy with nothing submitted, over 2 s; seconds between the starts of
    4 tasks submitted together)."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.futures import as_completed

    from actions.engines.profiling import fit_line
    from flows.invokers.local_pool import LocalPoolInvoker

    pool = LocalPoolInvoker(1)

    # the live generate task's shape: its options, a request-sized payload (Prefect walks task
    # parameters to track inputs) and a result of 32 per-sample records
    payload = {"model": {"store_uri": "/tmp/store", "base_key": "runs/r/base/manifest.json",
                         "policy_key": "runs/r/steps/000001/train/policy/manifest.json", "policy_version": 2},
               "dataset_key": "runs/r/data/train.json", "run_seed": 0, "step": 2, "shard": "gen-0",
               "prompt_ids": list(range(4)), "group_size": 8, "partial_keys": [], "max_new_tokens": 24,
               "temperature": 1.0, "dedup_prefill": True, "kv_bundle_key": "runs/r/steps/000002/kv/manifest.json",
               "engine": "torch", "output_key": "runs/r/steps/000002/rollouts/gen-0.json", "cut_after": 23}
    samples = [{"prompt_id": i, "sample_index": j, "length": 12, "finish_reason": "stop"}
               for i in range(4) for j in range(8)]

    @task(cache_policy=NO_CACHE, log_prints=False, retries=4, retry_delay_seconds=[0.2, 0.5, 1.0, 2.0],
          task_run_name="{action}-{shard}")
    def noop_task(action: str, payload: dict, shard: str) -> dict:
        entered[shard] = time.perf_counter()
        activation = pool.invoke("noop", {})
        return {"result": {"rollout_key": payload["output_key"], "samples": samples, "partial_key": None},
                "accounting": activation.accounting()}

    @flow(log_prints=False, validate_parameters=False)
    def probe() -> tuple[list[float], float]:
        times = []
        for i in range(repeats + 2):
            if i == 2:
                cpu0 = _tree_cpu_s(workers)
            t0 = time.perf_counter()
            next(as_completed([noop_task.submit(action="noop", payload=payload, shard=f"gen-{i}")])).result()
            times.append(time.perf_counter() - t0)
        return times[2:], (_tree_cpu_s(workers) - cpu0) / repeats

    @flow(log_prints=False, validate_parameters=False)
    def burst(size: int = 4) -> float:
        """Seconds between the starts of ``size`` tasks submitted together, as the flow submits
        a phase's generation actions (the task runner starts them one after another)."""
        points = []
        for r in range(repeats):
            t0 = time.perf_counter()
            futures = [noop_task.submit(action="noop", payload=payload, shard=f"b{r}-{i}") for i in range(size)]
            for f in futures:
                f.result()
            points += [(i, entered[f"b{r}-{i}"] - t0) for i in range(size)]
        return fit_line(points)[1]

    entered: dict[str, float] = {}
    try:
        workers = {w.proc.pid for w in pool._workers}
        cpu0, t0 = _tree_cpu_s(workers), time.perf_counter()
        time.sleep(2.0)  # idle: what the orchestrator burns with nothing to do
        background = (_tree_cpu_s(workers) - cpu0) / (time.perf_counter() - t0)
        cpu0 = _tree_cpu_s(workers)
        direct = _median_time(lambda: pool.invoke("noop", {}), 4 * repeats)
        direct_cpu = (_tree_cpu_s(workers) - cpu0) / (4 * repeats)
        t0 = time.perf_counter()
        times, task_cpu = probe()
        task_cpu -= background * (time.perf_counter() - t0) / (repeats + 2)  # the idle load during each task
        stagger = burst()
        return (max(0.0, statistics.median(times) - direct), direct, max(0.0, task_cpu - direct_cpu),
                background, stagger)
    finally:
        pool.close()


if __name__ == "__main__":
    sys.exit(main())
