"""Calling one reward function with TRL's keywords, sync or async, and checking what it returns.

TRL calls ``fn(prompts=..., completions=..., completion_ids=..., trainer_state=...,
log_extra=..., log_metric=..., **columns)`` and accepts a coroutine function as well
(``async def``): its result is awaited here, in an event loop of its own (an action runs no
loop; a caller that does gets a worker thread).

``log_metric(name: str, value: float)`` records a scalar; TRL averages a name's values over its
logging step, and the step's metrics here do the same (``reward_fn/<name>``,
``flows/step/metrics.py``). Names and values are checked once the call returns.
``log_extra(column: str, values: list)`` adds a column of one value per completion to TRL's
table of sampled completions; there is no such table here, so it is accepted and its values
dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import difflib
import inspect
import math
import numbers
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

from actions.tasks.dataset import record_where

RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""Keyword names the call fills itself: a dataset column of that name cannot reach a function
(in TRL the call fails with "multiple values for keyword"), so the start-up check refuses it
(``rewards.check_reward_functions``), but for the ``DROPPED`` ones."""

DROPPED = ("completion", "completion_ids")
"""Dataset columns left out of the reward functions' keywords, never refused, as TRL's
GRPOTrainer leaves out its ``prompt``, ``completion`` and ``completion_ids`` columns: a
prompt-completion dataset's ``completion`` is not the sampled completion (that is
``completions``), and ``completion_ids`` is always the sampled ids. (``prompt`` is the prompt
column, ``data.prompt_key``, which no function gets by its name either.)"""

METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,99}")
"""A ``log_metric`` name: it becomes part of a metric's name in summary.json and the trackers."""


REWARD_LIMIT = 1e15
"""The largest reward magnitude taken (a function's value, and a row's weighted sum): the step's
statistics square and sum rewards in float32, whose range (3.4e38) a reward of 1e20 already
overflows, turning the update's advantages to NaN; no scale a reward needs comes near it."""

STEP_FAILS = " (a reward error fails the step and is not retried)"
"""What a reward error does mid-campaign, as its message says it."""


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


def log_extra(column: str, values: list) -> None:
    """TRL's ``log_extra``: a column for its table of sampled completions, which is not kept here."""


def _invoke(fn: Callable, kwargs: dict[str, Any], trainer_state: Any,
            log_metric: Callable[[str, float], None]) -> Any:
    return _await(fn(**fresh(kwargs), trainer_state=trainer_state, log_extra=log_extra, log_metric=log_metric))


def fresh(kwargs: dict[str, list]) -> dict[str, list]:
    """The call's inputs as lists of its own, their mutable values (a chat prompt's messages, a
    column's list or dict) copied: a function that edits what it is given (appends a message,
    pops a completion) changes neither the next function's inputs nor the rows a warm action
    keeps for later steps, nor the dataset the start-up check's rows are written to. Strings and
    numbers are shared (immutable); ``completion_ids`` are flat lists of ints, copied as such."""
    plain = (str, int, float, bool, type(None))
    return {k: [list(c) for c in v] if k == "completion_ids" else
            [x if isinstance(x, plain) else copy.deepcopy(x) for x in v] for k, v in kwargs.items()}


