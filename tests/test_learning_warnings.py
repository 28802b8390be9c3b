"""A run that cannot learn says so (progress line, ``summary.json`` ``warnings``), and
``--resume`` of a finished run prints its status and writes nothing."""

from __future__ import annotations

import json

import flows.campaign.run  # noqa: F401  (Prefect sets its logging up here, not under a test's capsys)
from flows.campaign.learning_warnings import (
    TRUNCATED_SHARE,
    TRUNCATED_STEPS,
    ZERO_STD_STEPS,
    learning_warnings,
    new_warning_lines,
)


def _step(zero_std: float = 0.5, grad: float = 0.3, none: float = 0.0) -> dict:
    return {"frac_reward_zero_std": zero_std, "grad_norm": grad, "frac_reward_none": none}


def test_each_kind_fires_once_where_it_first_holds():
    assert ZERO_STD_STEPS == 3
    steps = [_step(), _step(1.0, 0.0), _step(1.0, 0.1), _step(1.0, 0.0, none=1.0), _step(1.0)]
    got = {w["kind"]: (w["step"], w["steps"]) for w in learning_warnings(steps, total=10)}
    # zero spread from step 2 on: 3 in a row first at step 4 (raised then, as held since step 2),
    # and still at step 5: four steps
    assert got == {"zero_grad_norm": (2, 2), "zero_reward_std": (2, 4), "no_reward": (4, 1)}
    assert [line.split(": ")[1:3] for line in new_warning_lines(steps[:4], 10)] == [
        ["step 4", "zero_reward_std"], ["step 4", "no_reward"]]
    # a run broken and formed again adds its whole length
    again = [*steps, _step(), _step(1.0), _step(1.0), _step(1.0)]
    assert {w["kind"]: (w["step"], w["steps"]) for w in learning_warnings(again, total=10)}["zero_reward_std"] == \
        (2, 7)
    assert new_warning_lines(steps[:3], 10) == []
    # a campaign shorter than the window warns when all of its steps had no spread
    assert [w["kind"] for w in learning_warnings([_step(1.0), _step(1.0)], total=2)] == ["zero_reward_std"]
    assert learning_warnings([_step(), _step()], total=2) == []


def test_zero_reward_spread_warns_for_grpo_only():
    """PPO learns from its critic's baseline and the KL reward, not from a group's spread: one
    reward per group (every step with group_size 1) is no warning there. The other kinds still are."""
    flat = [_step(1.0), _step(1.0, 0.0), _step(1.0)]
    assert [w["kind"] for w in learning_warnings(flat, total=3)] == ["zero_reward_std", "zero_grad_norm"]
    assert [w["kind"] for w in learning_warnings(flat, total=3, algorithm="grpo")] == ["zero_reward_std",
                                                                                      "zero_grad_norm"]
    assert [w["kind"] for w in learning_warnings(flat, total=3, algorithm="ppo")] == ["zero_grad_norm"]
    assert new_warning_lines(flat, 3, "ppo") == []


def test_completions_cut_at_the_length_limit_warn_after_three_steps_in_a_row():
    """Most completions stopping at generation.max_new_tokens (a limit too short for the task) is
    reported for any algorithm, once it held TRUNCATED_STEPS steps running (or all of a shorter run)."""
    assert (TRUNCATED_SHARE, TRUNCATED_STEPS) == (0.5, 3)

    def cut(share: float) -> dict:
        return {**_step(), "response_length/clip_ratio": share}

    steps = [cut(0.9), cut(0.5), cut(0.49), cut(0.6), cut(1.0), cut(0.7), cut(0.8)]
    for algorithm in ("grpo", "ppo"):
        [got] = learning_warnings(steps, total=10, algorithm=algorithm)
        assert (got["kind"], got["step"], got["steps"]) == ("truncated", 4, 4)  # steps 4-7, raised at 6
        assert "generation.max_new_tokens" in got["message"] and "50%" in got["message"]
    assert learning_warnings(steps[:5], total=10) == []  # the 0.49 step broke the run of cut steps
    assert [w["kind"] for w in learning_warnings([cut(0.5), cut(0.5)], total=2)] == ["truncated"]
    assert learning_warnings([cut(0.5), cut(0.4)], total=2) == []
    assert learning_warnings([_step()] * 4, total=4) == []  # a step without the metric is not cut
    [plain] = learning_warnings([cut(0.9)] * 3, total=3)
    [masked] = learning_warnings([cut(0.9)] * 3, total=3, mask_truncated=True)
    assert "set algorithm.mask_truncated: true" in plain["message"]  # the run lacks it: offered
    assert "set algorithm.mask_truncated" not in masked["message"] and "already" in masked["message"]


