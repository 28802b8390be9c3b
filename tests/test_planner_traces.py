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

The §3.6 feasibility check no longer applies to actors with no start to hide (co-located
ones, ``flows/planning/timeline.py``): candidates it had marked infeasible now carry no reason,
and every digest was computed again. Of the chosen plans, rlhfless's changed on gsm8k/budget
only (one step: 106.03 -> 106.05 s, 189.3 -> 189.7 GPU-s), no-assign's on every case.
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
    "without AVX-512": {
        "gsm8k/budget": {"no-assign": "ed6f85977a19bb9b", "no-cut": "d084896b5071bbec", "no-scale": "88591cb5ff474675",
                         "oracle": "510245ac168ff3d3", "rlhfless": "d084896b5071bbec",
                         "round-robin:4": "2cd3528d39699be6", "static:3": "f11f1eb43909f151"},
        "gsm8k/value": {"no-assign": "26a88e187f90d669", "no-cut": "40ed308b7ac6009c", "no-scale": "7b828d78af517e6d",
                        "oracle": "da5b4d8539bfb9a5", "rlhfless": "b03a4381c9a095b1",
                        "round-robin:4": "3224643d62c62506", "static:3": "1c927ee685e247f2"},
        "lcb/budget": {"no-assign": "9156b92e48a4c350", "no-cut": "b86cce991f48ac0a", "no-scale": "ebc61ce3b98fc13a",
                       "oracle": "ce6d055190f22671", "rlhfless": "b86cce991f48ac0a",
                       "round-robin:4": "345ba5065c573f3f", "static:3": "948a8148938a940e"},
        "lcb/value": {"no-assign": "9fe2415af5fb5c79", "no-cut": "ba095387b87cedcc", "no-scale": "637166429ea88ea0",
                      "oracle": "edee5fefdd6fa235", "rlhfless": "97c5be7d14a6bbb5",
                      "round-robin:4": "2a8b13b039b8dcec", "static:3": "5afe583e80ca99d7"},
    },
    "AVX-512": {
        "gsm8k/budget": {"no-assign": "33cc980f7de33f4f", "no-cut": "9b5e7b1006dcb3a6", "no-scale": "7a95cf7f96398b4c",
                         "oracle": "510245ac168ff3d3", "rlhfless": "9b5e7b1006dcb3a6",
                         "round-robin:4": "78e27c76fa45e87e", "static:3": "54751b9c4afb4355"},
        "gsm8k/value": {"no-assign": "a7c901366e6957ec", "no-cut": "cadf70b4ab6b3f7d", "no-scale": "a5b11e2b45c18665",
                        "oracle": "da5b4d8539bfb9a5", "rlhfless": "d3cc7422b681caa7",
                        "round-robin:4": "575de0ef6026bb13", "static:3": "6d756732248fe617"},
        "lcb/budget": {"no-assign": "0ce4c60bbc651c03", "no-cut": "72be61602b6d48d3", "no-scale": "ebc61ce3b98fc13a",
                       "oracle": "ce6d055190f22671", "rlhfless": "72be61602b6d48d3",
                       "round-robin:4": "345ba5065c573f3f", "static:3": "948a8148938a940e"},
        "lcb/value": {"no-assign": "94dbeec4922cfe7b", "no-cut": "88c04aa44370f57f", "no-scale": "637166429ea88ea0",
                      "oracle": "edee5fefdd6fa235", "rlhfless": "d6808a4de93770b5",
                      "round-robin:4": "2a8b13b039b8dcec", "static:3": "5afe583e80ca99d7"},
    },
}
"""Per environment, per case, per policy: the digest. numpy's float kernels with AVX-512 round
some sums differently, which moves the simulated figures' last bits (and with them the digest of
every policy whose figures are not whole numbers): one revision gives the first set on the CPU
the digests were first computed on and the second on a 2-core AMD EPYC with AVX-512. A replay
must give one environment's whole set; the test does not guess which from the CPU's flags."""
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
    got = digests(trace, objective)
    # one known environment's whole set: a planning change matches neither
    assert any(got == known[case] for known in DIGESTS.values()), got
