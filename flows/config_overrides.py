"""``--set dotted.key=value`` overrides, applied to what the user wrote before it is validated.

A key is dotted section names down to a setting (``algorithm.lr``). A list setting's entry is
named by its index, ``reward.models[0].weight`` (or ``reward.models.0.weight``): the entry must
exist already (the list comes from the configuration file or an earlier ``--set`` that gave it
whole), since an entry made up of one field would drop the others it needs. An entry of
``reward.functions`` or ``reward.models`` written in short (a bare name or path, or one entry
not in a list) is the mapping it stands for (``actions/config/reward.py``), so a key below it
applies as to an entry written out. The value is YAML (``[{path: /m, weight: 0.5}]`` replaces a
list whole), or the text as written where it does not parse.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel

from actions.config.quoting import quote
from actions.config.reward import SHORT_ENTRY_KEYS
from flows.config_yaml import AliasBomb, load_yaml

_INDEXED = re.compile(r"([^\[\]]+)((?:\[\d+\])+)")

SHORT_ENTRIES = {("reward", setting): key for setting, key in SHORT_ENTRY_KEYS.items()}
"""List settings whose entry may be one string, standing for ``{key: it}``, and whose one entry
may stand alone, not in a list (``actions.config.reward._entries``): setting -> key."""


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


def apply_override(raw: dict[str, Any], item: str, schema: type[BaseModel] | None = None) -> None:
    """Apply the override ``item`` to ``raw`` (changed in place): sections are made as needed,
    list entries must exist. ``schema``: the model ``raw`` is validated against, read for the
    form a list's entries take in a message's fix (None: guessed from the entries given).
    Raises ValueError naming the key and the fix."""
    parts, value = parse_override(item)
    node: Any = raw
    for depth, part in enumerate(parts[:-1]):
        node = _child(node, part, parts[:depth], parts[depth + 1], item, schema)
    last = parts[-1]
    if isinstance(last, int):
        _entry(node, last, parts[:-1], item, schema)
    else:
        _section(node, parts[:-1], last, item)
    node[last] = value


def _child(node: Any, part: str | int, above: list[str | int], below: str | int, item: str,
           schema: type[BaseModel] | None) -> Any:
    if isinstance(part, int):
        entries = _entry(node, part, above, item, schema)
        key = SHORT_ENTRIES.get(tuple(above))
        if key and isinstance(entries[part], str):  # a bare name or path: the mapping it stands for
            entries[part] = {key: entries[part]}
        return entries[part]
    _section(node, above, part, item)
    child = node.setdefault(part, [] if isinstance(below, int) else {})
    if isinstance(below, int) and tuple([*above, part]) in SHORT_ENTRIES and isinstance(child, (str, dict)):
        child = node[part] = [child]  # one entry alone: the list of it
    if isinstance(child, (dict, list)):
        return child
    raise ValueError(f"--set {quote(item)}: {quote(dotted_key([*above, part]))} is a value, not a section")


def _section(node: Any, above: list[str | int], part: str, item: str) -> None:
    """Refuse ``node`` (the setting ``above`` names) where a section must hold ``part``."""
    if isinstance(node, list):
        raise ValueError(f"--set {quote(item)}: {dotted_key(above)} is a list; name an entry, "
                         f"{dotted_key(above)}[0].{part}")
    if not isinstance(node, dict):
        raise ValueError(f"--set {quote(item)}: {quote(dotted_key(above))} is a value, not a section")


def _entry(node: Any, index: int, above: list[str | int], item: str, schema: type[BaseModel] | None) -> list[Any]:
    """``node`` as a list that holds entry ``index``; ValueError otherwise, naming the fix."""
    name = dotted_key(above)
    if not isinstance(node, list):
        raise ValueError(f"--set {quote(item)}: {name} is not a list; drop the index")
    if index >= len(node):
        raise ValueError(f"--set {quote(item)}: {name} has {len(node)} entr{'y' if len(node) == 1 else 'ies'} "
                         f"in what was given before it, so [{index}] is not one; give the list whole first, e.g. "
                         f"--set '{name}={_list_example(schema, above, node)}', or edit it in the --config file")
    return node


def _list_example(schema: type[BaseModel] | None, parts: list[str | int], given: list[Any]) -> str:
    """A value of the list setting ``parts`` for a message's fix, in YAML: ``[{...}]`` for a list
    of mappings (sections); for a list of scalars its default where that has entries (``[history,
    prompt_lookup]``), else its allowed values (a ``Literal``), else ``[..., ...]``. Without a
    schema (or a setting it does not hold), the entries ``given`` tell which."""
    found = _list_field(schema, parts) if schema is not None else None
    if found is None:
        scalars = bool(given) and not any(isinstance(e, (dict, list)) for e in given)
        return _flow(given) if scalars else "[{...}]"
    entry, default = found
    if isinstance(entry, type) and issubclass(entry, BaseModel):
        return "[{...}]"
    if isinstance(default, list) and default:
        return _flow(default)
    if typing.get_origin(entry) is typing.Literal:
        return _flow(list(typing.get_args(entry)))
    return "[..., ...]"


def _flow(values: list[Any]) -> str:
    return yaml.safe_dump(values, default_flow_style=True, width=1000).strip()


def _list_field(schema: type[BaseModel], parts: list[str | int]) -> tuple[Any, Any] | None:
    """(the type of an entry, the default) of the list setting ``parts`` names in ``schema``;
    None where ``parts`` leads to no list field of it."""
    tp: Any = schema
    default = None
    for part in parts:
        tp = _required(tp)
        if isinstance(part, int) and typing.get_origin(tp) is list:
            tp, default = typing.get_args(tp)[0], None
        elif isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            field = tp.model_fields[part]
            tp, default = field.annotation, field.default
        else:
            return None
    tp = _required(tp)
    return (typing.get_args(tp)[0], default) if typing.get_origin(tp) is list and typing.get_args(tp) else None


def _required(tp: Any) -> Any:
    """``tp`` without ``| None`` (an optional setting's type is that of its value)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def dotted_key(parts: list[str | int] | tuple[str | int, ...]) -> str:
    """A setting's key as messages write it, a list's entry by its index in brackets.

    >>> dotted_key(["reward", "models", 0, "weight"]), dotted_key([])
    ('reward.models[0].weight', 'the top level')
    """
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
    return text or "the top level"
