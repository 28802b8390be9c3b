"""The ``reward`` section: weighted reward functions, built-in or ``package.module:function``."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from actions.config.quoting import chat_template_mode, quote
from actions.config.section import HomePath
from actions.config.section import Section as _Section

BUILTIN_REWARDS = ("repeat", "gsm8k", "math", "exact_match", "format")
"""The built-in reward functions' names (``actions/tasks/rewards`` implements each)."""
REFERENCE_REWARDS = ("repeat", "gsm8k", "math", "exact_match")
"""The built-ins that compare a completion with the row's reference answer (``data.answer_key``)."""

DEFAULT_MAX_LENGTH = 1024
"""A reward model's input limit in tokens under ``max_length: auto`` (its own limit, if lower)."""


class RewardFunctionConfig(_Section):
    name: str
    """A built-in (repeat, gsm8k, math, exact_match, format) or ``package.module:function``."""
    weight: float = 1.0
    """Its reward is multiplied by this before the rewards are summed."""
    pattern: str | None = None
    """The regular expression of the ``format`` reward (None: its default)."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        module, _, attr = v.partition(":")
        if v in BUILTIN_REWARDS or (module and attr.isidentifier()
                                    and all(p.isidentifier() for p in module.split("."))):
            return v
        raise ValueError(f"reward.functions name {quote(v)} is not a built-in ({', '.join(BUILTIN_REWARDS)}) nor "
                         f"package.module:function; {_name_hint(v)}")

    @model_validator(mode="after")
    def _check_pattern(self) -> RewardFunctionConfig:
        if self.pattern is not None:
            if self.name != "format":
                raise ValueError(f"reward.functions {quote(self.name)} has a pattern, which only the format reward uses; "
                                 "remove it")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"reward.functions format pattern {quote(self.pattern)} is not a regular expression "
                                 f"({exc}); fix it") from None
        return self


def _name_hint(v: str) -> str:
    """The fix for ``v``, a ``reward.functions`` name that is neither a built-in nor
    ``package.module:function``: a module's file (``plugins/mod.py:fn``) is named by its module; a
    Hub id or a folder (``org/model``, ``./rm``; TRL's ``reward_funcs`` takes reward models so) is a
    reward model, which goes under ``reward.models`` as a local folder; ``pkg.mod.fn`` is
    ``pkg.mod:fn``."""
    module, colon, attr = v.partition(":")
    path_like = "/" in module or "\\" in module
    if module.endswith(".py") or (path_like and colon):  # a file path, not a module name
        folder, _, stem = module.replace("\\", "/").rpartition("/")
        return (f"a reward is named by its module, not its file: put its folder ({folder or '.'}) on PYTHONPATH "
                f"and use '{stem.removesuffix('.py')}:{attr or '<function>'}'")
    folder = os.path.isdir(v) and not os.path.isfile(os.path.join(v, "__init__.py"))  # a package is a module
    if not colon and (path_like or folder or not all(p.isidentifier() for p in v.split("."))):
        where = (f"reward.models: [{{path: {v}}}]" if folder else
                 "reward.models: [{path: <local folder>}] with the model downloaded there (reward.models takes a "
                 "local folder, not a Hub id)")
        return ("a reward model (a Hub id or a folder) is not a function: remove it from reward.functions and set "
                + where)
    if not colon and "." in v:
        module, _, attr = v.rpartition(".")
        return f"a function is named by its module and its name joined by ':': use '{module}:{attr}'"
    return "fix the name"


class RewardModelConfig(_Section):
    """A learned reward model: an ``AutoModelForSequenceClassification`` folder that scores
    each (prompt, completion) in the score action (``actions/tasks/rewards/model_scoring.py``)."""

    path: HomePath = Field(min_length=1)
    """A local Hugging Face folder of a sequence-classification model."""
    label: int | str | None = None
    """Which logit is the score: a label name of the model's ``id2label`` (``POSITIVE``) or its
    index. None: the model's only logit (TRL's ``logits[:, 0]`` of a one-label reward model); a
    model with several labels must name one, since its first is often the unwanted class."""
    weight: float = 1.0
    """Its score is multiplied by this before it is added to the functions' sum."""
    batch_size: int = Field(16, gt=0)
    """(prompt, completion) pairs per forward."""
    max_length: Literal["auto"] | Annotated[int, Field(gt=0)] | None = "auto"
    """Longest input in tokens; a longer one keeps its last ``max_length`` tokens (the prompt's
    beginning is cut, not the completion; each step counts the cut rows,
    ``reward_fn/reward_model/<i>/truncated_frac``). ``auto``: ``DEFAULT_MAX_LENGTH`` (1024)
    lowered to what the model takes: its tokenizer's ``model_max_length`` (512 for BERT and
    RoBERTa) and its position embeddings (``max_position_embeddings``, less ``pad_token_id + 1``
    for RoBERTa-style models). None: no limit. A number (or None) beyond what the model takes
    is refused. A value of its own, not "the default": it means the same after the config
    crossed into an action as JSON (which does not keep which fields were set)."""
    chat_template: Literal["auto"] | bool = "auto"
    """``auto``: chat prompts go through the reward tokenizer's chat template with the completion
    as the assistant's turn, string prompts are joined to the completion (TRL's rule); ``true``:
    the template for both (a string prompt becomes the user's turn); ``false``: plain text."""

    @field_validator("chat_template", mode="before")
    @classmethod
    def _check_chat_template(cls, v: Any) -> Any:
        return chat_template_mode(v, "reward.models chat_template")

    @field_validator("label", mode="before")
    @classmethod
    def _check_label(cls, v: Any) -> Any:
        if isinstance(v, bool) or (isinstance(v, int) and v < 0) or v == "":
            raise ValueError(f"reward.models label {v!r} is not a label; give a label name of the model's id2label "
                             "(e.g. POSITIVE) or its index (0, 1, ...)")
        return v


