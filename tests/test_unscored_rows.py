"""Completions no reward function or model scored (every reward None): they carry no outcome,
so they get advantage 0 and stay out of the group baseline, the reward metrics and PPO's
whitening and value loss, as TRL's GRPOTrainer leaves them out (CPU, milliseconds)."""

from __future__ import annotations

import math

import pytest
import torch

from actions.config.workload import AlgorithmConfig
from actions.rl.advantage import group_normalized_advantages
from actions.rl.batch import TrainBatch, rollout_metrics
from actions.rl.optimizer import TrainOptimizer
from actions.rl.sequences import pack
from actions.rl.update import _critic_pass, compute_advantages


def _batch(rewards: list[float], applicable: list[bool] | None, *, ppo: bool = False) -> TrainBatch:
    prompts = [[1, 2]] * len(rewards)
    responses = [[3, 4, 5][: 1 + i % 3] for i in range(len(rewards))]
    packed = pack(prompts, responses, 0)
    zeros = torch.zeros(packed.response_mask.shape)
    return TrainBatch(packed, zeros if ppo else None, None, torch.tensor(rewards), zeros.clone() if ppo else None,
                      ["stop"] * len(rewards), prompts, responses, 0, applicable)


def test_unscored_row_leaves_the_group_statistics_and_gets_advantage_zero():
    # group 1: yes/no/no scored [1, 0, 0], the 4th unscorable (stand-in 0): mean 1/3, population
    # std sqrt(2/9) = 0.4714 -> (1 - 1/3)/0.4714 = 1.4142, (0 - 1/3)/0.4714 = -0.7071, and 0.
    # (Counting the 4th gave [1.732, -0.577, -0.577, -0.577]; TRL's Bessel std gives 1.155, -0.577, 0.)
    # group 2: nothing scored -> all 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    scored = torch.tensor([True, True, True, False, False, False, False, False])
    adv = group_normalized_advantages(rewards, 4, scored=scored)
    s = math.sqrt(2 / 9)
    torch.testing.assert_close(adv, torch.tensor([(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, 0, 0, 0, 0, 0]),
                               atol=1e-5, rtol=0)
    assert adv[3] == 0.0 and torch.equal(adv[4:], torch.zeros(4))
    # mean-centring only (TRL's scale_rewards="none" gives the same)
    centred = group_normalized_advantages(rewards, 4, scale_by_std=False, scored=scored)
    torch.testing.assert_close(centred, torch.tensor([2 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0, 0]))


def test_all_scored_is_bit_for_bit_the_plain_computation():
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(0))
    plain = group_normalized_advantages(rewards, 4)
    assert torch.equal(group_normalized_advantages(rewards, 4, scored=torch.ones(16, dtype=torch.bool)), plain)


def test_grpo_batch_advantages_read_which_rows_were_scored():
    algo = AlgorithmConfig(batch_size=4, group_size=4, num_minibatches=1)
    adv, _ = compute_advantages(_batch([1.0, 0.0, 0.0, 0.0], [True, True, True, False]), algo)
    assert adv[3] == 0.0 and adv[0] > 1.4
    unknown, _ = compute_advantages(_batch([1.0, 0.0, 0.0, 0.0], None), algo)  # shards scored before the flag
    torch.testing.assert_close(unknown, group_normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4))


def test_reward_metrics_are_over_scored_rows_with_trls_std():
    algo = AlgorithmConfig(batch_size=8, group_size=4, num_minibatches=1)
    m = rollout_metrics(_batch([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
                               [True, True, True, False, True, True, False, False]), algo)
    # scored rewards [1, 0, 0, 1, 1]: mean 0.6, Bessel std sqrt((3 * 0.16 + 2 * 0.36) / 4) = sqrt(0.3)
    assert m["reward/mean"] == pytest.approx(0.6) and m["reward/std"] == pytest.approx(math.sqrt(0.3))
    assert m["frac_reward_none"] == 3 / 8
    assert m["frac_reward_zero_std"] == 0.5  # group 2's scored rows are all 1
    every = rollout_metrics(_batch([1.0, 0.0, 0.0, 1.0], None), AlgorithmConfig(batch_size=4, group_size=4,
                                                                                num_minibatches=1))
    assert every["reward/std"] == pytest.approx(math.sqrt(1 / 3))  # Bessel: 4 * 0.25 / 3, TRL's reward_std
    none = rollout_metrics(_batch([0.0] * 4, [False] * 4), AlgorithmConfig(batch_size=4, group_size=4,
                                                                           num_minibatches=1))
    assert (none["reward/mean"], none["reward/std"], none["frac_reward_none"]) == (0.0, 0.0, 1.0)


def test_ppo_gives_unscored_rows_zero_advantage_and_no_value_target():
    algo = AlgorithmConfig(name="ppo", batch_size=4, group_size=4, num_minibatches=1, kl_coef=0.0)
    batch = _batch([1.0, 0.0, 5.0, 100.0], [True, True, True, False], ppo=True)
    adv, ret = compute_advantages(batch, algo)
    assert torch.equal(adv[3], torch.zeros_like(adv[3]))
    scored = batch.scored_mask()
    assert abs(float((adv * scored).sum())) < 1e-5  # whitened over the scored tokens alone

    class Constant(torch.nn.Module):  # a critic predicting 0 everywhere
        def __init__(self):
            super().__init__()
            self.v = torch.nn.Parameter(torch.zeros(()))

        def forward(self, packed):
            return self.v * torch.ones(packed.response_mask.shape)

    critic = Constant()
    m = _critic_pass(critic, TrainOptimizer(critic, 1e-3), batch, ret, torch.arange(4), algo)
    # value loss 0.5 x token mean of return^2 over the scored rows' tokens only (the 4th's 100 is left out)
    expected = 0.5 * float((ret.square() * scored).sum() / scored.sum())
    assert m["loss/value"] == pytest.approx(expected) and expected < 100
