"""The ``reward`` section: weighted reward functions, built-in or ``package.module:function``."""

from __future__ import annotations

import re

from pydantic import field_validator, model_validator

from actions.common.config_section import Section as _Section
from actions.common.quoting import quote

BUILTIN_REWARDS = ("repeat", "gsm8k", "math", "exact_match", "format")
"""The built-in reward functions' names (``actions/tasks/rewards`` implements each)."""


class RewardFunctionConfig(_Section):
    name: str
    """A built-in (repeat, gsm8k, math, exact_match, format) or ``package.module:function``."""
    weight: float = 1.0
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
                         "package.module:function; fix the name")

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


class RewardConfig(_Section):
    functions: list[RewardFunctionConfig] | None = None
    """Weighted reward functions, summed; None: the task's (repeat: repeat, arith: gsm8k)."""

    @field_validator("functions")
    @classmethod
    def _check_functions(cls, v: list[RewardFunctionConfig] | None) -> list[RewardFunctionConfig] | None:
        if v is not None and not v:
            raise ValueError("reward.functions is empty; name at least one, e.g. [{name: gsm8k}], or remove the key")
        if v is not None and len({f.name for f in v}) != len(v):
            raise ValueError("reward.functions names a function twice; give each once (weights add up instead)")
        return v


TASK_REWARDS = {"repeat": "repeat", "arith": "gsm8k"}
