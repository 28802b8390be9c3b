"""Advantage estimators: GRPO group-normalised outcome advantages and PPO's GAE.

GRPO (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2 "outcome supervision"): each prompt is
sampled ``group_size`` times and a completion's advantage is its reward standardised within
its group, ``(r - mean_group) / (std_group + eps)``, broadcast to all its tokens by the loss.
- std is the *population* std (``unbiased=False``, divide by G). The paper does not say which;
  TRL uses the sample std. With rewards [1, 0, 0, 1] this gives std 0.5 and advantages +-1.
- ``eps`` is added to the std, not the variance. A group whose (scored) rewards are all equal
  gets advantage exactly 0, set so rather than computed: it carries no learning signal, but
  its mean in floating point can differ from the shared value by a rounding step (eight
  rewards of 0.3 in fp32: 1.5e-8), which divided by a std of about 0 plus ``eps`` would become
  an advantage of the same sign on every row (0.03 there, up to 0.95 seen).
- ``scale_by_std=False`` gives mean-centring only, as Dr. GRPO (arXiv 2503.20783) recommends:
  dividing by the std up-weights near-uniform groups (too easy or too hard questions).
- ``std_scope="batch"`` divides the group-centred rewards by the population std of every
  (scored) reward of the batch instead of their group's (group mean, batch std: "Tricks or
  Traps", arXiv 2508.08221; TRL's ``scale_rewards: batch``, whose std is the sample
  std): a group's spread is kept relative to the others' rather than stretched to 1.
- Rows of one group are contiguous: row b belongs to group ``b // group_size``.
- Unscorable rows (``scored`` False: every reward function returned None and no reward model
  scored them) are left out of their group's mean and std and get advantage exactly 0: a
  stand-in reward 0 (TRL's GRPOTrainer counts one, through its ``nansum``, and warns) would
  shift the baseline and hand them a made-up advantage. A group with no scored row gets 0 everywhere. Where every row is scored the
  result is bit for bit the plain computation. Rewards of scored rows must be finite.

GAE (Schulman et al., arXiv 1506.02438, sec. 3, eq. 16) over response tokens, for PPO:
``delta_t = r_t + gamma * V_{t+1} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t+1}``. The
value after the last real token is 0 (the response ended: terminal), as is the advantage.
Rows are right-padded with contiguous real tokens; a 0 inside a row would end the episode
there. Outputs are 0 at padding and carry no gradient (values are a fixed baseline here).

``kl_penalized_token_rewards`` builds PPO-RLHF's per-token reward (Ouyang et al.,
arXiv 2203.02155, eq. 2; DeepSeekMath eq. 2): ``-kl_coef * kl`` on every token plus the
outcome reward on the last real token. ``kl`` is the paper's k1 (``logp - ref_logp``) unless
``algorithm.kl_kind`` picks k2 or k3, as TRL's PPO ``kl_estimator`` offers k3.
"""

from __future__ import annotations

import torch
from torch import Tensor

from actions.rl.kl import kl_estimate


