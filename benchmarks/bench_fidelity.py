"""Simulator fidelity: simulated vs measured generation time per step of the local campaign.

1. Measure this machine's TPOT profile of the default tiny model with the torch engine
   (the code behind ``rlhfless profile``).
2. Measure the start-up of a generation activation on the local warm pool: a one-token
   generate of one prompt on a worker holding the policy version (HTTP round trip, request
   validation, KV/dataset lookups, output write); the step's pre-warm has loaded the weights.
3. Run the default campaign (fewer steps) on the local warm pool, planning with the measured
   profile.
4. Replay every step in the simulator: the plan the flow executed, the true length of every
   sample (read back from the store), the measured profile, the measured start-up for every
   generation and continuation action, cut-and-migrate as the live flow does it (cut samples
   go to a continuation action, re-prefilled), and actors sharing this machine's processors.
   Compare with the measured ``timing_s/generate`` of the step.

Target: simulated within +-20% of measured, per step (median and worst reported; the
aggregate, total simulated over total measured, is printed too). For diagnosis each step also
shows, from the activation records of the live step, when the last primary (planned)
generation action returned and how long the phase then ran on (continuations of cut samples),
and how many score activations ran during the phase on the same processors (the simulator
does not model them).

    .venv/bin/python benchmarks/bench_fidelity.py [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

TOLERANCE = 0.20
WARM_STEPS = 1  # step 0 starts the workers' Python and torch: not a generation-time question


def measure_profile(cfg) -> "TpotProfile":  # noqa: F821
    import torch

    from actions.common.modeling import build_tiny_model
    from actions.engines.profiling import measure_grid
    from flows.planning.profile import TpotProfile

    torch.set_num_threads(1)
    m = cfg.model
    model, _ = build_tiny_model(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                                intermediate_size=m.intermediate_size, max_positions=m.max_positions, seed=0)
    model.eval()
    return TpotProfile.from_dict(measure_grid(model, model.config.vocab_size, [1, 4, 16, 64, 128], [16, 48]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    from prefect.testing.utilities import prefect_test_harness

    from actions.common.config import load_config
    from actions.common.storage import get_json, open_store
    from flows.campaign import run_campaign
    from flows.simulate.cluster import ActorSpec, Sample, SimConfig, simulate_phase
    from flows.state import load_state

    tmp = tempfile.mkdtemp(prefix="bench-fidelity-")
    base_cfg = load_config(None, [f"steps={args.steps}", "eval_every=0", f"store.uri={tmp}/store"])
    profile = measure_profile(base_cfg)
    profile_path = f"{tmp}/profile.json"
    profile.save(profile_path)
    print(f"profile: {profile_path}; TPOT batch 1 {profile.tpot(1, 32) * 1e3:.2f} ms, "
          f"batch 64 {profile.tpot(64, 32) * 1e3:.2f} ms, batch 128 {profile.tpot(128, 32) * 1e3:.2f} ms")
    cfg = base_cfg.model_copy(update={"scaling": base_cfg.scaling.model_copy(update={"profile": profile_path})})
    records = capture_records()
    with prefect_test_harness(server_startup_timeout=120):
        run_campaign(cfg, progress=lambda line: None)
    store = open_store(cfg.store.uri)
    state = load_state(store, cfg.resolved_run_id())
    tokens = get_json(store, state.prepared["tokens_key"])
    startup = measure_startup(cfg, state, store)
    cores = os.cpu_count() or 1
    print(f"start-up of a generation activation: {startup * 1e3:.0f} ms; processors shared: {cores}")
    tau, group = cfg.generation.cut_threshold, cfg.algorithm.group_size
    print(f"{'step':>4} {'N':>2} {'cut':>3} {'measured s':>10} {'simulated s':>11} {'error':>7} "
          f"{'last primary s':>14} {'tail s':>6} {'scores':>6}")
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
        for pids in entry["plan"]["assignments"]:
            samples = []
            for pid in pids:
                for i in range(group):
                    s = final[(pid, i)]
                    # a stopped sample also spent a decode step sampling its EOS
                    steps = len(s["tokens"]) + (1 if s["finish_reason"] == "stop" else 0)
                    samples.append(Sample(sid, pid, len(tokens[str(pid)]["prompt"]), steps))
                    sid += 1
            actors.append(ActorSpec(tuple(samples), 0.0, startup))
        n = len(actors)
        sim = SimConfig(profile=profile, gpus_per_actor=1, tau=tau if tau is not None and tau < 1 else None,
                        continuation=True, weight_transfer_s=startup, spare_warm_actors=n + 1,
                        shared_processors=cores, migrate_to_running=False)
        result, _ = simulate_phase(actors, sim)
        measured = entry["timing_s/generate"]
        err = result.time_s / measured - 1
        errors.append(err)
        total_measured += measured
        total_sim += result.time_s
        last_primary, tail, scores = phase_breakdown(records[k], measured, n)
        print(f"{k:>4} {n:>2} {result.num_cut:>3} {measured:>10.3f} {result.time_s:>11.3f} {err:>+7.1%} "
              f"{last_primary:>14.3f} {tail:>6.3f} {scores:>6}")
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
    import flows.campaign as campaign

    records: dict[int, list[dict]] = {}
    metrics = campaign.step_metrics

    def keep(out, phase, *args, **kwargs):
        m = metrics(out, phase, *args, **kwargs)
        records[len(records)] = out["records"]
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


def measure_startup(cfg, state, store) -> float:
    """Median seconds of a one-token generate of one prompt on a worker that already holds the
    policy version -- what a generation action finds after the step's pre-warm loaded it --
    on a fresh one-worker pool."""
    from actions.common.contracts import GenerateRequest, ModelRef
    from actions.common.storage import get_json
    from flows.invokers.local_pool import LocalPoolInvoker

    pid = int(min(get_json(store, state.prepared["tokens_key"]), key=int))
    pool = LocalPoolInvoker(1)
    try:
        times = []
        for k in range(len(state.steps)):
            ref = ModelRef(store_uri=cfg.store.uri, base_key=state.prepared["base_key"],
                           policy_key=f"runs/{state.run_id}/steps/{k:06d}/train/policy/manifest.json",
                           policy_version=k + 1)
            req = GenerateRequest(model=ref, dataset_key=state.prepared["train_key"], run_seed=0, step=k,
                                  shard="probe", prompt_ids=[pid], group_size=1, max_new_tokens=1,
                                  temperature=1.0, output_key=f"bench/probe/{k}.json")
            pool.invoke("generate", req.model_dump(mode="json"))  # loads the version
            t0 = time.perf_counter()
            pool.invoke("generate", req.model_dump(mode="json"))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        pool.close()


if __name__ == "__main__":
    sys.exit(main())
