"""Where else a mistyped configuration key is a setting: ``train.steps`` is the top level's
``steps``. Pure: reads the pydantic models' fields, touches nothing."""

from __future__ import annotations

from pydantic import BaseModel

from actions.config.section import section_of


def setting_paths(name: str, root: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted path under ``root`` whose last part is ``name`` (a list's entry as ``[i]``),
    shallowest first."""
    found: list[str] = []
    deeper: list[str] = []
    for field, info in root.model_fields.items():
        path = f"{prefix}{field}"
        if field == name:
            found.append(path)
        section, many = section_of(info.annotation)
        if section is not None:
            deeper += setting_paths(name, section, f"{path}{'[i]' if many else ''}.")
    return found + deeper


def elsewhere_hint(key: str, root: type[BaseModel]) -> str:
    """``; 'steps' is a setting elsewhere: steps or warmup.steps`` for an unknown dotted ``key``
    whose last part is a setting of another section (at most three named), else ''."""
    name = key.rsplit(".", 1)[-1]
    paths = [p for p in setting_paths(name, root) if p != key][:3]
    if not paths:
        return ""
    return f"; {name!r} is a setting elsewhere: {' or '.join(paths)}"
