"""train_step action: advantages and one policy update from the step's scored shards.

Gathers every scored sample (sorted by prompt id and sample index, so the batch does not
depend on the fan-out), computes advantages (GRPO: group-normalised outcome rewards; PPO:
GAE over KL-penalised token rewards with the critic's values), runs ``epochs`` passes of
``num_minibatches`` shuffled mini-batches (prompt groups stay together; each split into
``micro_batch_size`` micro batches whose gradients accumulate), and publishes policy version
v+1 in the training dtype and the optimizer state, fp32 master weights included under
bf16/fp16 (and the critic for PPO). With ``model.lora`` the version is the adapter alone (in
the training dtype) and the optimizer state covers only the adapter, its fp32 masters
included under bf16/fp16 (``actions/models/lora.py``). The policy (and critic) train with the
model's own dropout off (``actions/rl/dropout.py``), and the log-probs are of the distribution
the rollouts were sampled from, at ``generation.temperature`` (``actions/rl/head.py``).

A warm container keeps the model and optimizer state it just published, under the keys of
what it published (``trained_key``; PPO's critic and its optimizer state likewise,
``trained_critic_key``): the next step's training, when it lands on the same container (the
local pool routes it there, ``flows/invokers/idle.py``), starts from them instead of reading
them back from the store. They are the published tensors themselves, so the update is the same
bit for bit; anything else (another version, a retry after a failure) reads the store.

Besides the learning metrics, a one-rank step reports where its seconds went:
``train/load_s`` (model and optimizer state, from the warm cache or the store, and the
batch), ``train/update_s`` (advantages and every pass), ``train/publish_policy_s`` and
``train/publish_optimizer_s`` (hashing and writing each; the optimizer state, fp32 master
weights and moments, is the larger by far), and ``train/state_read_bytes``: the blob bytes of
the weights and optimizer states it fetched from the store (0 when it starts from what the warm
container kept, the policy and its optimizer state and PPO's critic and its optimizer state,
``train/reused_state`` and ``train/reused_critic_state``; a LoRA run's backbone counts only
when this container had not read it yet).
"""

from __future__ import annotations

import time

import torch

from actions.contracts import TrainStepRequest, TrainStepResult
from actions.models import warm
from actions.models.loading import counting_reader, load_model, store_for
from actions.models.lora import adapter_tensors
from actions.models.special_tokens import special_tokens
from actions.rl.batch import TrainBatch, gather_batch, rollout_metrics
from actions.rl.critic_store import load_critic
from actions.rl.dropout import disable_dropout
from actions.rl.recompute import enable_checkpointing
from actions.rl.update import make_optimizer, run_updates
from actions.rl.world_size import check_world_size
from actions.runtime.adapter import run_action
from actions.store import read_manifest
from actions.store.weights import publish_tensors


def trained_key(store_uri: str, policy_key: str, weights_sha256: str | None, dtype: str,
                optimizer_key: str | None) -> tuple:
    """Warm-cache key of a trained model and its optimizer state, by what was published."""
    return ("trained", store_uri, policy_key, weights_sha256, dtype, optimizer_key)


def trained_critic_key(store_uri: str, critic_key: str | None, dtype: str, optimizer_key: str | None) -> tuple:
    """Warm-cache key of a trained PPO critic and its optimizer state, by what was published."""
    return ("trained_critic", store_uri, critic_key, dtype, optimizer_key)


