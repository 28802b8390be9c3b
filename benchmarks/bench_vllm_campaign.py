"""A campaign on the vLLM engine against the same campaign on the torch engine, side by side:
engine starts, in-place weight pushes, the generate phase per step and the planner's error.

Workload: the default campaign with the tiny Llama at head_dim 64 (``model.hidden_size=128
model.num_heads=2``, the smallest head vLLM's CPU attention accepts), on the local warm pool
at the default fan-out, ``--steps`` steps (default 4); ``--set`` adds overrides to both runs
(``--set warmup.steps=20`` shortens the set-up). Each campaign gets a fresh store, so each
measures its own engine profile. Printed per engine:

* per step: the generate phase (``timing_s/generate``), its ratio to step 1's, the planner's
  prediction, engine starts and pushes reported by the step's generate actions and their
  seconds;
* the campaign: engine starts and their seconds, pushes and the mean push (set-up and
  evaluations included), for vLLM the engines each worker started (from its log), and the planner's
  median relative error on the generate phase (``planner_fidelity``).

Run it in the ``make test-vllm`` environment (the vLLM half is skipped elsewhere):

    .venv-vllm/bin/python benchmarks/bench_vllm_campaign.py --steps 4
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actions.engines.preflight import vllm_available

SHAPE = ["model.hidden_size=128", "model.num_heads=2"]


def run(engine: str, steps: int, extra: list[str], root: Path) -> tuple[dict[str, Any], dict[str, int], float]:
    """(summary, engine starts per worker log, wall seconds) of one campaign, run as a user
    runs it: ``rlhfless train`` in a child process (its own embedded Prefect server)."""
    sets = [*SHAPE, f"generation.engine={engine}", f"store.uri={root / 'store'}", f"run_id=bench-{engine}", *extra]
    argv = [sys.executable, "-m", "flows.commands.cli", "train", "--steps", str(steps), "--out", str(root / "out")]
    for item in sets:
        argv += ["--set", item]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    summary = json.loads((root / "out" / "summary.json").read_text())
    starts = {log.stem: len(re.findall(r"vllm engine started", log.read_text()))
              for log in sorted((root / "out" / "logs").glob("worker-*.log"))}
    return summary, starts, wall


def engine_line(engine: str, e: dict[str, Any], starts: dict[str, int]) -> str:
    """The campaign's engine starts and pushes (``summary["engine"]``, ``e``). ``starts`` counts
    the ``vllm engine started`` lines of each worker's log, so it is shown for vLLM only: the
    torch engine's starts (generation slot models built) log no such line.

    >>> engine_line("torch", {"starts": 4, "start_s": 0.5, "weight_pushes": 6, "weight_push_s": 0.042},
    ...             {"worker-0": 0})
    'engine starts 4 (0.5 s); pushes 6, mean 7 ms'
    """
    pushes = e["weight_pushes"]
    per_worker = f", vLLM engines per worker {starts}" if engine == "vllm" else ""
    return (f"engine starts {int(e['starts'])} ({e['start_s']:.1f} s){per_worker}; "
            f"pushes {int(pushes)}, mean {e['weight_push_s'] / pushes * 1e3 if pushes else 0:.0f} ms")


def report(engine: str, summary: dict[str, Any], starts: dict[str, int], wall: float) -> None:
    steps = summary["steps"]
    first = steps[0]["timing_s/generate"]
    print(f"== engine {engine}: {len(steps)} steps in {wall:.0f} s; profile {summary['profile']['name']} "
          f"({summary['profile']['source']}), push in profile {summary['profile'].get('weight_push_s', 0) * 1e3:.0f} ms")
    print("step | actions | generate s | / step 1 | predicted s | engine starts (s) | pushes (s)")
    for i, s in enumerate(steps):
        print(f"{i + 1:4d} | {int(s['actors/n']):7d} | {s['timing_s/generate']:10.2f} | "
              f"{s['timing_s/generate'] / first:7.2f}x | {s['plan/predicted_generate_s']:11.2f} | "
              f"{int(s.get('engine/starts', 0))} ({s.get('engine/start_s', 0):.2f}) | "
              f"{int(s.get('engine/weight_pushes', 0))} ({s.get('engine/weight_push_s', 0):.3f})")
    steady = [s["timing_s/generate"] / first for s in steps[1:]]
    e = summary["engine"]
    print(f"steady steps' generate / step 1: median {statistics.median(steady) if steady else 0:.2f}x, "
          f"max {max(steady, default=0):.2f}x")
    print(engine_line(engine, e, starts))
    fid = summary["planner_fidelity"]["generate"]
    print(f"planner, generate phase: median relative error {fid['median_relative_error']:+.1%}, "
          f"median |error| {fid['median_abs_relative_error']:.1%} over {fid['steps']} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--set", dest="extra", action="append", default=[])
    parser.add_argument("--engines", default="torch,vllm")
    args = parser.parse_args()
    for engine in args.engines.split(","):
        if engine == "vllm" and not vllm_available():
            print("== engine vllm: skipped, vLLM is not importable here (run in .venv-vllm, make test-vllm)")
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-{engine}-") as tmp:
            report(engine, *run(engine, args.steps, args.extra, Path(tmp)))


if __name__ == "__main__":
    main()
