"""Reward functions: built-ins and ``package.module:function`` plug-ins, weighted and summed.

Every reward function has TRL's signature, so existing TRL reward functions work unchanged::

    fn(prompts: list, completions: list, completion_ids: list[list[int]], trainer_state,
       log_extra, log_metric, **columns) -> list[float | None]

``prompts`` are the dataset's prompts as written there (a string, or a list of chat messages),
not the text the policy reads (``chat.py`` applies the chat template and ``data.system_prompt``
to that); ``completions`` are strings for string prompts and ``[{"role": "assistant",
"content": ...}]`` for chat prompts (TRL's conversational format); ``completion_ids`` the
completions' token ids as trained (ending with the EOS id where the sample stopped, as in TRL);
``trainer_state`` a ``transformers.TrainerState`` (``actions/tasks/rewards/trainer_state.py``
says which fields are filled); ``log_metric(name, value)`` and ``log_extra(column, values)``
TRL's logging callables (``calling.py``). Every other column of the dataset (the id column
too, all but the prompt) arrives as a keyword list under its own name with its JSON values, as
TRL passes them: a number stays a number, a null is None, and so is a key a JSON Lines row
leaves out (every row has every column of its file, ``fields.to_rows``, as in a Hugging Face
dataset, so every batch passes every column); as in TRL, a ``completion`` or
``completion_ids`` column does not (``calling.DROPPED``). ``answer`` is the dataset's
``answer`` column; a dataset without one whose reference is in another column
(``data.answer_key: solution``) gets the reference under ``answer`` as well, and one without any
reference gets no ``answer`` keyword. The built-ins alone read the reference as text
(``PromptRow.answer``). ``None`` means "not applicable to this row". An ``async`` function is
awaited, and a 1-D NumPy array or torch tensor, or NumPy scalars, are taken as TRL takes them
(``calling.py``).

A row's reward is the weighted sum over the functions that apply to it (None counts as 0, as
in TRL's nansum), plus the weighted scores of the reward models (``reward.models``, scored by
``model_scoring.py`` and passed in as ``model_scores``). Its best possible reward is the
functions' sum over each one's maximum (1.0 for the built-ins; a plug-in may set a
``max_reward`` attribute, and a ``min_reward`` one, each a finite number; a reward model has
none), and evaluation counts a completion correct when the functions' sum, the reward models'
scores left out, reaches it (a row no function applies to is never correct). A function that
raises, or returns a list of the wrong length or type, or rewards whose weighted sum overflows
to a non-finite total, fails the step with :class:`RewardFunctionError` naming the function
and the row; it is a bug in the function and is never retried. A reward model's NaN or infinite
score fails it with :class:`RewardModelError` naming the model and the row (never retried either).
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from actions.config.quoting import clip, quote
from actions.config.reward import BUILTIN_REWARDS
from actions.tasks.rewards.calling import (
    DROPPED,
    RESERVED,
    REWARD_LIMIT,
    RewardFunctionError,
    call_reward,
    row_place,
    unbound_parameter,
)
from actions.tasks.rewards.trainer_state import make_trainer_state


class RewardModelError(ValueError):
    """A reward model scored a completion with NaN or an infinity: the same weights score the
    same text alike again, so it is not transient and never retried."""

    field = "reward.models"


class RewardSpec(Protocol):
    name: str
    weight: float
    pattern: str | None


class RewardRow(Protocol):
    prompt_id: int
    prompt: str
    answer: str
    has_answer: bool
    source_prompt: Any
    source_answer: Any
    columns: dict[str, Any]


def load_reward(name: str, pattern: str | None = None) -> Callable[..., list[float | None]]:
    """The callable behind a reward name. Raises RewardFunctionError for an unknown built-in,
    a module that does not import or a missing attribute (the message says which)."""
    if ":" not in name:
        return _builtin(name, pattern)
    module_name, attr = name.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not (exc.name and (module_name + ".").startswith(exc.name + ".")):  # a module it imports is missing
            raise RewardFunctionError(f"reward.functions name {quote(name)}: importing module {quote(module_name)} "
                                      f"raised ModuleNotFoundError: {clip(exc)}; install what it imports (and in the "
                                      "action image)") from None
        stem = module_name.removesuffix(".py")
        hint = f" and name it {quote(f'{stem}:{attr}')}" if module_name.endswith(".py") else ""
        raise RewardFunctionError(
            f"reward.functions name {quote(name)}: module {quote(module_name)} cannot be imported "
            f"({type(exc).__name__}: {clip(exc)}); put it on PYTHONPATH{hint} (and in the action image)") from None
    except Exception as exc:  # found, but its own code failed: any import-time failure is a configuration error
        raise RewardFunctionError(
            f"reward.functions name {quote(name)}: importing module {quote(module_name)} raised "
            f"{type(exc).__name__}: {clip(exc)}; fix the module, or what it needs at import (an environment "
            "variable, a file)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardFunctionError(f"reward.functions name {quote(name)}: {clip(module_name)} has no function "
                                  f"{quote(attr)}; name a function as package.module:function")
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
        raise RewardFunctionError(f"reward.functions name {quote(name)} is not a built-in "
                                  f"({', '.join(BUILTIN_REWARDS)}) nor package.module:function; fix the name")
    return fn


def reward_inputs(rows: Sequence[RewardRow], texts: Sequence[str]) -> tuple[list, list, dict[str, list]]:
    """(prompts, completions, columns) in TRL's formats for rows and their completion texts: the
    dataset's prompts (``prompt``, the policy's text, where a stored row has no ``source_prompt``)
    and its columns by name (None where a row lacks one: a row stored before every row had every
    column of its file, or one built by hand; not the keywords' own names nor
    ``calling.DROPPED``'s, TRL's ``completion`` and ``completion_ids``). ``answer`` is the row's ``answer``
    column, else its reference as the dataset wrote it (``source_answer`` or ``answer``); it is
    left out where no row has either (module docstring)."""
    prompts = [r.source_prompt if r.source_prompt is not None else r.prompt for r in rows]
    completions = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts)]
    columns = {k: [r.columns.get(k) for r in rows] for k in _passed_columns(rows)}
    if any(r.has_answer for r in rows):
        columns["answer"] = [r.columns["answer"] if "answer" in r.columns else _reference(r) for r in rows]
    return prompts, completions, columns


def _passed_columns(rows: Sequence[RewardRow]) -> list[str]:
    """The columns of ``rows`` that reach the reward functions under their own names, sorted."""
    return sorted({k for r in rows for k in r.columns} - set(RESERVED) - set(DROPPED))


def column_keywords(rows: Sequence[RewardRow]) -> set[str]:
    """The names of the column keywords :func:`reward_inputs` passes for ``rows`` (``answer``
    where a row has a reference), without computing their values."""
    return set(_passed_columns(rows)) | ({"answer"} if any(r.has_answer for r in rows) else set())


def _reference(row: RewardRow) -> Any:
    """The row's reference as the dataset wrote it (a number stays a number); None without one."""
    if not row.has_answer:
        return None
    return row.source_answer if row.source_answer is not None else row.answer


