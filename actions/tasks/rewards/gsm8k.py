"""GSM8K answer checking: the reference's final answer against the completion's.

Reference: the text after the last ``####`` (GSM8K's format, ``... #### 72``); a reference
without ``####`` is read as a completion is (its ``\\boxed{}``, else its last number).
Completion: the number that starts the line after its last ``####`` followed by one (a
``#### Step 1`` Markdown heading is not an answer), else the content of its last
``\\boxed{}``, else its last number. Both sides are compared by value
(``numeric.py``): ``1,000``, ``1000.0`` and ``$1000`` are equal. A completion with no number
earns 0.0; a reference with no number makes the row not applicable (None).

Deviation from the original GSM8K grader, which compares strings after ``####`` only: the
``\\boxed{}`` and last-number fallbacks accept the formats instruction-tuned models write.
"""

from __future__ import annotations

from fractions import Fraction

from actions.tasks.rewards.numeric import boxed, last_number, leading_number, parse_number
from actions.tasks.rewards.text import completion_text


def final_answer(text: str) -> Fraction | None:
    """The value a text commits to: the number that starts a line after ``####`` (the last such),
    else in ``\\boxed{}``, else its last number.

    >>> final_answer("3+4=7. 7*2=14.\\n#### 14"), final_answer(r"so \\boxed{1,000}"), final_answer("it is 5, no 6")
    (Fraction(14, 1), Fraction(1000, 1), Fraction(6, 1))
    >>> final_answer("#### Step 1: add\\n24 + 48 = 72\\n#### Final answer\\n\\\\boxed{72}")
    Fraction(72, 1)
    """
    for after in reversed(text.split("####")[1:]):  # the last marker an answer follows
        line = after.lstrip(" \t").split("\n", 1)[0]
        value = leading_number(line)
        if value is not None:
            return value
    inner = boxed(text)
    if inner is not None:
        return parse_number(inner)
    return last_number(text)


def gsm8k_reward(completions: list, answer: list[str], **kwargs: object) -> list[float | None]:
    """1.0 when the completion's final answer equals the reference's by value, else 0.0.

    >>> gsm8k_reward(["... #### 1,000", r"\\boxed{1000.0}", "$1000", "#### 999", "no idea"],
    ...              answer=["x #### 1000"] * 5)
    [1.0, 1.0, 1.0, 0.0, 0.0]
    >>> gsm8k_reward(["#### 3"], answer=["no number here"])
    [None]
    """
    out: list[float | None] = []
    for completion, reference in zip(completions, answer, strict=True):
        want = final_answer(str(reference))
        if want is None:
            out.append(None)
            continue
        got = final_answer(completion_text(completion))
        out.append(1.0 if got is not None and got == want else 0.0)
    return out
