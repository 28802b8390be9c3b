"""End-to-end campaigns against a real S3 server (SeaweedFS on loopback)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest

from actions.store.uri import open_store
from flows.campaign.run import run_campaign
from flows.campaign.state import load_state
from flows.invokers.local_pool import LocalPoolInvoker

try:
    from conftest import LEARNING, assert_learned
except ImportError:  # tests/ imported as a package
    from tests.conftest import LEARNING, assert_learned

pytestmark = pytest.mark.s3


def test_campaign_on_s3_store_commits_and_resumes(tiny_config, s3_server, monkeypatch, prefect_harness, tmp_path):
    """Also: neither the S3 secret nor the pool's secret reaches the worker logs, tracebacks
    of failed activations included."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    pool_secrets: list[str] = []  # every worker's own secret, replacements of killed workers included
    spawn = LocalPoolInvoker._spawn

    def spy_spawn(self, name):
        worker = spawn(self, name)
        pool_secrets.append(worker.secret)
        return worker

    monkeypatch.setattr(LocalPoolInvoker, "_spawn", spy_spawn)
    uri = s3_server.uri(f"e2e/{uuid.uuid4().hex[:8]}")
    cfg = tiny_config("invoker.kind=local", "invoker.num_workers=2", f"store.uri={uri}", "run_id=s3run", "steps=1",
                      "faults.fail_fraction=0.5", "faults.kill_fraction=0.5", "faults.kill_after_s=0.1")
    first = run_campaign(cfg, progress=lambda m: None)
    assert first["steps_completed"] == 1
    logs = sorted((tmp_path / "logs").glob("worker-*.log"))
    text = "".join(p.read_text() for p in logs)
    assert len(logs) == 2 and "Traceback" in text and "InjectedFault" in text
    assert len(pool_secrets) >= 2 and not any(s in text for s in pool_secrets)
    assert s3_server.secret_key not in text
    more = run_campaign(tiny_config("invoker.kind=inprocess", f"store.uri={uri}", "run_id=s3run", "steps=2"),
                        resume=True, progress=lambda m: None)
    assert more["steps_completed"] == 2 and more["policy_version"] == 2


@pytest.mark.slow
def test_kill_9_at_random_points_then_resume_gives_same_weights(tiny_config, tmp_path):
    """SIGKILL the CLI mid-campaign a few times, resume each time, compare with a clean run."""
    args = ["--set", "invoker.kind=inprocess", "--set", "steps=4", "--set", "data.max_count=6",
            "--set", "model.hidden_size=32", "--set", "model.num_heads=2", "--set", "warmup.steps=5",
            "--set", "algorithm.batch_size=16", "--set", "algorithm.group_size=4", "--set", "generation.max_new_tokens=10",
            "--set", "data.num_train_prompts=32", "--set", "data.num_eval_prompts=8",
            *(a for o in LEARNING for a in ("--set", o))]

    def committed(store) -> int:
        try:
            state = load_state(open_store(str(store)), "k9")
        except Exception:  # a commit being written as it is read: look again
            return -1
        return 0 if state is None else state.step

    def run(store, out, resume=False, kill_at=None):
        """Run the CLI; with ``kill_at=(step, delay)``, SIGKILL it ``delay`` s after it has committed
        ``step``, so each kill lands between two commits whatever the machine's speed."""
        cmd = [sys.executable, "-m", "flows.commands.cli", "train", "--set", f"store.uri={store}", "--run-id", "k9",
               "--out", str(out), *args] + (["--resume"] if resume else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if kill_at is None:
            assert proc.wait(timeout=600) == 0
            return
        step, delay = kill_at
        deadline = time.monotonic() + 600
        while committed(store) < step:
            assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before it committed step {step}"
            assert time.monotonic() < deadline, f"no commit of step {step} in 600 s"
            time.sleep(0.02)  # a tiny step takes a few tenths of a second on a fast machine
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    run(tmp_path / "clean", tmp_path / "clean-out")
    import json
    import statistics

    periods = [s["timing_s/period"] for s in json.loads((tmp_path / "clean-out" / "summary.json").read_text())["steps"]]
    into_next = statistics.median(periods) / 2  # half a step: mid-step on a slow machine and a fast one
    killed = tmp_path / "killed"
    at_kill = []
    for step, delay in ((1, 0.0), (2, into_next), (3, 0.0)):  # just after a commit, or into the next step
        run(killed, tmp_path / "killed-out", resume=step > 1, kill_at=(step, delay))
        at_kill.append(committed(killed))
    assert at_kill[0] >= 1 and at_kill == sorted(at_kill) and at_kill[-1] < 4, \
        f"each kill must land mid-campaign, after the previous one's commits: committed steps at the kills {at_kill}"
    run(killed, tmp_path / "killed-out", resume=True)
    a = json.loads((tmp_path / "clean-out" / "summary.json").read_text())
    b = json.loads((tmp_path / "killed-out" / "summary.json").read_text())
    assert_learned(a)
    assert a["weights_sha256"] == b["weights_sha256"]
