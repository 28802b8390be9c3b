"""A campaign on the vLLM engine keeps its engines warm (``make test-vllm``).

Four steps with ``generation.engine: vllm`` on the local pool at the default fan-out: each
worker starts at most one engine, the campaign at most two, and every new policy version
reaches a running engine through an in-place push. The same campaign in process gives the
same samples. Timing ratios (steady steps' generate phase against step 1's) are measured by
``benchmarks/bench_vllm_campaign.py``, not asserted here.
"""

from __future__ import annotations

import re

import pytest

from actions.engines.preflight import vllm_available

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="needs vLLM (make test-vllm)")]

STEPS = 4
VLLM_OVERRIDES = ["generation.engine=vllm", "model.hidden_size=128", "model.num_heads=2", f"steps={STEPS}",
                  "store.keep_last=null"]  # every step's rollouts stay, to compare them


def _samples(cfg) -> dict:
    from actions.store import get_json, open_store

    store = open_store(cfg.store.uri)
    out = {}
    for step in range(STEPS):
        for key in store.list(f"runs/{cfg.resolved_run_id()}/steps/{step:06d}/rollouts/"):
            if key.endswith(".json"):
                for s in get_json(store, key)["samples"]:
                    out[(step, s["prompt_id"], s["sample_index"])] = s["tokens"]
    return out


def test_a_vllm_campaign_starts_each_engine_once_and_pushes_every_version_into_it(tmp_path, prefect_harness):
    from actions.engines import factory
    from flows.campaign.run import run_campaign
    from flows.config import load_config
    from tests.conftest import LEARNING, TINY_OVERRIDES

    # the default fan-out, and a reward that moves the weights every step: a version that never
    # reached an engine would show in the samples
    base = [o for o in TINY_OVERRIDES if not o.startswith(("scaling.", "steps="))] + list(LEARNING)
    pool = load_config(None, [*base, *VLLM_OVERRIDES, f"store.uri={tmp_path / 'pool'}",
                              f"invoker.log_dir={tmp_path / 'logs'}", "run_id=v"])
    summary = run_campaign(pool, progress=lambda m: None)
    assert summary["steps_completed"] == STEPS
    assert all(s["grad_norm"] > 0 for s in summary["steps"])  # every version differs from the one before
    starts = {log.stem: len(re.findall(r"vllm engine started", log.read_text()))
              for log in (tmp_path / "logs").glob("worker-*.log")}
    assert max(starts.values()) <= 1, starts  # one engine per worker, whatever it ran
    assert 1 <= sum(starts.values()) <= 2 and summary["engine"]["starts"] == sum(starts.values()), starts
    steps = summary["steps"]
    # every version after the first reached the engines in place, never through a restart
    assert sum(s["engine/weight_pushes"] for s in steps[1:]) >= STEPS - 1
    assert all(s["engine/weight_push_s"] > 0 for s in steps[1:] if s["engine/weight_pushes"])
    assert summary["profile"]["name"].startswith("measured-vllm") and summary["profile"]["weight_push_s"] > 0

    inproc = load_config(None, [*base, *VLLM_OVERRIDES, f"store.uri={tmp_path / 'inproc'}",
                                "invoker.kind=inprocess", "run_id=v"])
    try:
        again = run_campaign(inproc, progress=lambda m: None)
    finally:
        factory.close_vllm()
    assert again["engine"]["starts"] == 1  # one process, one engine
    a, b = _samples(pool), _samples(inproc)
    assert len(a) == STEPS * 16 and a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []
    # and the torch engine, which loads each version afresh, samples the same tokens
    torch_run = load_config(None, [*base, *VLLM_OVERRIDES, "generation.engine=torch",
                                   f"store.uri={tmp_path / 'torch'}", "invoker.kind=inprocess", "run_id=v"])
    run_campaign(torch_run, progress=lambda m: None)
    c = _samples(torch_run)
    assert c.keys() == a.keys() and [k for k in a if a[k] != c[k]] == []
