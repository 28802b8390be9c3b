"""Assembling the training batch from scored shards.

Samples are sorted by (prompt id, sample index) so a prompt's group occupies contiguous rows
(``row // group_size`` is its group) and the batch is the same whatever the fan-out was.
Per-token tensors from shards of different widths are right-padded to the batch width T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from actions.config.workload import AlgorithmConfig
from actions.rl.sequences import PackedBatch, pack
from actions.store import ObjectStore
from actions.store.weights import load_tensors


@dataclass
class TrainBatch:
    packed: PackedBatch
    old_logp: torch.Tensor | None  # [B, T]; None where the update computes them (update.needs_old_logp)
    ref_logp: torch.Tensor | None  # [B, T]; None without a KL term (update.needs_ref_logp)
    rewards: torch.Tensor  # [B]
    values: torch.Tensor | None  # [B, T] (PPO)
    finish_reasons: list[str]
    prompts: list[list[int]]  # token ids, rows in batch order
    responses: list[list[int]]
    pad_id: int
    reward_applicable: list[bool] | None = None
    """Per row: did any reward function or model score it (None: shards scored before this was kept)."""
    temperature: float = 1.0
    """The rows' sampling temperature: the update's log-probs are of ``softmax(logits / temperature)``,
    as the scored ones (``TrainStepRequest.temperature``, ``actions/rl/head.py``)."""
    max_new_tokens: int | None = None
    """The rows' response limit (``TrainStepRequest.max_new_tokens``): the constant that
    ``algorithm.loss_agg: seq_mean_token_sum_norm`` divides each row's token sum by."""

    def scored(self) -> torch.Tensor:
        """``[B]`` bool on the rewards' device: rows a reward function or model scored (all, where
        ``reward_applicable`` is unknown). The others have no outcome: advantage 0 (``update.py``)."""
        if self.reward_applicable is None:
            return torch.ones_like(self.rewards, dtype=torch.bool)
        return torch.tensor(self.reward_applicable, dtype=torch.bool, device=self.rewards.device)

    def policy_mask(self, mask_truncated: bool) -> torch.Tensor:
        """The tokens the policy loss counts (``[B, T]``, ``response_mask``'s dtype): every real
        token, but for the rows cut at the length limit where ``mask_truncated``
        (``algorithm.mask_truncated``)."""
        mask = self.packed.response_mask
        if not mask_truncated:
            return mask
        kept = torch.tensor([r != "length" for r in self.finish_reasons], dtype=mask.dtype, device=mask.device)
        return mask * kept[:, None]

    def scored_mask(self) -> torch.Tensor:
        """``response_mask`` with the unscored rows' tokens set to 0 (``[B, T]``, same dtype)."""
        mask = self.packed.response_mask
        return mask * self.scored()[:, None].to(mask.dtype)

    def to(self, device: torch.device) -> TrainBatch:
        """Every tensor on ``device`` (the policy's), for the update loop."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return TrainBatch(self.packed.to(device), move(self.old_logp), move(self.ref_logp), self.rewards.to(device),
                          move(self.values), self.finish_reasons, self.prompts, self.responses, self.pad_id,
                          self.reward_applicable, self.temperature, self.max_new_tokens)


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad (or, for a shard scored at bucketed widths wider than the batch, crop the zero tail) to ``width``."""
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def gather_batch(store: ObjectStore, keys: list[str], algo: AlgorithmConfig, pad_id: int, *,
                 temperature: float = 1.0, max_new_tokens: int | None = None) -> TrainBatch:
    rows = []  # (identity, sample meta, per-row tensors)
    for key in keys:
        tensors, meta = load_tensors(store, key)
        for i, s in enumerate(meta["samples"]):
            per_row = {name: t[i] for name, t in tensors.items()}
            rows.append(((s["prompt_id"], s["sample_index"]), s, per_row))
    rows.sort(key=lambda r: r[0])
    if len({r[0] for r in rows}) != len(rows):
        raise ValueError("scored shards contain a sample twice; each sample must be scored exactly once")
    if len(rows) % algo.group_size:
        raise ValueError(f"{len(rows)} scored samples do not form whole groups of {algo.group_size}")
    packed = pack([r[1]["prompt"] for r in rows], [r[1]["response"] for r in rows], pad_id)
    T = packed.response_width

    def stack(name: str) -> torch.Tensor | None:
        if name not in rows[0][2]:  # not scored: see update.needs_old_logp / needs_ref_logp
            return None
        return torch.stack([_pad_to(r[2][name][None], T)[0] for r in rows]) * packed.response_mask

    return TrainBatch(packed, stack("old_logp"), stack("ref_logp"), torch.stack([r[2]["rewards"] for r in rows]),
                      stack("values") if algo.name == "ppo" else None, [r[1]["finish_reason"] for r in rows],
                      [r[1]["prompt"] for r in rows], [r[1]["response"] for r in rows], pad_id,
                      [bool(r[1].get("reward_applicable", True)) for r in rows], temperature, max_new_tokens)


