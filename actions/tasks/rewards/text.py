"""Completions as text, in either of TRL's formats.

TRL passes a plain string per completion for standard prompts and a list of messages
(``[{"role": "assistant", "content": ...}]``) for conversational prompts. Built-in rewards
accept both.
"""

from __future__ import annotations


def completion_text(completion: object) -> str:
    """The text of one completion.

    >>> completion_text("abc"), completion_text([{"role": "assistant", "content": "abc"}])
    ('abc', 'abc')
    """
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)
