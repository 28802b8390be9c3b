"""GRPO loss: PPO's clipped surrogate on group-normalised advantages plus a KL loss term.

Source: DeepSeekMath, arXiv 2402.03300, sec. 4.1, eq. 3 (objective) with the k3 KL
estimator of eq. 4, written as a loss to minimise, per real token t of sample i:
``max(-A_i * ratio, -A_i * clip(ratio, 1 - clip_low, 1 + clip_high)) + kl_coef * KL_t``,
``ratio = exp(logp - old_logp)``, ``A_i`` from ``advantage.group_normalized_advantages``.

Choices and deviations from eq. 3:
- Aggregation (``loss_agg``, ``masked.aggregate``): by default the token-level mean over all
  real tokens of the batch (DAPO, arXiv 2503.14476, sec. 3.3 "token-level policy gradient
  loss"), so long responses weigh in proportion to their length; ``seq_mean_token_mean`` is the
  original GRPO's (tokens averaged within each sequence, then sequences over the batch),
  ``seq_mean_token_sum_norm`` Dr. GRPO's (the token sum over a constant). The KL term is reduced
  the same way; its logged value is always the token mean. A caller accumulating micro-batches
  must weight each by its share (``masked.micro_share``).
- Clip range decoupled as in DAPO sec. 3.1 ("clip-higher"); equal values give GRPO's epsilon.
- KL is a loss term (not a reward penalty as in PPO); ``kl_kind`` defaults to k3 as in the
  paper. ``ref_logp`` may be None when ``kl_coef == 0`` (DAPO drops the KL term).
- Shares the surrogate with ``ppo_loss.ppo_policy_loss`` (clamped log-ratio, detached
  ``old_logp`` and advantages). Since the mean is linear, mean(pg + c*kl) = mean(pg) + c*mean(kl).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from actions.rl.kl import kl_estimate
from actions.rl.masked import aggregate, masked_mean
from actions.rl.ppo_loss import ppo_policy_loss

if TYPE_CHECKING:
    from actions.config.workload import LossAgg


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    kl_kind: str = "k3",
    loss_agg: LossAgg = "token_mean",
    norm_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO loss, reduced over the batch as ``loss_agg`` says (a token-level mean by default).

    Args:
        logp: log-probs of the sampled tokens under the policy being trained, ``[B, T]``.
        old_logp: log-probs under the behaviour policy that sampled them, ``[B, T]``.
        ref_logp: log-probs under the frozen reference policy, ``[B, T]``; None iff unused.
        advantages: one advantage per sample, ``[B]``.
        mask: 0/1, 1 on real response tokens, ``[B, T]``.
        clip_low: ratio lower bound is ``1 - clip_low``.
        clip_high: ratio upper bound is ``1 + clip_high``.
        kl_coef: weight of the KL(pi || pi_ref) term (beta).
        kl_kind: KL estimator, see ``kl.kl_estimate``.
        loss_agg: ``algorithm.loss_agg`` (``masked.aggregate``).
        norm_tokens: ``seq_mean_token_sum_norm``'s response limit (``generation.max_new_tokens``).
    Returns:
        ``(loss, metrics)``: a scalar to minimise, and python floats ``"loss"`` (that scalar:
        TRL's ``loss``), ``"loss/policy"`` (its clipped surrogate alone, without the KL term),
        ``"kl"`` (token-mean KL estimate; absent without ``ref_logp``, as PPO's and TRL's
        with a zero KL weight: no KL is computed), ``"clipfrac"`` and ``"ratio_mean"``.
    """
    if advantages.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must be per sample with shape {tuple(logp.shape[:1])}, got "
            f"{tuple(advantages.shape)}; use ppo_policy_loss for per-token advantages"
        )
    token_advantages = advantages[:, None].expand_as(logp)
    loss, metrics = ppo_policy_loss(
        logp, old_logp, token_advantages, mask, clip_low=clip_low, clip_high=clip_high, loss_agg=loss_agg,
        norm_tokens=norm_tokens,
    )
    if ref_logp is not None:
        real = mask.bool()
        zeros = torch.zeros_like(logp)
        # Padding is zeroed before the estimator so garbage there cannot NaN the gradient.
        kl = kl_estimate(
            torch.where(real, logp, zeros), torch.where(real, ref_logp, zeros).detach(), kl_kind
        )
        kl_mean = masked_mean(kl, mask)
        metrics["kl"] = kl_mean.item()
        if kl_coef != 0.0:
            reduced = kl_mean if loss_agg == "token_mean" else aggregate(kl, mask, loss_agg, norm_tokens)
            loss = loss + kl_coef * reduced
    elif kl_coef != 0.0:
        raise ValueError(f"ref_logp is None but kl_coef={kl_coef}; pass ref_logp or set kl_coef=0")
    metrics["loss"] = loss.item()
    return loss, metrics
