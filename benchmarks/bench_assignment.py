"""Ranked assignment + cut-and-migrate vs round-robin at the same fan-out (paper §3.3-3.4).

Two parts, each printing ratios against its naive baseline measured in the same run:

1. **Live, on the real local warm pool.** Two campaigns with the same seed and configuration
   except the generation strategy: ``assignment=round_robin`` without cutting (baseline) and
   ``assignment=ranked`` with ``cut_threshold=0.7``, both at ``fixed:4`` generation actions.
   Cut samples continue in continuation actions and every sample keeps its own random stream,
   so both campaigns generate the same samples (checked: every step's token sequences are
   compared -- a step with no rollouts in either store fails the check --, and on the CPU the
   trained weights' hashes; CUDA training is not bitwise reproducible even between two
   identical campaigns): per-step figures are paired. Reported per step: billed
   actor-seconds of the generation actions (continuations included) and step wall time;
   printed as medians of per-step ratios and as totals. Targets: billed actor-seconds at
   least 25% lower, step time no more than 5% longer. ``--repeats R`` runs the pair R times,
   alternating which strategy goes first, each campaign in a fresh process with its own
   Prefect server (in one process, a campaign inherited the earlier ones' server database and
   heap, and the last campaigns ran slower).

   The machine is shared (2 cores): another process's work during one campaign and not the
   other skews its steps. Every step therefore also records the CPU time used on the machine
   by processes outside this benchmark ("foreign", in cores); the verdict is taken over the
   pairs where both steps ran with at most ``QUIET_CORES`` foreign cores (at least
   ``MIN_PAIRS`` of them, else it is INCONCLUSIVE); the median over all pairs is printed too.
2. **Through the planner and simulator** on ``../shared/traces/*.jsonl``, or the ``*.jsonl``
   of ``--traces DIR`` (skipped with a message saying why when there are none):
   ``no-scale:N`` (ranked, cut, serverless release) vs ``round-robin:N`` (serverless
   release, no cut) for N in 2, 3, 4, 8, on the roofline profile of Qwen2.5-7B on
   H100 with 2 GPUs per actor, for both migration modes and both slicings of the ranking
   (``rank_slack`` 0.1, the default, and equal prompt counts).

Exit status: 1 when the live part's check fails (the campaigns did not generate the same
samples or train the same weights: the pairing every figure rests on does not hold); a missed
target (NOT MET) or an INCONCLUSIVE verdict is printed and exits 0, as every benchmark's
figures do.

    .venv/bin/python benchmarks/bench_assignment.py [--steps 10] [--repeats 1] [--skip-live] [--skip-traces]
        [--traces DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proc_cpu import tree_cpu_s  # beside this script

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
FANOUT = 4
WARM_STEPS = 2  # the first epoch: cold workers and answer-length predictions only
TARGET_SAVING, TARGET_SLOWDOWN = 0.25, 0.05
QUIET_CORES, MIN_PAIRS = 0.1, 8  # at most 5% of this 2-core machine busy with other work
# a task with a wide spread of response lengths (k = 1..60 letters) and room to finish; 32
# prompts = 2 steps per epoch, so from step 2 on lengths are predicted from the last epoch
WORKLOAD = [
    "data.max_count=60", "generation.max_new_tokens=96", "data.num_train_prompts=32",
    "data.num_eval_prompts=16", "algorithm.batch_size=128", "algorithm.group_size=8",
    f"scaling.policy=fixed:{FANOUT}", f"invoker.num_workers={FANOUT + 2}", "eval_every=0",
    # every step's rollouts stay in the store (no garbage collection): the report compares them
    "store.keep_last=null",
]
STRATEGIES = {
    "round_robin": ["generation.assignment=round_robin", "generation.cut_threshold=null"],
    "ranked+cut": ["generation.assignment=ranked", "generation.cut_threshold=0.7"],
}


class ForeignCpu:
    """CPU seconds used on this machine, since the last ``take()``, by processes that are not
    this benchmark or its descendants (Linux /proc; None elsewhere)."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as fh:
                f = [int(x) for x in fh.readline().split()[1:]]
            busy = (sum(f[:8]) - f[3] - f[4]) / self.tick  # all but idle and iowait
            own = tree_cpu_s(os.getpid(), reaped=True)  # this process, its descendants, reaped ones
        except OSError:
            return None
        return busy, own, time.monotonic()

    def take(self) -> float | None:
        """Foreign cores (CPU-s per wall-s) since the previous call."""
        now, last = self._read(), self.last
        self.last = now
        if now is None or last is None or now[2] <= last[2]:
            return None
        return max(0.0, (now[0] - last[0]) - (now[1] - last[1])) / (now[2] - last[2])


