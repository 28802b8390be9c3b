"""PPO losses for RLHF: the clipped policy surrogate and the clipped value loss.

Policy: Schulman et al., arXiv 1707.06347, eq. 7, per token, as a loss to minimise:
``max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - clip_low, 1 + clip_high))`` with
``ratio_t = exp(logp_t - old_logp_t)``. Deviations and choices:
- Decoupled clip range (DAPO arXiv 2503.14476, sec. 3.1 "clip-higher"); equal values give the
  paper's symmetric epsilon.
- Aggregation is the token-level mean over all real tokens of the batch (DAPO sec. 3.3) by
  default; ``loss_agg`` chooses GRPO's per-sequence mean or Dr. GRPO's constant normaliser
  (``masked.aggregate``). The value loss is a token mean.
- The log-ratio is clamped to [-20, 20] before ``exp`` (as verl does) so a stale outlier
  token cannot overflow to inf; no dual-clip (arXiv 1912.09729) bound for A < 0.
- ``old_logp`` and ``advantages`` are constants (detached here).

Value: clipped value loss of OpenAI baselines ppo2 and verl,
``0.5 * max((V - R)^2, (old_V + clip(V - old_V, -c, c) - R)^2)``, token-level masked mean.

KL to the reference policy is *not* a loss term in PPO here: the caller folds it into the
per-token reward before GAE, ``token_rewards = -kl_coef * kl`` (``kl``: the estimator
``algorithm.kl_kind`` names, k1 by default) plus the outcome reward at the last real token (``advantage.kl_penalized_token_rewards``). GRPO instead adds it to the loss
(``grpo_loss``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from actions.rl.masked import aggregate, masked_mean

if TYPE_CHECKING:
    from actions.config.workload import LossAgg

LOG_RATIO_CLAMP = 20.0


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: LossAgg = "token_mean",
    norm_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped-surrogate policy loss, reduced as ``loss_agg`` says (a token-level mean by default).

    Args:
        logp: log-probs of the sampled tokens under the policy being trained, ``[B, T]``.
        old_logp: log-probs under the behaviour policy that sampled them, ``[B, T]``.
        advantages: per-token advantages, ``[B, T]`` (GRPO broadcasts its ``[B]`` ones).
        mask: 0/1, 1 on real response tokens, ``[B, T]``.
        clip_low: ratio lower bound is ``1 - clip_low``.
        clip_high: ratio upper bound is ``1 + clip_high``.
        loss_agg: ``algorithm.loss_agg`` (``masked.aggregate``).
        norm_tokens: ``seq_mean_token_sum_norm``'s response limit (``generation.max_new_tokens``).
    Returns:
        ``(loss, metrics)``: a scalar to minimise, and python floats ``"loss/policy"`` (the loss),
        ``"clipfrac"`` (share of real tokens where the clipped term was the active one, so
        their gradient is zero) and ``"ratio_mean"``.
    """
    if advantages.shape != logp.shape:
        raise ValueError(
            f"advantages must match logp's shape {tuple(logp.shape)}, got "
            f"{tuple(advantages.shape)}; broadcast per-sample advantages with [:, None]"
        )
    real = mask.bool()
    # Select before exp so padding garbage (inf/NaN) cannot reach exp's backward.
    log_ratio = torch.where(real, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    advantages = advantages.detach()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, mask, loss_agg, norm_tokens)
    metrics = {
        "loss/policy": loss.item(),
        "clipfrac": masked_mean((clipped > unclipped).to(logp.dtype), mask).item(),
        "ratio_mean": masked_mean(ratio.detach(), mask).item(),
    }
    return loss, metrics


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value-function loss, token-level mean.

    Args:
        values: critic outputs being trained, ``[B, T]``.
        old_values: critic outputs at rollout time (used by GAE), ``[B, T]``.
        returns: value targets from ``advantage.gae``, ``[B, T]``.
        mask: 0/1, 1 on real response tokens, ``[B, T]``.
        clip: the new value may move at most ``clip`` from ``old_values`` in the clipped term.
    Returns:
        ``(loss, metrics)``: a scalar to minimise, and python floats ``"loss/value"`` and
        ``"vf_clipfrac"`` (share of real tokens where the clipped error was the larger one).
    """
    old_values, returns = old_values.detach(), returns.detach()
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_err = (values - returns).square()
    clipped_err = (clipped_values - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(unclipped_err, clipped_err), mask)
    metrics = {
        "loss/value": loss.item(),
        "vf_clipfrac": masked_mean((clipped_err > unclipped_err).to(values.dtype), mask).item(),
    }
    return loss, metrics
