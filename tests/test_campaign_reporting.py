"""What a campaign reports about itself, read from its state: the JSON summary, report.md, the
Prefect report artifact, the spend and wall time across resumes, and ``rlhfless status``."""

from __future__ import annotations

import json
import math
import time
import types
import uuid

import prefect.artifacts
import prefect.context
import pytest

from flows.campaign.reporting import PROGRESS_PHASES, summarize
from flows.campaign.state import SPEND_KEYS, CampaignState, EvalRecord
from flows.commands.report import write_report

try:
    from conftest import bare_state
except ImportError:  # tests/ imported as a package
    from tests.conftest import bare_state

RUN = "rep"


def _state(**update) -> CampaignState:
    return bare_state(RUN, **update)


def _step(step: int, **values: float) -> dict:
    return {"step": float(step), "reward/mean": 0.5, "response_length/mean": 6.0, "response_length/max": 9.0,
            "actors/n": 1.0, "actors/migrated": 0.0, "cost/billed_gpu_seconds": 1.0, "cost/gpu_seconds": 0.5,
            "cost/usd": 0.001, **{f"timing_s/{p}": 0.25 for p in PROGRESS_PHASES}, "timing_s/step": 2.0, **values}


def _eval(step: int, **values: float) -> EvalRecord:
    return EvalRecord(**{"step": step, "policy_version": step, "accuracy": 0.5, "reward_mean": 0.25,
                         "mean_length": 4.0, "num_prompts": 4, **values})


def test_a_nan_metric_is_null_in_the_summary_which_is_strict_json(tmp_path):
    # a diverged update: grad_norm NaN (train/skipped_nonfinite), as the step's metrics carry it
    state = _state(step=2, steps=[_step(0, grad_norm=math.nan), _step(1, kl=math.inf, **{"reward/mean": math.nan})],
                   evals=[_eval(0), _eval(2)])
    summary = summarize(state, 3.0, profile={"activation_s": math.nan})
    text = json.dumps(summary, allow_nan=False)  # what the CLI writes: no NaN token
    back = json.loads(text)
    assert back["steps"][0]["grad_norm"] is None and back["steps"][1]["kl"] is None
    assert back["reward_mean_last"] is None and back["profile"] == {"activation_s": None}
    write_report({**back, "profile": None}, tmp_path)  # report.md reads the nulls as NaN
    report = (tmp_path / "report.md").read_text()
    assert "| 2 | nan | 6.0 |" in report and (tmp_path / "reward.png").exists()


def test_a_nan_committed_as_null_is_read_back_as_nan_for_a_resumes_outputs(monkeypatch):
    """A commit holds a diverged step's NaN as null (strict JSON); read back for a resume, it is
    NaN again: the metrics table artifact takes it (``float(None)`` raised after the resumed
    run's first commit), the divergence warning still names that step, status stays strict JSON."""
    from flows.campaign.artifacts import publish_step_artifacts
    from flows.campaign.learning_warnings import learning_warnings

    committed = _state(step=2, steps=[_step(0, grad_norm=math.nan, **{"loss/policy": math.nan}), _step(1)])
    back = CampaignState.model_validate_json(committed.model_dump_json())
    assert json.loads(committed.model_dump_json())["steps"][0]["grad_norm"] is None  # what the store holds
    assert math.isnan(back.steps[0]["grad_norm"]) and back.steps[1] == committed.steps[1]
    assert [w["step"] for w in learning_warnings(back.steps, 2) if w["kind"] == "nonfinite_update"] == [1]
    tables = []
    run = types.SimpleNamespace(flow_run=types.SimpleNamespace(id=uuid.uuid4()))
    monkeypatch.setattr(prefect.context.FlowRunContext, "get", classmethod(lambda cls: run))
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda **kw: tables.append(kw["table"]))
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda **kw: None)
    assert publish_step_artifacts(RUN, back.steps, [], "action-seconds")
    assert math.isnan(tables[0][0]["loss/policy"]) and tables[0][1]["loss/policy"] == ""  # not measured: blank