def run_train(req: TrainStepRequest) -> TrainStepResult:
    world = check_world_size(req.world_size, req.gpus_per_actor)
    if world > 1:
        return run_sharded(req, world)
    store = store_for(req.policy.store_uri)
    torch.manual_seed(req.seed * 100_003 + req.step)
    t_start = time.perf_counter()
    ref = req.policy
    fetched: list[int] = []  # blob bytes read from the store: weights, then optimizer states
    read = counting_reader(fetched)
    kept = warm.take(trained_key(ref.store_uri, ref.policy_key, ref.weights_sha256, ref.dtype, req.optimizer_key))
    if kept is not None:
        policy, tokenizer, opt_state = kept
    else:
        policy, tokenizer, _ = load_model(req.policy, fresh=True, read=read)
        opt_state = read(store, req.optimizer_key) if req.optimizer_key else None
    policy.train()
    disable_dropout(policy)  # log-probs without random masks, as scored (actions/rl/dropout.py)
    enable_checkpointing(policy, req.gradient_checkpointing)
    algo = req.algorithm
    batch: TrainBatch = gather_batch(store, req.scored_keys, algo, special_tokens(policy, tokenizer).pad_id,
                                     temperature=req.temperature, max_new_tokens=req.max_new_tokens)
    device = next(policy.parameters()).device
    batch = batch.to(device)
    opt = make_optimizer(policy, algo.lr)
    if opt_state is not None:
        opt.load_state_tensors(opt_state, where=req.optimizer_key or "")
    critic = critic_opt = kept_critic = None
    if algo.name == "ppo":
        kept_critic = warm.take(trained_critic_key(ref.store_uri, req.critic_key, ref.dtype, req.critic_optimizer_key))
        if kept_critic is not None and kept_critic[2] != _published(store, req.critic_key, req.critic_optimizer_key):
            kept_critic = None  # the keys were published again since (a retried step elsewhere): read them
        if kept_critic is not None:
            critic, critic_state, _ = kept_critic
        else:
            critic = load_critic(req.policy.store_uri, req.policy.base_key, req.critic_key, fresh=True,
                                 dtype_setting=req.policy.dtype, read=read)
            critic_state = critic.stored_optimizer_state(read(store, req.critic_optimizer_key)) \
                if req.critic_optimizer_key else None
        critic.train()
        disable_dropout(critic)
        enable_checkpointing(critic.lm, req.gradient_checkpointing)
        critic_opt = make_optimizer(critic, algo.critic_lr)
        if critic_state is not None:
            critic_opt.load_state_tensors(critic_state, where=req.critic_optimizer_key or "")
    metrics = rollout_metrics(batch, algo)
    metrics["train/reused_state"] = float(kept is not None)
    if critic is not None:
        metrics["train/reused_critic_state"] = float(kept_critic is not None)
    metrics["train/world_size"] = 1.0
    metrics["train/state_read_bytes"] = float(sum(fetched))
    t_loaded = time.perf_counter()
    metrics.update(run_updates(policy, opt, batch, algo, critic, critic_opt, seed=req.seed, step=req.step))
    if device.type == "cuda":  # the optimizer's last kernels may still run: time them as the update's
        torch.cuda.synchronize(device)
    t_updated = time.perf_counter()
    version = req.policy.policy_version + 1
    # A LoRA policy publishes its adapter only; the backbone was stored once, as version 0.
    pub = publish_tensors(store, f"{req.output_prefix}/policy/manifest.json", adapter_tensors(policy),
                          {"version": version, "step": req.step})
    t_policy = time.perf_counter()
    opt_pub = publish_tensors(store, f"{req.output_prefix}/optimizer/manifest.json", opt.state_tensors(),
                              scalars_in_meta=True)
    # where the step's seconds go: loading (model, optimizer state, batch), the update, and
    # publishing the version and the optimizer state (the last two every step, for a retry)
    metrics.update({"train/load_s": t_loaded - t_start, "train/update_s": t_updated - t_loaded,
                    "train/publish_policy_s": t_policy - t_updated,
                    "train/publish_optimizer_s": time.perf_counter() - t_policy})
    out = TrainStepResult(policy_key=pub.manifest_key, policy_version=version, weights_sha256=pub.weights_sha256,
                          optimizer_key=opt_pub.manifest_key,
                          bytes_uploaded=pub.stats.bytes_uploaded + opt_pub.stats.bytes_uploaded, metrics=metrics)
    policy.zero_grad(set_to_none=True)
    warm.put(trained_key(ref.store_uri, pub.manifest_key, pub.weights_sha256, ref.dtype, opt_pub.manifest_key),
             (policy, tokenizer, opt.state_tensors()))
    if critic is not None:
        c = publish_tensors(store, f"{req.output_prefix}/critic/manifest.json", critic.tensors())
        co = publish_tensors(store, f"{req.output_prefix}/critic_optimizer/manifest.json", critic_opt.state_tensors(),
                             scalars_in_meta=True)
        out.critic_key, out.critic_optimizer_key = c.manifest_key, co.manifest_key
        critic.zero_grad(set_to_none=True)
        warm.put(trained_critic_key(ref.store_uri, c.manifest_key, ref.dtype, co.manifest_key),
                 (critic, critic_opt.state_tensors(), (c.weights_sha256, co.weights_sha256)))
    return out


def _published(store, *manifest_keys: str | None) -> tuple:
    """The ``weights_sha256`` the manifests under ``manifest_keys`` record now: the warm critic is
    kept under its manifests' keys, which a step published again (a retry on another container
    after an interrupted commit) may fill with other tensors; the policy's key has its
    ``weights_sha256`` for that."""
    return tuple(None if k is None else read_manifest(store, k).get("meta", {}).get("weights_sha256")
                 for k in manifest_keys)


def run_sharded(req: TrainStepRequest, world: int) -> TrainStepResult:
    """The step on ``world`` FSDP2 ranks (``actions/rl/sharded_train.py``), each with its share
    of this activation's threads on the CPU."""
    from actions.models.device import action_device
    from actions.rl.ranks import run_on_ranks
    from actions.rl.sharded_train import train_on_rank

    # the device the ranks compute on (``sharded_train.rank_device``), so ``auto`` without CUDA is gloo
    backend = "nccl" if action_device().type == "cuda" else "gloo"
    threads = max(1, torch.get_num_threads() // world)
    out = run_on_ranks(train_on_rank, world, (req.model_dump(mode="json"), threads), backend=backend,
                       what="train rank")
    return TrainStepResult.model_validate(out)


def main(args: dict) -> dict:
    return run_action(TrainStepRequest, run_train, args)
