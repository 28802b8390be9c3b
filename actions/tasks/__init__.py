"""Tasks: how prompts are made, demonstrated and rewarded. Looked up by ``data.task``."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from actions.tasks import repeat
from actions.tasks.dataset import PromptRow


@dataclass(frozen=True)
class Task:
    name: str
    reward: Callable[..., list[float | None]]
    demonstrate: Callable[[PromptRow, random.Random, float], str]
    make_rows: Callable[..., list[PromptRow]]


def _repeat_demo(row: PromptRow, rng: random.Random, error_rate: float) -> str:
    return repeat.demonstrate(row, rng, error_rate=error_rate)


TASKS = {"repeat": Task("repeat", repeat.exact_match_reward, _repeat_demo, repeat.make_rows)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"data.task {name!r} is unknown; available: {sorted(TASKS)}")
    return TASKS[name]
