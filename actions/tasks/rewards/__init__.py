"""Reward functions: built-ins and ``package.module:function`` plug-ins, weighted and summed.

Every reward function has TRL's signature, so existing TRL reward functions work unchanged::

    fn(prompts: list, completions: list, **columns) -> list[float | None]

``prompts`` are the dataset's prompts as written there (a string, or a list of chat messages);
``completions`` are strings for string prompts and ``[{"role": "assistant", "content": ...}]``
for chat prompts (TRL's conversational format); every other column of the dataset arrives as
a keyword list, and ``answer`` is always the reference (``data.answer_key``). ``None`` means
"not applicable to this row".

A row's reward is the weighted sum over the functions that apply to it (None counts as 0, as
in TRL's nansum). Its best possible reward is the same sum over each function's maximum
(1.0 for the built-ins; a plug-in may set a ``max_reward`` attribute), and evaluation counts a
completion correct when its reward reaches it. A function that raises, or returns a list of
the wrong length or type, fails the step with :class:`RewardFunctionError` naming the
function and the row; it is a bug in the function and is never retried.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from actions.common.reward_config import BUILTIN_REWARDS


class RewardSpec(Protocol):
    name: str
    weight: float
    pattern: str | None


class RewardFunctionError(ValueError):
    """A reward function failed or broke its contract: not transient, never retried."""

    field = "reward.functions"


class RewardRow(Protocol):
    prompt_id: int
    prompt: str
    answer: str
    source_prompt: Any
    columns: dict[str, Any]


def load_reward(name: str, pattern: str | None = None) -> Callable[..., list[float | None]]:
    """The callable behind a reward name. Raises RewardFunctionError for an unknown built-in,
    a module that does not import or a missing attribute (the message says which)."""
    if ":" not in name:
        return _builtin(name, pattern)
    module_name, attr = name.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is a configuration error
        raise RewardFunctionError(
            f"reward.functions name {name!r}: module {module_name!r} cannot be imported "
            f"({type(exc).__name__}: {exc}); put it on PYTHONPATH (and in the action image)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardFunctionError(f"reward.functions name {name!r}: {module_name} has no function {attr!r}; "
                                  "name a function as package.module:function")
    return fn


def _builtin(name: str, pattern: str | None) -> Callable[..., list[float | None]]:
    if name == "repeat":
        from actions.tasks.repeat import exact_match_reward as fn
    elif name == "gsm8k":
        from actions.tasks.rewards.gsm8k import gsm8k_reward as fn
    elif name == "math":
        from actions.tasks.rewards.symbolic import math_reward as fn
    elif name == "exact_match":
        from actions.tasks.rewards.exact_match import exact_match_reward as fn
    elif name == "format":
        from actions.tasks.rewards.format import make_format_reward

        return make_format_reward(pattern)
    else:
        raise RewardFunctionError(f"reward.functions name {name!r} is not a built-in ({', '.join(BUILTIN_REWARDS)}) "
                                  "nor package.module:function; fix the name")
    return fn


def reward_inputs(rows: Sequence[RewardRow], texts: Sequence[str]) -> tuple[list, list, dict[str, list]]:
    """(prompts, completions, columns) in TRL's formats for rows and their completion texts."""
    prompts = [r.source_prompt if r.source_prompt is not None else r.prompt for r in rows]
    completions = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts)]
    names = sorted({k for r in rows for k in r.columns} - {"answer", "prompts", "completions"})
    columns = {k: [r.columns.get(k) for r in rows] for k in names}
    columns["answer"] = [r.answer for r in rows]
    return prompts, completions, columns


@dataclass(frozen=True)
class Rewards:
    total: list[float]
    """Per row: the weighted sum over the functions that apply (0.0 when none does)."""
    best: list[float]
    """Per row: the largest total the applicable functions allow."""
    per_function: dict[str, list[float | None]]


def compute_rewards(specs: Sequence[RewardSpec], rows: Sequence[RewardRow], texts: Sequence[str]) -> Rewards:
    """Score ``texts`` (one completion per row) with every function of ``specs``.

    Raises:
        RewardFunctionError: a function raised or returned the wrong length/type (names it and the row).
    """
    prompts, completions, columns = reward_inputs(rows, texts)
    total = [0.0] * len(rows)
    best = [0.0] * len(rows)
    per_function: dict[str, list[float | None]] = {}
    for spec in specs:
        fn = load_reward(spec.name, spec.pattern)
        values = _call(spec.name, fn, rows, prompts, completions, columns)
        per_function[spec.name] = values
        top = float(getattr(fn, "max_reward", 1.0))
        low = float(getattr(fn, "min_reward", 0.0))
        for i, v in enumerate(values):
            if v is not None:
                total[i] += spec.weight * v
                best[i] += max(spec.weight * top, spec.weight * low)
    return Rewards(total=total, best=best, per_function=per_function)


def is_best(rewards: Rewards, tolerance: float = 1e-9) -> list[bool]:
    """Per row: did the completion reach the best reward (and was any function applicable)?"""
    return [t >= b - tolerance and b > 0 for t, b in zip(rewards.total, rewards.best)]


def _call(name: str, fn: Callable, rows: Sequence[RewardRow], prompts: list, completions: list,
          columns: dict[str, list]) -> list[float | None]:
    try:
        values = fn(prompts=prompts, completions=completions, **columns)
    except Exception as exc:
        raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc} "
                                  f"on prompt_id {_failing_row(fn, rows, prompts, completions, columns)}; "
                                  "fix the function (a reward error fails the step and is not retried)") from None
    if not isinstance(values, (list, tuple)) or len(values) != len(rows):
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise RewardFunctionError(f"reward function {name!r} returned {got} values for {len(rows)} completions; "
                                  "return one float (or None) per completion")
    out: list[float | None] = []
    for row, v in zip(rows, values):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise RewardFunctionError(f"reward function {name!r} returned {v!r} for prompt_id {row.prompt_id}; "
                                      "return a finite float or None per completion")
        out.append(None if v is None else float(v))
    return out


def _failing_row(fn: Callable, rows: Sequence[RewardRow], prompts: list, completions: list,
                 columns: dict[str, list]) -> str:
    """The first row on which ``fn`` raises alone (the batch call does not say which)."""
    for i, row in enumerate(rows):
        try:
            fn(prompts=[prompts[i]], completions=[completions[i]], **{k: [v[i]] for k, v in columns.items()})
        except Exception:
            return f"{row.prompt_id} (row {i} of the batch)"
    return "? (it raised only on the whole batch)"


def check_reward_functions(specs: Sequence[RewardSpec], rows: Sequence[RewardRow]) -> None:
    """Import every function and call each plug-in once on up to two rows, with the reference
    answers as completions, so a broken plug-in fails at start-up rather than mid-campaign.

    Raises:
        RewardFunctionError: naming the function and what is wrong.
    """
    sample = list(rows[:2])
    for spec in specs:
        fn = load_reward(spec.name, spec.pattern)
        if ":" in spec.name:
            prompts, completions, columns = reward_inputs(sample, [r.answer for r in sample])
            _call(spec.name, fn, sample, prompts, completions, columns)
