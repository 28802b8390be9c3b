"""Every error message that names a configuration key (``section.key``) names one that exists.

The messages are read statically (``ast``): the text of every exception raised in ``flows/``
and ``actions/`` (string literals and the literal parts of f-strings). A dotted name whose first
part is a section of ``CampaignConfig`` (``scaling``, ``generation``, ...) must resolve, part by
part, to a setting of the configuration's schema: a message that sends a user to
``scaling.group_size`` when the setting is ``algorithm.group_size`` fails here.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

from pydantic import BaseModel

from flows.config import CampaignConfig

ROOT = Path(__file__).resolve().parent.parent
DOTTED = re.compile(r"(?<![\w.])([a-z_]+)\.([a-z_][a-z0-9_]*)(?:\.([a-z_][a-z0-9_]*))?")


def _section(annotation) -> type[BaseModel] | None:
    """The settings model of a field: itself, or the one model of an optional one
    (``LoraConfig | None``)."""
    candidates = [annotation, *typing.get_args(annotation)]
    models = [a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if models else None


SECTIONS = {name: model for name, f in CampaignConfig.model_fields.items()
            if (model := _section(f.annotation)) is not None}


def resolves(parts: list[str]) -> bool:
    """Whether ``section.key[.sub]`` is a setting of the schema."""
    model: type[BaseModel] | None = SECTIONS[parts[0]]
    for part in parts[1:]:
        if model is None or part not in model.model_fields:
            return False
        model = _section(model.model_fields[part].annotation)
    return True


def messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every exception raised with a message in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for arg in node.exc.args:
                parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
                text = "".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str))
                if text:
                    out.append((node.lineno, text))
    return out


def unknown_keys(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: key`` of every configuration key named in ``path``'s messages that does not exist."""
    found = []
    for line, text in messages(path):
        for match in DOTTED.finditer(text):
            parts = [p for p in match.groups() if p]
            if parts[0] in SECTIONS and not resolves(parts):
                found.append(f"{path.relative_to(root)}:{line}: {'.'.join(parts)}")
    return found


def test_the_walk_reads_messages_and_can_fail(tmp_path: Path) -> None:
    assert {"scaling", "generation", "algorithm", "store"} <= set(SECTIONS)
    assert resolves(["algorithm", "group_size"]) and not resolves(["scaling", "group_size"])
    probe = tmp_path / "probe.py"
    probe.write_text('def f(v):\n    raise ValueError(f"scaling.group_size={v}: use algorithm.group_size")\n')
    assert unknown_keys(probe, tmp_path) == ["probe.py:2: scaling.group_size"]


def test_every_error_names_a_key_that_exists() -> None:
    sources = [p for d in ("flows", "actions") for p in sorted((ROOT / d).rglob("*.py"))]
    assert sum(len(messages(p)) for p in sources) > 100  # the walk sees the messages
    found = [k for p in sources for k in unknown_keys(p)]
    assert not found, "error messages naming keys the configuration does not have:\n" + "\n".join(found)
