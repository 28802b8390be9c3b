"""Campaign-level tests: determinism, fan-out invariance, resume refusal, smoke flow."""

from __future__ import annotations

import pytest

from actions.store import get_json, open_store
from flows.campaign.run import CampaignRefused, run_campaign
from flows.campaign.state import load_state_at

try:
    from conftest import LEARNING, assert_learned
except ImportError:  # tests/ imported as a package
    from tests.conftest import LEARNING, assert_learned


def _rollout_tokens(cfg, step: int) -> dict:
    store = open_store(cfg.store.uri)
    prefix = f"runs/{cfg.resolved_run_id()}/steps/{step:06d}/rollouts/"
    out = {}
    for key in store.list(prefix):
        if key.endswith(".json"):
            for s in get_json(store, key)["samples"]:
                out[(s["prompt_id"], s["sample_index"])] = s["tokens"]
    return out


def test_same_seed_gives_same_weights_with_speculation_on_and_off(tiny_config, prefect_harness):
    # 4 prompts: every step is a new epoch, so step 1 drafts from step 0's responses (history).
    small = ("data.num_train_prompts=4", *LEARNING)
    # history drafts only: a round is counted under its main strategy, and with prompt lookup
    # beside it which one leads depends on the measured forward times (machine load)
    a = run_campaign(tiny_config("invoker.kind=inprocess", "run_id=a", "generation.draft_strategies=[history]",
                                 *small), progress=lambda m: None)
    b = run_campaign(tiny_config("invoker.kind=inprocess", "run_id=b", "generation.speculation=off", *small),
                     progress=lambda m: None)
    assert_learned(a)
    assert a["weights_sha256"] and a["weights_sha256"] == b["weights_sha256"]
    assert a["steps_completed"] == 2 and a["policy_version"] == 2
    spec = a["steps"][1]
    # drafts from step 0 were checked (a barely warmed-up model rarely repeats itself, so few
    # are kept; tests/test_speculative.py covers acceptance token by token)
    assert spec["spec/strategy/history"] > 0 and spec["spec/draft_len"] > 0, spec
    assert not any(k.startswith("spec/") for k in b["steps"][1])
    store = open_store(tiny_config().store.uri)  # bounded: only the drafts the index points to
    assert store.list("runs/a/drafts/") == ["runs/a/drafts/000001.json"]


def test_fanout_one_and_three_produce_the_same_training_data(tiny_config, prefect_harness):
    # hidden 96 (the default width): narrower models hide the float effects of batch shapes
    wide = ("model.hidden_size=96", "model.num_heads=4", "model.intermediate_size=256")
    one = tiny_config("invoker.kind=inprocess", "run_id=one", "scaling.policy=fixed:1", "steps=1",
                      "generation.cut_threshold=null", *wide, *LEARNING)
    three = tiny_config("invoker.kind=inprocess", "run_id=three", "scaling.policy=fixed:3", "steps=1", *wide,
                        *LEARNING)
    s1, s3 = run_campaign(one, progress=lambda m: None), run_campaign(three, progress=lambda m: None)
    assert s1["steps"][0]["actors/n"] == 1 and s3["steps"][0]["actors/n"] == 3
    assert s3["steps"][0]["actors/cut"] > 0  # the three-way run also cuts and continues
    t1, t3 = _rollout_tokens(one, 0), _rollout_tokens(three, 0)
    assert t1.keys() == t3.keys() and len(t1) == 16
    assert all(t1[k] == t3[k] for k in t1)
    # Scoring pads every row to widths of its own, so a sample's log-probs do not depend on
    # which shard it was scored in: the weights are equal bit for bit, not only the tokens.
    assert_learned(s1)
    assert s1["weights_sha256"] == s3["weights_sha256"]


