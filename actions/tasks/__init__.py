"""Synthetic tasks: how their rows are made and demonstrated. Looked up by ``data.task``.

A task produces dataset records (plain dicts, as a file would hold them) and names the keys
that hold the prompt, the answer and the id, so its rows take the same path through
``fields.py`` and ``chat.py`` as a user's file. Its reward is a name in ``rewards``
(``WorkloadConfig.reward_functions``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actions.tasks import arith, repeat
from actions.tasks.fields import FieldMap


@dataclass(frozen=True)
class Task:
    name: str
    fields: FieldMap
    make_records: Callable[..., list[dict[str, Any]]]
    """(num_rows, *, max_count, max_value, seed, exclude, first_id) -> records; ``exclude``:
    questions not to repeat; ``max_value``: the largest quantity, where the task has them."""
    demonstrate: Callable[[str, random.Random, float], str]
    """(reference answer, rng, error_rate) -> an imperfect demonstration for warm-up."""
    extra_chars: str = ""
    """Characters the tiny model's tokenizer must hold beyond its base alphabet."""


def _repeat_records(num_rows: int, *, max_count: int, max_value: int | None, seed: int,
                    exclude: frozenset[str] = frozenset(), first_id: int = 0) -> list[dict[str, Any]]:
    return [r.model_dump(include={"prompt_id", "prompt", "answer"})
            for r in repeat.make_rows(num_rows, max_count=max_count, seed=seed, first_id=first_id)]


def _arith_records(num_rows: int, *, max_count: int, max_value: int | None, seed: int,
                   exclude: frozenset[str] = frozenset(), first_id: int = 0) -> list[dict[str, Any]]:
    return arith.make_records(num_rows, max_ops=max_count, seed=seed, exclude=exclude,
                              limit=arith.LIMIT if max_value is None else max_value)


TASKS = {
    "repeat": Task("repeat", FieldMap("prompt", "answer", "prompt_id"), _repeat_records,
                   lambda answer, rng, e: repeat.demonstrate_answer(answer, rng, error_rate=e)),
    "arith": Task("arith", FieldMap("question", "answer"), _arith_records,
                  lambda answer, rng, e: arith.demonstrate(answer, rng, error_rate=e), arith.EXTRA_CHARS),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"data.task {name!r} is unknown; available: {sorted(TASKS)}")
    return TASKS[name]
