"""Fault injection through configuration (``faults``): workers killed mid-activation, failed
activations and added latency cost time, never results.

A tiny campaign on the local warm pool runs with all three kinds injected; its final weights
must equal a fault-free run's, and every injected kill or failure must cost exactly one retry.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.campaign.run import run_campaign
from flows.step.faults import FaultInjector
from flows.invokers.base import ActionError
from flows.invokers.local_pool import LocalPoolInvoker

try:
    from conftest import LEARNING, assert_learned
except ImportError:  # tests/ imported as a package
    from tests.conftest import LEARNING, assert_learned

# seed 8 picks a kill of gen-0 and a failure of score-gen-0, with latency on both, and a failure
# of score-gen-1 should the planner choose two generation actions (it picks one or two here).
FAULTS = ["faults.seed=8", "faults.fail_fraction=0.25", "faults.kill_fraction=0.4", "faults.kill_after_s=0.2",
          "faults.latency_fraction=0.5", "faults.latency_s=0.3", "faults.actions=[generate,score]"]


@dataclass
class Call:
    action: str
    key: str
    """The activation's output key (prefix): one per (step, action, shard), the same on a retry."""
    fault: str | None
    latency_s: float
    error: ActionError | None = None
    busy_s: float = 0.0


def _record_invocations(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Call], list[int]]:
    """Spy on the pool: every invocation with its injected fault and outcome, and the exit
    status of every worker the pool had to replace."""
    calls: list[Call] = []
    exits: list[int] = []
    invoke, replace = LocalPoolInvoker.invoke, LocalPoolInvoker._replace

    def spy_invoke(self, action, payload, **kw):
        fault = "kill" if "__inject_kill_after_s" in payload else "fail" if payload.get("__inject_failure") else None
        # an output-less activation (the campaign's noop probes) is named by its probe index
        key = str(payload.get("output_key") or payload.get("output_prefix") or f"{action}/probe-{payload.get('probe')}")
        call = Call(action, key, fault, float(payload.get("__inject_latency_s") or 0.0))
        calls.append(call)
        try:
            activation = invoke(self, action, payload, **kw)
        except ActionError as exc:
            call.error = exc
            raise
        call.busy_s = activation.busy_s
        return activation

    def spy_replace(self, worker):
        exits.append(worker.proc.wait(timeout=30))  # the worker must already be dead, not killed here
        return replace(self, worker)

    monkeypatch.setattr(LocalPoolInvoker, "invoke", spy_invoke)
    monkeypatch.setattr(LocalPoolInvoker, "_replace", spy_replace)
    return calls, exits


