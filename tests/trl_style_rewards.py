"""A TRL-style reward function for the campaign of ``tests/test_reward_models.py``: it reads
``prompts``, ``answer``, ``completion_ids`` and ``trainer_state``, logs a metric and records
what it saw."""

SEEN = []
SEEN_INPUTS = []
"""(prompt, answer) of every row scored."""


def even_token_reward(prompts, completions, completion_ids, trainer_state, answer, log_metric, **kwargs):
    """The share of a completion's tokens with an even id."""
    SEEN.append((trainer_state.global_step, trainer_state.epoch, trainer_state.max_steps))
    SEEN_INPUTS.extend(zip(prompts, answer))
    shares = [sum(1 for t in ids if t % 2 == 0) / max(1, len(ids)) for ids in completion_ids]
    log_metric("even_share", sum(shares) / len(shares))
    return shares


def never_applies(completions, **kwargs):
    """Not applicable to any completion: a run scored by it alone cannot learn."""
    return [None] * len(completions)


SEEN_KEYWORDS = []
"""The keyword names of every call of ``short_reward``."""


def short_reward(completions, **kwargs):
    """Shorter is better: 1 / (1 + characters), for a dataset without reference answers."""
    SEEN_KEYWORDS.append(sorted(kwargs))
    return [1.0 / (1.0 + len(c)) for c in completions]