def run_live(steps: int, repeats: int, overrides: list[str]) -> list[dict[str, dict]]:
    """Run the pair ``repeats`` times, alternating which strategy goes first; every campaign in
    a fresh process with its own Prefect server, so no run inherits another's server database,
    heap or workers."""
    out = []
    tmp = tempfile.mkdtemp(prefix="bench-assignment-")
    for r in range(repeats):
        names = list(STRATEGIES) if r % 2 == 0 else list(reversed(STRATEGIES))
        runs = {}
        for name in names:
            store, result = f"{tmp}/{name}-{r}", f"{tmp}/{name}-{r}.json"
            print(f"-- live campaign {name} ({steps} steps, repeat {r + 1}/{repeats})", flush=True)
            subprocess.run([sys.executable, __file__, "--one-campaign", name, "--store", store,
                            "--steps", str(steps), "--out", result, *[f"--set={o}" for o in overrides]],
                           check=True,
                           stdout=subprocess.DEVNULL)
            with open(result) as fh:
                runs[name] = json.load(fh)
        out.append(runs)
    return out


def run_one_campaign(name: str, store: str, steps: int, out_path: str, overrides: list[str]) -> None:
    """One campaign of the pair (this process's own Prefect server); writes its step metrics,
    the CPU other processes used during each step, the run id and the weights' hash."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry writes racing the steps
    from prefect.testing.utilities import prefect_test_harness

    from flows.campaign.run import run_campaign
    from flows.config import load_config

    meter = ForeignCpu()
    cfg = load_config(None, [*WORKLOAD, f"steps={steps}", f"store.uri={store}", *STRATEGIES[name], *overrides])
    foreign: list[float | None] = []

    def progress(line: str) -> None:  # called after set-up phases and every step
        value = meter.take()
        if line.startswith("["):
            foreign.append(value)

    with prefect_test_harness(server_startup_timeout=120):
        meter.take()
        result = run_campaign(cfg, progress=progress)
    with open(out_path, "w") as fh:
        json.dump({"steps": result["steps"], "run_id": result["run_id"], "store": store,
                   "weights_sha256": result["weights_sha256"], "foreign": foreign}, fh)


def step_samples(run: dict, step: int) -> dict[tuple[int, int], list[int]]:
    """(prompt id, sample index) -> generated tokens of one step, from the run's store; empty
    when the store holds no rollouts of that step."""
    from actions.store import get_json, open_store

    store = open_store(run["store"])
    prefix = f"runs/{run['run_id']}/steps/{step:06d}/rollouts/"
    return {(s["prompt_id"], s["sample_index"]): s["tokens"]
            for key in store.list(prefix) if key.endswith(".json")
            for s in get_json(store, key)["samples"]}


def unpaired_steps(base: dict, ours: dict) -> tuple[list[int], list[int]]:
    """(steps whose samples differ, steps with no rollouts stored in either run) of the two
    runs' steps; both empty when every step generated the same, non-empty, samples. An empty
    step is not "the same": two stores that lost their rollouts would compare equal."""
    differ, missing = [], []
    for s in base["steps"]:
        k = int(s["step"])
        a, b = step_samples(base, k), step_samples(ours, k)
        if not a or not b:
            missing.append(k)
        elif a != b:
            differ.append(k)
    return differ, missing


def _verdict(billed: list[float], times: list[float]) -> str:
    med_b, med_t = statistics.median(billed), statistics.median(times)
    return (f"billed actor-s x{med_b:.2f} median (saving {1 - med_b:.0%}, target >= "
            f"{TARGET_SAVING:.0%}), step time x{med_t:.2f} median (target <= "
            f"x{1 + TARGET_SLOWDOWN:.2f})")


def _on_cpu() -> bool:
    """Whether the campaigns' actions ran on the CPU (``RLHFLESS_DEVICE``, docs/gpu.md)."""
    device = os.environ.get("RLHFLESS_DEVICE", "cpu")
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