def call_reward(name: str, fn: Callable, rows: Sequence[Any], kwargs: dict[str, list], trainer_state: Any,
                metrics: dict[str, list[float]] | None = None, *, raised_fix: str = STEP_FAILS,
                source: str | None = None) -> list[float | None]:
    """``fn``'s reward per row: one float or None each. ``fn`` may return a list or tuple, or a
    1-D NumPy array or torch tensor; each value a real number (NumPy scalars and 0-d arrays or
    tensors included, bools not) or None.

    Args:
        kwargs: ``prompts``, ``completions``, ``completion_ids`` and the columns, one list entry per row.
        metrics: receives what ``fn`` passed to ``log_metric``: name -> values in call order
            (appended to; None: checked, then dropped).
        raised_fix: what a raising function's message adds to "fix the function" (mid-campaign:
            the step fails and is not retried).
        source: the file ``rows`` were read from, as errors name it (``data.train_path d.jsonl``):
            a row that carries its place in it (``line``) is named by it, as the dataset's own
            errors name a row; None (rows of the stored copy): by prompt_id and place in the batch.

    Raises:
        RewardFunctionError: it raised (naming the first row it raises on alone, or the
            parameter that is not a column, for a call that cannot bind), returned the wrong
            number or type of values, or logged a metric with a bad name or value.
    """
    logged: list[tuple[Any, Any]] = []
    try:
        values = _invoke(fn, kwargs, trainer_state, lambda metric, value: logged.append((metric, value)))
    except Exception as exc:
        unbound = unbound_parameter(name, fn, kwargs) if isinstance(exc, TypeError) else None
        if unbound:  # the signature, not a row, is at fault: every row fails alike
            raise RewardFunctionError(unbound) from None
        raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc} "
                                  f"on {_failing_row(fn, rows, kwargs, trainer_state, source)}; "
                                  f"fix the function{raised_fix}") from None
    listed = _as_list(values)
    if listed is None and values is None:  # most often a missing return statement
        raise RewardFunctionError(f"reward function {name!r} returned None, not a list; return one float (or None) "
                                  f"per completion, {len(rows)} here (is a return statement missing?)")
    if listed is None or len(listed) != len(rows):
        got = len(listed) if listed is not None else type(values).__name__
        raise RewardFunctionError(f"reward function {name!r} returned {got} values for {len(rows)} completions; "
                                  "return one float (or None) per completion")
    out: list[float | None] = []
    for row, v in zip(rows, listed):
        number = None if v is None else _number(v)
        if type(v).__name__ in ("bool", "bool_"):  # Python's or NumPy's: TRL casts them to 1.0 / 0.0
            raise RewardFunctionError(f"reward function {name!r} returned {bool(v)!r} (a bool) for "
                                      f"{row_place(row, source)}; return float({bool(v)!r}) or another number (TRL casts "
                                      "bools to 1.0 and 0.0, RLHFless refuses them)")
        if v is not None and number is None:
            raise RewardFunctionError(f"reward function {name!r} returned {_shown(v)} for {row_place(row, source)}; "
                                      "return a finite float or None per completion")
        if number is not None and abs(number) > REWARD_LIMIT:
            raise RewardFunctionError(f"reward function {name!r} returned {_shown(v)} for {row_place(row, source)}, "
                                      f"beyond +-{REWARD_LIMIT:g}, where the step's float32 statistics overflow; "
                                      "return rewards of a moderate scale (e.g. within +-1e6)")
        out.append(number)
    for metric, value in _checked_metrics(name, logged):
        if metrics is not None:
            metrics.setdefault(metric, []).append(value)
    return out


def _as_list(values: Any) -> list | None:
    """A reward function's result as a list: a list or tuple, or a 1-D NumPy array or torch
    tensor (TRL takes those too, ``torch.tensor(result)``); None for anything else."""
    if isinstance(values, (list, tuple)):
        return list(values)
    if getattr(values, "ndim", None) == 1 and callable(getattr(values, "tolist", None)):
        return values.tolist()
    return None


def _number(v: Any) -> float | None:
    """``v`` as a finite float: a real number (NumPy's scalars are registered as ``numbers.Real``)
    or a 0-d array or tensor holding one. None for a bool, a non-finite value or anything else;
    an infinity for an int past float's range (refused as too large by the caller)."""
    if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    try:
        v = float(v)
    except OverflowError:  # an int past float's range: as large as a reward can be
        return math.inf if v > 0 else -math.inf
    return v if math.isfinite(v) else None


def _shown(v: Any) -> str:
    """``v`` for a message: its repr, cut short (an int of 400 digits)."""
    text = repr(v)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


def _checked_metrics(name: str, logged: Sequence[tuple[Any, Any]]) -> list[tuple[str, float]]:
    """``log_metric``'s (name, value) pairs as (str, float). Raises RewardFunctionError at the first bad one."""
    out = []
    for metric, value in logged:
        if not isinstance(metric, str) or not METRIC_NAME.fullmatch(metric):
            raise RewardFunctionError(
                f"reward function {name!r} called log_metric with the name {metric!r}; a metric name is a string "
                "of 1-100 letters, digits and _ . / - that starts with a letter, digit or _: fix the name")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardFunctionError(
                f"reward function {name!r} logged {value!r} ({type(value).__name__}) as metric {metric!r}; "
                "log_metric takes one finite number (a tensor: pass value.item())")
        out.append((metric, float(value)))
    return out


