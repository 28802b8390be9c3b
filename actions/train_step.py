"""train_step action: advantages and one policy update from the step's scored shards.

Gathers every scored sample (sorted by prompt id and sample index, so the batch does not
depend on the fan-out), computes advantages (GRPO: group-normalised outcome rewards; PPO:
GAE over KL-penalised token rewards with the critic's values), runs ``epochs`` passes of
``num_minibatches`` shuffled mini-batches (prompt groups stay together), and publishes policy
version v+1 and the optimizer state (and the critic for PPO).
"""

from __future__ import annotations

import torch

from actions.common.adapter import run_action
from actions.common.contracts import TrainStepRequest, TrainStepResult
from actions.common.critic_store import load_critic
from actions.common.loading import load_model, store_for
from actions.common.optim_state import load_optimizer_tensors, optimizer_tensors
from actions.common.special_tokens import special_tokens
from actions.common.weights import load_tensors, publish_tensors
from actions.rl.batch import TrainBatch, gather_batch, rollout_metrics
from actions.rl.update import make_optimizer, run_updates


def run_train(req: TrainStepRequest) -> TrainStepResult:
    store = store_for(req.policy.store_uri)
    torch.manual_seed(req.seed * 100_003 + req.step)
    policy, tokenizer, _ = load_model(req.policy, fresh=True)
    policy.train()
    algo = req.algorithm
    batch: TrainBatch = gather_batch(store, req.scored_keys, algo, special_tokens(policy, tokenizer).pad_id)
    batch = batch.to(next(policy.parameters()).device)
    opt = make_optimizer(policy, algo.lr)
    if req.optimizer_key:
        load_optimizer_tensors(opt, load_tensors(store, req.optimizer_key)[0], where=req.optimizer_key)
    critic = critic_opt = None
    if algo.name == "ppo":
        critic = load_critic(req.policy.store_uri, req.policy.base_key, req.critic_key, fresh=True)
        critic.train()
        critic_opt = make_optimizer(critic, algo.critic_lr)
        if req.critic_optimizer_key:
            load_optimizer_tensors(critic_opt, load_tensors(store, req.critic_optimizer_key)[0],
                                   where=req.critic_optimizer_key)
    metrics = rollout_metrics(batch, algo)
    metrics.update(run_updates(policy, opt, batch, algo, critic, critic_opt, seed=req.seed, step=req.step))
    version = req.policy.policy_version + 1
    pub = publish_tensors(store, f"{req.output_prefix}/policy/manifest.json", policy.state_dict(),
                          {"version": version, "step": req.step})
    opt_pub = publish_tensors(store, f"{req.output_prefix}/optimizer/manifest.json", optimizer_tensors(opt))
    out = TrainStepResult(policy_key=pub.manifest_key, policy_version=version, weights_sha256=pub.weights_sha256,
                          optimizer_key=opt_pub.manifest_key,
                          bytes_uploaded=pub.stats.bytes_uploaded + opt_pub.stats.bytes_uploaded, metrics=metrics)
    if critic is not None:
        c = publish_tensors(store, f"{req.output_prefix}/critic/manifest.json", critic.tensors())
        co = publish_tensors(store, f"{req.output_prefix}/critic_optimizer/manifest.json", optimizer_tensors(critic_opt))
        out.critic_key, out.critic_optimizer_key = c.manifest_key, co.manifest_key
    return out


def main(args: dict) -> dict:
    return run_action(TrainStepRequest, run_train, args)