def _call(spec: RewardSpec, fn: Callable, rows: Sequence[RewardRow], kwargs: dict[str, list], trainer_state: Any,
          metrics: dict[str, list[float]] | None = None, **how: str | None) -> list[float | None]:
    """``call_reward`` with the reference as text for a built-in (a plug-in gets the dataset's value)."""
    if ":" not in spec.name:
        kwargs = kwargs | {"answer": [r.answer for r in rows]}
    return call_reward(spec.name, fn, rows, kwargs, trainer_state, metrics, **how)


@dataclass(frozen=True)
class Rewards:
    total: list[float]
    """Per row: the weighted sum over the functions that apply and the reward models (0.0 when none does)."""
    best: list[float]
    """Per row: the largest ``function_total`` the applicable functions allow (reward models add nothing)."""
    per_function: dict[str, list[float | None]]
    function_total: list[float]
    """Per row: ``total`` less the reward models, what ``best`` bounds (0.0 when no function applies)."""
    function_applicable: list[bool]
    """Per row: did any reward function score it (reward models aside)."""
    applicable: list[bool] = field(default_factory=list)
    """Per row: did any function or reward model score it (False: every reward was None)."""
    metrics: dict[str, list[float]] = field(default_factory=dict)
    """What the functions passed to ``log_metric``: name -> values, in call order."""