@pytest.mark.parametrize("kind, unit", [("local", "action-seconds"), ("openwhisk", "GPU-seconds")])
def test_the_report_artifact_names_the_unit_billed_time_has_on_the_invoker(tiny_config, monkeypatch, kind, unit):
    from flows.campaign.overhead import Background
    from flows.campaign.reporting import Reporter

    reports = []
    run = types.SimpleNamespace(flow_run=types.SimpleNamespace(id=uuid.uuid4()))  # what the artifacts read
    monkeypatch.setattr(prefect.context.FlowRunContext, "get", classmethod(lambda cls: run))
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda **kwargs: None)
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda key, markdown: reports.append(markdown))
    publisher = Background()
    reporter = Reporter(tiny_config(f"invoker.kind={kind}"), RUN, publisher, progress=lambda m: None)
    state = _state(step=1, steps=[_step(0)])
    reporter.committed(state, type("Record", (), {"metrics": state.steps[-1]})())
    publisher.wait()
    reporter.close()
    assert f"- billed 1.00 {unit} ($0.00100), step 2.00 s" in reports[0]


def test_an_accounted_block_collects_every_activation_and_failed_attempt(tiny_config):
    from flows.campaign.setup import ledger_cost
    from flows.invokers.base import Activation
    from flows.step.context import RunContext, set_context
    from flows.step.invoke import accounted, invoke_action

    killed = Activation("noop", "k", {}, 0.0, 0.0, 2.0, 0.0)  # retried by the invoker: billed 2 s

    class Invoker:
        sees_local_files = True

        def invoke(self, action, payload, *, timeout_s=None):
            return Activation(action, "a", {"ok": True}, 0.0, 0.0, 1.0, 0.75, failed_attempts=(killed,))

    ctx = RunContext(config=tiny_config("scaling.gpus_per_actor=2", "price_per_gpu_second=0.5"), store=None,
                     invoker=Invoker(), run_id=RUN)
    set_context(ctx)
    try:
        invoke_action.fn(action="noop", payload={}, shard="outside")  # no block: nothing kept
        with accounted() as ledger:
            invoke_action.fn(action="noop", payload={}, shard="probe-0")
            with accounted() as inner:  # an evaluation inside set-up keeps its own
                invoke_action.fn(action="noop", payload={}, shard="eval")
    finally:
        set_context(None)
    assert [(a.shard, a.billed_s) for a in ledger.records] == [("probe-0", 1.0)]
    assert [(a.shard, a.billed_s) for a in ledger.failed] == [("probe-0", 2.0)]
    assert [a.shard for a in inner.records] == ["eval"]
    cost = ledger_cost(ctx, ledger)  # (1 + 2) s billed, 0.75 s busy, times 2 GPUs; at $0.5
    assert (cost["cost/billed_gpu_seconds"], cost["cost/gpu_seconds"], cost["cost/usd"]) == (6.0, 1.5, 3.0)


def test_the_budget_keeps_room_for_the_evaluation_after_the_next_step(tiny_config):
    from flows.campaign.budget import budget_stop

    # spent 10 billed s; the last step cost 2, the last evaluation 1.5: the next step and the
    # evaluation that follows it (due, or made by a stop after it) bring about 3.5
    state = _state(step=2, steps=[_step(0), _step(1, **{"cost/billed_gpu_seconds": 2.0})], evals=[_eval(0)],
                   spend={"billed_gpu_seconds": 10.0, "useful_gpu_seconds": 5.0, "usd": 0.01})
    state.evals[0].billed_gpu_seconds = 1.5
    assert budget_stop(tiny_config("steps=4", "budget.gpu_seconds=13.5"), state) is None
    reason = budget_stop(tiny_config("steps=4", "budget.gpu_seconds=13"), state)
    assert reason == ("budget.gpu_seconds=13.0 would be exceeded by the next step and the evaluation after it "
                      "(spent 10.0, next about 3.5)")
    state.prepared.data["evaluation"] = "none"  # no eval set: only the step
    assert budget_stop(tiny_config("steps=4", "budget.gpu_seconds=12"), state) is None


