"""The policy (and critic) update loop shared by GRPO and PPO.

Advantages: GRPO uses group-normalised outcome rewards with the KL to the reference as a loss
term (k3); PPO uses GAE over token rewards that carry the KL as a per-token penalty (k1) and
the outcome at the last token, whitened over the batch. Mini-batches are shuffled prompt
groups drawn from a generator seeded by (seed, step), so an update is reproducible.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from actions.common.config import AlgorithmConfig
from actions.rl.advantage import gae, group_normalized_advantages, kl_penalized_token_rewards
from actions.rl.batch import TrainBatch
from actions.rl.critic import Critic
from actions.rl.grpo_loss import grpo_loss
from actions.rl.masked import masked_mean, masked_whiten
from actions.rl.ppo_loss import ppo_policy_loss, value_loss
from actions.rl.sequences import response_logprobs


def make_optimizer(module: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    # foreach=False keeps the update order, and so the bytes, independent of tensor grouping.
    return torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0, foreach=False)


def compute_advantages(batch: TrainBatch, algo: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages, returns): GRPO [B] and None; PPO [B, T] and [B, T]."""
    if algo.name == "grpo":
        return group_normalized_advantages(batch.rewards, algo.group_size, scale_by_std=algo.scale_by_std), None
    mask = batch.packed.response_mask
    token_rewards = kl_penalized_token_rewards(batch.rewards, batch.old_logp, batch.ref_logp, mask, algo.kl_coef)
    adv, ret = gae(token_rewards, batch.values, mask, algo.gamma, algo.gae_lambda)
    return masked_whiten(adv, mask), ret


def _minibatches(num_rows: int, algo: AlgorithmConfig, gen: torch.Generator) -> list[torch.Tensor]:
    groups = torch.randperm(num_rows // algo.group_size, generator=gen)
    rows = (groups[:, None] * algo.group_size + torch.arange(algo.group_size)).flatten()
    return list(rows.chunk(algo.num_minibatches))


def run_updates(policy: torch.nn.Module, opt: torch.optim.Optimizer, batch: TrainBatch, algo: AlgorithmConfig,
                critic: Critic | None, critic_opt: torch.optim.Optimizer | None, *, seed: int, step: int
                ) -> dict[str, float]:
    adv, ret = compute_advantages(batch, algo)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    sums: dict[str, float] = defaultdict(float)
    count = 0
    for _ in range(algo.epochs):
        for idx in _minibatches(len(batch.rewards), algo, gen):
            sub = batch.packed.select(idx)
            logp, entropy = response_logprobs(policy, sub, with_entropy=True)
            if algo.name == "grpo":
                loss, m = grpo_loss(logp, batch.old_logp[idx], batch.ref_logp[idx], adv[idx], sub.response_mask,
                                    clip_low=algo.clip_low, clip_high=algo.clip_high, kl_coef=algo.kl_coef,
                                    kl_kind=algo.kl_kind)
            else:
                loss, m = ppo_policy_loss(logp, batch.old_logp[idx], adv[idx], sub.response_mask,
                                          clip_low=algo.clip_low, clip_high=algo.clip_high)
            opt.zero_grad()
            loss.backward()
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), algo.max_grad_norm))
            opt.step()
            m["entropy"] = float(masked_mean(entropy.detach(), sub.response_mask))
            if critic is not None:
                values = critic(sub)
                vloss, vm = value_loss(values, batch.values[idx], ret[idx], sub.response_mask, clip=algo.value_clip)
                critic_opt.zero_grad()
                vloss.backward()
                torch.nn.utils.clip_grad_norm_(critic.parameters(), algo.max_grad_norm)
                critic_opt.step()
                m.update(vm)
            for k, v in m.items():
                sums[k] += v
            count += 1
    out = {k: v / count for k, v in sums.items()}
    if algo.name == "ppo":  # the KL the penalty saw (k1), for the same metric name as GRPO
        out["kl"] = float(masked_mean(batch.old_logp - batch.ref_logp, batch.packed.response_mask))
    return out
