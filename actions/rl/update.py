"""The policy (and critic) update loop shared by GRPO and PPO.

Advantages: GRPO uses group-normalised outcome rewards with the KL to the reference as a loss
term; PPO uses GAE over token rewards that carry the KL as a per-token penalty and the outcome
at the last token, whitened over the batch. Both estimate the KL with ``algorithm.kl_kind``
(unset: k3 for GRPO, k1 for PPO). Mini-batches are shuffled prompt groups drawn from a
generator seeded by (seed, step), so an update is reproducible. So are LoRA's dropout masks
(``model.lora.dropout``): each forward call draws them from a generator seeded by (seed, step,
epoch, mini-batch, the call's first row) (``dropout.seeded_masks``), so a row gets the same
masks on one rank and on several (``sharded_update.py``), and on a resumed run.

Micro-batches (``algorithm.micro_batch_size``): each mini-batch is split into micro batches
whose gradients are accumulated before the optimizer step. A micro batch's loss is weighted by
its share of the mini-batch (``masked.micro_share``: of its real tokens for the token mean,
``algorithm.loss_agg``'s default, of its rows for the per-sequence reductions): the sum of the
weighted losses is the mini-batch's loss, and the update equals the unsplit one up to float
round-off. ``loss/policy`` and ``loss`` are combined with the same weights, the token means among the
metrics (``clipfrac``, ``ratio_mean``, ``kl``, ``entropy``) with the tokens' shares.

The policy's log-probs are computed like the score action's (``sequences.per_row_widths``:
each row at widths of its own, the output head in chunks, at the batch's sampling temperature;
the train action turns the model's dropout off, ``dropout.py``), so on the first mini-batch of
the first epoch they equal the scored ``old_logp`` bit for bit. That is what makes the
one-pass shortcut exact (``needs_old_logp``): where the policy has not moved between scoring
and a mini-batch (one epoch of one mini-batch, GRPO), ``old_logp`` is this pass's own
log-probs, detached, and the score action does not compute them.

A mini-batch whose gradient norm is not finite (an infinite reward, a NaN loss) makes no
optimizer step (``TrainOptimizer.step``): the weights and optimizer state stay as they were,
``grad_norm`` keeps the NaN or inf (so ``nonfinite_update`` warns), and ``SKIPPED`` counts it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from actions.config.workload import AlgorithmConfig
from actions.rl.advantage import gae, group_normalized_advantages, kl_penalized_token_rewards
from actions.rl.batch import TrainBatch
from actions.rl.critic import Critic
from actions.rl.dropout import mask_seed, seeded_masks
from actions.rl.grpo_loss import grpo_loss
from actions.rl.kl import kl_estimate
from actions.rl.masked import masked_mean, masked_whiten, micro_share
from actions.rl.optimizer import TrainOptimizer
from actions.rl.ppo_loss import ppo_policy_loss, value_loss
from actions.rl.sequences import per_row_widths, response_logprobs

SKIPPED = "train/skipped_nonfinite"
"""Metric: the policy's optimizer steps of this train step that were skipped because the
mini-batch's gradient norm was not finite (``TrainOptimizer.step``); a count, not a mean."""
CRITIC_SKIPPED = "train/critic_skipped_nonfinite"
"""Metric: the same count for the critic's optimizer steps (PPO)."""
COUNTS = (SKIPPED, CRITIC_SKIPPED)
"""Metrics summed over the mini-batches of a step, where the others are averaged."""


def needs_old_logp(algo: AlgorithmConfig) -> bool:
    """Whether the score action must compute the sampling policy's log-probs.

    Not for GRPO with one epoch of one mini-batch: the policy trained on the batch is then the
    policy that sampled it (on-policy data), unchanged until its only update, and the update
    pass's own log-probs are the old ones. PPO needs them before any update, for the KL
    penalty inside its advantages.
    """
    return algo.name == "ppo" or algo.epochs > 1 or algo.num_minibatches > 1


def needs_ref_logp(algo: AlgorithmConfig) -> bool:
    """Whether the reference model has to run: only for a KL term with a non-zero weight."""
    return algo.kl_coef > 0


def make_optimizer(module: torch.nn.Module, lr: float) -> TrainOptimizer:
    return TrainOptimizer(module, lr)


