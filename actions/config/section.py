"""The base of every configuration section: unknown keys are errors, assignments validated,
every float finite (``nan`` or ``inf`` in a weight, a timeout or a price is refused with the
field named, rather than failing later far from the config), and no number a boolean."""

from __future__ import annotations

import os
import types
import typing
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

BOOL_NOT_NUMBER = "bool_not_number"
"""The error type of a boolean given for a number; its context holds ``field``, ``value``,
``kind`` and the field's ``default``, and ``flows.config.load_config`` names the dotted key with
:func:`bool_error_line`."""


def expand_home(value: str) -> str:
    """A path whose first part is ``~`` or ``~user`` with that part expanded, as a shell expands
    it on the command line (nothing expands it in a YAML file); any other value as it is."""
    return os.path.expanduser(value) if value.startswith("~") else value


HomePath = Annotated[str, AfterValidator(expand_home)]
"""A local path setting (a model folder, a data file, a log folder) that may start with ``~``."""


def _numeric_kind(annotation: Any) -> str | None:
    """``"an integer"`` or ``"a number"`` where ``annotation`` takes an int or a float and no
    boolean (``int``, ``float | None``, ``Literal["auto"] | Annotated[int, ...]``); else None."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    numbers = set()
    for m in members:
        if typing.get_origin(m) is Annotated:
            m = typing.get_args(m)[0]
        if m is type(None) or (typing.get_origin(m) is Literal and not any(isinstance(a, bool)
                                                                            for a in typing.get_args(m))):
            continue
        if m not in (int, float):  # a bool, a string or a structure: its own validators decide
            return None
        numbers.add(m)
    return ("a number" if float in numbers else "an integer") if numbers else None


@cache
def _bool_refusal(section: type, name: str) -> dict[str, Any] | None:
    """The error context (``kind`` and the ``default`` to suggest, or None) for field ``name``
    of ``section`` when it is a number field; else None."""
    spec = section.model_fields[name]
    kind = _numeric_kind(spec.annotation)
    if kind is None:
        return None
    default = spec.default  # a number to show, or a word (null, auto) the field also takes
    if default is None or not isinstance(default, (int, float, str)):
        default = "null" if default is None else ""  # required: nothing to suggest
    return {"kind": kind, "default": default}


def bool_error_line(key: str, ctx: dict[str, Any]) -> str:
    """The one-line error for a boolean given for the number at dotted ``key``."""
    default = ctx["default"]
    fix = f", e.g. {key}: {default}" if isinstance(default, (int, float)) else f", or {default}" if default else ""
    return (f"{key}={ctx['value']} is not a number (YAML reads true/false, yes/no and on/off as booleans); "
            f"set {ctx['kind']}{fix}")


class Section(BaseModel):
    """A config section that forbids unknown keys, so a typo names the key instead of being ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_bool_number(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic takes True for 1 and 1.0: `temperature: false` would decode greedily,
        # `steps: yes` run one step. A field that takes a boolean itself is left to its own rules.
        if isinstance(v, bool) and info.field_name and (refusal := _bool_refusal(cls, info.field_name)):
            ctx = {**refusal, "field": info.field_name, "value": v}
            raise PydanticCustomError(BOOL_NOT_NUMBER, bool_error_line(info.field_name, ctx), ctx)
        return v


def with_quiet_defaults(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` (``model``'s ``model_dump``) with the fields a dump leaves out at their default
    (``exclude_if``: settings newer than runs and actions that refuse unknown keys) put back, in
    field order: every setting shows, as ``rlhfless config --reference`` lists them."""
    from pydantic_core import to_jsonable_python

    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if name in dumped:
            out[name] = (with_quiet_defaults(value, dumped[name])
                         if isinstance(value, BaseModel) and isinstance(dumped[name], dict) else dumped[name])
        elif info.exclude_if is not None and info.exclude_if(value):
            out[name] = to_jsonable_python(value)
    return out


def section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the section class a field's ``annotation`` holds, or None; whether it is a list of them):
    ``X``, ``X | None``, ``list[X] | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args:
        inner, _ = section_of(args[0])
        return inner, True
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            inner, many = section_of(arg)
            if inner is not None:
                return inner, many
    return None, False
