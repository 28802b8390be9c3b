"""Masked reductions over right-padded token tensors.

Every RL loss here reduces a per-token tensor ``x`` of shape ``[B, T]`` (B samples, T response
tokens, right-padded) with a mask of the same shape that is 1 on real response tokens and 0 on
padding. Masks are 0/1 (bool or float); fractional weights are not supported because empty
rows are handled by clamping the token count to at least 1.

Masked positions are *selected away* with ``torch.where`` rather than multiplied by 0, so
padding may hold anything (``inf`` or ``NaN`` from a padded log-prob) without poisoning the
result: ``NaN * 0`` is ``NaN``, ``where(False, NaN, 0)`` is 0.

All-element reductions are pinned to one order: each row is summed, then the row sums. A
plain ``x.sum()`` over more than ATen's grain (32,768 elements) splits the tensor among the
intra-op threads and adds the pieces, so its last bits would depend on how many threads the
activation was given (``flows.invokers.cores``); a row reduction is serial within the row.

Not covered: sequence-parallel or data-parallel all-reduces of the token count; a caller that
accumulates gradients over micro-batches must weight each micro-batch by its share of the
mini-batch (``micro_share``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from actions.config.workload import LossAgg


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over positions where ``mask`` is set.

    Args:
        x: values, any shape (typically ``[B, T]``).
        mask: 0/1 mask of the same shape as ``x``.
        dim: dimension to reduce; ``None`` reduces everything to a scalar.
    Returns:
        The sum, with ``dim`` removed (a 0-d tensor when ``dim`` is None).
    """
    selected = torch.where(mask.bool(), x, torch.zeros_like(x))
    return _sum_all(selected) if dim is None else selected.sum(dim=dim)


def _sum_all(x: Tensor) -> Tensor:
    """Sum of every element in an order that does not depend on the thread count: rows first
    (each one serial), then the row sums."""
    return x.sum(dim=-1).flatten().sum() if x.dim() >= 2 else x.sum()


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is set; 0 where nothing is set.

    Args:
        x: values, any shape (typically ``[B, T]``).
        mask: 0/1 mask of the same shape as ``x``.
        dim: dimension to reduce; ``None`` gives the token-level mean over the whole batch.
    Returns:
        The mean, with ``dim`` removed. An all-zero mask (e.g. an empty response) yields 0
        rather than NaN, so one empty row cannot turn a batch loss into NaN.
    """
    count = mask.to(x.dtype)
    count = _sum_all(count) if dim is None else count.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1.0)


def aggregate(x: Tensor, mask: Tensor, mode: LossAgg, norm_tokens: int | None = None) -> Tensor:
    """A per-token loss ``x`` ``[B, T]`` reduced to a scalar as ``algorithm.loss_agg`` says.

    * ``token_mean``: :func:`masked_mean` over every real token (DAPO).
    * ``seq_mean_token_mean``: each row's token mean, then the mean over the B rows (GRPO's
      paper); a row without real tokens counts 0.
    * ``seq_mean_token_sum_norm``: the sum over every real token / (B x ``norm_tokens``), a
      constant per batch shape (Dr. GRPO, arXiv 2503.20783; ``norm_tokens`` the response limit,
      ``generation.max_new_tokens``).

    Raises:
        ValueError: ``seq_mean_token_sum_norm`` without a positive ``norm_tokens``, or an unknown mode.
    """
    if mode == "token_mean":
        return masked_mean(x, mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(x, mask, dim=-1).mean()
    if mode == "seq_mean_token_sum_norm":
        if not norm_tokens or norm_tokens < 1:
            raise ValueError(f"loss_agg seq_mean_token_sum_norm divides by the response limit, and norm_tokens is "
                             f"{norm_tokens!r}; pass generation.max_new_tokens")
        return masked_sum(x, mask, dim=-1).sum() / (x.shape[0] * norm_tokens)
    raise ValueError(f"loss_agg {mode!r} is not one of token_mean, seq_mean_token_mean, seq_mean_token_sum_norm")


def micro_share(mask: Tensor, rows: Tensor, idx: Tensor, mode: LossAgg) -> Tensor:
    """The weight of rows ``rows``' loss in the loss of mini-batch rows ``idx`` (``rows`` a part
    of them), so that the weighted parts sum to the whole's :func:`aggregate`: their share of its
    real tokens (``token_mean``), else of its rows. A 0-d tensor on ``mask``'s device."""
    if mode == "token_mean":
        return mask[rows].sum() / mask[idx].sum().clamp_min(1.0)
    return torch.tensor(len(rows) / max(len(idx), 1), dtype=mask.dtype, device=mask.device)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Standardise ``x`` to zero mean and unit variance over the masked positions.

    Statistics are taken over all masked positions of the tensor (batch-level whitening of
    PPO advantages, as in OpenAI baselines ppo2). The variance is the population variance
    (divide by N, not N-1), matching ``group_normalized_advantages``.

    Values whose squares (or sum) overflow ``x``'s dtype (float32 rewards of 1e20: allowed, as
    GRPO's normalisation takes them) would make the variance infinite and every result 0; they
    are whitened as ``x / max|x|`` instead, the same quotient. Every other input takes the
    direct formula, bit for bit as before.

    Args:
        x: values, any shape (typically advantages ``[B, T]``).
        mask: 0/1 mask of the same shape.
        eps: added to the variance before the square root.
    Returns:
        ``(x - mean) / sqrt(var + eps)`` on masked positions, 0 elsewhere; same shape as ``x``.
    """
    mean = masked_mean(x, mask)
    centered = torch.where(mask.bool(), x - mean, torch.zeros_like(x))
    var = masked_mean(centered.square(), mask)
    if not bool(torch.isfinite(var)):  # one check a batch: the overflow, or a NaN/inf in x itself
        selected = torch.where(mask.bool(), x, torch.zeros_like(x))
        if bool(torch.isfinite(selected).all()):
            return _whiten_scaled(selected, mask, eps)
    return centered * torch.rsqrt(var + eps)


def _whiten_scaled(x: Tensor, mask: Tensor, eps: float) -> Tensor:
    """``masked_whiten`` of finite ``x`` (0 where unmasked) whose statistics overflow its
    dtype: of ``y = x / s``, ``s = max|x|``, every term fits, and ``(x - m) / sqrt(v + eps)`` is
    ``(y - m/s) / sqrt(v/s**2 + eps/s**2)``. ``eps/s**2`` underflows to 0, so values that are all
    equal (variance 0) give 0, as the direct formula does."""
    scale = x.abs().amax()
    y = x / scale
    mean = masked_mean(y, mask)
    centered = torch.where(mask.bool(), y - mean, torch.zeros_like(y))
    var = masked_mean(centered.square(), mask) + eps / scale.square()
    return torch.where(var > 0, centered * torch.rsqrt(var), torch.zeros_like(centered))
