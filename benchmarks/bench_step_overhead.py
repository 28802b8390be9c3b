"""Where a step's ``timing_s/overhead`` goes: before the step flow's body, in it, after it.

Runs the default campaign (``rlhfless train``'s configuration plus ``--set`` overrides) in this
process, on the temporary local Prefect API the CLI starts, with timestamps around each call of
the step flow and around its body (the flow function), and prints per-step medians (the first
step left out) of:

* ``before body`` -- from the call to the body's start: the flow run's creation (unless it was
  created ahead), its update, Running, its read;
* ``body - work`` -- the body's wall time minus the activations' busy time on the critical path
  (task submission and task runs, the pool's HTTP round trips, result validation);
* ``after body`` -- from the body's end to the call's return: Completed;
* ``overhead`` and ``period`` as the campaign records them (``flows/campaign/overhead.py``).

Usage::

    PREFECT_HOME=/tmp/overhead-home python benchmarks/bench_step_overhead.py --out /tmp/overhead --set steps=14

Without ``--out`` the run directory is a fresh temporary one, printed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None,
                        help="run directory (its store and worker logs); default a fresh temporary one")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override, as the CLI")
    args = parser.parse_args()
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="bench-step-overhead-")
    print(f"run directory: {args.out}", flush=True)
    from flows.campaign import run as campaign
    from flows.commands.local_api import start_local_api
    from flows.config import load_config
    from flows.step import flow as step

    cfg = load_config(None, [f"store.uri={args.out}/store", f"invoker.log_dir={args.out}/logs", *args.overrides])
    start_local_api()
    bodies: list[tuple[float, float]] = []
    calls: list[tuple[float, float]] = []
    body_fn = step.rlhf_step.fn

    def timed_body(*a: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = body_fn(*a, **kw)
        bodies.append((t0, time.time()))
        return out

    step.rlhf_step.fn = timed_body  # the campaign wraps rlhf_step when it starts, after this
    run_one = campaign.run_one_step

    def timed_step(ctx: Any, state: Any, planner: Any, tokens: Any, step_flow: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            t0 = time.time()
            out = step_flow(*a, **kw)
            calls.append((t0, time.time()))
            return out
        return run_one(ctx, state, planner, tokens, call)

    campaign.run_one_step = timed_step
    summary = campaign.rlhf_campaign(config=cfg.model_dump(mode="json"))
    rows: dict[str, list[float]] = {"before body": [], "body - work": [], "after body": [], "overhead": [],
                                    "period": []}
    for s, (c0, c1), (b0, b1) in list(zip(summary["steps"], calls, bodies))[1:]:
        busy = s["timing_s/work"] - s["timing_s/plan"]
        rows["before body"].append(b0 - c0)
        rows["body - work"].append(b1 - b0 - busy)
        rows["after body"].append(c1 - b1)
        rows["overhead"].append(s["timing_s/overhead"])
        rows["period"].append(s["timing_s/period"])
    print(f"{len(rows['period'])} steps; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"weights_sha256 {summary['weights_sha256'][:16]}")
    for name, values in rows.items():
        q = statistics.quantiles([1000 * v for v in values], n=4)
        print(f"{name:<12} median {1000 * statistics.median(values):7.1f} ms  (p25 {q[0]:.1f}, p75 {q[2]:.1f})")


if __name__ == "__main__":
    main()
