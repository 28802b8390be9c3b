"""The simulator's plans on the shared length traces are those the planner made before it
became one object (``flows/planning/planner.py``) and its policies a registry, on these
traces (``TRACE_SHA256``; another trace file skips, naming both hashes) and this environment
(numpy 2.4: the digests were computed again for it and the traces of 2026-11-28, with the
code from before that change giving the same digests as the code after it).

Each digest is the sha256 (first 16 hex digits) of the JSON of every replayed step of one
policy: its plan (``GenerationPlan.to_dict`` without the wall-clock ``planning_ms``) and the
simulated step's time, GPU-seconds, cuts and migrations. The digests below were computed with
the code before that change; a planning change that moves any plan or any figure on these
traces by one bit shows here. Skips where the traces are absent.

The replay caps predictions at the shared traces' generation cap, 2,048 tokens, which they do
not state. It used the longest response of the whole trace before: 2,048 on lcb, whose digests
therefore stand, and 1,543 on gsm8k, whose digests were computed again for the 2,048 cap (every
policy but the oracle, which plans with the true lengths).

The first-epoch fit's M-step counts the censored groups' conditional variance
(``flows/planning/first_epoch.py``): lcb's epoch 0, with groups at the cap, plans from a
steeper, wider fit, and its digests were computed again (gsm8k has no group at the cap).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from flows.simulate.cli import add_arguments, build_model
from flows.simulate.replay import read_trace, replay

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
POLICIES = ["rlhfless", "static:3", "no-assign", "no-scale", "no-cut", "oracle", "round-robin:4"]
DIGESTS = {
    "gsm8k/budget": {"no-assign": "38c62f3c86a16c48", "no-cut": "1d488e74785e7e8d", "no-scale": "88591cb5ff474675",
                     "oracle": "a1160751838e8d71", "rlhfless": "1d488e74785e7e8d",
                     "round-robin:4": "c4b0e72b2459de6d", "static:3": "6b135de98db934ed"},
    "gsm8k/value": {"no-assign": "89ebaf9c66d5079a", "no-cut": "aff2ee250bb4443e", "no-scale": "7b828d78af517e6d",
                    "oracle": "dde671b4fed8f795", "rlhfless": "d7d5e238e352f8e0",
                    "round-robin:4": "96dcbc96f2707e37", "static:3": "02864483460214f3"},
    "lcb/budget": {"no-assign": "58af385456952e8f", "no-cut": "b67cb26db85a7c52", "no-scale": "ebc61ce3b98fc13a",
                   "oracle": "64ed13b908538570", "rlhfless": "b67cb26db85a7c52",
                   "round-robin:4": "50d856e8457322aa", "static:3": "627cee5f4a8f17db"},
    "lcb/value": {"no-assign": "06d5a483b97f3210", "no-cut": "686b31e16220d462", "no-scale": "637166429ea88ea0",
                  "oracle": "1a974a5d1a0a799b", "rlhfless": "d397e9095c1d9010",
                  "round-robin:4": "7c0cbbfc62e372ae", "static:3": "ef8c5b58838de01a"},
}
SHARED_TRACES_CAP = 2048
"""The generation cap the shared traces were made with (they do not state it)."""
TRACE_SHA256 = {"gsm8k": "9962f5c3dac48db4", "lcb": "a930ba5403dca578"}
"""The first 16 hex digits of the sha256 of the trace files the digests were computed on."""


def digests(trace: Path, objective: str) -> dict[str, str]:
    """Per policy, the digest of its replay of ``trace`` on the CLI's default cluster."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    model = build_model(parser.parse_args(["--trace", str(trace), "--objective", objective]))
    out = {}
    for name, run in replay(read_trace(trace), POLICIES, model, max_new_tokens=SHARED_TRACES_CAP).items():
        rows = []
        for plan, step in zip(run.plans, run.steps, strict=True):
            d = plan.to_dict()
            d.pop("planning_ms")
            rows.append([d, step.time_s, step.gpu_seconds, step.num_cut, step.num_migrated])
        out[name] = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
    return out


@pytest.mark.parametrize("case", [
    "gsm8k/budget", pytest.param("lcb/budget", marks=pytest.mark.slow),
    pytest.param("gsm8k/value", marks=pytest.mark.slow), pytest.param("lcb/value", marks=pytest.mark.slow),
])
def test_the_plans_on_the_shared_traces_are_bit_identical(case: str) -> None:
    name, objective = case.split("/")
    trace = TRACES / f"{name}.jsonl"
    if not trace.exists():
        pytest.skip(f"shared trace not found at {trace}")
    found = hashlib.sha256(trace.read_bytes()).hexdigest()[:16]
    if found != TRACE_SHA256[name]:
        pytest.skip(f"{trace} is not the trace the digests were computed on (sha256 {found}..., expected "
                    f"{TRACE_SHA256[name]}...): recompute DIGESTS with digests() on the code before a planning change")
    assert digests(trace, objective) == DIGESTS[case]