def report_live(repeats: list[dict[str, dict]]) -> bool:
    """Print the paired per-step table and the verdict; False when the campaigns of a repeat did
    not generate the same samples (or, on the CPU, train the same weights), else True, whether
    the targets are met or not (the verdict line says which)."""
    pairs = []  # (billed ratio, time ratio, quiet)
    sums = [0.0, 0.0, 0.0, 0.0]
    same = True
    for r, runs in enumerate(repeats):
        base, ours = runs["round_robin"], runs["ranked+cut"]
        differ, missing = unpaired_steps(base, ours)
        # CUDA training is not bitwise reproducible run to run (two identical campaigns end with
        # different weights), so there the weights cannot tell the strategies apart
        same_weights = base["weights_sha256"] == ours["weights_sha256"] or not _on_cpu()
        same = same and not differ and not missing and same_weights
        print(f"repeat {r + 1}: same samples at every step: {not differ and not missing}"
              f"{f' (differ at steps {differ})' if differ else ''}"
              f"{f' (no rollouts stored at steps {missing})' if missing else ''}; weights_sha256 equal: "
              f"{base['weights_sha256'] == ours['weights_sha256']}"
              f"{'' if _on_cpu() else ' (not required on CUDA)'}")
        print(f"{'step':>4} {'rr billed':>10} {'ranked billed':>14} {'ratio':>6} {'rr step s':>10} "
              f"{'ranked step s':>14} {'ratio':>6} {'cut':>4} {'migr':>5} {'rank corr':>9} "
              f"{'foreign rr/ranked':>17}")
        rows = zip(base["steps"], ours["steps"], base["foreign"], ours["foreign"])
        for b, o, fb, fo in list(rows)[WARM_STEPS:]:
            rb, ro = b["cost/generate_billed_actor_s"], o["cost/generate_billed_actor_s"]
            tb, to = b["timing_s/step"], o["timing_s/step"]
            quiet = fb is not None and fo is not None and max(fb, fo) <= QUIET_CORES
            pairs.append((ro / rb, to / tb, quiet))
            for i, v in enumerate((rb, ro, tb, to)):
                sums[i] += v
            fore = "n/a" if fb is None or fo is None else f"{fb:.2f}/{fo:.2f}"
            print(f"{b['step']:>4.0f} {rb:>10.2f} {ro:>14.2f} {ro / rb:>6.2f} {tb:>10.2f} {to:>14.2f} "
                  f"{to / tb:>6.2f} {o['actors/cut']:>4.0f} {o['actors/migrated']:>5.0f} "
                  f"{o['lengths/rank_correlation']:>9.2f} {fore:>17}")
    print(f"all {len(pairs)} paired steps: {_verdict([p[0] for p in pairs], [p[1] for p in pairs])}; "
          f"totals: billed x{sums[1] / sums[0]:.2f}, step time x{sums[3] / sums[2]:.2f}")
    quiet = [p for p in pairs if p[2]]
    if not same:
        print("ranked+cut vs round_robin: FAIL (the campaigns did not generate the same samples "
              "or train the same weights: the pairs above are not comparable)")
        return False
    if len(quiet) < MIN_PAIRS:
        print(f"ranked+cut vs round_robin at fixed:{FANOUT}: INCONCLUSIVE, only {len(quiet)} pairs "
              f"with <= {QUIET_CORES} foreign cores (need {MIN_PAIRS}); rerun on a quieter machine "
              "or with more --repeats")
        return True
    med_b = statistics.median(p[0] for p in quiet)
    med_t = statistics.median(p[1] for p in quiet)
    ok = 1 - med_b >= TARGET_SAVING and med_t - 1 <= TARGET_SLOWDOWN
    print(f"ranked+cut vs round_robin at fixed:{FANOUT}, {len(quiet)} quiet paired steps (<= "
          f"{QUIET_CORES} foreign cores): {_verdict([p[0] for p in quiet], [p[1] for p in quiet])}: "
          f"{'PASS' if ok else 'NOT MET'}")
    return True