SHORT_ENTRY_KEYS = {"functions": "name", "models": "path"}
"""``reward`` list settings whose entry may be written as one string, and the key it stands
for (``{name: it}``, ``{path: it}``); ``flows/config_overrides.py`` reads entries so too."""


def _entries(v: Any, setting: str, key: str, entry: type, form: str) -> Any:
    """A list setting written as its entries' ``key`` alone: a string is ``{key: it}``, and one
    string or mapping alone is a list of it; an entry of any other type is refused naming
    ``setting[i]`` and ``form`` (what an entry is). Anything not a list is left to pydantic."""
    if isinstance(v, (str, dict)):  # one entry
        v = [v]
    if not isinstance(v, list):
        return v  # None, or a type pydantic's own message names
    for i, e in enumerate(v):
        if not isinstance(e, (str, dict, entry)):
            raise ValueError(f"{setting}[{i}] = {quote(e)}: each entry is {form}")
    return [{key: e} if isinstance(e, str) else e for e in v]


class RewardConfig(_Section):
    functions: list[RewardFunctionConfig] | None = None
    """Weighted reward functions, summed; None: the task's (repeat: repeat, arith: gsm8k), or
    none when ``models`` is set."""
    models: list[RewardModelConfig] = []
    """Reward models, their weighted scores added to the functions' sum."""

    @field_validator("functions", mode="before")
    @classmethod
    def _names_alone(cls, v: Any) -> Any:
        """``[gsm8k, pkg.mod:fn]`` (TRL's ``reward_funcs`` as a list of names) is ``[{name: ...}, ...]``,
        and one name or ``{name, weight}`` alone is a list of it; anything else an entry cannot be is
        refused here."""
        return _entries(v, "reward.functions", SHORT_ENTRY_KEYS["functions"], RewardFunctionConfig,
                        "a function's name or {name, weight}, e.g. [gsm8k, {name: 'my_rewards:fmt', weight: 0.5}]")

    @field_validator("models", mode="before")
    @classmethod
    def _paths_alone(cls, v: Any) -> Any:
        """A folder's path is ``{path: ...}``, and one path or one ``{path, ...}`` alone is a
        list of it, as ``functions`` takes names; anything else an entry cannot be is refused."""
        return _entries(v, "reward.models", SHORT_ENTRY_KEYS["models"], RewardModelConfig,
                        "a model folder's path or {path, weight, ...}, e.g. [{path: /models/rm, weight: 0.5}]")

    @field_validator("functions")
    @classmethod
    def _check_functions(cls, v: list[RewardFunctionConfig] | None) -> list[RewardFunctionConfig] | None:
        if v is not None and not v:
            raise ValueError("reward.functions is empty; name at least one, e.g. [{name: gsm8k}], or remove the key")
        if v is not None and len({f.name for f in v}) != len(v):
            twice = next(f.name for i, f in enumerate(v) if f.name in {g.name for g in v[:i]})
            if len({f.pattern for f in v if f.name == twice}) > 1:  # two patterns: weights cannot merge them
                raise ValueError(f"reward.functions names {quote(twice)} twice, with two patterns; one "
                                 f"{twice} reward is allowed: score a second pattern with a package.module:function")
            raise ValueError(f"reward.functions names {quote(twice)} twice; give each function once (one "
                             "entry's weight is the sum of the weights)")
        return v


TASK_REWARDS = {"repeat": "repeat", "arith": "gsm8k"}


def reward_model_key(run_prefix: str, index: int) -> str:
    """Where ``prepare`` stores reward model ``index`` (its folder's files, as one artifact)."""
    return f"{run_prefix}/reward_models/{index}/manifest.json"
