"""The ``trainer_state`` reward functions get counts steps as TRL's GRPOTrainer does: in the
policy's optimizer steps (``epochs x num_minibatches`` per RL step), and the start-up call of a
plug-in already sees the campaign's ``max_steps`` (CPU, no model)."""

from __future__ import annotations

import json

from actions.contracts import EvaluateRequest, ModelRef, ScoreRequest
from actions.tasks.dataset import PromptRow
from actions.tasks.rewards.model_scoring import score_completions
from flows.config import load_config

SEEN: list[tuple[int, float, int]] = []


def progress_reward(completions, trainer_state, **kwargs):
    """A TRL curriculum reward: the share of training done."""
    SEEN.append((trainer_state.global_step, trainer_state.epoch, trainer_state.max_steps))
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)


def _config(tmp_path, *extra: str):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(8)))
    return load_config(None, [f"data.train_path={data}",
                              "reward.functions=[{name: 'test_trainer_state:progress_reward'}]",
                              "algorithm.batch_size=8", "algorithm.group_size=4", "algorithm.num_minibatches=2",
                              f"store.uri={tmp_path / 'store'}", "run_id=t", *extra])


def test_startup_check_gives_a_curriculum_reward_the_campaigns_max_steps(tmp_path):
    from flows.campaign.preflight import check_campaign

    SEEN.clear()
    check_campaign(_config(tmp_path, "steps=3", "algorithm.epochs=2", "invoker.kind=inprocess"))
    # 3 RL steps x 2 epochs x 2 mini-batches = 12 optimizer steps (max_steps 0 raised ZeroDivisionError)
    assert SEEN == [(0, 0.0, 12)]


def test_scoring_counts_optimizer_steps_as_trl(tmp_path):
    from flows.step.context import RunContext
    from flows.step.payloads import StepInputs, score_payload

    cfg = _config(tmp_path, "steps=3")
    ctx = RunContext(config=cfg, store=None, invoker=None, run_id="t")
    model = ModelRef(store_uri=str(tmp_path), base_key="b", policy_key="p", policy_version=0)
    rows = [PromptRow(prompt_id=i, prompt=f"say {i}", answer=str(i)) for i in range(2)]
    SEEN.clear()
    for step in range(3):  # TRL with steps_per_generation=2 and max_steps=6 sees (0, 6), (2, 6), (4, 6)
        inputs = StepInputs(step=step, epoch=0, prompt_ids=[0], model=model, reference_key="p", train_key="d",
                            optimizer_key=None, critic_key=None, critic_optimizer_key=None)
        req = ScoreRequest.model_validate(score_payload(ctx, inputs, ["r"], "s0"))
        score_completions(req, rows, ["0", "1"], [[1], [2]], str(tmp_path), epoch=step * 2 / 8)
    assert SEEN == [(0, 0.0, 6), (2, 0.25, 6), (4, 0.5, 6)]
    # the evaluation after the last step: every optimizer step done
    SEEN.clear()
    evaluate = EvaluateRequest(model=model, dataset_key="d", max_new_tokens=4, output_key="e",
                               rewards=cfg.reward_functions(), step=6, max_steps=6)  # optimizer steps
    score_completions(evaluate, rows, ["0", "1"], [[1], [2]], str(tmp_path))
    assert SEEN == [(6, 0.0, 6)]


# The requests' fields in the revision before trainer_state counted optimizer steps.
OLD_SCORE_FIELDS = {"algorithm", "critic_key", "dataset_key", "max_steps", "output_key", "policy", "reference_key",
                    "reward_models", "rewards", "rollout_keys", "step", "temperature"}
OLD_EVALUATE_FIELDS = {"compile_decode", "cuda_graphs", "dataset_key", "engine", "fused_sampling", "kv_cache",
                       "max_new_tokens", "max_steps", "model", "output_key", "reward_models", "rewards", "step"}


def test_score_and_evaluate_requests_keep_the_fields_older_actions_take(tmp_path):
    """Actions refuse unknown fields: the default campaign's requests (whose factor is 2) carry
    the step counts in fields that actions of that revision take."""
    from flows.step.context import RunContext
    from flows.step.payloads import StepInputs, score_payload

    cfg = _config(tmp_path)
    assert cfg.algorithm.optimizer_steps_per_step == 2
    ctx = RunContext(config=cfg, store=None, invoker=None, run_id="t")
    model = ModelRef(store_uri=str(tmp_path), base_key="b", policy_key="p", policy_version=0)
    inputs = StepInputs(step=1, epoch=0, prompt_ids=[0], model=model, reference_key="p", train_key="d",
                        optimizer_key=None, critic_key=None, critic_optimizer_key=None)
    assert set(score_payload(ctx, inputs, ["r"], "s0")) <= OLD_SCORE_FIELDS
    evaluate = EvaluateRequest(model=model, dataset_key="d", max_new_tokens=4, output_key="e",
                               rewards=cfg.reward_functions(), step=2, max_steps=6)
    assert set(evaluate.model_dump(mode="json")) <= OLD_EVALUATE_FIELDS