def test_the_budget_also_keeps_room_for_the_evaluation_due_after_the_step_just_run(tiny_config):
    """The loop judges a step before it evaluates it: where ``eval_every`` asks for that
    evaluation, the estimate holds it too; a committed state (a resume's) owes none."""
    from flows.campaign.budget import budget_stop

    # as above (spent 10, a step 2, an evaluation 1.5), but step 2's evaluation is due and not made
    state = _state(step=2, steps=[_step(0), _step(1, **{"cost/billed_gpu_seconds": 2.0})], evals=[_eval(0)],
                   spend={"billed_gpu_seconds": 10.0, "useful_gpu_seconds": 5.0, "usd": 0.01})
    state.evals[0].billed_gpu_seconds = 1.5

    def judged(*overrides: str, before_evaluation: bool = True) -> str | None:
        return budget_stop(tiny_config("steps=4", *overrides), state, before_evaluation=before_evaluation)

    assert judged("eval_every=2", "budget.gpu_seconds=15") is None
    assert judged("eval_every=2", "budget.gpu_seconds=14.9") == (
        "budget.gpu_seconds=14.9 would be exceeded by this step's evaluation, the next step and the evaluation "
        "after it (spent 10.0, next about 5.0)")
    assert judged("eval_every=3", "budget.gpu_seconds=13.5") is None  # none due at step 2
    # committed (a resume, whose eval_every may have changed): no evaluation of step 2 is still to come
    assert judged("eval_every=2", "budget.gpu_seconds=13.5", before_evaluation=False) is None


@pytest.mark.parametrize("eval_every", [0, 1, 2, 3])
def test_a_run_whose_costs_are_as_estimated_never_spends_past_its_budget(tiny_config, eval_every):
    """``_loop``'s order (run a step, judge the budget, evaluate where due, commit) with every
    step and every evaluation costing what the last did: the spend stays within every budget,
    and the run stops only where one more step and its evaluations would not fit."""
    from flows.campaign.budget import budget_stop, evaluation_due

    step_s, eval_s = 10.0, 4.0
    for budget in range(14, 140, 3):
        cfg = tiny_config("steps=8", f"eval_every={eval_every}", f"budget.gpu_seconds={budget}")
        state = _state(evals=[_eval(0, billed_gpu_seconds=eval_s)], spend={"billed_gpu_seconds": eval_s})
        stop = None
        while not stop and state.step < cfg.steps:
            state.steps.append(_step(state.step, **{"cost/billed_gpu_seconds": step_s}))
            state.step += 1
            state.add_spend("steps", step_s, step_s, 0.0)
            stop = budget_stop(cfg, state, before_evaluation=True)
            if evaluation_due(cfg, state, stop):
                state.add_evaluation(_eval(state.step, billed_gpu_seconds=eval_s))
        spent = state.spend["billed_gpu_seconds"]
        assert spent <= budget or state.step == 1, (budget, state.step, spent)  # the first step always runs
        if stop:  # not early: the spend before this step's evaluation and the reserve it was judged with exceed it
            made = eval_s if eval_every and state.step % eval_every == 0 else 0.0  # this step's own, due anyway
            assert spent + made + step_s > budget, (budget, state.step, spent)


def test_a_state_committed_before_the_spend_was_broken_down_reads_its_steps_only():
    old = _state(step=3, spend={"billed_gpu_seconds": 6.0, "useful_gpu_seconds": 4.0, "usd": 0.5})
    assert old.spend == {"billed_gpu_seconds": 6.0, "useful_gpu_seconds": 4.0, "usd": 0.5,
                         "steps_billed_gpu_seconds": 6.0, "evaluations_billed_gpu_seconds": 0.0,
                         "setup_billed_gpu_seconds": 0.0, "wall_seconds": 0.0}
    assert old.spend_since_step == 3 and _state().spend_since_step == 0
    summary = summarize(old, 1.0)
    assert summary["billed_gpu_seconds_by_part"] == {"steps": 6.0, "evaluations": 0.0, "setup": 0.0}
    assert summary["spend_since_step"] == 3 and summary["wall_seconds_total"] == 0.0


