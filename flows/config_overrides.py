"""``--set dotted.key=value`` overrides, applied to what the user wrote before it is validated.

A key is dotted section names down to a setting (``algorithm.lr``). A list setting's entry is
named by its index, ``reward.models[0].weight`` (or ``reward.models.0.weight``): the entry must
exist already (the list comes from the configuration file or an earlier ``--set`` that gave it
whole), since an entry made up of one field would drop the others it needs. The value is YAML
(``[{path: /m, weight: 0.5}]`` replaces a list whole), or the text as written where it does not
parse.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from actions.config.quoting import quote
from flows.config_yaml import AliasBomb, load_yaml

_INDEXED = re.compile(r"([^\[\]]+)((?:\[\d+\])+)")


def parse_override(item: str) -> tuple[list[str | int], Any]:
    """``a.b[0].c=value`` -> (["a", "b", 0, "c"], parsed YAML value).

    >>> parse_override("reward.models[1].weight=0.5")
    (['reward', 'models', 1, 'weight'], 0.5)
    >>> parse_override("algorithm.lr=1e-3")
    (['algorithm', 'lr'], 0.001)
    """
    if "=" not in item:
        raise ValueError(f"--set {quote(item)} is not of the form dotted.key=value, e.g. --set algorithm.lr=1e-3")
    key, raw = item.split("=", 1)
    parts: list[str | int] = []
    for segment in key.strip().split("."):
        indexed = _INDEXED.fullmatch(segment)
        if indexed:
            parts.append(indexed.group(1))
            parts.extend(int(i) for i in re.findall(r"\d+", indexed.group(2)))
        elif segment.isdigit() and parts:
            parts.append(int(segment))
        elif segment and "[" not in segment and "]" not in segment:
            parts.append(segment)
        elif not segment:
            raise ValueError(f"--set {quote(item)} has an empty key segment; use dotted.key=value")
        else:
            raise ValueError(f"--set {quote(item)} has a malformed key segment {quote(segment)}; use "
                             "dotted.key=value, with [i] for an entry of a list (reward.models[0].weight=0.5)")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except AliasBomb as exc:
        raise ValueError(f"--set {quote(key)}: the value is refused: {exc}; write the value out") from None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply the override ``item`` to ``raw`` (changed in place): sections are made as needed,
    list entries must exist. Raises ValueError naming the key and the fix."""
    parts, value = parse_override(item)
    node: Any = raw
    for depth, part in enumerate(parts[:-1]):
        node = _child(node, part, parts[:depth], parts[depth + 1], item)
    last = parts[-1]
    if isinstance(last, int):
        _entry(node, last, parts[:-1], item)
    else:
        _section(node, parts[:-1], last, item)
    node[last] = value


def _child(node: Any, part: str | int, above: list[str | int], below: str | int, item: str) -> Any:
    if isinstance(part, int):
        return _entry(node, part, above, item)[part]
    _section(node, above, part, item)
    child = node.setdefault(part, [] if isinstance(below, int) else {})
    if isinstance(child, (dict, list)):
        return child
    raise ValueError(f"--set {quote(item)}: {quote(_name([*above, part]))} is a value, not a section")


def _section(node: Any, above: list[str | int], part: str, item: str) -> None:
    """Refuse ``node`` (the setting ``above`` names) where a section must hold ``part``."""
    if isinstance(node, list):
        raise ValueError(f"--set {quote(item)}: {_name(above)} is a list; name an entry, {_name(above)}[0].{part}")
    if not isinstance(node, dict):
        raise ValueError(f"--set {quote(item)}: {quote(_name(above))} is a value, not a section")


def _entry(node: Any, index: int, above: list[str | int], item: str) -> list[Any]:
    """``node`` as a list that holds entry ``index``; ValueError otherwise, naming the fix."""
    name = _name(above)
    if not isinstance(node, list):
        raise ValueError(f"--set {quote(item)}: {name} is not a list; drop the index")
    if index >= len(node):
        raise ValueError(f"--set {quote(item)}: {name} has {len(node)} entr{'y' if len(node) == 1 else 'ies'} "
                         f"in what was given before it, so [{index}] is not one; give the list whole first, e.g. "
                         f"--set '{name}=[{{...}}]', or edit it in the --config file")
    return node


def _name(parts: list[str | int]) -> str:
    """``["reward", "models", 0]`` -> ``reward.models[0]``."""
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text or "the top level"
