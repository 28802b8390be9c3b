"""Per-token estimators of KL(pi || pi_ref) from log-probs of tokens sampled from pi.

Source: J. Schulman, "Approximating KL Divergence" (blog post, 2020), estimators k1, k2, k3.
With ``log_r = ref_logp - logp`` (the log of r = pi_ref(x) / pi(x) for x ~ pi):

- ``k1 = -log_r = logp - ref_logp``: unbiased, high variance, can be negative per token.
  Used by PPO-RLHF as a per-token reward penalty (Ouyang et al. arXiv 2203.02155, eq. 2).
- ``k2 = 0.5 * log_r**2``: biased, low variance, always >= 0.
- ``k3 = exp(log_r) - log_r - 1``: unbiased, low variance, always >= 0. GRPO adds it to the
  loss (DeepSeekMath arXiv 2402.03300, eq. 4).

Deviation: for k3 ``log_r`` is clamped to at most 20 before ``exp``. A token the policy now
finds far less likely than the reference does (stale or mismatched log-probs, e.g. inference
engine vs trainer numerics) gives a large positive ``log_r``; unclamped, ``exp`` overflows to
inf in fp32 past about 88 (past about 11 in fp16) and one token turns the batch loss and its
gradient into inf/NaN. exp(20) ~ 4.9e8 is still finite; the clamp only bites on such outliers
and zeroes their gradient. The other side is not clamped: there k3 ~ ``-log_r - 1`` grows
linearly, finite for finite log-probs, and its gradient (``1 - exp(log_r)`` ~ 1 per nat of
``logp``) is what pulls a token the policy drifted far above the reference back; a clamp there
would cap the penalty and zero that gradient exactly where it matters. (verl clamps ``log_r``
to [-20, 20] and the k3 value to [-10, 10]; TRL clamps neither.)
k1 and k2 are polynomial in ``log_r`` and are not clamped.

Not covered: masking (callers reduce with ``masked.masked_mean``) and the full-vocabulary KL.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_KINDS = ("k1", "k2", "k3")
K3_LOG_RATIO_CLAMP = 20.0


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate.

    Args:
        logp: log pi(x_t) of the sampled tokens under the current policy, ``[B, T]``, nats.
        ref_logp: log pi_ref(x_t) of the same tokens under the reference policy, ``[B, T]``.
        kind: ``"k1"``, ``"k2"`` or ``"k3"`` (see the module docstring).
    Returns:
        Per-token estimate, ``[B, T]``, nats. Padding positions are not masked here.
    """
    log_r = ref_logp - logp
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    if kind == "k3":
        log_r = log_r.clamp(max=K3_LOG_RATIO_CLAMP)
        return torch.exp(log_r) - log_r - 1.0
    raise ValueError(f"kl kind must be one of {KL_KINDS}, got {kind!r}")
