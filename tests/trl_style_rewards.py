"""A TRL-style reward function for the campaign of ``tests/test_reward_models.py``: it reads
``completion_ids`` and ``trainer_state`` and records what it saw."""

SEEN = []


def even_token_reward(completions, completion_ids, trainer_state, **kwargs):
    """The share of a completion's tokens with an even id."""
    SEEN.append((trainer_state.global_step, trainer_state.epoch, trainer_state.max_steps))
    return [sum(1 for t in ids if t % 2 == 0) / max(1, len(ids)) for ids in completion_ids]


def never_applies(completions, **kwargs):
    """Not applicable to any completion: a run scored by it alone cannot learn."""
    return [None] * len(completions)