def compute_advantages(batch: TrainBatch, algo: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages, returns): GRPO [B] and None; PPO [B, T] and [B, T].

    A row no reward function or model scored (``TrainBatch.scored``) has advantage 0: GRPO
    leaves it out of its group's statistics (``advantage.py``), PPO out of the whitening
    statistics (and ``_critic_pass`` out of the value loss), its stand-in reward 0 being no outcome.
    """
    scored = batch.scored()
    if algo.name == "grpo":
        return group_normalized_advantages(batch.rewards, algo.group_size, scale_by_std=algo.scale_by_std,
                                           scored=scored, std_scope=algo.std_scope), None
    mask = batch.packed.response_mask
    if batch.old_logp is None:
        raise ValueError("PPO needs the scored old_logp; the score action computes them for algorithm.name ppo")
    ref = batch.ref_logp if batch.ref_logp is not None else batch.old_logp  # kl_coef == 0: no penalty
    token_rewards = kl_penalized_token_rewards(batch.rewards, batch.old_logp, ref, mask, algo.kl_coef, algo.kl_kind)
    adv, ret = gae(token_rewards, batch.values, mask, algo.gamma, algo.gae_lambda)
    return masked_whiten(adv, batch.scored_mask()), ret


def minibatches(num_rows: int, algo: AlgorithmConfig, gen: torch.Generator) -> list[torch.Tensor]:
    """The row indices of ``algo.num_minibatches`` mini-batches: the prompt groups in a seeded
    random order, split into that many runs of whole groups as equal as they can be (sizes
    differ by one group at most where ``num_minibatches`` does not divide the prompts).

    The groups are split, not the rows: a row split (``chunk``) could cut a group in two and,
    with ceil-sized chunks, give fewer optimizer steps than asked (6 prompts in 4 gave 3).
    Where the prompts divide evenly (the default config) both splits are the same, row for row.
    """
    groups = torch.randperm(num_rows // algo.group_size, generator=gen)
    offsets = torch.arange(algo.group_size)
    return [(part[:, None] * algo.group_size + offsets).flatten()
            for part in groups.tensor_split(algo.num_minibatches) if len(part)]


def policy_logprobs(policy: torch.nn.Module, batch: TrainBatch, idx: torch.Tensor, masks: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropy) of rows ``idx``, ``[len(idx), T]`` at the batch's width T, computed
    as the score action computes them (each row at its own bucketed widths). ``masks``: the
    optimizer step's key of LoRA's dropout masks (``dropout.mask_seed``), each forward call's
    masks drawn from it and the call's first row; none: from the global generator."""
    rows = idx.tolist()
    device = batch.packed.input_ids.device

    def stats(packed):
        logp, entropy = response_logprobs(policy, packed, with_entropy=True, temperature=batch.temperature)
        return torch.stack([logp, entropy], dim=-1)

    (out,), _ = per_row_widths([stats], [batch.prompts[i] for i in rows], [batch.responses[i] for i in rows],
                               batch.pad_id, device=device, each_call=call_masks(masks, rows, device))
    T = batch.packed.response_width
    if out.shape[1] < T:
        out = torch.nn.functional.pad(out, (0, 0, 0, T - out.shape[1]))
    out = out[:, :T]
    return out[..., 0], out[..., 1]


def call_masks(masks: int | None, rows: list[int], device: torch.device
               ) -> Callable[[list[int]], AbstractContextManager] | None:
    """``per_row_widths``'s ``each_call`` for the batch rows ``rows``: each call's dropout masks
    seeded by ``masks`` and the batch row of its first row, so they do not depend on which
    other calls ran before it (or on which rank: ``sharded_update.py``)."""
    if masks is None:
        return None
    return lambda local: seeded_masks(mask_seed(masks, rows[local[0]]), device)


def micro_batches(idx: torch.Tensor, algo: AlgorithmConfig) -> list[torch.Tensor]:
    return list(idx.split(algo.micro_batch_size or len(idx)))


def _policy_pass(policy: torch.nn.Module, opt: TrainOptimizer, batch: TrainBatch, adv: torch.Tensor,
                 idx: torch.Tensor, algo: AlgorithmConfig, *, masks: int | None = None) -> dict[str, float]:
    """One optimizer step of the policy on mini-batch ``idx``, gradients accumulated over micro
    batches; ``masks`` keys LoRA's dropout masks (``policy_logprobs``)."""
    metrics: dict[str, float] = defaultdict(float)
    mask = batch.policy_mask(algo.mask_truncated)
    opt.zero_grad()
    for mb in micro_batches(idx, algo):
        logp, entropy = policy_logprobs(policy, batch, mb, masks)
        loss, m = policy_loss(logp, entropy, batch, adv, mb, algo)
        share, tokens = shares(mask, mb, idx, algo)  # 1 without micro batches
        (loss * share).backward()
        add_weighted(metrics, m, share, tokens)
    metrics["grad_norm"] = opt.step(algo.max_grad_norm)
    metrics[SKIPPED] = float(not math.isfinite(metrics["grad_norm"]))
    return metrics