def read_traces(traces: Path = TRACES) -> dict[Path, list] | None:
    """Every ``*.jsonl`` in ``traces``, read (``replay.read_trace``: ValueError naming the file
    and line of a malformed one); None, with a line saying why, where there is none."""
    paths = sorted(traces.glob("*.jsonl"))
    if not paths:
        why = "has no *.jsonl traces" if traces.is_dir() else "does not exist"
        print(f"traces: skipped: {traces} {why} (the shared traces sit beside the repository, in "
              "../shared/traces; pass --traces DIR where they are elsewhere)")
        return None
    from flows.simulate.replay import read_trace

    return {path: read_trace(path) for path in paths}


def run_traces(traces: Path = TRACES, read: dict[Path, list] | None = None) -> None:
    """Part 2 (module docstring) on every ``*.jsonl`` in ``traces`` (``read``: those traces read
    already by ``read_traces``); a line saying why where there is none."""
    read = read_traces(traces) if read is None else read
    if not read:
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_simulator import SHARED_TRACES_CAP, default_model

    from flows.simulate.replay import replay

    model = default_model()
    print(f"\ntraces: {model.profile.name}, {model.gpus_per_actor} GPUs/actor, cut_threshold={model.cut_threshold}; "
          f"target: GPU-s ratio <= {1 - TARGET_SAVING:.2f} and time ratio <= {1 + TARGET_SLOWDOWN:.2f}; "
          "slices: budget = rank_slack 0.1 (default), equal = equal prompt counts; ratios over all "
          "steps, and over the steps after the first epoch (predictions from history, not "
          "from reference answers)")
    print(f"{'trace':<7} {'N':>2} {'migration':>9} {'slices':>6} {'GPU-s ratio':>11} {'time ratio':>10} "
          f"{'target':>7} {'GPU-s, epoch>=1':>15} {'time, epoch>=1':>14}")
    for path, steps in read.items():
        print(f"{path.stem}: {len(steps)} steps, "
              f"{statistics.median(len(s.prompts) for s in steps):.0f} prompts per step (median)")
        later = [i for i, s in enumerate(steps) if s.epoch > steps[0].epoch]
        for n in (2, 3, 4, 8):
            for migration in ("reprefill", "kv"):
                for slices, slack in (("budget", 0.1), ("equal", None)):
                    runs = replay(steps, [f"round-robin:{n}", f"no-scale:{n}"],
                                  dataclasses.replace(model, migration=migration, rank_slack=slack),
                                  max_new_tokens=SHARED_TRACES_CAP)
                    base, ours = runs[f"round-robin:{n}"].steps, runs[f"no-scale:{n}"].steps
                    gpu_s, wall = _ratios(base, ours, range(len(steps)))
                    gpu_later, wall_later = _ratios(base, ours, later)
                    ok = 1 - gpu_s >= TARGET_SAVING and wall - 1 <= TARGET_SLOWDOWN
                    print(f"{path.stem:<7} {n:>2} {migration:>9} {slices:>6} {gpu_s:>11.2f} {wall:>10.2f} "
                          f"{'PASS' if ok else 'NOT MET':>7} {gpu_later:>15.2f} {wall_later:>14.2f}")


def _ratios(base: list, ours: list, steps) -> tuple[float, float]:
    """(GPU-s, time) of ``ours`` over ``base``, summed over the given step indices."""
    steps = list(steps)
    if not steps:
        return float("nan"), float("nan")
    return (sum(ours[i].gpu_seconds for i in steps) / sum(base[i].gpu_seconds for i in steps),
            sum(ours[i].time_s for i in steps) / sum(base[i].time_s for i in steps))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--skip-traces", action="store_true")
    parser.add_argument("--traces", default=str(TRACES), metavar="DIR",
                        help="directory of the shared length traces (default: ../shared/traces beside the repository)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both campaigns, e.g. generation.score_while_generating=false")
    parser.add_argument("--one-campaign", choices=list(STRATEGIES), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_campaign:  # a child of run_live
        run_one_campaign(args.one_campaign, args.store, args.steps, args.out, args.set)
        return 0
    read = None
    if not args.skip_traces:  # a malformed trace is one line before the live part's minutes, not a traceback
        try:
            read = read_traces(Path(args.traces))
        except ValueError as exc:
            print(f"bench_assignment.py: {exc}", file=sys.stderr)
            return 2
    paired = True
    if not args.skip_live:
        paired = report_live(run_live(args.steps, args.repeats, args.set))
    if read:
        run_traces(Path(args.traces), read)
    return 0 if paired else 1


if __name__ == "__main__":
    sys.exit(main())
