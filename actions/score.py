"""score action: rewards, old and reference log-probs (and critic values for PPO) for a shard.

Reads one or more rollout objects, scores every sample (its text without the tokenizer's special
tokens, ``loading.completion_text``, as TRL decodes it) with the configured reward functions
and reward models (``actions/tasks/rewards``; a function that fails raises
``RewardFunctionError``, an application error that is not retried; what the functions pass to
``log_metric`` comes back in ``reward_metrics``), and computes per-token log-probs under the
sampling policy (the "old" policy of the PPO ratio) and under the frozen reference, plus the
critic's values for PPO. Both log-probs are of the distribution the samples were drawn from,
``softmax(logits / temperature)`` at ``generation.temperature`` (``actions/rl/head.py``).
Under LoRA the reference is the policy's own backbone with the adapter switched off.
Each forward runs only where the update needs it: no reference model without a KL term
(``kl_coef: 0``), and no old log-probs where the update's own pass gives them (GRPO with one
epoch of one mini-batch, ``update.needs_old_logp``). The policy's weights are loaded only for
its own log-probs: the rewards and the token rows need the tokenizer alone. The output
is an artifact of tensors [B, T] (right-padded responses, T = the shard's widest row rounded
up to ``sequences.WIDTH_BUCKET``) and a meta table of the samples.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from actions.contracts import ModelRef, ScoreRequest, ScoreResult
from actions.engines.torch_slot import held_model
from actions.models.device import action_device
from actions.models.loading import completion_text, encode_prompt, load_model, load_tokenizer, store_for
from actions.models.lora import adapter_disabled
from actions.rl.critic_store import load_critic
from actions.rl.kl import kl_estimate
from actions.rl.masked import masked_mean
from actions.rl.sequences import per_row_widths, response_logprobs
from actions.rl.update import needs_old_logp, needs_ref_logp
from actions.runtime.adapter import run_action
from actions.store import get_json
from actions.store.weights import publish_tensors
from actions.tasks.rewards.model_scoring import metric_name, score_completions
from actions.tasks.stored import load_dataset


def _load_samples(req: ScoreRequest) -> list[dict]:
    store = store_for(req.policy.store_uri)
    samples = [s for key in req.rollout_keys for s in get_json(store, key)["samples"]]
    # Sorted by identity: the scored shard does not depend on how generation was split.
    return sorted(samples, key=lambda s: (s["prompt_id"], s["sample_index"]))


def _policy_model(ref: ModelRef) -> torch.nn.Module:
    """The sampling policy's model: the generation slot's where it holds this very version
    (generate ran in this process: no second copy), else the warm cache's."""
    held = held_model(ref)
    return held if held is not None else load_model(ref)[0]


def _reference_is_policy(req: ScoreRequest) -> bool:
    """Whether the reference is the sampling policy's own version (the first RL step, before any
    update): no second model is built (a 7B in bf16: 15 GB more), and its log-probs are the
    policy's, computed once."""
    return req.reference_key == req.policy.policy_key and req.policy.lora is None


def _reference_logprobs(req: ScoreRequest) -> Callable[..., torch.Tensor]:
    """Log-probs under the frozen reference. With LoRA over it (the reference is the
    backbone), the policy's own model with its adapter switched off: no second copy."""
    if req.policy.lora is not None and req.reference_key == req.policy.backbone_key:
        model = _policy_model(req.policy)

        def ref_logp(*args: object, **kwargs: object) -> torch.Tensor:
            with adapter_disabled(model):
                return response_logprobs(model, *args, temperature=req.temperature, **kwargs)

        return ref_logp
    if _reference_is_policy(req):  # the first step's: its weights are the model the policy already has
        return partial(response_logprobs, _policy_model(req.policy), temperature=req.temperature)
    ref_model, _, _ = load_model(req.policy.model_copy(update={"policy_key": req.reference_key, "policy_version": 0,
                                                               "weights_sha256": None, "lora": None,
                                                               "backbone_key": None}))
    return partial(response_logprobs, ref_model, temperature=req.temperature)


