"""GRPO loss parity with TRL's ``GRPOTrainer._compute_loss`` on fixed inputs.

TRL is a benchmark-only dependency (``pip install 'rlhfless[bench]'``, ``make bench``); these
tests skip without it. TRL's loss runs unchanged on a stand-in trainer object carrying only the
attributes the loss reads, with the policy log-probs fixed (its model forward is replaced by
the same tensor ours takes), so the comparison covers exactly the loss arithmetic.

Semantics aligned for the comparison (the remaining differences, measured in
docs/results.md): ``loss_type="dapo"`` with one accumulation step (token mean over the batch,
ours), ``use_bias_correction_kl=False`` (TRL multiplies the k3 KL by the importance ratio by
default), ``epsilon_low/high`` = our ``clip_low/high``, ``beta`` = our ``kl_coef`` with k3.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from actions.rl.grpo_loss import grpo_loss

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


def _trl_loss(logp, old, ref, adv, mask, *, beta, clip_low, clip_high, loss_type="dapo", bias_correction=False,
              max_completion_length=None):
    model = torch.nn.Linear(1, 1)  # .training is all the loss reads from it
    acc = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x, gather_for_metrics=lambda x: x,
                          reduce=lambda x, reduction="sum": x)
    fake = SimpleNamespace(
        top_entropy_quantile=1.0, aux_loss_enabled=False, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type=loss_type, epsilon_low=clip_low,
        epsilon_high=clip_high, use_vllm=False, model=model, current_gradient_accumulation_steps=1,
        accelerator=acc, _entropy_bonus_enabled=False, max_completion_length=max_completion_length,
        _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=bias_correction, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None))
    B, T = logp.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    return trl_grpo.GRPOTrainer._compute_loss(fake, model, inputs)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 12
    mask = torch.ones(B, T)
    for i, n in enumerate([12, 3, 7, 12, 1, 9, 5, 11]):  # ragged responses
        mask[i, n:] = 0
    old = -torch.rand(B, T, generator=g) * 3 - 0.05
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)  # ratios inside and outside the clip
    ref = old + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_and_gradient_match_trl_with_aligned_semantics(beta):
    logp, old, ref, adv, mask = _inputs()
    ours_logp = logp.clone().requires_grad_(True)
    trl_logp = logp.clone().requires_grad_(True)
    ours, _ = grpo_loss(ours_logp, old, ref if beta else None, adv, mask, clip_low=0.2, clip_high=0.28,
                        kl_coef=beta, kl_kind="k3")
    theirs = _trl_loss(trl_logp, old, ref, adv, mask, beta=beta, clip_low=0.2, clip_high=0.28)
    ours.backward()
    theirs.backward()
    assert abs(ours.item() - theirs.item()) <= 1e-6
    assert (ours_logp.grad - trl_logp.grad).abs().max().item() <= 1e-6


@pytest.mark.parametrize("loss_type,loss_agg", [("grpo", "seq_mean_token_mean"), ("dr_grpo", "seq_mean_token_sum_norm"),
                                                ("bnpo", "token_mean")])
def test_each_trl_loss_type_matches_its_loss_agg(loss_type, loss_agg):
    """README's mapping of TRL's ``loss_type``: the loss and its gradient match, the KL term
    reduced as the surrogate is (TRL adds it per token before reducing)."""
    logp, old, ref, adv, mask = _inputs(2)
    ours_logp = logp.clone().requires_grad_(True)
    trl_logp = logp.clone().requires_grad_(True)
    ours, _ = grpo_loss(ours_logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_kind="k3",
                        loss_agg=loss_agg, norm_tokens=16)
    theirs = _trl_loss(trl_logp, old, ref, adv, mask, beta=0.04, clip_low=0.2, clip_high=0.28, loss_type=loss_type,
                       max_completion_length=16)
    ours.backward()
    theirs.backward()
    assert abs(ours.item() - theirs.item()) <= 1e-6
    assert (ours_logp.grad - trl_logp.grad).abs().max().item() <= 1e-6


def test_trl_defaults_differ_where_documented():
    logp, old, ref, adv, mask = _inputs(1)
    ours, _ = grpo_loss(logp, old, ref, adv, mask, clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_kind="k3")
    # TRL's default KL bias correction multiplies the KL by the ratio: a different loss
    corrected = _trl_loss(logp, old, ref, adv, mask, beta=0.04, clip_low=0.2, clip_high=0.28, bias_correction=True)
    # "grpo" averages within each sequence first, then over sequences (the original paper)
    per_seq = _trl_loss(logp, old, ref, adv, mask, beta=0.04, clip_low=0.2, clip_high=0.28, loss_type="grpo")
    assert abs(ours.item() - corrected.item()) > 1e-4 and abs(ours.item() - per_seq.item()) > 1e-4
