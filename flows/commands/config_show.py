"""``rlhfless config``: the configuration a ``train`` with the same ``--config`` and ``--set``
would run, or the reference of every key.

Without ``--reference`` it loads and validates the configuration exactly as ``train`` does
(a bad value is the same one-line error, exit 2) and prints it whole as YAML, defaults filled
in, with the run id it derives; nothing is read but the configuration, nothing is written.
What ``train`` checks beyond the configuration (the data and model files, the engine, the
store) is not checked here, and the two paths ``train`` fills from its ``--out``
(``invoker.log_dir``, ``observability.tensorboard_dir``) print as null. With a dataset file
the generated task's sizes are left out, which ``train`` would refuse beside it.
Settings a dump leaves out at their defaults (``exclude_if``) are printed too.
Automatic values (a key whose default is null, resolved from the rest: ``warmup.steps``,
``data.max_count``, ``algorithm.kl_kind``...) are printed resolved, and named in a comment:
given back with ``--config`` the file runs the same, but as a template for other data they
would be carried along, so the comment says to drop them.
``--reference`` prints every key as a Markdown table (type, default, meaning), built from the
configuration classes themselves: their field types, defaults and attribute docstrings (read
from their source here, not by pydantic at every import: that would cost every command about
0.1 s). ``docs/config.md`` is that output,
and ``tests/test_config_reference.py`` checks that it still is, and that every key has a
meaning.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from actions.config.section import section_of

HEADER = """# Configuration reference

Every key of a campaign's configuration: the YAML file of `rlhfless train --config FILE` (or a
deployment's `config` parameter), or `--set KEY=VALUE`. Unknown keys are refused, naming the
key. `rlhfless config [--config FILE] [--set KEY=VALUE ...]` prints the whole configuration a
`train` with the same arguments would run, defaults filled in. What the environment sets
(the OpenWhisk and S3 connections, the actions' device, dtype and threads) is listed in
docs/openwhisk.md, "Environment variables".

This page is the output of `rlhfless config --reference` (`tests/test_config_reference.py`
checks that it still is).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML campaign configuration")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set algorithm.name=ppo (repeatable)")
    p.add_argument("--reference", action="store_true",
                   help="print every key with its type, default and meaning (Markdown) instead")


def run(args: argparse.Namespace) -> int:
    if args.reference:
        if args.config or args.overrides:
            raise ValueError("config --reference describes every key, not one configuration; "
                             "drop --config and --set, or drop --reference")
        return emit(reference())
    import yaml

    from flows.config import CampaignConfig, config_input, validate_config
    from flows.planning.objective import knobs_off_default, unread_knob_warnings

    written = config_input(args.config, list(args.overrides))  # the file read once
    cfg = validate_config(written)
    sys.stderr.writelines(f"{w}\n" for w in unread_knob_warnings(cfg.scaling.objective, knobs_off_default(cfg.scaling)))
    dumped = cfg.settings()
    lines = []
    if dumped.get("run_id") is None:
        lines.append(f"# run_id derived from this configuration: {cfg.resolved_run_id()}")
    auto = automatic_keys(CampaignConfig, dumped, written)
    if auto:
        lines.append(f"# resolved automatically (null by default): {', '.join(auto)}; as a template for another "
                     "dataset, task or algorithm, drop these")
    lines.append(yaml.safe_dump(dumped, sort_keys=False, allow_unicode=True))
    return emit("\n".join(lines))


def emit(text: str) -> int:
    """Write ``text`` to stdout (nothing where the command started with stdout closed, ``>&-``:
    Python's ``sys.stdout`` is None). A reader gone (``rlhfless config | head``) is the CLI's to
    answer, with 141 (``flows/commands/closed_pipe.py``), here or at its flush."""
    if sys.stdout is not None:
        sys.stdout.write(text)
    return 0