def test_scores_can_wait_for_the_end_of_generation(tiny_config, prefect_harness, monkeypatch):
    import flows.campaign.advance as campaign

    records, chains, metrics = [], [], campaign.step_metrics

    def keep(out, *args, **kwargs):  # the step's activation records reach only the metrics
        records.append(out.records)
        chains.append(out.continued_from)
        return metrics(out, *args, **kwargs)

    monkeypatch.setattr(campaign, "step_metrics", keep)
    wide = ("model.hidden_size=96", "model.num_heads=4", "model.intermediate_size=256")  # it cuts
    common = ("invoker.kind=inprocess", "scaling.policy=fixed:3", "steps=1", *wide, *LEARNING)
    overlap = run_campaign(tiny_config(*common, "run_id=overlap", "generation.score_while_generating=true"),
                           progress=lambda m: None)
    after = run_campaign(tiny_config(*common, "run_id=after"), progress=lambda m: None)  # in-process: off
    gens = [r for r in records[1] if r.action == "generate"]
    scores = [r for r in records[1] if r.action == "score"]
    assert len(gens) >= 3 and scores
    assert min(s.submitted_at for s in scores) >= max(g.ended_at for g in gens)
    # after generation, rollouts (continuations included) share one score activation where
    # the actions share the processors (flows/planning/score_batches.py); overlapping, one each
    assert len(scores) == 1 and len(gens) > 3  # a continuation ran: four rollouts, one score
    # timing_s/work follows it from the actions whose cut samples it finished (their shards)
    shards = {r.shard for r in gens}
    assert chains[1] and all(c in shards and set(src) <= shards - set(chains[1]) for c, src in chains[1].items())
    assert len([r for r in records[0] if r.action == "score"]) == len(
        [r for r in records[0] if r.action == "generate"])
    # only the order and the packing changed: the same weights
    assert_learned(after)
    assert overlap["weights_sha256"] == after["weights_sha256"]


def test_scores_overlap_generation_by_default_only_where_actions_own_accelerators():
    from flows.config import load_config

    def overlap(*overrides):
        return load_config(None, list(overrides)).overlap_scoring()

    assert overlap("invoker.kind=openwhisk") and not overlap() and not overlap("invoker.kind=inprocess")
    assert overlap("generation.score_while_generating=true")
    assert not overlap("invoker.kind=openwhisk", "generation.score_while_generating=false")


def test_one_score_activation_where_actions_share_the_processors():
    """Splitting the scores only loads the policy and reference again where the actions share
    the machine's cores; with an accelerator per activation the fan-out's parallelism pays."""
    from flows.config import load_config

    assert load_config(None, []).score_bins(4) == 1
    assert load_config(None, ["invoker.kind=inprocess"]).score_bins(3) == 1
    assert load_config(None, ["invoker.kind=openwhisk"]).score_bins(3) == 3


def test_existing_run_needs_resume_and_same_config(tiny_config, prefect_harness):
    cfg = tiny_config("invoker.kind=inprocess", "run_id=r", "steps=1")
    run_campaign(cfg, progress=lambda m: None)
    with pytest.raises(CampaignRefused, match=r"--resume \(or the parameter resume=true of a deployment run\)"):
        run_campaign(cfg, progress=lambda m: None)
    said: list[str] = []  # a deployment's scheduled run after the last step says it trains nothing
    run_campaign(cfg, resume=True, progress=said.append)
    assert "run 'r' is complete: 1/1 steps committed; nothing to train (raise steps above 1 to train further)" in said
    with pytest.raises(CampaignRefused, match="different configuration"):
        run_campaign(tiny_config("invoker.kind=inprocess", "run_id=r", "algorithm.lr=0.1"), resume=True,
                     progress=lambda m: None)
    more = run_campaign(tiny_config("invoker.kind=inprocess", "run_id=r", "steps=2"), resume=True,
                        progress=lambda m: None)
    assert more["steps_completed"] == 2