def shares(mask: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor, algo: AlgorithmConfig
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss's weight, the token means' weight) of mini-batch ``idx``'s rows ``rows``
    (``masked.micro_share``); one tensor twice for ``algorithm.loss_agg: token_mean``."""
    tokens = micro_share(mask, rows, idx, "token_mean")
    return (tokens if algo.loss_agg == "token_mean" else micro_share(mask, rows, idx, algo.loss_agg)), tokens


LOSS_KEYS = ("loss/policy", "loss")
"""Metrics that are a loss reduced as ``algorithm.loss_agg`` says, not a token mean."""


def add_weighted(metrics: dict[str, float], part: dict[str, float], share: torch.Tensor,
                 tokens: torch.Tensor) -> None:
    """Add a part's metrics ``part`` into ``metrics``: the losses (``LOSS_KEYS``) weighted by
    ``share`` (the loss's own weight), the token means by ``tokens`` (the part's share of the tokens)."""
    for k, v in part.items():
        metrics[k] += v * float(share if k in LOSS_KEYS else tokens)


def policy_loss(logp: torch.Tensor, entropy: torch.Tensor, batch: TrainBatch, adv: torch.Tensor, rows: torch.Tensor,
                algo: AlgorithmConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The algorithm's policy loss (reduced as ``algorithm.loss_agg`` says) over batch rows
    ``rows``, whose log-probs and entropies ``[len(rows), T]`` are given, with its metrics
    (entropy included)."""
    sub_mask = batch.policy_mask(algo.mask_truncated)[rows]
    old = batch.old_logp[rows] if batch.old_logp is not None else logp.detach()
    if algo.name == "grpo":
        ref = batch.ref_logp[rows] if batch.ref_logp is not None else None
        loss, m = grpo_loss(logp, old, ref, adv[rows], sub_mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                            kl_coef=algo.kl_coef if ref is not None else 0.0, kl_kind=algo.kl_kind,
                            loss_agg=algo.loss_agg, norm_tokens=batch.max_new_tokens)
    else:
        loss, m = ppo_policy_loss(logp, old, adv[rows], sub_mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
                                  loss_agg=algo.loss_agg, norm_tokens=batch.max_new_tokens)
    m["entropy"] = float(masked_mean(entropy.detach(), sub_mask))
    return loss, m


def _critic_pass(critic: Critic, opt: TrainOptimizer, batch: TrainBatch, ret: torch.Tensor, idx: torch.Tensor,
                 algo: AlgorithmConfig) -> dict[str, float]:
    """One optimizer step of the critic on mini-batch ``idx``; unscored rows have no value target."""
    mask = batch.scored_mask()
    total = mask[idx].sum().clamp_min(1.0)
    metrics: dict[str, float] = defaultdict(float)
    opt.zero_grad()
    for mb in micro_batches(idx, algo):
        values = critic(batch.packed.select(mb))
        vloss, m = value_loss(values, batch.values[mb], ret[mb], mask[mb], clip=algo.value_clip)
        share = mask[mb].sum() / total
        (vloss * share).backward()
        for k, v in m.items():
            metrics[k] += v * float(share)
    metrics[CRITIC_SKIPPED] = float(not math.isfinite(opt.step(algo.max_grad_norm)))
    return metrics


PolicyPass = Callable[..., dict[str, float]]
"""One optimizer step of the policy on a mini-batch's rows: (policy, opt, batch, adv, idx, algo, *, masks)
-> metrics, ``masks`` the step's key of the dropout masks (``policy_logprobs``)."""
CriticPass = Callable[[Critic, TrainOptimizer, TrainBatch, torch.Tensor, torch.Tensor, AlgorithmConfig],
                      dict[str, float]]


def run_updates(policy: torch.nn.Module, opt: TrainOptimizer, batch: TrainBatch, algo: AlgorithmConfig,
                critic: Critic | None, critic_opt: TrainOptimizer | None, *, seed: int, step: int,
                policy_pass: PolicyPass | None = None, critic_pass: CriticPass | None = None) -> dict[str, float]:
    """``algo.epochs`` passes over the seeded mini-batches, one policy (and critic) step each;
    the metrics averaged over the steps, but the skipped steps' counts (``COUNTS``) summed.
    ``policy_pass``/``critic_pass`` replace the one-rank passes (the sharded learner's,
    ``sharded_update.py``)."""
    policy_pass, critic_pass = policy_pass or _policy_pass, critic_pass or _critic_pass
    if batch.old_logp is None and needs_old_logp(algo):
        raise ValueError(f"the scored shards have no old_logp, but algorithm {algo.name} with epochs={algo.epochs}, "
                         f"num_minibatches={algo.num_minibatches} needs them; score with this algorithm config")
    adv, ret = compute_advantages(batch, algo)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    sums: dict[str, float] = defaultdict(float)
    count = 0
    for epoch in range(algo.epochs):
        for number, idx in enumerate(minibatches(len(batch.rewards), algo, gen)):
            m = policy_pass(policy, opt, batch, adv, idx, algo, masks=mask_seed(seed, step, epoch, number))
            if critic is not None:
                m.update(critic_pass(critic, critic_opt, batch, ret, idx, algo))
            for k, v in m.items():
                sums[k] += v
            count += 1
    out = {k: v if k in COUNTS else v / count for k, v in sums.items()}
    if algo.name == "ppo" and batch.ref_logp is not None:  # the KL the penalty saw, as GRPO's metric name
        kl = kl_estimate(batch.old_logp, batch.ref_logp, algo.kl_kind)
        out["kl"] = float(masked_mean(kl, batch.packed.response_mask))
    return out
