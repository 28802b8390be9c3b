"""The simulator's plans on the shared length traces are those the planner made before it
became one object (``flows/planning/planner.py``) and its policies a registry.

Each digest is the sha256 (first 16 hex digits) of the JSON of every replayed step of one
policy: its plan (``GenerationPlan.to_dict`` without the wall-clock ``planning_ms``) and the
simulated step's time, GPU-seconds, cuts and migrations. The digests below were computed with
the code before that change; a planning change that moves any plan or any figure on these
traces by one bit shows here. Skips where the traces are absent.
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
    "gsm8k/budget": {"no-assign": "2cfe8ba9140acc2a", "no-cut": "5a36e1d78e688295", "no-scale": "76277858e6327403",
                     "oracle": "33024f2537028d11", "rlhfless": "5a36e1d78e688295",
                     "round-robin:4": "3721326d7cfb1dd2", "static:3": "4e137dbca826ec46"},
    "gsm8k/value": {"no-assign": "9476247dfa2c2815", "no-cut": "4a1411ad51592b06", "no-scale": "9a307345ee305c99",
                    "oracle": "1d90540b27f60881", "rlhfless": "c2d6e5e19456d384",
                    "round-robin:4": "8a650603cb327375", "static:3": "306b31164adc8915"},
    "lcb/budget": {"no-assign": "b75f2a5692c41306", "no-cut": "0b57b2572c02e62a", "no-scale": "1338a5d2cb1fc3f3",
                   "oracle": "2d4b85efcb87e29c", "rlhfless": "0b57b2572c02e62a",
                   "round-robin:4": "441f44e2384334a9", "static:3": "694ef15df93d25f5"},
    "lcb/value": {"no-assign": "ee15cc4931b66919", "no-cut": "64139bf03d9930c6", "no-scale": "0674791ffdde11cb",
                  "oracle": "03a698b6229eeb32", "rlhfless": "9bafaade3d980957",
                  "round-robin:4": "39d05539d404a091", "static:3": "f8cc32548f84ffe4"},
}


def digests(trace: Path, objective: str) -> dict[str, str]:
    """Per policy, the digest of its replay of ``trace`` on the CLI's default cluster."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    model = build_model(parser.parse_args(["--trace", str(trace), "--objective", objective]))
    out = {}
    for name, run in replay(read_trace(trace), POLICIES, model).items():
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
    assert digests(trace, objective) == DIGESTS[case]