def test_smoke_whole_flow_on_local_warm_pool(tiny_config, prefect_harness, monkeypatch):
    from actions.contracts import DecodeSettings
    from flows.campaign.run import rlhf_campaign
    from flows.invokers.local_pool import LocalPoolInvoker

    warmed: list[tuple[str, int]] = []  # (action, policy version) of every pre-warm with a model
    settings = []  # the decode settings each pre-warm builds its engine with
    real_prewarm = LocalPoolInvoker.prewarm

    loads: dict[int, int] = {}  # policy version -> workers that loaded it through any pre-warm

    def spy(self, action, count, *, model=None, **kw):
        loaded = real_prewarm(self, action, count, model=model, **kw)
        if model is not None:
            warmed.append((action, model["policy_version"]))
            settings.append(kw["decode"])
            loads[model["policy_version"]] = loads.get(model["policy_version"], 0) + loaded
        return loaded

    monkeypatch.setattr(LocalPoolInvoker, "prewarm", spy)
    # a prefill action that takes a second: the generation calls come late enough for a pre-warm
    cfg = tiny_config("invoker.kind=local", "run_id=smoke", "invoker.num_workers=2", "generation.prefill_action=always",
                      "faults.latency_fraction=1", "faults.latency_s=1.0", "faults.actions=[prefill]")
    summary = rlhf_campaign(config=cfg.model_dump(mode="json"))
    # The version each step trains is loaded for the next step's generation as soon as it is
    # published, none after the last step. The step-start pre-warm finds it loaded or loading
    # and loads it only where it is not: the two pre-warms together load it into each of the
    # 2 workers at most once (which of them loads a worker depends on timing and on how many
    # actors the next plan has).
    assert ("generate", 1) in warmed and ("generate", 2) not in warmed
    assert settings and all(s == DecodeSettings.of(cfg.generation) for s in settings)
    assert summary["steps"][-1]["prewarm/started"] <= loads[1] <= 2, loads
    assert loads[1] >= 1, loads
    assert summary["steps_completed"] == 2
    assert summary["billed_gpu_seconds"] > 0 and summary["useful_gpu_seconds"] > 0
    step = summary["steps"][-1]
    for name in ("timing_s/generate", "reward/mean", "cost/idle_fraction", "actors/n", "prefill/tokens_saved",
                 "response_length/mean", "loss/policy", "kl", "plan/activation_s", "plan/prefill_fixed_s",
                 "plan/decode_scale"):
        assert name in step, name
    assert 0.0 <= summary["eval_accuracy_last"] <= 1.0
    # each reward function's own scores, under TRL's names: one function of weight 1 is the reward
    per_function = {k: v for k, v in step.items() if k.startswith("rewards/")}
    [mean] = [k for k in per_function if k.endswith("/mean")]
    assert per_function[mean] == pytest.approx(step["reward/mean"], abs=1e-6) and len(per_function) == 2
    # overhead from the outside: each step's period is its work plus the control plane's time
    for s in summary["steps"]:
        assert s["timing_s/period"] >= s["timing_s/overhead"] >= 0.0 and s["timing_s/work"] > 0.0
    # pre-warming from call history: none without history, then before the generation phase
    first, last = summary["steps"]
    assert first["prewarm/offset_s"] == -1.0 and first["prewarm/fired_s"] == -1.0
    assert first["timing_s/prefill"] >= 1.0
    assert 0.0 <= last["prewarm/offset_s"] <= last["prewarm/fired_s"] and last["prewarm/duration_s"] >= 0.0


def test_ppo_step_trains_critic(tiny_config, prefect_harness, monkeypatch):
    """PPO trains its critic; the second step trains the critic and optimizer state the first
    kept warm (``actions/train_step.py``), reading nothing back, and reading them from the store
    instead gives the same policy and critic bit for bit."""
    from actions.models import warm

    # one sample per prompt, natural for PPO: every group has one reward, which is no warning here
    ppo = ("invoker.kind=inprocess", "algorithm.name=ppo", "algorithm.group_size=1", "steps=2",
           "store.keep_last=null")
    cfg = tiny_config(*ppo, "run_id=ppo")
    lines: list[str] = []
    summary = run_campaign(cfg, progress=lines.append)
    step = summary["steps"][0]
    assert "loss/value" in step and step["loss/value"] >= 0.0
    assert step["frac_reward_zero_std"] == 1.0
    assert "zero_reward_std" not in {w["kind"] for w in summary["warnings"]}
    assert not [line for line in lines if "zero_reward_std" in line], lines
    assert [s["train/reused_critic_state"] for s in summary["steps"]] == [0.0, 1.0]
    assert summary["steps"][0]["train/state_read_bytes"] > 0 == summary["steps"][1]["train/state_read_bytes"]
    monkeypatch.setattr(warm, "take", lambda key: None)
    cold_cfg = tiny_config(*ppo, "run_id=ppo_cold")
    cold = run_campaign(cold_cfg, progress=lambda m: None)
    assert [s["train/reused_critic_state"] for s in cold["steps"]] == [0.0, 0.0]
    assert cold["steps"][1]["train/state_read_bytes"] > 0
    assert cold["weights_sha256"] == summary["weights_sha256"]
    store = open_store(cfg.store.uri)

    def critic_files(c):
        return get_json(store, load_state_at(store, c.resolved_run_id(), 2).critic_key)["files"]

    assert {k: e["sha256"] for k, e in critic_files(cold_cfg).items()} == \
        {k: e["sha256"] for k, e in critic_files(cfg).items()}


def test_failed_activations_are_retried_and_change_nothing(tiny_config, prefect_harness, clean_summary):
    cfg = tiny_config("invoker.kind=inprocess", "run_id=faulty", "faults.fail_fraction=0.2",
                      "faults.actions=[generate,score]", *LEARNING)
    from flows.step.faults import FaultInjector

    injected: list = []
    original = FaultInjector.should_inject

    def spy(self, action, shard):
        hit = original(self, action, shard)
        if hit:
            injected.append((action, shard))
        return hit

    FaultInjector.should_inject = spy
    try:
        faulty = run_campaign(cfg, progress=lambda m: None)
    finally:
        FaultInjector.should_inject = original
    assert injected, "the fault injector should have failed some activations"
    assert_learned(clean_summary)
    assert faulty["weights_sha256"] == clean_summary["weights_sha256"]


