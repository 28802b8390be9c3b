"""What a TRL GRPOTrainer user meets: ``reward_std`` and ``frac_reward_zero_std`` mean what TRL
logs under those names for the run's std scope, a reward model written into ``reward.functions``
(TRL's ``reward_funcs`` takes one) is pointed to ``reward.models``, and GRPO with one completion
per prompt is refused at start-up, as TRL refuses ``num_generations`` below 2 (CPU, milliseconds)."""

from __future__ import annotations

import math
import re
import statistics

import pytest
import torch
from pydantic import ValidationError

from actions.config.workload import AlgorithmConfig
from actions.config.workload import RewardFunctionConfig as Fn
from actions.rl.batch import TrainBatch, rollout_metrics
from actions.rl.sequences import pack
from flows.campaign.tensorboard import step_scalars
from flows.config import load_config


def _batch(rewards: list[float], applicable: list[bool] | None = None) -> TrainBatch:
    prompts = [[1, 2]] * len(rewards)
    responses = [[3, 4]] * len(rewards)
    return TrainBatch(pack(prompts, responses, 0), None, None, torch.tensor(rewards), None,
                      ["stop"] * len(rewards), prompts, responses, 0, applicable)


def _algo(**kw) -> AlgorithmConfig:
    return AlgorithmConfig(batch_size=8, group_size=4, num_minibatches=1, **kw)


# two groups, each of one reward (1 and 5): nothing to learn within a group, yet a wide batch spread
UNIFORM = [1.0, 1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0]
MIXED = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_group_scope_reward_std_is_the_mean_of_the_groups_std_as_trl():
    """TRL (scale_rewards group or none): reward_std = std_rewards.mean(), each row's group's
    Bessel std; frac_reward_zero_std the share of rows whose group's std is 0."""
    m = rollout_metrics(_batch(UNIFORM), _algo())
    assert m["reward_std"] == 0.0 and m["frac_reward_zero_std"] == 1.0
    assert m["reward/std"] == pytest.approx(statistics.stdev(UNIFORM))  # the batch's, under its own name
    mixed = rollout_metrics(_batch(MIXED), _algo())
    assert mixed["reward_std"] == pytest.approx(statistics.stdev([1.0, 0.0, 0.0, 1.0]) / 2)
    assert mixed["frac_reward_zero_std"] == 0.5 and mixed["reward/frac_uniform_groups"] == 0.5
    # Dr. GRPO (TRL's scale_rewards none) logs the group figures too
    assert rollout_metrics(_batch(MIXED), _algo(scale_by_std=False))["reward_std"] == mixed["reward_std"]


def test_batch_scope_reward_std_is_the_batch_std_as_trl():
    """TRL (scale_rewards batch): reward_std = the batch's Bessel std, and frac_reward_zero_std is
    1.0 or 0.0 (every row shares the one std); the groups of one reward stay counted apart."""
    m = rollout_metrics(_batch(UNIFORM), _algo(std_scope="batch"))
    assert m["reward_std"] == pytest.approx(statistics.stdev(UNIFORM)) == m["reward/std"]
    assert m["frac_reward_zero_std"] == 0.0 and m["reward/frac_uniform_groups"] == 1.0
    flat = rollout_metrics(_batch([2.0] * 8), _algo(std_scope="batch"))
    assert flat["reward_std"] == 0.0 and flat["frac_reward_zero_std"] == 1.0


def test_group_reward_std_is_over_the_scored_rows():
    # group 1 scored [1, 0, 0] (Bessel std sqrt(1/3)), group 2 one scored row (counts 0)
    m = rollout_metrics(_batch(MIXED, [True, True, True, False, True, False, False, False]), _algo())
    assert m["reward_std"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert m["frac_reward_zero_std"] == 0.5


def test_trackers_log_trls_reward_std_not_the_batch_std():
    s = step_scalars(rollout_metrics(_batch(UNIFORM), _algo()))
    assert s["reward_std"] == 0.0 and s["reward/std"] > 2.0


@pytest.mark.parametrize(("name", "says"), [
    ("Skywork/Skywork-Reward-V2-Qwen3-0.6B", "reward.models: [{path: <local folder>}]"),
    ("Skywork-Reward-V2", "reward.models: [{path: <local folder>}]"),  # no module syntax
    ("myrew.len_reward", "use 'myrew:len_reward'"),
    ("plugins/myrewards.py:score", "put its folder (plugins) on PYTHONPATH and use 'myrewards:score'"),
])
def test_a_reward_name_that_is_no_function_gets_the_fix_for_what_it_looks_like(name, says):
    with pytest.raises(ValidationError) as info:
        Fn(name=name)
    line = str(info.value)
    assert says in line, line
    assert "PYTHONPATH" not in line or name.endswith(":score"), line


def test_a_reward_model_folder_in_reward_functions_is_pointed_to_reward_models(tmp_path, monkeypatch):
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for name in ("./rm", "rm"):
        with pytest.raises(ValidationError, match=r"remove it from reward\.functions and set reward\.models: "
                                                  rf"\[\{{path: {re.escape(name)}\}}\]"):
            Fn(name=name)


def test_grpo_with_one_completion_per_prompt_is_refused_naming_the_fix():
    with pytest.raises(ValueError) as info:
        load_config(None, ["algorithm.group_size=1", "algorithm.batch_size=16", "algorithm.num_minibatches=1"])
    line = str(info.value)
    assert "algorithm.group_size=1" in line and "2 or more" in line and "algorithm.name=ppo" in line, line
    # PPO's critic needs no group
    assert load_config(None, ["algorithm.name=ppo", "algorithm.group_size=1", "algorithm.batch_size=16",
                              "algorithm.num_minibatches=1"]).algorithm.group_size == 1