def compute_rewards(specs: Sequence[RewardSpec], rows: Sequence[RewardRow], texts: Sequence[str], *,
                    completion_ids: Sequence[Sequence[int]] | None = None, trainer_state: Any = None,
                    model_scores: Mapping[str, tuple[float, list[float]]] | None = None) -> Rewards:
    """Score ``texts`` (one completion per row) with every function of ``specs``.

    Args:
        completion_ids: per row, the completion's token ids (TRL's ``completion_ids``; default: empty lists).
        trainer_state: passed as TRL's ``trainer_state`` (``trainer_state.make_trainer_state``).
        model_scores: reward-model name -> (weight, one score per row), added to the totals.

    Raises:
        RewardFunctionError: a function raised, returned the wrong length/type (names it and the
            row) or logged a bad metric (names it and the metric).
        RewardModelError: a reward model's score is NaN or infinite (names the model and the row).
    """
    prompts, completions, columns = reward_inputs(rows, texts)
    ids = [list(c) for c in completion_ids] if completion_ids is not None else [[] for _ in rows]
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": ids, **columns}
    total = [0.0] * len(rows)
    best = [0.0] * len(rows)
    applicable = [False] * len(rows)
    per_function: dict[str, list[float | None]] = {}
    metrics: dict[str, list[float]] = {}
    weights: dict[str, float] = {}
    for spec in specs:
        fn = load_reward(spec.name, spec.pattern)
        values = _call(spec, fn, rows, kwargs, trainer_state, metrics)
        per_function[spec.name], weights[spec.name] = values, spec.weight
        top, low = reward_bounds(spec.name, fn)
        for i, v in enumerate(values):
            if v is not None:
                total[i] += spec.weight * v
                best[i] += max(spec.weight * top, spec.weight * low)
                applicable[i] = True
    function_total, function_applicable = list(total), list(applicable)
    for name, (weight, scores) in (model_scores or {}).items():
        _check_model_scores(name, scores, rows)
        per_function[name], weights[name] = list(scores), weight
        for i, v in enumerate(scores):
            total[i] += weight * v
            applicable[i] = True
    _check_totals(total, rows, per_function, weights)
    return Rewards(total=total, best=best, per_function=per_function, function_total=function_total,
                   function_applicable=function_applicable, applicable=applicable, metrics=metrics)


def reward_bounds(name: str, fn: Callable) -> tuple[float, float]:
    """(``max_reward``, ``min_reward``) of a reward function: its attributes, 1.0 and 0.0 when
    it sets none. Raises RewardFunctionError for one that is not a finite number, naming the
    function, the attribute, the value and the fix."""
    out = []
    for attr, default in (("max_reward", 1.0), ("min_reward", 0.0)):
        value = getattr(fn, attr, default)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardFunctionError(
                f"reward function {name!r} has {attr} = {value!r} ({type(value).__name__}); {attr} is the finite "
                f"number its rewards reach at {'best' if attr == 'max_reward' else 'worst'}: set it to one (e.g. "
                f"{name.rpartition(':')[2]}.{attr} = {default}), or remove it for the default {default}")
        out.append(float(value))
    return out[0], out[1]


def _check_model_scores(name: str, scores: Sequence[float], rows: Sequence[RewardRow]) -> None:
    """Raise RewardModelError for a reward model's first score that is not finite (the score
    action names its cause first, ``model_scoring.check_scores``): the functions' values are
    finite, so a non-finite total would otherwise read as their overflow."""
    for row, v in zip(rows, scores):
        if not math.isfinite(v):
            raise RewardModelError(
                f"reward.models[{name.rpartition('/')[2]}] scored prompt_id {row.prompt_id} {v}, not a finite number: "
                "its weights hold NaN or inf, or its activations overflow in the dtype it ran in (bfloat16 or "
                "float16); check the folder's weights, or score in float32 (RLHFLESS_DTYPE=float32)")


def _check_totals(total: Sequence[float], rows: Sequence[RewardRow], per_function: Mapping[str, Sequence[Any]],
                  weights: Mapping[str, float], source: str | None = None) -> None:
    """Raise RewardFunctionError for the first row whose weighted sum is beyond
    ``REWARD_LIMIT``: each value is within it, but a sum of large ones, or a large weight, may
    not be, and the step's float32 statistics would overflow (an infinite reward turns the
    update's gradients to NaN). ``source``: the file the rows were read from, which names a
    row by its place in it (``row_place``); None: by prompt_id."""
    for i, t in enumerate(total):
        if abs(t) <= REWARD_LIMIT:
            continue
        terms = ", ".join(f"{n!r} {v[i]:g} x weight {weights[n]:g}" for n, v in per_function.items()
                          if v[i] is not None)
        raise RewardFunctionError(
            f"reward.functions: the weighted sum of the rewards for {row_place(rows[i], source)} is {t:g} ({terms}), "
            f"beyond +-{REWARD_LIMIT:g}, where the step's float32 statistics overflow: return rewards of a moderate "
            "scale (e.g. within +-1e6), or lower their weights")


def is_best(rewards: Rewards, tolerance: float = 1e-9) -> list[bool]:
    """Per row: did a reward function apply, and did the functions' weighted sum reach the best
    they allow? Reward models define no best and do not count: their scores would let a wrong
    completion pass, or hold a right one back. A best of 0 or below (a penalty whose
    ``max_reward`` is 0) is reached like any other."""
    return [applied and t >= b - tolerance
            for t, b, applied in zip(rewards.function_total, rewards.best, rewards.function_applicable)]


STARTUP_CHECK = ("reward check at start-up, before any step (each package.module:function is called on up to 2 "
                 "training rows, their reference answers as the completions, '' where a row has none)")