def _record_injections(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    hits: dict[str, list] = {"fail": [], "kill": []}
    for kind, name in (("fail", "should_inject"), ("kill", "should_kill")):
        original = getattr(FaultInjector, name)

        def spy(self, action, shard, original=original, kind=kind):
            hit = original(self, action, shard)
            if hit:
                hits[kind].append((action, shard))
            return hit

        monkeypatch.setattr(FaultInjector, name, spy)
    return hits


def test_kills_failures_and_latency_on_the_pool_change_nothing_but_time(
        tiny_config, prefect_harness, clean_summary, monkeypatch):
    calls, exits = _record_invocations(monkeypatch)
    hits = _record_injections(monkeypatch)
    cfg = tiny_config("invoker.kind=local", "invoker.num_workers=2", "run_id=faulty", *FAULTS, *LEARNING)

    faulty = run_campaign(cfg, progress=lambda m: None)

    assert faulty["steps_completed"] == 2
    assert_learned(clean_summary)
    assert faulty["weights_sha256"] == clean_summary["weights_sha256"]
    assert hits["kill"] and hits["fail"], hits
    # Every injected kill or failure failed its activation, transiently, and nothing else failed.
    failed = [c for c in calls if c.error is not None]
    assert {id(c) for c in failed} == {id(c) for c in calls if c.fault}
    assert len(failed) == len(hits["kill"]) + len(hits["fail"])
    assert all(c.error.transient for c in failed)
    assert all("lost mid-activation" in c.error.message for c in failed if c.fault == "kill")
    assert all("faults.fail_fraction" in c.error.message for c in failed if c.fault == "fail")
    # ... and cost exactly one retry: two attempts of that activation, the second one good.
    for c in failed:
        attempts = [x for x in calls if (x.action, x.key) == (c.action, c.key)]
        assert len(attempts) == 2 and attempts[1].error is None, attempts
    assert len(calls) - len({(c.action, c.key) for c in calls}) == len(failed)
    # A killed worker really died of SIGKILL, and the pool replaced it.
    assert exits == [-signal.SIGKILL] * len(hits["kill"])
    delayed = [c for c in calls if c.latency_s and c.error is None]
    assert delayed and all(c.busy_s >= c.latency_s for c in delayed)
    # The failed attempts are billed (a platform charges for them), each killed one for the
    # kill_after_s it ran, and none of it is useful time.
    steps = faulty["steps"]
    spent = [a.billed_s for c in failed for a in c.error.failed_attempts]
    assert len(spent) == len(failed) == sum(s["cost/failed_attempts"] for s in steps)
    failed_billed = [s["cost/failed_billed_gpu_seconds"] for s in steps]
    assert sum(failed_billed) == pytest.approx(sum(spent) * cfg.scaling.gpus_per_actor)
    assert all(a.billed_s >= 0.2 for c in failed if c.fault == "kill" for a in c.error.failed_attempts)
    assert all(s["cost/billed_gpu_seconds"] - f >= s["cost/gpu_seconds"] for s, f in zip(steps, failed_billed))


def test_fault_draws_are_deterministic_exclusive_and_first_attempt_only(tiny_config):
    cfg = tiny_config("faults.fail_fraction=0.5", "faults.kill_fraction=0.5", "faults.latency_fraction=0.5",
                      "faults.latency_s=0.1")
    shards = [("generate", f"gen-{i}") for i in range(40)] + [("score", f"score-gen-{i}") for i in range(40)]

    def draws():
        faults = FaultInjector(cfg.faults)
        return [faults.control(a, s).to_payload() for a, s in shards], faults

    first, faults = draws()
    assert first == draws()[0]  # same seed, same faults
    assert not any("__inject_failure" in p and "__inject_kill_after_s" in p for p in first)
    assert sum("__inject_failure" in p for p in first) > 10 and sum("__inject_kill_after_s" in p for p in first) > 5
    again = [faults.control(a, s).to_payload() for a, s in shards]  # the retries: latency stays, no new failure or kill
    assert [p.get("__inject_latency_s") for p in again] == [p.get("__inject_latency_s") for p in first]
    assert not any("__inject_failure" in p or "__inject_kill_after_s" in p for p in again)
    assert faults.control("train_step", "train").to_payload() == {}  # not in faults.actions


# Every action is a target. Shard names repeat across steps and a shard is faulted at most once
# per campaign, so these fractions make about a fifth of all first attempts fail or die. The
# prefill action runs although it saves nothing here (its samples equal the clean run's, which
# runs none), so that it is a target too.
STORM = ["faults.seed=32", "faults.fail_fraction=0.15", "faults.kill_fraction=0.2", "faults.kill_after_s=0.1",
         "faults.actions=[prefill,generate,score,train_step,warmup,evaluate]", "generation.prefill_action=always"]


def test_a_fault_storm_ends_with_the_clean_weights(tiny_config, prefect_harness, clean_summary, monkeypatch):
    """About 20% of activations fail or lose their worker (every kind of action); the campaign
    retries each once and ends with exactly the weights of a clean run."""
    calls, exits = _record_invocations(monkeypatch)
    cfg = tiny_config("invoker.kind=local", "invoker.num_workers=2", "run_id=storm", "eval_every=1", *STORM,
                      *LEARNING)

    storm = run_campaign(cfg, progress=lambda m: None)

    assert_learned(clean_summary)
    assert storm["steps_completed"] == 2 and storm["weights_sha256"] == clean_summary["weights_sha256"]
    first_attempts = {(c.action, c.key): c for c in reversed(calls)}  # the earliest call per activation
    faulted = [c for c in first_attempts.values() if c.fault]
    assert 0.18 <= len(faulted) / len(first_attempts) <= 0.4, (len(faulted), len(first_attempts))
    assert {c.fault for c in faulted} == {"fail", "kill"}
    assert len({c.action for c in faulted}) >= 3, faulted  # not only generation
    assert all(c.error is not None and c.error.transient for c in faulted)
    assert exits == [-signal.SIGKILL] * sum(c.fault == "kill" for c in faulted)
    assert len(calls) == len(first_attempts) + len(faulted)  # one retry each, nothing else failed


BUGGY_SCORE = '''
"""Test-only start-up hook for pool workers: a bug in the score action (a helper called with
the wrong number of arguments), to see how a permanent error is reported."""
import actions.score
actions.score._load_samples = lambda: []
'''


def test_a_bug_in_an_action_fails_the_step_on_the_first_attempt(tiny_config, prefect_harness, tmp_path,
                                                                 monkeypatch):
    """A TypeError is not retried: one activation, and one line naming the type, the message and
    the worker log, which holds the traceback."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BUGGY_SCORE)
    monkeypatch.setenv("PYTHONPATH", f"{hook}{os.pathsep}{os.getcwd()}")  # the workers inherit it
    calls, _ = _record_invocations(monkeypatch)
    cfg = tiny_config("invoker.kind=local", "invoker.num_workers=2", "run_id=buggy")

    with pytest.raises(ActionError) as info:
        run_campaign(cfg, progress=lambda m: None)

    line = str(info.value)
    assert "\n" not in line and line.startswith("action score failed: TypeError: ")
    assert "<lambda>() takes 0 positional arguments but 1 was given" in line
    assert not info.value.transient
    log = Path(line.rsplit("worker log ", 1)[1])
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text()
    assert "_load_samples" in log.read_text()
    scores = [c.key for c in calls if c.action == "score"]
    assert scores and len(set(scores)) == len(scores)  # each failed at once, none retried