@torch.no_grad()
def run_score(req: ScoreRequest) -> ScoreResult:
    tokenizer, ids = load_tokenizer(req.policy)
    dataset = load_dataset(req.policy.store_uri, req.dataset_key)
    samples = _load_samples(req)
    encoded = {pid: encode_prompt(tokenizer, dataset[pid]) for pid in dict.fromkeys(s["prompt_id"] for s in samples)}
    prompts = [encoded[s["prompt_id"]] for s in samples]
    # A stopped sample ends with the EOS id it emitted (a model may have several).
    responses = [s["tokens"] + ([s.get("stop_token", ids.eos_id)] if s["finish_reason"] == "stop" else [])
                 for s in samples]
    texts = [completion_text(tokenizer, s["tokens"]) for s in samples]
    # Unscorable output (None from every function) is data, not an error: it earns no reward.
    epoch = req.step * req.algorithm.prompts_per_step / max(1, len(dataset))  # TRL's fractional epoch
    scored_rewards = score_completions(req, [dataset[s["prompt_id"]] for s in samples], texts, responses,
                                       req.policy.store_uri, epoch)
    rewards = torch.tensor(scored_rewards.total)
    # Only the forwards the update needs (update.needs_old_logp / needs_ref_logp).
    fns = {}
    if needs_old_logp(req.algorithm):  # the only use of the sampling policy's weights here
        fns["old_logp"] = partial(response_logprobs, _policy_model(req.policy), temperature=req.temperature)
    shared_ref = needs_ref_logp(req.algorithm) and "old_logp" in fns and _reference_is_policy(req)
    if needs_ref_logp(req.algorithm) and not shared_ref:
        fns["ref_logp"] = _reference_logprobs(req)
    if req.algorithm.name == "ppo":
        if req.critic_key is None:
            raise ValueError("ScoreRequest.critic_key is required when algorithm.name is ppo")
        fns["values"] = load_critic(req.policy.store_uri, req.policy.base_key, req.critic_key,
                                    dtype_setting=req.policy.dtype)
    # Each row at widths of its own: its log-probs do not depend on the shard it is scored in.
    device = action_device()  # where load_model puts every model (the critic's included)
    outs, mask = (per_row_widths(list(fns.values()), prompts, responses, ids.pad_id, device=device) if fns
                  else ([], None))
    scored = dict(zip(fns, outs))
    if shared_ref:
        scored["ref_logp"] = scored["old_logp"]
    tensors = {name: t.cpu() for name, t in scored.items()} | {"rewards": rewards}
    meta = {"samples": [{"prompt_id": s["prompt_id"], "sample_index": s["sample_index"], "prompt": list(p),
                         "response": r, "finish_reason": s["finish_reason"], "reward_applicable": a}
                        for s, p, r, a in zip(samples, prompts, responses, scored_rewards.applicable)]}
    publish_tensors(store_for(req.policy.store_uri), req.output_key, tensors, meta)
    # KL of the sampling policy to the reference where both were computed; else the update reports it.
    kl = (masked_mean(kl_estimate(scored["old_logp"], scored["ref_logp"], req.algorithm.kl_kind), mask)
          if {"old_logp", "ref_logp"} <= set(scored) else 0.0)
    shown = {m.name: metric_name(m) for m in req.reward_models}  # a reward model by its folder's name
    return ScoreResult(scored_key=req.output_key, num_samples=len(samples), reward_mean=float(rewards.mean()),
                       reward_sum=float(rewards.sum()), kl_mean=float(kl), reward_metrics=scored_rewards.metrics,
                       reward_values={shown.get(name, name): [float(v) for v in values if v is not None]
                                      for name, values in scored_rewards.per_function.items()})


def main(args: dict) -> dict:
    return run_action(ScoreRequest, run_score, args)