def automatic_keys(model: type[BaseModel], resolved: dict[str, Any], written: dict[str, Any]) -> list[str]:
    """Dotted keys whose declared default is null, that ``written`` (the user's input) does not
    set (or sets to null, which asks for the same), and whose ``resolved`` value is not null:
    the values the configuration chose itself."""
    out = []
    for key, entry in keys(model):
        if "[]" in key or entry.field.default is not None or entry.field.default_factory is not None:
            continue
        parts = key.split(".")
        if _lookup(resolved, parts) not in (None, _MISSING) and _lookup(written, parts) in (None, _MISSING):
            out.append(key)
    return out


_MISSING = object()


def _lookup(tree: Any, parts: list[str]) -> Any:
    for p in parts:
        if not isinstance(tree, dict) or p not in tree:
            return _MISSING
        tree = tree[p]
    return tree


def reference() -> str:
    """The Markdown reference of every key of ``CampaignConfig`` (module docstring)."""
    from flows.config import CampaignConfig

    sections: dict[str, list[tuple[str, Key]]] = {"": []}
    for key, entry in keys(CampaignConfig):
        section = key.split(".")[0] if "." in key else ""
        sections.setdefault(section, []).append((key, entry))
    out = [HEADER]
    for section, rows in sections.items():
        out.append(f"\n## {f'`{section}`' if section else 'Top level'}\n")
        doc = _section_doc(CampaignConfig, section)
        if doc:
            out.append(f"\n{doc}\n")
        out.append("\n| key | type | default | meaning |\n|---|---|---|---|\n")
        for key, entry in rows:
            out.append(f"| `{key}` | {_cell(type_text(entry.annotation))} | {_cell(default_text(entry.field))} | "
                       f"{_cell(text(entry.description))} |\n")
    return "".join(out)


class Key(typing.NamedTuple):
    annotation: Any
    field: Any
    """The pydantic field (its default)."""
    description: str
    """The attribute docstring ('' where there is none)."""


def keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Key]]:
    """(dotted key, its type, field and docstring) of every leaf setting, in declaration order;
    a section (a model, optional or in a list) is walked, its keys named ``a.b`` (``a.b[].c`` for
    list items), after a row of its own where it is optional or a list (``model.lora``: absent
    is off)."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        entry = Key(field.annotation, field, attribute_docs(model).get(name, ""))
        inner, many = section_of(field.annotation)
        if inner is None:
            yield key, entry
            continue
        if inner is not field.annotation:  # optional or a list: the key itself is a setting
            yield key, entry
        yield from keys(inner, f"{key}[]." if many else f"{key}.")


def attribute_docs(model: type) -> dict[str, str]:
    """Field name -> the string literal right below its annotated assignment, for ``model`` and
    the classes it inherits fields from (the nearest one's wins)."""
    out: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if issubclass(c, BaseModel) and c is not BaseModel]):
        out.update(_own_attribute_docs(cls))
    return out


@functools.cache
def _own_attribute_docs(cls: type) -> dict[str, str]:
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return out


def type_text(annotation: Any) -> str:
    """A type as a user writes its values: ``int``, ``"a" | "b"``, ``list of str``, ``... or null``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # constrained (conint and the like): the values are the base type's
        return type_text(args[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


def text(doc: str) -> str:
    """A docstring as one Markdown line: reST's double backquotes as single ones, its roles
    (``:attr:``) dropped, whitespace collapsed."""
    return re.sub(r"\s+", " ", re.sub(r":\w+:`", "`", doc.replace("``", "`"))).strip()


def _cell(value: str) -> str:
    # a literal | in a cell would split it: Markdown tables take \| (literal types already escape theirs)
    return re.sub(r"(?<!\\)\|", r"\\|", value)


def _section_doc(model: type[BaseModel], section: str) -> str:
    field = model.model_fields.get(section)
    if not section or field is None:
        return ""
    inner, _ = section_of(field.annotation)
    own = attribute_docs(model).get(section, "")
    cls_doc = (inner.__doc__ or "") if inner is not None and inner.__doc__ != BaseModel.__doc__ else ""
    return text(own or cls_doc)