def _failing_row(fn: Callable, rows: Sequence[Any], kwargs: dict[str, list], trainer_state: Any,
                 source: str | None = None) -> str:
    """The first row on which ``fn`` raises alone (the batch call does not say which), as ``row_place`` names it."""
    for i, row in enumerate(rows):
        try:
            # these calls only locate the row: what they log is not part of any step's metrics
            _invoke(fn, {k: [v[i]] for k, v in kwargs.items()}, trainer_state, lambda metric, value: None)
        except Exception:
            return row_place(row, source, i)
    return "prompt_id ? (it raised only on the whole batch)"


def row_place(row: Any, source: str | None, number: int | None = None) -> str:
    """``row`` for a message: where it is in the file it was read from (``data.train_path
    d.jsonl:3 (prompt_id N)``, as ``dataset.record_where`` names it), when ``source`` is given
    and the row carries its line; else ``prompt_id N``, the stored copy's rows having no place
    in a file, followed by ``(row <number> of the batch)`` when ``number`` (from 0) is given."""
    line = getattr(row, "line", None)
    if source is not None and line is not None:
        return f"{record_where(source, line, getattr(row, 'file', None))} (prompt_id {row.prompt_id})"
    return f"prompt_id {row.prompt_id}" + (f" (row {number} of the batch)" if number is not None else "")


PASSED = ("trainer_state", "log_extra", "log_metric")
"""The keywords ``_invoke`` adds to the call's inputs (``kwargs``)."""


def unbound_parameter(name: str, fn: Callable, keywords: Collection[str], dataset: str = "the dataset",
                      fix: Callable[[str], str] | None = None) -> str | None:
    """Why ``fn``'s signature cannot take a call whose keywords are ``keywords`` (the inputs'
    names, ``PASSED`` added), with the fix: its first parameter that needs a value and that no
    keyword fills (a column ``dataset`` lacks, often a misspelt one), or keywords it has no
    parameter for and no ``**kwargs``. ``fix``: the parameter's name -> what to do about it, in
    place of renaming it (an eval file that lacks a training file's column). None when the
    signature binds (or cannot be read): a TypeError is then the function's own."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object without a readable signature
        return None
    passed = set(keywords) | set(PASSED)
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    missing = [p.name for p in params if p.kind in keyword and p.default is p.empty and p.name not in passed]
    if not missing:
        extra = sorted(passed - {p.name for p in params if p.kind in keyword})
        if extra and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            shown = ", ".join(repr(k) for k in extra[:6]) + (f" and {len(extra) - 6} more" if len(extra) > 6 else "")
            on = "" if dataset == "the dataset" else f" on the rows of {dataset}"
            return (f"reward function {name!r} takes neither **kwargs nor keywords the call passes it{on} ({shown}); "
                    "add **kwargs to its parameters, as TRL's reward functions have")
        return None
    if missing[0] in DROPPED:
        return (f"reward function {name!r}: its parameter {missing[0]!r} is never passed (as in TRL, a dataset's "
                f"{missing[0]!r} column is left out of the reward keywords); read the sampled completion from "
                "completions (completion_ids), or rename the column and the parameter")
    columns = sorted(passed - set(RESERVED))
    close = difflib.get_close_matches(missing[0], columns, n=len(columns), cutoff=0.6)
    listed = ", ".join(repr(c) for c in close + [c for c in columns if c not in close]) or "none"
    return (f"reward function {name!r}: its parameter {missing[0]!r} is not a column of {dataset} (columns: "
            f"{listed}; keywords always passed: {', '.join(RESERVED)}); "
            + (fix(missing[0]) if fix else f"rename the parameter to a column, or give it a default "
               f"({missing[0]}=None), or drop it and read the columns from **kwargs"))
