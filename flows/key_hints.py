"""Where else a mistyped configuration key is a setting: ``train.steps`` is the top level's
``steps``. Pure: reads the pydantic models' fields, touches nothing."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel


def _sections(annotation: Any, many: bool = False) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic models a field's annotation holds (``X``, ``X | None``, ``list[X] | None``),
    each with whether it is a list's entry."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, many)]
    inner = many or typing.get_origin(annotation) is list
    return [found for arg in typing.get_args(annotation) for found in _sections(arg, inner)]


def setting_paths(name: str, root: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted path under ``root`` whose last part is ``name`` (a list's entry as ``[i]``),
    shallowest first."""
    found: list[str] = []
    deeper: list[str] = []
    for field, info in root.model_fields.items():
        path = f"{prefix}{field}"
        if field == name:
            found.append(path)
        for section, many in _sections(info.annotation):
            deeper += setting_paths(name, section, f"{path}{'[i]' if many else ''}.")
    return found + deeper


def elsewhere_hint(key: str, root: type[BaseModel]) -> str:
    """``; `steps` is a setting of the top level: steps`` for an unknown dotted ``key`` whose last
    part is a setting of another section, else ''."""
    name = key.rsplit(".", 1)[-1]
    paths = [p for p in setting_paths(name, root) if p != key][:3]
    if not paths:
        return ""
    return f"; {name!r} is a setting elsewhere: {' or '.join(paths)}"
