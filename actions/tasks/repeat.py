"""The embedded default task: write a letter exactly k times.

A synthetic, verifiable task whose correct answer length varies strongly from prompt to
prompt (k is drawn from 1..``max_count``), so response-length statistics matter for planning
exactly as they do for GSM8K-style reasoning traces. Every prompt shares one instruction
template, so deduplicated prefill has a long cross-prompt prefix to save as well as the
per-group prompt.

Prompt: ``TEMPLATE + "k=<k> c=<letter>\\n"``; reference answer: ``letter * k``. The model
must stop with EOS right after the k-th letter.

The warm-up demonstrations come from an imperfect demonstrator (:func:`demonstrate_answer`) that
miscounts long answers, as weak teacher models do: warm-up gives a policy that writes the right
kind of answer but often the wrong number of letters, and RL with the exact-match reward has a
real error to fix.
"""

from __future__ import annotations

import random

from actions.tasks.dataset import PromptRow
from actions.tasks.rewards.text import completion_text

TEMPLATE = "write the letter c exactly k times, then stop.\n"
LETTERS = "abcdefghij"


def make_prompt(k: int, letter: str) -> str:
    return f"{TEMPLATE}k={k} c={letter}\n"


def make_rows(num_rows: int, *, max_count: int, seed: int, first_id: int = 0) -> list[PromptRow]:
    """``num_rows`` prompts with k uniform in [1, max_count] and a random letter."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_rows):
        k = rng.randint(1, max_count)
        letter = rng.choice(LETTERS)
        rows.append(PromptRow(prompt_id=first_id + i, prompt=make_prompt(k, letter), answer=letter * k))
    return rows


def demonstrate_answer(answer: str, rng: random.Random, *, error_rate: float) -> str:
    """An imperfect demonstration of the reference ``answer``: with probability
    ``error_rate * min(1, k / 12)`` the count is off by one or two (errors grow with the
    answer's length)."""
    k = len(answer)
    letter = answer[:1]
    if rng.random() < error_rate * min(1.0, k / 12):
        k = max(1, k + rng.choice([-2, -1, 1, 2]))
    return letter * k


def exact_match_reward(completions: list, answer: list[str], **kwargs: object) -> list[float | None]:
    """1.0 when the completion equals the reference answer (surrounding whitespace ignored).

    Follows TRL's reward signature: dataset columns arrive as keyword lists, and a completion is
    a string or, for chat prompts, a list of messages (the default reward of any dataset).

    >>> exact_match_reward(["aaa", "aa", " aaa\\n"], answer=["aaa", "aaa", "aaa"])
    [1.0, 0.0, 1.0]
    >>> exact_match_reward(["bbbbb", [{"role": "assistant", "content": "bbbb"}]], answer=["bbbb"] * 2)
    [0.0, 1.0]
    """
    return [1.0 if completion_text(c).strip() == str(a).strip() else 0.0
            for c, a in zip(completions, answer, strict=True)]