def check_reward_functions(specs: Sequence[RewardSpec], rows: Sequence[RewardRow],
                           encode: Callable[[str], Sequence[int]] | None = None, *, trainer_state: Any = None,
                           sources: Sequence[tuple[str, Sequence[RewardRow]]] = ()) -> None:
    """Import every function and call each plug-in once on up to two rows, with the reference
    answers as completions ("" for a row without one; their token ids from ``encode``, when
    given) and ``trainer_state`` (default: step 0 of a one-step campaign; a campaign passes its
    own, so ``global_step / max_steps`` works as in TRL), so a broken plug-in fails at start-up
    rather than mid-campaign. A dataset column
    named like a keyword the call fills itself (``calling.RESERVED``, but for the ``DROPPED``
    ``completion_ids``, left out as TRL leaves it out) is refused for a plug-in,
    in every set of ``sources`` ((name as errors give it, rows): the train and the eval rows, as
    evaluation calls the plug-ins too; none: ``rows``, named "the dataset"; the set that
    ``rows`` begins names the sample rows that carry their line in errors),
    and so is a plug-in whose signature cannot take the columns of one of them (a parameter that
    is a column of the training file but not of the eval file), and so are
    ``max_reward``/``min_reward`` attributes that are not finite numbers and sample rewards
    whose weighted sum is not finite.

    Raises:
        RewardFunctionError: naming the function and what is wrong.
    """
    sample = list(rows[:2])
    per_function: dict[str, list[float | None]] = {}
    weights: dict[str, float] = {}
    total = [0.0] * len(sample)
    state = trainer_state or make_trainer_state(step=0, epoch=0.0, max_steps=1, optimizer_steps_per_step=1)
    # the file the sample was read from, so an error names its row as the dataset's own errors do
    where = next((name for name, checked in sources if list(checked[:len(sample)]) == sample), None)
    for spec in specs:
        fn = load_reward(spec.name, spec.pattern)
        reward_bounds(spec.name, fn)
        if ":" in spec.name:
            for source, checked in sources or (("the dataset", rows),):
                _check_column_names(spec.name, source, checked)
            prompts, completions, columns = reward_inputs(sample, [r.answer for r in sample])
            ids = [list(encode(r.answer)) if encode else [] for r in sample]
            kwargs = {"prompts": prompts, "completions": completions, "completion_ids": ids, **columns}
            try:
                values = _call(spec, fn, sample, kwargs, state, raised_fix="", source=where)
            except RewardFunctionError as exc:  # say where it was called: no step has run
                raise RewardFunctionError(f"{STARTUP_CHECK}: {exc}") from None
            per_function[spec.name], weights[spec.name] = values, spec.weight
            total = [t + spec.weight * v if v is not None else t for t, v in zip(total, values)]
            _check_signature(spec.name, fn, sources)
    _check_totals(total, sample, per_function, weights, where)  # the plug-ins' sum: built-ins score at most 1 each


def _check_signature(name: str, fn: Callable, sources: Sequence[tuple[str, Sequence[RewardRow]]]) -> None:
    """Raise RewardFunctionError where ``fn``'s signature cannot take the columns one set of
    ``sources`` passes it (the sample call saw two training rows only; evaluation calls the
    plug-ins on the eval rows, whose file may lack a column), naming the set, the parameter and
    the fix. Reads signatures only: nothing is called."""
    have = {source: column_keywords(rows) for source, rows in sources if rows}
    for source, columns in have.items():
        def fix(param: str, source: str = source) -> str:
            other = next((s for s, c in have.items() if param in c), None)
            said = f"{other} has it, but the reward functions are called on these rows too: " if other else ""
            return f"{said}add the column to {source}, or give the parameter a default ({param}=None)"

        problem = unbound_parameter(name, fn, columns | {"prompts", "completions", "completion_ids"}, source, fix)
        if problem:
            raise RewardFunctionError(problem)


def _check_column_names(name: str, source: str, rows: Sequence[RewardRow]) -> None:
    """Raise RewardFunctionError for a column of ``rows`` (named ``source``: ``data.eval_path
    e.jsonl``) that a reward keyword would shadow."""
    clash = sorted({k for r in rows for k in r.columns} & (set(RESERVED) - set(DROPPED)))
    if clash:
        raise RewardFunctionError(
            f"reward.functions {name!r}: {source} has a column named {clash[0]!r}, a keyword the reward functions "
            f"receive from the trainer ({', '.join(RESERVED)}), so the column cannot reach them; rename the column "
            + ("(TRL's GRPOTrainer fails on it too)" if clash[0] in ("prompts", "completions") else
               "(TRL's GRPOTrainer passes its own value in its place)"))