def test_a_budget_stop_evaluates_and_commits_the_policy_it_stops_with_and_resume_completes(
        clean_summary, tiny_config, prefect_harness, tmp_path):
    """A run stopped by its budget evaluates the policy it stops with and commits why it
    stopped, in its last step's one commit record (``status`` shows both); a resume with a
    larger budget clears the reason and ends with the weights of a run that never stopped."""
    import contextlib
    import io
    import json

    import yaml

    from flows.campaign.budget import budget_stop, resume_setup_estimate, resume_stop
    from flows.campaign.state import load_state
    from flows.commands.cli import main

    cfg = tiny_config("invoker.kind=inprocess", "run_id=budget", "budget.gpu_seconds=0.001", *LEARNING)  # steps=2
    lines: list[str] = []
    first = run_campaign(cfg, progress=lines.append)
    reason = first["stopped_reason"]
    assert first["steps_completed"] == 1 and "budget.gpu_seconds" in reason
    assert [(e["step"], e["policy_version"]) for e in first["evals"]] == [(0, 0), (1, 1)]
    assert first["eval_accuracy_last"] == first["evals"][1]["accuracy"]  # the trained version's, not v0's
    assert any(line.startswith(f"stopped after step 1/2: {reason}; raise the budget") for line in lines)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", "budget", "--store", cfg.store.uri]) == 0
    status = json.loads(out.getvalue())
    assert status["stopped_reason"] == reason and status["policy_version"] == 1
    assert status["last_eval"]["step"] == 1 and status["last_eval"]["policy_version"] == 1
    store = open_store(cfg.store.uri)
    commits = sorted(store.list("runs/budget/campaign/commits/"))
    again = run_campaign(cfg, resume=True, progress=lambda m: None)  # the same budget: no step, no commit
    # the same spend: a resume that runs no step invokes no action (no profile); it is judged
    # with its own set-up still to pay
    assert again["steps_completed"] == 1 and again["stopped_reason"].startswith(
        "budget.gpu_seconds=0.001 would be exceeded by the resume's set-up, the next step and the evaluation after it")
    spend = ("billed_gpu_seconds", "useful_gpu_seconds", "usd", "billed_gpu_seconds_by_part")
    assert {k: again[k] for k in spend} == {k: first[k] for k in spend} and again["profile"] is None
    assert sorted(store.list("runs/budget/campaign/commits/")) == commits
    # a budget with room for the next step and its evaluation, not for the set-up before them:
    # stopped before paying the set-up (which no commit would record), at the CLI in one line
    state = load_state(store, "budget")
    setup = resume_setup_estimate(state)
    assert 0 < setup < state.spend["setup_billed_gpu_seconds"]  # the probes and a cached profile read only
    tight = (state.spend["billed_gpu_seconds"] + state.steps[-1]["cost/billed_gpu_seconds"]
             + state.evals[-1].billed_gpu_seconds + setup / 2)
    short = tiny_config("invoker.kind=inprocess", "run_id=budget", f"budget.gpu_seconds={tight!r}", *LEARNING)
    assert budget_stop(short, state) is None and "the resume's set-up" in resume_stop(short, state)
    assert run_campaign(short, resume=True, progress=lambda m: None)["profile"] is None
    assert sorted(store.list("runs/budget/campaign/commits/")) == commits
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(short.model_dump(mode="json")))
    held = json.dumps(again, indent=1)  # the run's summary of its last commit: kept byte for byte
    (tmp_path / "summary.json").write_text(held)
    with contextlib.redirect_stdout(out := io.StringIO()):
        assert main(["train", "--config", str(tmp_path / "c.yaml"), "--resume", "--summary",
                     str(tmp_path / "summary.json")]) == 0
    assert out.getvalue().startswith("run 'budget' stops before its next step: 1/2 steps committed, budget.gpu_sec")
    # and the command that continues it once the budget is raised, this one's settings kept, with
    # the least budget that the resume's own check lets run a step
    spent = state.spend["billed_gpu_seconds"]
    hint = out.getvalue().splitlines()[1]
    assert hint.startswith(
        f"to continue: rlhfless train --config {tmp_path / 'c.yaml'} --set budget.gpu_seconds=N --summary "
        f"{tmp_path / 'summary.json'} --run-id budget --resume  (N: budget.gpu_seconds of at least "), hint
    least = float(hint.split("of at least ")[1].split(",")[0])
    assert f", the {spent:.6g} spent so far plus about " in hint and hint.endswith(
        " for the resume's set-up, the next step and the evaluation after it)"), hint
    enough = tiny_config("invoker.kind=inprocess", "run_id=budget", f"budget.gpu_seconds={least!r}", *LEARNING)
    assert resume_stop(short, state) is not None and resume_stop(enough, state) is None
    assert (tmp_path / "summary.json").read_text() == held
    assert sorted(store.list("runs/budget/campaign/commits/")) == commits
    rest = run_campaign(tiny_config("invoker.kind=inprocess", "run_id=budget", *LEARNING), resume=True,
                        progress=lambda m: None)
    assert rest["steps_completed"] == 2 and rest["stopped_reason"] is None
    # a resume that runs a step profiles again, and bills it as set-up, and keeps what that cost
    # where the next resume from that commit finds it (commit 1: the resume started there)
    from flows.campaign.resume_setup import observed_setup_s

    assert rest["profile"] is not None and observed_setup_s(store, "budget", 1) > 0
    assert rest["billed_gpu_seconds_by_part"]["setup"] > first["billed_gpu_seconds_by_part"]["setup"]
    assert load_state(store, "budget").stopped_reason is None
    assert [e["step"] for e in rest["evals"]] == [0, 1, 2]
    assert_learned(clean_summary)
    assert rest["weights_sha256"] == clean_summary["weights_sha256"]