def test_a_zero_gradient_with_every_completion_masked_names_the_length_limit():
    """algorithm.mask_truncated with every completion cut leaves no token in the loss: the
    zero_grad_norm line names generation.max_new_tokens and the setting, not the rewards' spread."""
    masked = {**_step(0.0, 0.0), "response_length/clip_ratio": 1.0}
    [got] = [w for w in learning_warnings([masked], total=1, mask_truncated=True) if w["kind"] == "zero_grad_norm"]
    assert "generation.max_new_tokens" in got["message"] and "algorithm.mask_truncated" in got["message"]
    assert "spread" not in got["message"] and "algorithm.lr" not in got["message"]
    for plain in (learning_warnings([masked], total=1), learning_warnings(
            [{**masked, "response_length/clip_ratio": 0.5}], total=1, mask_truncated=True)):
        [got] = [w for w in plain if w["kind"] == "zero_grad_norm"]
        assert "rewards' spread" in got["message"] and "algorithm.mask_truncated" not in got["message"]


def test_uniform_groups_warn_whatever_the_std_scope():
    """With algorithm.std_scope batch, TRL's frac_reward_zero_std is 0.0 unless every reward is
    equal; groups each of one reward still have every advantage 0: the warning reads
    reward/frac_uniform_groups, and a step recorded without it frac_reward_zero_std."""
    batch_scope = [{**_step(0.0), "reward/frac_uniform_groups": 1.0}] * 3
    assert [w["kind"] for w in learning_warnings(batch_scope, total=3)] == ["zero_reward_std"]
    spread = [{**_step(1.0), "reward/frac_uniform_groups": 0.5}] * 3
    assert learning_warnings(spread, total=3) == []


def test_a_diverged_update_warns():
    """A non-finite loss or gradient norm (on OpenWhisk sent as "NaN"/"Infinity" and read back as
    floats by the typed result) is reported, not dropped with the tracker's non-finite values."""
    steps = [_step(), {**_step(), "grad_norm": float("inf")}, {**_step(), "loss/policy": float("nan")}, _step()]
    got = learning_warnings(steps, total=10)
    assert [(w["kind"], w["step"], w["steps"]) for w in got] == [("nonfinite_update", 2, 2)]
    assert got[0]["message"].startswith("warning: step 2: nonfinite_update: the update diverged")
    assert learning_warnings([_step(), {**_step(), "loss/value": 1e30}], total=2) == []


def test_a_diverged_critic_is_named_as_the_critic_not_as_the_policy():
    """PPO's critic alone skipped its steps (rewards of extreme size overflow its value loss):
    the line names its counter and the rewards' scale, not the policy's counter; where both
    diverged, both counters are named."""
    critic = {**_step(), "train/skipped_nonfinite": 0.0, "train/critic_skipped_nonfinite": 2.0,
              "loss/value": float("inf")}
    [got] = learning_warnings([_step(), critic], total=2, algorithm="ppo")
    assert (got["kind"], got["step"]) == ("nonfinite_update", 2)
    message = got["message"].removeprefix("warning: step 2: nonfinite_update: ")
    assert message.startswith("the critic's update diverged") and "train/critic_skipped_nonfinite" in message
    assert "rewards' scale" in message and "algorithm.critic_lr" in message
    assert "train/skipped_nonfinite" not in message
    both = {**critic, "train/skipped_nonfinite": 1.0, "grad_norm": float("nan")}
    [got] = learning_warnings([both], total=1, algorithm="ppo")
    assert got["message"].startswith("warning: step 1: nonfinite_update: the update diverged")
    assert "(train/skipped_nonfinite)" in got["message"] and "(train/critic_skipped_nonfinite)" in got["message"]
    [got] = learning_warnings([{**_step(), "train/skipped_nonfinite": 1.0}], total=1, algorithm="ppo")
    assert "critic" not in got["message"]


