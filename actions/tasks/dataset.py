"""Prompt rows as the actions read them from the store: one JSON object per line.

::

    {"prompt_id": 17, "prompt": "...", "answer": "...", "has_answer": true, "source_prompt": "...",
     "source_answer": null, "columns": {}}

``prompt_id`` is unique; it keys the response-length history and every sample's random
stream. ``prompt`` is the exact text the policy is given (chat template and system prompt
already applied, see ``chat.py``). ``answer`` is the reference used by the built-in reward
functions, by the warm-up on reference solutions and, in the first epoch, as the length
prediction; as text (``source_answer`` keeps a numeric reference's value for the plug-in reward
functions), and "" with ``has_answer`` false in a row without one. ``source_prompt`` keeps the
prompt as the dataset wrote it, a string or chat messages with all their keys (the reward
functions' ``prompts`` and the reward models' text), and ``columns`` the dataset's other
columns. User files are read by ``sources.py`` and mapped by ``fields.py``; this module is the
store's own format. A row stored without ``has_answer`` (or with a message holding only
``role`` and ``content``) loads as before: it had a reference answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DATASET_FILE = "rows.jsonl"
"""The one file of a stored dataset artifact (JSON Lines of :class:`PromptRow`)."""


class PromptRow(BaseModel):
    """One prompt with its reference answer."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_id: int
    prompt: str
    answer: str
    """The reference answer as text; "" where the row has none (``has_answer``)."""
    has_answer: bool = True
    """False: the row has no reference answer (``data.answer_key`` null, or its column absent,
    null or neither a string nor a number in this row), which only a run that reads none allows."""
    source_prompt: str | list[dict[str, Any]] | None = None
    """The dataset's prompt as written, before the chat template and system prompt: a string or
    chat messages, each with every key the dataset gave it (``tool_calls``, ``name``, ...).
    None in a row built by hand or in a dataset stored before string prompts were kept (a row
    of either still loads); ``prompt`` then stands in for it."""
    source_answer: int | float | None = None
    """The dataset's reference when it is a number (``answer`` holds its text): plug-in reward
    functions receive it as it is (``rewards.reward_inputs``). None for a string reference or none."""
    columns: dict[str, Any] = {}
    """The dataset's columns but the prompt (JSON values), passed to the reward functions by
    name; a reference in a column named ``answer`` is left out (``answer`` and ``source_answer``
    hold it)."""
    line: int | None = Field(None, exclude=True)
    """The row's number in the file it was read from (1-based: a JSONL line, a Parquet row; in
    a folder of several Parquet files, the row in ``file``), for the errors that name it; None in
    a generated or stored row (never stored)."""
    file: str | None = Field(None, exclude=True)
    """The Parquet file of a folder of several that the row was read from (its name), for the
    errors that name it; None for a single file or a generated or stored row (never stored)."""
    add_special_tokens: bool = Field(False, exclude_if=lambda v: not v)
    """Encode ``prompt`` with the tokenizer's special tokens (its BOS, where it adds one): a string
    prompt under ``data.chat_template: messages``, as TRL encodes one (``chat.py``;
    ``loading.encode_prompt``). False (left out of the stored row): the text's tokens alone."""


def row_where(source: str, row: PromptRow, number: int) -> str:
    """Where ``row`` comes from, for an error line: ``<source>:<line> (prompt_id N)`` for a row
    read from a file (the line its errors name when the file is read; ``<source>: <file> row
    <line>`` for a row of one of several Parquet files), else ``<source>: row <number>
    (prompt_id N)`` (``number``: its place among the rows checked)."""
    at = record_where(source, row.line, row.file) if row.line is not None else f"{source}: row {number}"
    return f"{at} (prompt_id {row.prompt_id})"


def record_where(source: str, number: int, file: str | None = None) -> str:
    """A row read from a file, as error lines name it: ``<source>:<number>``, or ``<source>:
    <file> row <number>`` for a row of ``file``, one of several Parquet files read as one.

    >>> record_where("data.train_path d.jsonl", 3), record_where("data.train_path dir", 2, "part-1.parquet")
    ('data.train_path d.jsonl:3', 'data.train_path dir: part-1.parquet row 2')
    """
    return f"{source}: {file} row {number}" if file else f"{source}:{number}"


def not_utf8(data: bytes, exc: UnicodeDecodeError, where: str, what: str) -> str:
    """The error line for ``data`` (a file's bytes, as its lines are numbered) whose decoding
    failed with ``exc``: the line (from 1) and the byte within it (from 1) of the first byte
    that is not UTF-8, and the fix. ``what`` names the format (``JSON Lines``).

    >>> data = b'{"a": 1}' + bytes([10]) + b'{"a": "' + bytes([255]) + b'"}'  # bytes([10]): a newline
    >>> not_utf8(data, UnicodeDecodeError("utf-8", data, 16, 17, "invalid start byte"), "f", "JSON Lines")
    'f:2: byte 8 of the line (0xff) is not UTF-8; save the file as UTF-8 (a dataset is UTF-8 JSON Lines)'
    """
    start = exc.start
    line = data.count(b"\n", 0, start) + 1
    column = start - data.rfind(b"\n", 0, start)  # rfind gives -1 on line 1: the column is then start + 1
    return (f"{where}:{line}: byte {column} of the line (0x{data[start:start + 1].hex()}) is not UTF-8; save the file "
            f"as UTF-8 (a dataset is UTF-8 {what})")


def rows_to_jsonl(rows: Iterable[PromptRow]) -> bytes:
    return "".join(json.dumps(r.model_dump(), sort_keys=True) + "\n" for r in rows).encode()


def json_objects(data: bytes, *, where: str) -> list[tuple[int, dict[str, Any]]]:
    """Decode UTF-8 JSON Lines into ``(line number from 1, object)`` pairs, skipping blank
    lines. A line ends at "\n" (or "\r\n") only, as JSON Lines defines it (a file whose rows end at
    "\r" alone has them made "\n" before: ``sources._read_jsonl``). Raises ValueError
    naming ``where`` and the line for bad UTF-8, bad JSON or a line that is not an object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(not_utf8(data, exc, where, "JSON Lines")) from None
    objects: list[tuple[int, dict[str, Any]]] = []
    # "\n" alone ends a line (a "\r" before it is dropped): str.splitlines also splits at
    # U+2028, U+2029 and U+0085, which a JSON string may hold as they are
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}:{lineno}: not valid JSON ({exc.msg}); each line must be one object") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}:{lineno}: a {type(obj).__name__}, not an object; each line must be one "
                             "JSON object")
        objects.append((lineno, obj))
    return objects


def parse_jsonl(data: bytes, *, source: str) -> list[PromptRow]:
    """Parse and validate JSONL bytes. Raises ValueError naming source, line and field."""
    rows: list[PromptRow] = []
    seen: set[int] = set()
    for lineno, obj in json_objects(data, where=source):
        try:
            row = PromptRow.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "row"
            got = obj.get(field, "<missing>")
            raise ValueError(
                f"{source}:{lineno}: field {field!r} {err['msg'].lower()} (got {got!r}); "
                "every row needs prompt_id (int), prompt (str) and answer (str)"
            ) from None
        if row.prompt_id in seen:
            raise ValueError(f"{source}:{lineno}: prompt_id {row.prompt_id} appears twice; make every prompt_id unique")
        seen.add(row.prompt_id)
        rows.append(row)
    if not rows:
        raise ValueError(f"{source}: no rows; add at least one {{prompt_id, prompt, answer}} line")
    return rows