def test_flow_run_publishes_step_artifacts(tiny_config, prefect_harness):
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.campaign.run import rlhf_campaign

    cfg = tiny_config("invoker.kind=inprocess", "run_id=art_1", "steps=1")
    rlhf_campaign(config=cfg.model_dump(mode="json"))

    async def keys():
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["art-1-metrics", "art-1-plan", "art-1-report"])))
            return {a.key for a in found}

    assert asyncio.run(keys()) == {"art-1-metrics", "art-1-plan", "art-1-report"}


def test_training_resumes_from_the_state_it_kept_with_the_same_weights(clean_summary, tiny_config, prefect_harness,
                                                                      monkeypatch):
    """In one process every step after the first trains the model and optimizer state the
    previous step kept (``actions/train_step.py``); reading both back from the store instead
    gives the same weights bit for bit."""
    from actions.models import warm

    assert [s["train/reused_state"] for s in clean_summary["steps"]] == [0.0, 1.0]
    assert clean_summary["steps"][1]["train/state_read_bytes"] == 0.0  # nothing read back from the store
    monkeypatch.setattr(warm, "take", lambda key: None)
    cfg = tiny_config("invoker.kind=inprocess", "run_id=clean", *LEARNING, "store.keep_last=null")
    cold = run_campaign(cfg, progress=lambda m: None)
    assert [s["train/reused_state"] for s in cold["steps"]] == [0.0, 0.0]
    store = open_store(cfg.store.uri)
    for step, keys in enumerate([["policy_key"], ["policy_key", "optimizer_key"]]):  # what step n+1 read: commit n's
        at = load_state_at(store, cfg.resolved_run_id(), step)
        stored = sum(e["size"] for k in keys for e in get_json(store, getattr(at, k))["files"].values())
        assert cold["steps"][step]["train/state_read_bytes"] == stored > 0, step
    assert_learned(clean_summary)
    assert cold["weights_sha256"] == clean_summary["weights_sha256"]


def test_a_warm_critic_whose_keys_hold_other_tensors_now_is_read_from_the_store(tiny_config, prefect_harness,
                                                                                   monkeypatch):
    """The warm critic is kept under its manifests' keys; where those were published again since
    (a step retried on another container), what the container kept is dropped and the store read."""
    from actions.models import warm

    put = warm.put

    def republished(key, value):  # as if the manifests now hold other blobs than those kept
        if key[0] == "trained_critic":
            value = (*value[:2], (("other", "0" * 64),))
        put(key, value)

    monkeypatch.setattr(warm, "put", republished)
    cfg = tiny_config("invoker.kind=inprocess", "algorithm.name=ppo", "algorithm.group_size=1", "steps=2",
                      "run_id=ppo_republished")
    summary = run_campaign(cfg, progress=lambda m: None)
    assert [s["train/reused_critic_state"] for s in summary["steps"]] == [0.0, 0.0]
    assert summary["steps"][1]["train/state_read_bytes"] > 0