def rollout_metrics(batch: TrainBatch, algo: AlgorithmConfig) -> dict[str, float]:
    """Reward and length statistics (the metric names of flows/step/metrics.py).

    The reward figures are over the scored rows only (``TrainBatch.scored``); stds are
    Bessel-corrected (TRL's; the advantages divide by the population std, ``advantage.py``), 0.0
    where fewer than 2 rows are scored. ``reward/mean`` (TRL's ``reward``) is their mean and
    ``reward/std`` the std of all of them (the batch's). ``reward_std`` and ``frac_reward_zero_std``
    are TRL's figures for the run's std scope (``algorithm.std_scope``, TRL's ``scale_rewards``):
    with ``group`` (also with ``scale_by_std`` false, TRL's ``none``, and for PPO) the mean over
    groups of each group's std, a group with at most one scored row counting 0, and the share of
    groups whose scored rewards are all equal or that have at most one scored row; with ``batch``
    the batch std, and 1.0 where every scored reward is equal, else 0.0 (the std each row is
    divided by). ``reward/frac_uniform_groups`` is that share of groups whatever the scope: every
    GRPO advantage of such a group is 0.
    """
    lengths = batch.packed.response_mask.sum(-1)
    scored = batch.scored()
    rewards = batch.rewards[scored]
    keep = scored.view(-1, algo.group_size)
    groups = batch.rewards.view(-1, algo.group_size)
    top = torch.where(keep, groups, torch.full_like(groups, -math.inf)).amax(-1)
    bottom = torch.where(keep, groups, torch.full_like(groups, math.inf)).amin(-1)
    uniform = float(((top == bottom) | (keep.sum(-1) <= 1)).float().mean())
    batch_std = float(rewards.std()) if len(rewards) > 1 else 0.0
    if algo.std_scope == "batch":
        trl_std, trl_zero = batch_std, float(len(rewards) < 2 or bool(rewards.amax() == rewards.amin()))
    else:
        trl_std, trl_zero = _mean_group_std(groups, keep), uniform
    return {
        "reward/mean": float(rewards.mean()) if len(rewards) else 0.0,
        "reward/std": batch_std,
        "reward_std": trl_std,
        "frac_reward_zero_std": trl_zero,
        "reward/frac_uniform_groups": uniform,
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": sum(r == "length" for r in batch.finish_reasons) / len(batch.finish_reasons),
        # rows no reward function or model applied to (every reward None): advantage 0, no signal
        "frac_reward_none": 1.0 - sum(scored.tolist()) / len(scored),
    }


def _mean_group_std(groups: torch.Tensor, keep: torch.Tensor) -> float:
    """The mean over groups (rows of ``groups``, ``[num_groups, G]``) of the Bessel-corrected std
    of each group's kept rewards (``keep``, same shape), 0 for a group with fewer than 2 kept."""
    count = keep.sum(-1).to(groups.dtype)
    kept = torch.where(keep, groups, torch.zeros_like(groups))
    mean = kept.sum(-1, keepdim=True) / count.clamp_min(1)[:, None]
    square = torch.where(keep, (groups - mean).square(), torch.zeros_like(groups)).sum(-1)
    std = torch.where(count > 1, (square / (count - 1).clamp_min(1)).sqrt(), torch.zeros_like(count))
    return float(std.mean())
