"""Exact match: the completion equals the reference answer, surrounding whitespace ignored."""

from __future__ import annotations

from actions.tasks.rewards.text import completion_text


def exact_match_reward(completions: list, answer: list[str], **kwargs: object) -> list[float | None]:
    """1.0 when ``completion.strip() == answer.strip()``, else 0.0.

    >>> exact_match_reward(["aaa", "aa", " aaa\\n"], answer=["aaa", "aaa", "aaa"])
    [1.0, 0.0, 1.0]
    """
    return [1.0 if completion_text(c).strip() == str(a).strip() else 0.0
            for c, a in zip(completions, answer, strict=True)]
