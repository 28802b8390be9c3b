"""Format reward: does the completion match a regular expression (``re.search``)?

The default pattern asks for a completion that ends in a final answer, in GSM8K's ``#### N``
form or in ``\\boxed{}``, followed by nothing but spaces, a period, ``$`` or a closing ``\\]``
or ``\\)``: ``#### 42.`` and ``$\\boxed{42}$`` count, ``\\boxed{42} Hope this helps`` does not.
Configure another with ``reward.functions: [{name: format, pattern: '...'}]``; the pattern is
compiled when the configuration is validated.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from actions.tasks.rewards.text import completion_text

DEFAULT_PATTERN = r"(?:####\s*-?\$?[\d,]*\.?\d+|\\boxed\{.+\})(?:\s|\.|\$|\\\]|\\\))*$"


def make_format_reward(pattern: str | None = None) -> Callable[..., list[float | None]]:
    """A reward function giving 1.0 to completions where ``pattern`` is found, else 0.0.

    >>> reward = make_format_reward()
    >>> reward(["7+3=10.\\n#### 10", r"so \\boxed{4}", "the answer is 10", "#### 10.", r"\\[\\boxed{4}\\]"])
    [1.0, 1.0, 0.0, 1.0, 1.0]
    >>> reward([r"\\boxed{4} Hope this helps", "#### 10\\n\\nHope this helps!"])
    [0.0, 0.0]
    >>> make_format_reward(r"^<think>.*</think>")(["<think>hm</think> 4", "4"])
    [1.0, 0.0]
    """
    compiled = re.compile(pattern or DEFAULT_PATTERN, re.DOTALL)

    def format_reward(completions: list, **kwargs: object) -> list[float | None]:
        return [1.0 if compiled.search(completion_text(c).strip()) else 0.0 for c in completions]

    return format_reward