def group_normalized_advantages(
    rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6, scored: Tensor | None = None,
    std_scope: str = "group",
) -> Tensor:
    """GRPO outcome advantages, normalised within each group of ``group_size`` rows.

    Args:
        rewards: one scalar reward per completion, ``[B]``, groups contiguous.
        group_size: completions per prompt (G); ``B`` must be a multiple of it.
        scale_by_std: divide by the group's population std (GRPO); False gives Dr. GRPO.
        eps: added to the std to avoid division by zero.
        scored: bool ``[B]``, False for an unscorable row (module docstring); None: all scored.
        std_scope: ``group`` (each group's std) or ``batch`` (the std of every scored reward).
    Returns:
        Advantages, ``[B]``, same dtype as ``rewards``; 0 on unscorable rows.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"group_size={group_size} must be >= 1 and divide the number of rewards "
            f"B={rewards.numel()}; pass all group_size completions of every prompt"
        )
    if std_scope not in ("group", "batch"):
        raise ValueError(f"std_scope {std_scope!r} is not group or batch")
    if scored is not None and not bool(scored.all()):
        return _scored_group_advantages(rewards, scored, group_size, scale_by_std=scale_by_std, eps=eps,
                                        std_scope=std_scope)
    grouped = rewards.view(-1, group_size)  # [num_groups, G]
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_by_std:
        std = rewards.std(unbiased=False) if std_scope == "batch" else grouped.std(dim=1, unbiased=False, keepdim=True)
        centered = centered / (std + eps)
    uniform = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    return torch.where(uniform, torch.zeros_like(centered), centered).reshape(-1)


def _scored_group_advantages(rewards: Tensor, scored: Tensor, group_size: int, *, scale_by_std: bool,
                             eps: float, std_scope: str) -> Tensor:
    """``group_normalized_advantages`` with the mean and population std of each group taken over
    its scored rows only, and 0 on the rest (and on a group with none scored)."""
    keep = scored.view(-1, group_size).to(torch.bool)  # [num_groups, G]
    grouped = torch.where(keep, rewards.view(-1, group_size), torch.zeros_like(rewards).view(-1, group_size))
    count = keep.sum(dim=1, keepdim=True).clamp_min(1).to(rewards.dtype)
    mean = grouped.sum(dim=1, keepdim=True) / count
    centered = torch.where(keep, grouped - mean, torch.zeros_like(grouped))
    if scale_by_std and std_scope == "batch":
        taken = rewards[scored.to(torch.bool)]
        centered = centered / (taken.std(unbiased=False) + eps)
    elif scale_by_std:
        std = (centered.square().sum(dim=1, keepdim=True) / count).sqrt()
        centered = centered / (std + eps)
    inf = torch.full_like(grouped, float("inf"))
    uniform = torch.where(keep, grouped, -inf).amax(dim=1, keepdim=True) == torch.where(keep, grouped, inf).amin(
        dim=1, keepdim=True)  # the scored rows all equal (none scored: inf != -inf, but every row is masked)
    return torch.where(uniform | ~keep, torch.zeros_like(centered), centered).reshape(-1)


@torch.no_grad()
def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over right-padded response tokens.

    Args:
        token_rewards: reward received after each token, ``[B, T]``.
        values: value estimates V(s_t) before each token, ``[B, T]`` (old critic, detached).
        mask: 0/1, 1 on real response tokens, ``[B, T]``.
        gamma: discount per token.
        lam: GAE lambda.
    Returns:
        ``(advantages, returns)``, both ``[B, T]``, 0 at padding; ``returns = advantages +
        values`` on real tokens (the value-function target).
    """
    real = mask.bool()
    zeros = torch.zeros_like(values)
    values = torch.where(real, values, zeros)
    token_rewards = torch.where(real, token_rewards, zeros)
    continues = real.to(values.dtype)  # 1 where token t+1 exists, once shifted below
    num_tokens = values.shape[1]
    advantages = torch.zeros_like(values)
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(num_tokens)):
        # V_{t+1} and A_{t+1} are 0 past the last real token (terminal state).
        if t + 1 < num_tokens:
            next_value, next_live = values[:, t + 1], continues[:, t + 1]
        else:
            next_value, next_live = zeros[:, 0], zeros[:, 0]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = delta + gamma * lam * next_live * next_adv
        advantages[:, t] = next_adv
    advantages = torch.where(real, advantages, zeros)
    returns = torch.where(real, advantages + values, zeros)
    return advantages, returns


@torch.no_grad()
def kl_penalized_token_rewards(
    outcome: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float, kl_kind: str = "k1"
) -> Tensor:
    """Per-token PPO-RLHF reward: ``-kl_coef * kl_estimate(logp, ref_logp, kl_kind)`` (k1:
    ``logp - ref_logp``), plus ``outcome`` at the end.

    Args:
        outcome: scalar reward per completion (reward model or verifier), ``[B]``.
        logp: log-probs of the sampled tokens under the behaviour policy, ``[B, T]``.
        ref_logp: log-probs of the same tokens under the reference policy, ``[B, T]``.
        mask: 0/1, 1 on real response tokens (right-padded), ``[B, T]``.
        kl_coef: KL penalty coefficient (beta).
        kl_kind: per-token KL estimator, ``"k1"``, ``"k2"`` or ``"k3"`` (``kl.kl_estimate``).
    Returns:
        Token rewards ``[B, T]`` (0 at padding, no gradient), the input to ``gae``.
    """
    real = mask.bool()
    rewards = -kl_coef * kl_estimate(logp, ref_logp, kind=kl_kind)
    last = (real.sum(dim=1) - 1).clamp_min(0)  # [B] index of the last real token
    rewards = rewards.scatter_add(1, last[:, None], outcome.to(rewards.dtype)[:, None])
    # An empty row has no last token: the outcome landed on padding and is dropped here.
    return torch.where(real, rewards, torch.zeros_like(rewards))