def test_the_spend_counts_every_activation_the_campaign_invokes_by_part(tiny_config, prefect_harness, monkeypatch):
    from collections import defaultdict

    from actions.store import open_store
    from flows.campaign.run import run_campaign
    from flows.campaign.state import load_state
    from flows.invokers.inprocess import InProcessInvoker

    billed: dict[str, float] = defaultdict(float)
    invoke = InProcessInvoker.invoke

    def counting(self, action, payload, *, timeout_s=None):
        activation = invoke(self, action, payload, timeout_s=timeout_s)
        billed[action] += activation.billed_s
        return activation

    monkeypatch.setattr(InProcessInvoker, "invoke", counting)
    setup = ("prepare", "warmup", "profile", "noop")
    walls = []
    for steps, resume in ((1, False), (2, True)):  # a resume profiles again: set-up too
        cfg = tiny_config("invoker.kind=inprocess", "run_id=spend", "eval_every=1", f"steps={steps}")
        t0 = time.time()
        summary = run_campaign(cfg, resume=resume, progress=lambda m: None)
        walls.append((time.time() - t0, summary["wall_seconds"], summary["wall_seconds_total"]))
        parts = summary["billed_gpu_seconds_by_part"]
        assert set(billed) == {*setup, "evaluate", "generate", "score", "train_step"}
        assert summary["billed_gpu_seconds"] == pytest.approx(sum(billed.values()))
        assert parts["steps"] == pytest.approx(sum(s["cost/billed_gpu_seconds"] for s in summary["steps"]))
        assert parts["evaluations"] == pytest.approx(billed["evaluate"])
        assert parts["evaluations"] == pytest.approx(sum(e["billed_gpu_seconds"] for e in summary["evals"]))
        assert parts["setup"] == pytest.approx(sum(billed[a] for a in setup))
        assert summary["usd"] == pytest.approx(summary["billed_gpu_seconds"] * cfg.price_per_gpu_second)
    assert [e["step"] for e in summary["evals"]] == [0, 1, 2] and summary["spend_since_step"] == 0
    assert load_state(open_store(cfg.store.uri), "spend").steps_configured == 2  # for `status`
    # wall time: this session's, and every session's, which grows with the run
    (first, first_session, first_total), (second, second_session, second_total) = walls
    assert first_session <= first and first_total == pytest.approx(first_session, abs=0.05)
    assert second_session <= second and second_total == pytest.approx(first_total + second_session, abs=0.5)


def test_the_wall_time_of_a_resumed_run_adds_to_the_one_committed(tmp_path):
    from actions.store import LocalStore
    from flows.campaign.run import SessionWall
    from flows.campaign.state import commit_state, load_state

    store = LocalStore(tmp_path)
    state = _state(step=1, spend=dict.fromkeys(SPEND_KEYS, 0.0) | {"wall_seconds": 40.0})  # 40 s committed
    wall = SessionWall(time.time() - 5.0)  # this session started 5 s ago
    wall.stamp(state)
    commit_state(store, state)
    assert load_state(store, RUN).spend["wall_seconds"] == pytest.approx(45.0, abs=0.5)
    summary = summarize(state, wall.session_s(), wall.total_s(state))
    assert summary["wall_seconds"] == pytest.approx(5.0, abs=0.5)
    assert summary["wall_seconds_total"] == pytest.approx(45.0, abs=0.5)
    write_report({**summary, "profile": None}, tmp_path)
    assert "- wall time: 45 s in all, 5 s in this session;" in (tmp_path / "report.md").read_text()


