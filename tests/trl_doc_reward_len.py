"""TRL's documented "reward longer completions" example (it is named ``reward_func`` there too)."""


def reward_func(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]
