"""The campaign's process stays a control plane: every model touch is an action.

``prepare`` and the PPO critic's first version run as actions (``flows/campaign/inputs.py``):
on the pool, or, when the actions run on a cluster that cannot read this machine's files, in a
child process (``flows/invokers/child.py``). A whole PPO campaign on the local pool is run in a
fresh interpreter, which must end without torch or transformers in ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flows.invokers.base import ActionError
from flows.invokers.child import ChildProcessInvoker

try:
    from conftest import TINY_OVERRIDES
except ImportError:  # tests/ imported as a package
    from tests.conftest import TINY_OVERRIDES

ROOT = Path(__file__).resolve().parents[1]

CAMPAIGN = """
import json, sys
from prefect.testing.utilities import prefect_test_harness
from flows.config import load_config
from flows.campaign.run import run_campaign
from actions.store import open_store

cfg = load_config(None, json.loads(sys.argv[1]))
with prefect_test_harness(server_startup_timeout=120):
    summary = run_campaign(cfg, progress=lambda m: None)
store = open_store(cfg.store.uri)
print(json.dumps({"steps": summary["steps_completed"], "value_loss": summary["steps"][0].get("loss/value"),
                  "critic": store.exists(f"runs/{cfg.resolved_run_id()}/critic/v000000/manifest.json"),
                  "loaded": sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules)}))
"""


def test_a_ppo_campaign_on_the_pool_never_loads_torch_in_its_own_process(tmp_path):
    overrides = [*TINY_OVERRIDES, f"store.uri={tmp_path / 'store'}", f"invoker.log_dir={tmp_path / 'logs'}",
                 "invoker.kind=local", "invoker.num_workers=2", "algorithm.name=ppo", "steps=1", "run_id=cp"]
    proc = subprocess.run([sys.executable, "-c", CAMPAIGN, json.dumps(overrides)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 1 and out["critic"] and out["value_loss"] >= 0.0
    assert out["loaded"] == [], f"the campaign's process imported {out['loaded']}"


def test_the_child_process_invoker_runs_an_action_and_returns_its_result(tmp_path):
    activation = ChildProcessInvoker(tmp_path / "child.log").invoke("noop", {}, timeout_s=120)
    assert activation.result == {"ok": True} and activation.worker == "child" and activation.busy_s > 0


def test_the_child_process_invoker_reports_a_rejected_request_without_retry(tmp_path):
    with pytest.raises(ActionError) as info:
        ChildProcessInvoker(tmp_path / "child.log").invoke("prepare", {"store_uri": str(tmp_path)}, timeout_s=120)
    assert not info.value.transient
    assert "workload" in info.value.message and "run_prefix" not in info.value.message.split(":")[0]


def test_a_child_past_invoker_timeout_s_names_the_setting_and_the_fix(tmp_path):
    from flows.invokers.child import _past_timeout

    with pytest.raises(ActionError) as info:  # the interpreter alone takes longer to start
        ChildProcessInvoker(tmp_path / "child.log").invoke("noop", {}, timeout_s=0.01)
    assert not info.value.transient
    assert info.value.message.endswith("ran past 0.01 s (invoker.timeout_s=0.01); raise invoker.timeout_s, "
                                       "or unset it for 600 s")
    assert _past_timeout(900.0).endswith("(invoker.timeout_s=900); raise invoker.timeout_s")  # unset: lower


def test_prepare_in_a_child_process_writes_what_prepare_in_process_writes(tmp_path, tiny_config):
    from actions.contracts import Prepared, PrepareRequest, parse_result
    from actions.prepare import prepare
    from actions.store import open_store

    cfg = tiny_config()
    here = prepare(cfg.workload(), open_store(str(tmp_path / "a")), "runs/x")
    req = PrepareRequest(workload=cfg.workload(), store_uri=str(tmp_path / "b"), run_prefix="runs/x")
    activation = ChildProcessInvoker(tmp_path / "child.log").invoke("prepare", req.model_dump(mode="json"),
                                                                     timeout_s=300)
    there = parse_result("prepare", activation.result)
    assert isinstance(there, Prepared) and there == here
    a, b = open_store(str(tmp_path / "a")), open_store(str(tmp_path / "b"))
    assert a.get(here.init_key) == b.get(there.init_key) and a.get(here.tokens_key) == b.get(there.tokens_key)
