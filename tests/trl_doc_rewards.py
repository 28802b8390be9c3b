"""Reward functions written as TRL's GRPOTrainer documentation writes them (its "Using a custom
reward function" examples), unchanged, for ``tests/test_reward_models.py``. Example 1, which
TRL also names ``reward_func``, is in ``trl_doc_reward_len.py``."""

import asyncio
import re


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def check_math_solution(prompt, completion):
    return completion.strip().endswith(str(eval(prompt.split(":")[1])))


def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            # Calculate math-specific reward
            correct = check_math_solution(prompt, completion)
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards


async def async_reward_func(prompts, completions, **kwargs):
    await asyncio.sleep(0.01)  # e.g. a call to a remote judge
    return [1.0 if "4" in completion else 0.0 for completion in completions]


SEEN_STEPS = []


def curriculum_reward_func(completions, completion_ids, trainer_state, **kwargs):
    """Shorter completions earn more; the target tightens as training advances."""
    SEEN_STEPS.append((trainer_state.global_step, trainer_state.epoch, trainer_state.max_steps))
    target = 8 if trainer_state.global_step < 1 else 4
    return [1.0 - abs(len(ids) - target) / 16 for ids in completion_ids]