def test_status_shows_the_run_state_its_configured_steps_and_who_holds_its_lease(tmp_path, capsys):
    from actions.store import LocalStore
    from flows.campaign.lease import RunLease
    from flows.campaign.state import commit_state
    from flows.commands.cli import main

    store = LocalStore(tmp_path)

    def status() -> dict:
        assert main(["status", RUN, "--store", str(tmp_path)]) == 0
        return json.loads(capsys.readouterr().out, parse_constant=pytest.fail)  # strict JSON: no NaN token

    commit_state(store, _state(step=1, steps_configured=3, steps=[_step(0, grad_norm=math.nan)]))
    shown = status()
    assert (shown["state"], shown["steps_committed"], shown["steps_configured"], shown["lease"]) == (
        "incomplete", 1, 3, None)
    assert shown["last_metrics"]["grad_norm"] is None  # a diverged step's NaN, as the summary shows it
    # a process of another host holds the lease
    lease = RunLease.acquire(store, RUN, ttl_s=60, renew=False, host="trainer", pid=4242, progress=lambda m: None)
    shown = status()
    assert shown["state"] == "running" and shown["lease"]["held"]
    assert (shown["lease"]["host"], shown["lease"]["pid"]) == ("trainer", 4242)
    assert 0 < shown["lease"]["expires_in_s"] <= 60 and shown["lease"]["stale"] is None
    assert lease.record.token not in json.dumps(shown)  # who and when, never the token
    lease.release()
    # a lease left by a process that died long ago: stale, and the run is not running
    RunLease.acquire(store, RUN, ttl_s=60, renew=False, host="trainer", pid=4242, clock=lambda: time.time() - 3600,
                     progress=lambda m: None)
    shown = status()
    assert shown["state"] == "incomplete" and not shown["lease"]["held"] and "expired" in shown["lease"]["stale"]


