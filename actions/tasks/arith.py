"""A CPU-learnable task in GSM8K's format: short multi-step arithmetic word problems.

Rows have GSM8K's columns, ``question`` and ``answer``, and the answer is a worked solution
that ends in ``#### N``::

    question: "mia has 3 coins. she finds 4 more. she loses 2. how many coins does mia have now?"
    answer:   "3+4=7. 7-2=5.\\n#### 5"

They go through the same field mapping (``fields.py``), the same formatting and the same
``gsm8k`` reward as a real GSM8K dataset; only the file reading is skipped. Every quantity
stays in 0..``limit`` (``data.max_value``, 9 by default), so the arithmetic is a table of about
a hundred facts a tiny model can hold (30 at ``limit`` 5: nearly all right after 600 warm-up
steps of 16, where 850 steps at 9 still leave many wrong), and a problem has 1..``max_ops``
operations, so answer lengths vary as they do in GSM8K.

The warm-up demonstrator (:func:`demonstrate`) is imperfect the way weak teachers are: on a
problem of two or more operations it often (``warmup.error_rate``, 0.7 by default for this
task) stops one operation early and gives the intermediate result as the final answer. Warm-up
then gives a policy that writes well-formed worked solutions and right arithmetic but, greedily,
stops early on multi-step problems, while a correct full solution is still sampled often
enough for RL with the ``gsm8k`` reward to find and reinforce it.

Only characters of the tiny model's alphabet are used (lower case, digits, ``.=+-?#``).
"""

from __future__ import annotations

import random
from typing import Any

EXTRA_CHARS = "#"
"""Characters this task needs beyond the tiny tokenizer's base alphabet."""

NAMES = (("tom", "he"), ("sam", "he"), ("leo", "he"), ("mia", "she"), ("ana", "she"), ("eva", "she"))
ITEMS = ("apples", "coins", "pens", "books", "cards", "eggs", "shells", "stamps")
GAINS = ("gets {n} more", "finds {n} more", "buys {n} more")
LOSSES = ("gives away {n}", "loses {n}", "sells {n}")
LIMIT = 9
"""The largest quantity by default: every number of a problem and its solution is one digit."""
MAX_REPEATS = 10_000
"""Draws in a row that found only known questions before ``make_records`` gives up."""


def make_problem(rng: random.Random, num_ops: int, limit: int = LIMIT) -> dict[str, str]:
    """One problem with ``num_ops`` operations, as a GSM8K row {question, answer}; every
    quantity, intermediate result and answer lies in 0..``limit``."""
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    value = rng.randint(1, limit)
    sentences = [f"{name} has {value} {item}."]
    steps = []
    for _ in range(num_ops):
        grow = value < limit and (value == 0 or rng.random() < 0.5)
        n = rng.randint(1, limit - value) if grow else rng.randint(1, value)
        new = value + n if grow else value - n
        sentences.append(f"{pronoun} {rng.choice(GAINS if grow else LOSSES).format(n=n)}.")
        steps.append(f"{value}{'+' if grow else '-'}{n}={new}.")
        value = new
    question = " ".join(sentences) + f" how many {item} does {name} have now?"
    return {"question": question, "answer": " ".join(steps) + f"\n#### {value}"}


def make_records(num_rows: int, *, max_ops: int, seed: int, exclude: frozenset[str] = frozenset(),
                 limit: int = LIMIT) -> list[dict[str, Any]]:
    """``num_rows`` distinct problems (none of whose questions is in ``exclude``), with the
    number of operations uniform in 1..``max_ops`` and quantities in 0..``limit``.

    Raises:
        ValueError: so few distinct problems exist (small ``limit`` and ``max_ops``) that
            ``MAX_REPEATS`` draws in a row found no new one.
    """
    rng = random.Random(seed)
    seen: set[str] = set(exclude)
    rows: list[dict[str, Any]] = []
    repeats = 0
    while len(rows) < num_rows:
        row = make_problem(rng, rng.randint(1, max_ops), limit)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
            repeats = 0
        elif (repeats := repeats + 1) > MAX_REPEATS:
            raise ValueError(f"data.task arith: only {len(rows)} distinct problems of 1..{max_ops} operations on "
                             f"quantities 0..{limit} were found for the {num_rows} asked; raise data.max_value or "
                             "data.max_count, or ask for fewer prompts (data.num_train_prompts, num_eval_prompts)")
    return rows


def demonstrate(answer: str, rng: random.Random, *, error_rate: float) -> str:
    """A worked solution that, with probability ``error_rate`` when it has two or more
    operations, drops its last operation and answers the intermediate result.

    >>> demonstrate("3+4=7. 7-2=5.\\n#### 5", random.Random(0), error_rate=0.0)
    '3+4=7. 7-2=5.\\n#### 5'
    >>> demonstrate("3+4=7. 7-2=5. 5+1=6.\\n#### 6", random.Random(0), error_rate=1.0)
    '3+4=7. 7-2=5.\\n#### 5'
    """
    work, _ = answer.rsplit("\n#### ", 1)
    steps = work.split(" ")
    if len(steps) > 1 and rng.random() < error_rate:
        steps = steps[:-1]
        result = steps[-1].rsplit("=", 1)[1].rstrip(".")
        return " ".join(steps) + f"\n#### {result}"
    return answer
