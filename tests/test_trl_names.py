"""TRL ``GRPOConfig`` / ``TrainingArguments`` names typed into a configuration are answered with
the RLHFless setting (``flows/trl_names.py``), and every setting a hint names is a real key."""

from __future__ import annotations

import re

import pytest

from flows.commands.config_show import keys
from flows.config import CampaignConfig, load_config
from flows.trl_names import TRL_SETTINGS, trl_hint

_KEY = re.compile(r"\b[a-z_]+(?:\.[a-z_]+)+\b")


def test_every_hint_names_real_keys():
    real = {k.replace("[]", "") for k, _ in keys(CampaignConfig)}
    sections = {k.split(".")[0] for k in real}
    for name, target in TRL_SETTINGS.items():
        named = [k for k in _KEY.findall(target) if k.split(".")[0] in sections]  # not file names
        assert named or target.startswith(("not supported", "not a setting", "steps")), (name, target)
        assert set(named) <= real, (name, target, set(named) - real)
    assert {"eval_every", "steps"} <= real  # the top-level keys hints name without a section


@pytest.mark.parametrize(("typed", "says"), [
    ("max_prompt_length=512", "data.max_prompt_tokens, with data.long_prompts: truncate_left"),
    ("use_vllm=true", "generation.engine: vllm"),
    ("algorithm.gradient_checkpointing=true", "model.gradient_checkpointing"),
    ("bf16=true", "model.dtype: bfloat16"),
    ("fp16=true", "model.dtype: float16"),
    ("save_steps=100", "store.checkpoint_every, in RL steps (every step is committed"),
    ("eval_steps=50", "eval_every, in RL steps"),
    ("num_generations_eval=4", "not supported: evaluation decodes one greedy completion"),
    ("generation.min_p=0.1", "not supported"),
    ("use_peft=true", "model.lora: {}"),
    ("model.lora.lora_r=8", "model.lora.r"),
    ("model.lora.lora_alpha=16", "model.lora.alpha"),
    ("model.lora.lora_dropout=0.05", "model.lora.dropout"),
    ("model.lora.lora_target_modules=[q_proj]", "model.lora.target_modules"),
    ("algorithm.generation_batch_size=64", "algorithm.batch_size"),
    ("model_name_or_path=Qwen/Qwen3-0.6B", "model.path"),
    ("disable_dropout=true", "not a setting: the actions run the policy with dropout off"),
    ("algorithm.lr_scheduler_type=cosine", "not supported: algorithm.lr is constant"),
    ("algorithm.warmup_ratio=0.1", "not supported: algorithm.lr is constant"),
    ("algorithm.importance_sampling_level=sequence", "not supported: the importance ratio is per token"),
    ("algorithm.delta=2.0", "not supported"),
    ("algorithm.top_entropy_quantile=0.2", "not supported"),
    ("algorithm.entropy_coef=0.01", "not supported: the loss has no entropy term"),
    ("algorithm.use_adaptive_entropy=true", "not supported: the loss has no entropy term"),
    ("algorithm.off_policy_mask_threshold=0.5", "not supported"),
    ("algorithm.sync_ref_model=true", "not supported: the reference policy stays the policy after warm-up"),
    ("generation.repetition_penalty=1.1", "not supported"),
    ("generation.generation_kwargs={}", "not supported"),
    ("reward.multi_objective_aggregation=normalize_then_sum", "not supported"),
])
def test_trainer_arguments_are_answered_with_their_setting(typed, says):
    key = typed.split("=")[0]
    with pytest.raises(ValueError) as info:
        load_config(None, [typed])
    line = str(info.value)
    assert f"unknown config key '{key}'" in line and f"TRL's `{key.rsplit('.', 1)[-1]}` is {says}" in line, line
    assert "\n" not in line
    assert trl_hint("model.dtype") == ""  # a real key's own name is no TRL name