def test_status_of_a_run_being_set_up_under_its_lease_is_running(tmp_path, capsys):
    """``train`` holds the run's lease from before its first commit (preparing the model, the
    data, warm-up): ``status`` says ``running`` with no step committed and who holds it, rather
    than that the run does not exist; once the holder is gone, it does not exist again."""
    from actions.store import LocalStore
    from flows.campaign.lease import RunLease
    from flows.campaign.state import commit_state
    from flows.commands.cli import main

    store = LocalStore(tmp_path)
    lease = RunLease.acquire(store, RUN, ttl_s=60, renew=False, host="trainer", pid=4242, progress=lambda m: None)
    assert main(["status", RUN, "--store", str(tmp_path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["run_id"], shown["state"], shown["steps_committed"]) == (RUN, "running", 0)
    assert (shown["lease"]["host"], shown["lease"]["pid"], shown["lease"]["held"]) == ("trainer", 4242, True)
    assert lease.record.token not in json.dumps(shown)
    # null where only a commit records it
    assert all(shown[k] is None for k in ("steps_configured", "policy_version", "weights_sha256", "spend",
                                          "stopped_reason", "last_eval", "last_metrics"))
    lease.release()
    assert main(["status", RUN, "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"holds nothing of run '{RUN}'; check the run id and --store" in err
    # stopped or killed before its first commit: what it set up is left, and train sets it up again
    store.put(f"runs/{RUN}/base/config.json", b"{}")
    assert main(["status", RUN, "--store", str(tmp_path)]) == 0
    stopped = json.loads(capsys.readouterr().out)
    assert (stopped["state"], stopped["steps_committed"], stopped["lease"]) == ("incomplete", 0, None)
    # the store's only run, found without its id (its first train failed: no commit names it)
    assert main(["status", "--store", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == stopped
    commit_state(store, _state(step=1, steps_configured=3, steps=[_step(0)]))
    assert main(["status", RUN, "--store", str(tmp_path)]) == 0
    assert set(json.loads(capsys.readouterr().out)) == set(shown)  # the same keys as a committed run's


@pytest.mark.parametrize("update, word", [
    ({"step": 3, "steps_configured": 3}, "complete"),
    ({"step": 1, "steps_configured": 3, "stopped_reason": "budget.usd=1.0 would be exceeded"}, "stopped: budget"),
    ({"step": 1, "steps_configured": 3}, "incomplete"),
    ({"step": 1}, "not running"),  # committed before the configured steps were recorded
])
def test_the_state_word_of_a_run_nobody_trains(update, word):
    from flows.campaign.status import run_state

    assert run_state(_state(**update), None) == word
    assert run_state(_state(**update), {"held": True}) == "running"


def test_a_resume_may_change_the_price_not_what_the_run_computes(tiny_config):
    """``price_per_gpu_second`` (USD and the planner's cost), ``algorithm.micro_batch_size`` (the
    same update to round-off), speculation and the engine (the same tokens, to round-off) may change on a resume; a
    setting that changes the samples or weights is still refused."""
    from flows.campaign.state import CampaignRefused, check_resume

    made = tiny_config("price_per_gpu_second=0.0004")
    existing = _state(step=2).model_copy(update={"fingerprint": made.fingerprint(), "identity": made.identity()})
    assert check_resume(existing, tiny_config("price_per_gpu_second=0.002", "budget.usd=1"), True) == []
    # the fix an out-of-memory error advises, and speculation (it changes no token), may change too
    assert check_resume(existing, tiny_config("algorithm.micro_batch_size=2", "generation.speculation=off",
                                              "generation.max_draft_len=2"), True) == []
    assert check_resume(existing, tiny_config("generation.engine=vllm"), True) == []  # the same tokens, to round-off
    # the values, the run's and the one asked for, so the fix needs no record of the first config
    with pytest.raises(CampaignRefused, match=r"settings differ: algorithm.lr: run 0.0006, now 0.5\); set them back "
                                              r"\(e.g. --set KEY=VALUE with the run's value, or that key of a "
                                              r"deployment run's config parameter\)"):
        check_resume(existing, tiny_config("price_per_gpu_second=0.002", "algorithm.lr=0.5"), True)
    assert made.identity()["algorithm"]["micro_batch_size"] is None  # the recorded identity is untouched


def test_a_resume_counts_its_set_up_before_paying_it(tiny_config):
    """The set-up a resume repeats (profile, probes) is counted with the next step before it is
    paid (``resume_setup_s``; 0 in an older record, as before it was kept); USD is projected
    at the run's price now, which a resume may change."""
    from flows.campaign.budget import budget_stop, resume_setup_estimate, resume_stop

    state = _state(step=2, steps=[_step(0), _step(1, **{"cost/billed_gpu_seconds": 2.0})],
                   spend={"billed_gpu_seconds": 10.0, "useful_gpu_seconds": 5.0, "usd": 0.004})
    state.prepared.data["evaluation"] = "none"
    assert resume_setup_estimate(state) == 0.0
    state.resume_setup_s = 0.5
    cfg = tiny_config("steps=4", "budget.gpu_seconds=12.4")
    assert budget_stop(cfg, state) is None  # the next step alone fits
    assert resume_stop(cfg, state) == ("budget.gpu_seconds=12.4 would be exceeded by the resume's set-up, the next "
                                       "step (spent 10.0, next about 2.5)")
    assert resume_stop(tiny_config("steps=4", "budget.gpu_seconds=12.5"), state) is None
    # spent $0.004 at $0.0004/s; 2.5 s more at a price raised to $0.01/s is $0.025, not $0.001
    dearer = tiny_config("steps=4", "price_per_gpu_second=0.01", "budget.usd=0.02")
    assert resume_stop(dearer, state) == ("budget.usd=0.02 would be exceeded by the resume's set-up, the next step "
                                          "(spent 0.004000, next about 0.025000)")
    assert resume_stop(tiny_config("steps=4", "price_per_gpu_second=0.01", "budget.usd=0.03"), state) is None


def test_what_a_resume_paid_for_its_set_up_is_counted_by_the_next_resume_from_that_commit(tiny_config, tmp_path):
    """A resume that paid more for its set-up than the committed estimate (cold workers) and was
    then stopped by the budget commits nothing: what it paid, kept beside the commits, makes the
    next resume from the same commit stop before paying it again."""
    from actions.store import LocalStore
    from flows.campaign.budget import resume_setup_estimate, resume_stop
    from flows.campaign.resume_setup import observed_setup_s, record_setup, setup_key

    store = LocalStore(tmp_path / "store")
    state = _state(step=2, steps=[_step(0), _step(1, **{"cost/billed_gpu_seconds": 2.0})],
                   spend={"billed_gpu_seconds": 10.0, "useful_gpu_seconds": 5.0, "usd": 0.004})
    state.prepared.data["evaluation"] = "none"
    state.resume_setup_s = 0.1  # a new run's, measured on warm workers
    cfg = tiny_config("steps=4", "budget.gpu_seconds=12.5")
    assert observed_setup_s(store, state.run_id, 2) is None and resume_stop(cfg, state) is None
    record_setup(store, state.run_id, 2, 4.0)  # what the resume paid on cold ones
    observed = observed_setup_s(store, state.run_id, 2)
    assert observed == 4.0 and resume_setup_estimate(state, observed) == 4.0
    assert resume_stop(cfg, state, observed).startswith("budget.gpu_seconds=12.5 would be exceeded by the resume's")
    # another commit's record, or an unreadable one, leaves the committed estimate
    assert observed_setup_s(store, state.run_id, 3) is None
    store.put(setup_key(state.run_id), b"{not json")
    assert observed_setup_s(store, state.run_id, 2) is None
    assert resume_setup_estimate(state, None) == 0.1


def test_the_command_after_a_budget_stop_asks_for_a_budget_the_resume_accepts(tiny_config, capsys):
    """The least N printed for the budget that stopped a run is what the resume's own check
    (``resume_stop``) lets through: the spend plus the resume's set-up, the next step and the
    evaluation after it, rounded up; the spend alone, what the line asked for before, stops it
    again. A second budget the resume would stop at is named with its own least value."""
    import argparse

    from actions.store import open_store
    from flows.campaign.budget import resume_stop
    from flows.campaign.state import commit_state
    from flows.commands.resume_command import print_continue

    # spent 10 billed s ($0.01); the last step cost 2 s, the last evaluation 1.5 s, the resume's
    # set-up 0.25 s: 10 + 0.25 + 2 + 1.5 = 13.75 s for one more step ($0.01375 at $0.001 a second)
    state = _state(step=2, steps=[_step(0), _step(1, **{"cost/billed_gpu_seconds": 2.0})],
                   evals=[_eval(0, billed_gpu_seconds=1.5)], resume_setup_s=0.25,
                   spend={"billed_gpu_seconds": 10.0, "useful_gpu_seconds": 5.0, "usd": 0.01})

    def cfg(*budgets: str):
        return tiny_config("steps=4", f"run_id={RUN}", "price_per_gpu_second=0.001", *budgets)

    store = open_store(cfg().store.uri)
    commit_state(store, state.model_copy(update={"step": 1}, deep=True))  # commits are consecutive
    commit_state(store, state)
    args = argparse.Namespace(config=None, overrides=["budget.gpu_seconds=13"], steps=None, out=None, summary=None)
    stopped = cfg("budget.gpu_seconds=13")
    print_continue(args, stopped, resume_stop(stopped, state), state.spend)
    assert capsys.readouterr().out == (
        "to continue: rlhfless train --set budget.gpu_seconds=N --run-id rep --resume  (N: budget.gpu_seconds of at "
        "least 13.75, the 10 spent so far plus about 3.75 for the resume's set-up, the next step and the evaluation "
        "after it)\n")
    assert resume_stop(cfg("budget.gpu_seconds=13.75"), state) is None
    assert resume_stop(cfg("budget.gpu_seconds=10.01"), state) is not None  # just above the spend: no step
    both = cfg("budget.usd=0.012", "budget.gpu_seconds=13")
    print_continue(args, both, resume_stop(both, state), state.spend)
    assert capsys.readouterr().out.endswith(
        "(N: budget.usd of at least 0.01375, the 0.01 spent so far plus about 0.00375 for the resume's set-up, the "
        "next step and the evaluation after it; budget.gpu_seconds=13.0 would stop it too: raise it to at least "
        "13.75)\n")
    assert resume_stop(cfg("budget.usd=0.01375", "budget.gpu_seconds=13.75"), state) is None
