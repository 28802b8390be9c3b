"""Where the campaign's background control-plane jobs run against each step's activations.

Runs ``bench_vs_trl.py``'s RLHFless campaign (its tiny Qwen2 folder, prompts and settings at
``--size``) through the CLI in this process, on the local warm pool, with timestamps around
every job of the campaign's background queue (``flows/campaign/overhead.py``: the next step's
flow run ``_create``, the step's parameters ``_write_parameters``, the previous step's
artifacts ``_publish``), every activation and every call of the step flow. Prints, per step,
each activation's and each job's window in seconds from the step's start, and the job seconds
that overlapped the training activation; then the medians over the steady steps (the first
and the last left out, as ``bench_vs_trl.py`` does).

Usage::

    python benchmarks/bench_control_plane.py --size small --steps 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

Event = tuple[str, str, float, float]  # kind (job, act, step), name, start, end (epoch seconds)


def timed(events: list[Event], kind: str, name: str, fn: Any) -> Any:
    """``fn`` that appends (kind, name, start, end) to ``events`` at each call's end."""
    def call(*args: Any, **kwargs: Any) -> Any:
        t = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            events.append((kind, name, t, time.time()))
    return call


def instrument(events: list[Event]) -> None:
    """Wrap the background queue's jobs, the pool's activations and the step flow's calls."""
    from flows.campaign import overhead, prestart
    from flows.invokers.local_pool import LocalPoolInvoker

    submit, invoke, run = overhead.Background.submit, LocalPoolInvoker.invoke, prestart.FlowRunStarter.run
    overhead.Background.submit = lambda self, fn, *a, **kw: submit(  # type: ignore[method-assign]
        self, timed(events, "job", getattr(fn, "__name__", "job"), fn), *a, **kw)
    LocalPoolInvoker.invoke = lambda self, action, *a, **kw: timed(  # type: ignore[method-assign]
        events, "act", action, invoke)(self, action, *a, **kw)
    prestart.FlowRunStarter.run = lambda self, *a, **kw: timed(  # type: ignore[method-assign]
        events, "step", "step", run)(self, *a, **kw)


def overlap(a: Event, b: Event) -> float:
    return max(0.0, min(a[3], b[3]) - max(a[2], b[2]))


def report(events: list[Event]) -> list[float]:
    """Print the per-step timeline; returns the job seconds beside training, per step."""
    steps = sorted(e for e in events if e[0] == "step")
    beside = []
    for i, (_, _, s0, s1) in enumerate(steps):
        until = steps[i + 1][2] if i + 1 < len(steps) else float("inf")
        acts = sorted((e for e in events if e[0] == "act" and s0 <= e[2] <= s1), key=lambda e: e[2])
        jobs = sorted((e for e in events if e[0] == "job" and e[3] >= s0 and e[2] < until), key=lambda e: e[2])
        train = next(a for a in acts if a[1] == "train_step")
        beside.append(sum(overlap(j, train) for j in jobs))
        print(f"step {i}: {s1 - s0:.3f} s | " + " ".join(f"{a[1]} {a[2] - s0:.3f}-{a[3] - s0:.3f}" for a in acts)
              + " | jobs " + " ".join(f"{j[1]} {j[2] - s0:.3f}-{j[3] - s0:.3f}" for j in jobs)
              + f" | beside training {beside[-1]:.3f} s")
    return beside


def main() -> None:
    import bench_vs_trl

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(bench_vs_trl.SIZES), default="small")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-control-plane-"))
    model, data = bench_vs_trl.write_inputs(work)
    prompts, samples, tokens = bench_vs_trl.SIZES[args.size]
    out = work / "run"
    argv = ["train", "--out", str(out), "--steps", str(args.steps)]
    for kv in (f"model.path={model}", f"data.train_path={data}", f"data.eval_path={data.with_name('eval.jsonl')}",
               "data.chat_template=false", "warmup.steps=0", f"algorithm.batch_size={prompts * samples}",
               f"algorithm.group_size={samples}", "algorithm.num_minibatches=1", "algorithm.kl_coef=0",
               f"algorithm.lr={bench_vs_trl.LR}", f"generation.max_new_tokens={tokens}", "eval_every=0",
               f"store.uri={out}/store"):
        argv += ["--set", kv]
    events: list[Event] = []
    instrument(events)
    from flows.commands.cli import main as cli

    cli(argv)
    beside = report(events)[1:-1]
    steady = json.loads((out / "summary.json").read_text())["steps"][1:-1]
    medians = {k: round(statistics.median(s[f"timing_s/{k}"] for s in steady), 3)
               for k in ("generate", "score", "train", "overhead", "period")}
    print(json.dumps({"steady_medians_s": medians, "job_s_beside_training": round(statistics.median(beside), 3)}))


if __name__ == "__main__":
    main()
