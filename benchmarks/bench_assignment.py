"""Ranked assignment + cut-and-migrate vs round-robin at the same fan-out (PAPER §3.3-3.4).

Two parts, each printing ratios against its naive baseline measured in the same run:

1. **Live, on the real local warm pool.** Two campaigns with the same seed and configuration
   except the generation strategy: ``assignment=round_robin`` without cutting (baseline) and
   ``assignment=ranked`` with ``cut_threshold=0.7``, both at ``fixed:4`` generation actions.
   Cut samples continue in continuation actions and every sample keeps its own random stream,
   so both campaigns generate the same samples and train the same weights (asserted through
   ``weights_sha256``): per-step figures are paired. Reported per step: billed
   actor-seconds of the generation actions (continuations included) and step wall time;
   printed as medians of per-step ratios and as totals. Targets: billed actor-seconds at
   least 25% lower, step time no more than 5% longer. ``--repeats R`` runs the pair R times,
   alternating which strategy goes first (the machine is shared: a slow spell then hits both
   strategies alike over the repeats); the verdict is on the median over all paired steps.
2. **Through the planner and simulator** on ``../shared/traces/*.jsonl`` (skipped with a
   message when absent): ``no-scale:N`` (ranked, cut, serverless release) vs ``round-robin:N``
   (serverless release, no cut) for N in 2, 3, 4, 8, on the roofline profile of Qwen2.5-7B on
   H100 with 2 GPUs per actor, for both migration modes.

    .venv/bin/python benchmarks/bench_assignment.py [--steps 10] [--repeats 1] [--skip-live] [--skip-traces]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
FANOUT = 4
WARM_STEPS = 2  # the first epoch: cold workers and answer-length predictions only
TARGET_SAVING, TARGET_SLOWDOWN = 0.25, 0.05
# a task with a wide spread of response lengths (k = 1..60 letters) and room to finish; 32
# prompts = 2 steps per epoch, so from step 2 on lengths are predicted from the last epoch
WORKLOAD = [
    "data.max_count=60", "generation.max_new_tokens=96", "data.num_train_prompts=32",
    "data.num_eval_prompts=16", "algorithm.batch_size=128", "algorithm.group_size=8",
    f"scaling.policy=fixed:{FANOUT}", f"invoker.num_workers={FANOUT + 2}", "eval_every=0",
]
STRATEGIES = {
    "round_robin": ["generation.assignment=round_robin", "generation.cut_threshold=null"],
    "ranked+cut": ["generation.assignment=ranked", "generation.cut_threshold=0.7"],
}


def run_live(steps: int, repeats: int) -> list[dict[str, dict]]:
    from prefect.testing.utilities import prefect_test_harness

    from actions.common.config import load_config
    from flows.campaign import run_campaign

    out = []
    tmp = tempfile.mkdtemp(prefix="bench-assignment-")
    with prefect_test_harness(server_startup_timeout=120):
        for r in range(repeats):
            names = list(STRATEGIES) if r % 2 == 0 else list(reversed(STRATEGIES))
            runs = {}
            for name in names:
                store = f"{tmp}/{name}-{r}"
                cfg = load_config(None, [*WORKLOAD, f"steps={steps}", f"store.uri={store}",
                                         *STRATEGIES[name]])
                print(f"-- live campaign {name} ({steps} steps, repeat {r + 1}/{repeats})", flush=True)
                runs[name] = run_campaign(cfg, progress=lambda line: None)
                runs[name]["store"] = store
            out.append(runs)
    return out


def report_live(repeats: list[dict[str, dict]]) -> bool:
    billed_ratios, time_ratios, sums = [], [], [0.0, 0.0, 0.0, 0.0]
    same = True
    for r, runs in enumerate(repeats):
        base, ours = runs["round_robin"], runs["ranked+cut"]
        same_r = base["weights_sha256"] == ours["weights_sha256"]
        same = same and same_r
        print(f"repeat {r + 1}: same training data (weights_sha256 equal): {same_r}")
        print(f"{'step':>4} {'rr billed':>10} {'ranked billed':>14} {'ratio':>6} {'rr step s':>10} "
              f"{'ranked step s':>14} {'ratio':>6} {'cut':>4} {'migr':>5} {'rank corr':>9}")
        for b, o in zip(base["steps"][WARM_STEPS:], ours["steps"][WARM_STEPS:]):
            rb, ro = b["cost/generate_billed_actor_s"], o["cost/generate_billed_actor_s"]
            tb, to = b["timing_s/step"], o["timing_s/step"]
            billed_ratios.append(ro / rb)
            time_ratios.append(to / tb)
            for i, v in enumerate((rb, ro, tb, to)):
                sums[i] += v
            print(f"{b['step']:>4.0f} {rb:>10.2f} {ro:>14.2f} {ro / rb:>6.2f} {tb:>10.2f} {to:>14.2f} "
                  f"{to / tb:>6.2f} {o['actors/cut']:>4.0f} {o['actors/migrated']:>5.0f} "
                  f"{o['lengths/rank_correlation']:>9.2f}")
    total_b, total_t = sums[1] / sums[0], sums[3] / sums[2]
    med_b, med_t = statistics.median(billed_ratios), statistics.median(time_ratios)
    ok = same and 1 - med_b >= TARGET_SAVING and med_t - 1 <= TARGET_SLOWDOWN
    print(f"ranked+cut vs round_robin at fixed:{FANOUT}, {len(billed_ratios)} paired steps over "
          f"{len(repeats)} repeat(s): billed actor-s x{med_b:.2f} median (x{total_b:.2f} total; saving "
          f"{1 - med_b:.0%}, target >= {TARGET_SAVING:.0%}), step time x{med_t:.2f} median "
          f"(x{total_t:.2f} total; target <= x{1 + TARGET_SLOWDOWN:.2f}): {'PASS' if ok else 'FAIL'}")
    return ok


def run_traces() -> None:
    paths = sorted(TRACES.glob("*.jsonl"))
    if not paths:
        print(f"traces: skipped, no ../shared/traces/*.jsonl next to the repository ({TRACES})")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_simulator import default_model

    from flows.simulate.replay import read_trace, replay

    model = default_model()
    print(f"\ntraces: {model.profile.name}, {model.gpus_per_actor} GPUs/actor, tau={model.tau}")
    print(f"{'trace':<7} {'N':>2} {'migration':>9} {'GPU-s ratio':>11} {'time ratio':>10}")
    for path in paths:
        steps = read_trace(path)
        for n in (2, 3, 4, 8):
            for migration in ("reprefill", "kv"):
                runs = replay(steps, [f"round-robin:{n}", f"no-scale:{n}"],
                              dataclasses.replace(model, migration=migration))
                base, ours = runs[f"round-robin:{n}"].summary(), runs[f"no-scale:{n}"].summary()
                print(f"{path.stem:<7} {n:>2} {migration:>9} "
                      f"{ours['total_gpu_seconds'] / base['total_gpu_seconds']:>11.2f} "
                      f"{ours['total_time_s'] / base['total_time_s']:>10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--skip-traces", action="store_true")
    args = parser.parse_args()
    if not args.skip_live:
        report_live(run_live(args.steps, args.repeats))
    if not args.skip_traces:
        run_traces()
    return 0


if __name__ == "__main__":
    sys.exit(main())
