"""The update loop of ``update.py`` on several FSDP2 ranks: the same mini-batches, the same loss,
the mini-batch's forward passes shared out among the ranks.

A mini-batch's work is cut into *jobs*, each one forward call and one backward call: for the
policy, a micro batch's rows of one width bucket (``sequences.per_row_widths`` makes exactly
these calls on one rank, so every row's log-probs are computed in the same shapes); for the
critic, one micro batch. Job ``j`` runs on rank ``j % world``. FSDP2 gathers and reduces in
every forward and backward, so each rank must make the same number of calls: a rank with fewer
jobs repeats its first one with a weight of zero.

A job's loss weighted by its share of the mini-batch (``masked.micro_share``: of its real
tokens for the token mean, of its rows for ``algorithm.loss_agg``'s per-sequence reductions)
sums, over jobs, to the one-rank loss; the ranks' gradients are summed
(``fsdp.shard``) and the update equals the one-rank update up to the order of float additions.
A job's LoRA dropout masks are seeded by the mini-batch and the job's first row, as the one-rank
call with those rows seeds them (``update.call_masks``), so dropout does not break this.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import partial

import torch

from actions.config.workload import AlgorithmConfig
from actions.rl.batch import TrainBatch
from actions.rl.critic import Critic
from actions.rl.fsdp import all_sum
from actions.rl.optimizer import TrainOptimizer
from actions.rl.ppo_loss import value_loss
from actions.rl.sequences import CUDA_ROW_BLOCK, bucket_widths, per_row_widths, response_logprobs
from actions.rl.update import (
    CRITIC_SKIPPED,
    SKIPPED,
    add_weighted,
    call_masks,
    micro_batches,
    policy_loss,
    run_updates,
    shares,
)


class LogprobRoot(torch.nn.Module):
    """The policy as FSDP's root unit: one call computes a packed group's log-probs and
    entropies (``[b, T, 2]``) at the rows' sampling ``temperature``, so the output head runs
    inside the root's gather."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, packed, temperature: float = 1.0) -> torch.Tensor:
        logp, entropy = response_logprobs(self.policy, packed, with_entropy=True, temperature=temperature)
        return torch.stack([logp, entropy], dim=-1)


@dataclass(frozen=True)
class Job:
    rows: tuple[int, ...]
    weight_scale: float  # 1 for real work, 0 for a rank's filler call


def policy_jobs(batch: TrainBatch, idx: torch.Tensor, algo: AlgorithmConfig, row_block: int | None) -> list[Job]:
    """One job per (micro batch, width bucket[, block of ``row_block`` rows])."""
    jobs = []
    for mb in micro_batches(idx, algo):
        groups: dict[tuple[int, int], list[int]] = {}
        for i in mb.tolist():
            groups.setdefault(bucket_widths(len(batch.prompts[i]), len(batch.responses[i])), []).append(i)
        for _, rows in sorted(groups.items()):
            block = row_block or len(rows)
            jobs += [Job(tuple(rows[s:s + block]), 1.0) for s in range(0, len(rows), block)]
    return jobs


def rank_share(jobs: list[Job], rank: int, world: int) -> list[Job]:
    """Rank ``rank``'s jobs, topped up with zero-weight repeats to ``ceil(len(jobs) / world)``."""
    mine = jobs[rank::world]
    count = math.ceil(len(jobs) / world)
    filler = Job((mine or jobs)[0].rows, 0.0)
    return mine + [filler] * (count - len(mine))


def _policy_pass(root: LogprobRoot, opt: TrainOptimizer, batch: TrainBatch, adv: torch.Tensor, idx: torch.Tensor,
                 algo: AlgorithmConfig, *, rank: int, world: int, masks: int | None = None) -> dict[str, float]:
    device = batch.packed.input_ids.device
    mask = batch.policy_mask(algo.mask_truncated)
    T = batch.packed.response_width
    row_block = CUDA_ROW_BLOCK if device.type == "cuda" else None
    metrics: dict[str, float] = defaultdict(float)
    opt.zero_grad()
    for job in rank_share(policy_jobs(batch, idx, algo, row_block), rank, world):
        rows = torch.tensor(job.rows, device=device)
        logprobs = partial(root, temperature=batch.temperature)
        (out,), _ = per_row_widths([logprobs], [batch.prompts[i] for i in job.rows],
                                   [batch.responses[i] for i in job.rows], batch.pad_id, device=device,
                                   row_block=row_block, each_call=call_masks(masks, list(job.rows), device))
        out = torch.nn.functional.pad(out, (0, 0, 0, max(0, T - out.shape[1])))[:, :T]
        loss, m = policy_loss(out[..., 0], out[..., 1], batch, adv, rows, algo)
        share, tokens = (s * job.weight_scale for s in shares(mask, rows, idx, algo))
        (loss * share).backward()
        add_weighted(metrics, m, share, tokens)
    metrics = defaultdict(float, all_sum(dict(metrics), device))
    metrics["grad_norm"] = opt.step(algo.max_grad_norm)  # the same whole norm, so the same skip, on every rank
    metrics[SKIPPED] = float(not math.isfinite(metrics["grad_norm"]))
    return metrics


def _critic_pass(critic: Critic, opt: TrainOptimizer, batch: TrainBatch, ret: torch.Tensor, idx: torch.Tensor,
                 algo: AlgorithmConfig, *, rank: int, world: int) -> dict[str, float]:
    device = batch.packed.input_ids.device
    mask = batch.scored_mask()  # as update._critic_pass: unscored rows have no value target
    total = mask[idx].sum().clamp_min(1.0)
    metrics: dict[str, float] = defaultdict(float)
    opt.zero_grad()
    jobs = [Job(tuple(mb.tolist()), 1.0) for mb in micro_batches(idx, algo)]
    for job in rank_share(jobs, rank, world):
        rows = torch.tensor(job.rows, device=device)
        values = critic(batch.packed.select(rows))
        vloss, m = value_loss(values, batch.values[rows], ret[rows], mask[rows], clip=algo.value_clip)
        share = mask[rows].sum() / total * job.weight_scale
        (vloss * share).backward()
        for k, v in m.items():
            metrics[k] += v * float(share)
    out = all_sum(dict(metrics), device)
    out[CRITIC_SKIPPED] = float(not math.isfinite(opt.step(algo.max_grad_norm)))
    return out


def run_sharded_updates(root: LogprobRoot, opt: TrainOptimizer, batch: TrainBatch, algo: AlgorithmConfig,
                        critic: Critic | None, critic_opt: TrainOptimizer | None, *, seed: int, step: int,
                        rank: int, world: int) -> dict[str, float]:
    """``update.run_updates`` with the forward and backward passes shared among ``world``
    ranks; every rank holds the whole ``batch`` and returns the same metrics."""
    return run_updates(root, opt, batch, algo, critic, critic_opt, seed=seed, step=step,
                       policy_pass=partial(_policy_pass, rank=rank, world=world),
                       critic_pass=partial(_critic_pass, rank=rank, world=world))
