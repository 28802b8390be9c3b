"""TRL ``GRPOConfig`` names a migrating user may type, and the RLHFless settings they map to
(README, "Coming from TRL"): an unknown key that is one of them is answered with its setting."""

from __future__ import annotations

TRL_SETTINGS = {
    "num_generations": "algorithm.group_size",
    "beta": "algorithm.kl_coef",
    "epsilon": "algorithm.clip_low",
    "epsilon_high": "algorithm.clip_high",
    "learning_rate": "algorithm.lr",
    "num_iterations": "algorithm.epochs",
    "steps_per_generation": "algorithm.num_minibatches = steps_per_generation / gradient_accumulation_steps "
                            "(1 for TRL's default)",
    "gradient_accumulation_steps": "algorithm.num_minibatches = steps_per_generation / gradient_accumulation_steps "
                                   "(1 for TRL's default)",
    "per_device_train_batch_size": "algorithm.micro_batch_size",
    "scale_rewards": "algorithm.scale_by_std (true for group, false for none) and algorithm.std_scope (batch: "
                     "scale_by_std true, std_scope batch)",
    "max_completion_length": "generation.max_new_tokens",
    "max_steps": "steps = max_steps / (algorithm.epochs x algorithm.num_minibatches)",
    "reward_funcs": "reward.functions",
    "reward_weights": "the weight of each reward.functions entry",
    "mask_truncated_completions": "algorithm.mask_truncated",
    "loss_type": "algorithm.loss_agg (dapo: token_mean; bnpo: token_mean with micro_batch_size unset; "
                 "grpo: seq_mean_token_mean; dr_grpo: seq_mean_token_sum_norm)",
    "temperature": "generation.temperature",
    "top_p": "generation.top_p",
    "top_k": "generation.top_k",
    "num_train_epochs": "steps = num_train_epochs x prompts / (algorithm.batch_size / algorithm.group_size)",
    "chat_template_kwargs": "not supported: edit the chat template in the model folder's tokenizer_config.json "
                            "(e.g. to leave thinking off)",
    "max_prompt_length": "data.max_prompt_tokens, with data.long_prompts: truncate_left to cut a longer prompt from "
                         "the left as TRL does (the default, error, refuses it)",
    "use_vllm": "generation.engine: vllm (docs/vllm.md)",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "bf16": "model.dtype: bfloat16 (auto: bfloat16 on CUDA, float32 on the CPU)",
    "fp16": "model.dtype: float16",
    "save_steps": "store.checkpoint_every, in RL steps (every step is committed, and a run resumes from its last "
                  "one whatever it says; store.checkpoint_every also keeps those steps' versions for good)",
    "eval_steps": "eval_every, in RL steps: eval_steps / (algorithm.epochs x algorithm.num_minibatches)",
    "num_generations_eval": "not supported: evaluation decodes one greedy completion per prompt",
    "min_p": "not supported: generation samples with generation.temperature, generation.top_k and generation.top_p",
    "repetition_penalty": "not supported: generation samples with generation.temperature, generation.top_k and "
                          "generation.top_p",
    "generation_kwargs": "not supported: generation takes generation.temperature, generation.top_k, generation.top_p "
                         "and generation.max_new_tokens only",
    "generation_batch_size": "algorithm.batch_size (samples per RL step: TRL's generation batch)",
    "model_name_or_path": "model.path (a local model folder, or a Hub id that prepare fetches once)",
    "disable_dropout": "not a setting: the actions run the policy with dropout off, in training too",
    "lr_scheduler_type": "not supported: algorithm.lr is constant (no schedule)",
    "warmup_ratio": "not supported: algorithm.lr is constant from the first step (warmup.steps are supervised steps "
                    "before RL, not a learning-rate warm-up)",
    "warmup_steps": "not supported: algorithm.lr is constant from the first step (warmup.steps are supervised steps "
                    "before RL, not a learning-rate warm-up)",
    # GRPOConfig's loss variants RLHFless does not implement (README, Coming from TRL: "none")
    "importance_sampling_level": "not supported: the importance ratio is per token (TRL's token); GSPO's sequence "
                                 "level is not implemented",
    "delta": "not supported: the ratio is clipped to [1 - algorithm.clip_low, 1 + algorithm.clip_high] only, with no "
             "two-sided delta bound",
    "top_entropy_quantile": "not supported: the loss counts every response token (TRL's 1.0), with no entropy filter",
    "entropy_coef": "not supported: the loss has no entropy term (TRL's 0.0); entropy is logged only",
    "use_adaptive_entropy": "not supported: the loss has no entropy term (TRL's false); entropy is logged only",
    "off_policy_mask_threshold": "not supported: no completion is masked for its KL to the policy that sampled it "
                                 "(TRL's None)",
    "sync_ref_model": "not supported: the reference policy stays the policy after warm-up (TRL's false), the KL to "
                      "it weighed by algorithm.kl_coef",
    "multi_objective_aggregation": "not supported: the weighted rewards are summed, then normalised (TRL's default, "
                                   "sum_then_normalize); normalize_then_sum is not implemented",
    # TRL's ModelConfig (PEFT's LoraConfig without the lora_ prefix is model.lora itself)
    "use_peft": "model.lora: {} (LoRA adapters with its defaults; absent: full fine-tuning)",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
}
"""TRL's name -> the RLHFless setting (or what stands for it)."""


TRL_LOSS_TYPES = {"dapo": "token_mean", "bnpo": "token_mean with algorithm.micro_batch_size unset",
                  "grpo": "seq_mean_token_mean", "dr_grpo": "seq_mean_token_sum_norm"}
"""TRL's ``loss_type`` values -> the ``algorithm.loss_agg`` that computes the same loss."""


def trl_value_hint(field: str, value: object) -> str:
    """``; TRL's loss_type dapo is loss_agg token_mean`` where ``field`` got a TRL value, else ''."""
    if field == "loss_agg" and isinstance(value, str) and value in TRL_LOSS_TYPES:
        return f"; TRL's loss_type {value} is loss_agg {TRL_LOSS_TYPES[value]} (README, Coming from TRL)"
    return ""


def trl_hint(key: str) -> str:
    """``; TRL's `beta` is algorithm.kl_coef`` for a dotted key whose last part is a TRL name, else ''."""
    name = key.rsplit(".", 1)[-1]
    target = TRL_SETTINGS.get(name)
    return f"; TRL's `{name}` is {target} (README, Coming from TRL)" if target else ""