def test_zero_variance_run_warns_and_resume_of_finished_run_writes_nothing(tmp_path, prefect_harness, capsys):
    from conftest import TINY_OVERRIDES

    from flows.commands.cli import main

    args = ["train", "--out", str(tmp_path / "run")]
    for o in [*TINY_OVERRIDES, f"store.uri={tmp_path / 'store'}", "invoker.kind=inprocess", "warmup.steps=0",
              "reward.functions=[{name: 'trl_style_rewards:never_applies'}]"]:
        args += ["--set", o]
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("warning: ")]
    # without warm-up the tiny model seldom stops before max_new_tokens: most completions are cut
    assert [line.split(": ")[1:3] for line in lines] == [["step 1", "no_reward"], ["step 1", "zero_grad_norm"],
                                                         ["step 2", "truncated"], ["step 2", "zero_reward_std"]], out
    summary_file = tmp_path / "run" / "summary.json"
    before = summary_file.read_bytes()
    summary = json.loads(before)
    # the two-step campaign's windowed kinds held at both steps (raised after the second)
    assert [(w["kind"], w["step"], w["steps"]) for w in summary["warnings"]] == [
        ("no_reward", 1, 2), ("truncated", 1, 2), ("zero_grad_norm", 1, 2), ("zero_reward_std", 1, 2)]
    # a step's commit column is the previous step's commit and collection, which ran in its period
    assert summary["steps"][0]["timing_s/commit"] == 0.0 < summary["steps"][1]["timing_s/commit"]
    store_files = {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*")}
    assert main([*args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "is complete: 2/2 steps committed" in out and "nothing written" in out
    assert summary_file.read_bytes() == before
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*")} == store_files
    # a stop between the summary's write and the report's: the report is drawn again, nothing else
    report = tmp_path / "run" / "report.md"
    drawn = report.read_text()
    report.unlink()
    assert main([*args, "--resume"]) == 0
    assert f"{report} was missing: drawn again from the summary" in capsys.readouterr().out
    assert report.read_text() == drawn and summary_file.read_bytes() == before
    # a complete run whose summary was never written (stopped while writing it): --resume
    # trains nothing and writes it
    summary_file.unlink()
    assert main([*args, "--resume"]) == 0
    again = json.loads(summary_file.read_text())
    assert (again["steps_completed"], again["weights_sha256"]) == (2, summary["weights_sha256"])
    # it invokes no action (no profile): the figures billed are the ones committed
    spend = ("billed_gpu_seconds", "useful_gpu_seconds", "usd", "billed_gpu_seconds_by_part")
    assert {k: again[k] for k in spend} == {k: summary[k] for k in spend} and again["profile"] is None
    # a summary of an earlier commit (a resume that committed, then failed before writing it):
    # rewritten the same way, not kept as the run's
    summary_file.write_text(json.dumps({**again, "steps_completed": 1, "weights_sha256": "0" * 64}))
    assert main([*args, "--resume"]) == 0
    assert "nothing written" not in capsys.readouterr().out
    assert json.loads(summary_file.read_text())["steps_completed"] == 2


def test_a_steps_commit_column_is_the_previous_steps_commit_alone(tiny_config, prefect_harness, monkeypatch):
    """``timing_s/commit`` of step k+1 is step k's commit and collection: a commit made slow at
    the first step shows at the second, and not again at the third."""
    import time

    import flows.campaign.run as run

    real = run.commit_state

    def slow_first(store, state):
        if state.step == 1:
            time.sleep(0.4)
        return real(store, state)

    monkeypatch.setattr(run, "commit_state", slow_first)
    steps = run.run_campaign(tiny_config("invoker.kind=inprocess", "run_id=commit", "steps=3"),
                             progress=lambda m: None)["steps"]
    commit = [s["timing_s/commit"] for s in steps]
    assert commit[0] == 0.0 and commit[1] >= 0.4 and commit[2] < 0.4, commit


def test_a_reward_model_that_cuts_most_pairs_for_steps_in_a_row_is_named():
    """``reward_model_truncated``: a reward model whose ``truncated_frac`` is at least
    ``TRUNCATED_SHARE`` for ``TRUNCATED_STEPS`` steps in a row; the line names which one."""
    def step(first: float, second: float) -> dict:
        return {**_step(), "reward_fn/reward_model/0/truncated_frac": first,
                "reward_fn/reward_model/1/truncated_frac": second}

    cut, kept = TRUNCATED_SHARE, TRUNCATED_SHARE / 2
    steps = [step(kept, cut), step(kept, cut), step(cut, kept), step(kept, cut), step(kept, cut), step(kept, cut)]
    [found] = learning_warnings(steps, total=10)
    # model 1 cut steps 1-2, then 4-6: a run long enough first from step 4; model 0 alone at step 3
    # breaks no run of "some model cut", so steps 1-6 are one run of 6
    assert (found["kind"], found["step"], found["steps"]) == ("reward_model_truncated", 1, 6)
    lines = new_warning_lines(steps[:TRUNCATED_STEPS], 10)
    assert len(lines) == 1 and "step 3: reward_model_truncated: reward model(s) 0, 1 cut" in lines[0], lines
    assert "reward.models[i].max_length" in lines[0]
    assert learning_warnings([step(kept, kept)] * 5, total=5) == []
    # a campaign shorter than the window warns when each of its steps cut
    assert [w["kind"] for w in learning_warnings([step(kept, cut)] * 2, total=2)] == ["reward_model_truncated"]
