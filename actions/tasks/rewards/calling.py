"""Calling one reward function with TRL's keywords, sync or async, and checking what it returns.

TRL calls ``fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)``
and accepts a coroutine function as well (``async def``): its result is awaited here, in an
event loop of its own (an action runs no loop; a caller that does gets a worker thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

RESERVED = ("answer", "prompts", "completions", "completion_ids", "trainer_state")
"""Keyword names the call fills itself: a dataset column of that name does not reach the function."""


class RewardFunctionError(ValueError):
    """A reward function failed or broke its contract: not transient, never retried."""

    field = "reward.functions"


def _await(value: Any) -> Any:
    """``value``, awaited when it is awaitable (an ``async def`` reward function's result)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no loop in this thread
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def _invoke(fn: Callable, kwargs: dict[str, Any], trainer_state: Any) -> Any:
    return _await(fn(**kwargs, trainer_state=trainer_state))


def call_reward(name: str, fn: Callable, rows: Sequence[Any], kwargs: dict[str, list], trainer_state: Any
                ) -> list[float | None]:
    """``fn``'s reward per row: one float or None each.

    Args:
        kwargs: ``prompts``, ``completions``, ``completion_ids`` and the columns, one list entry per row.

    Raises:
        RewardFunctionError: it raised (naming the first row it raises on alone) or returned the
            wrong number or type of values.
    """
    try:
        values = _invoke(fn, kwargs, trainer_state)
    except Exception as exc:
        raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc} "
                                  f"on prompt_id {_failing_row(fn, rows, kwargs, trainer_state)}; "
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


def _failing_row(fn: Callable, rows: Sequence[Any], kwargs: dict[str, list], trainer_state: Any) -> str:
    """The first row on which ``fn`` raises alone (the batch call does not say which)."""
    for i, row in enumerate(rows):
        try:
            _invoke(fn, {k: [v[i]] for k, v in kwargs.items()}, trainer_state)
        except Exception:
            return f"{row.prompt_id} (row {i} of the batch)"
    return "? (it raised only on the whole batch)"
