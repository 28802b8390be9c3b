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
store's own format, and the JSON reading both share (:func:`load_json`: a key twice in one
object, or an unpaired surrogate escape, is refused naming the line and the key). A row
stored without ``has_answer`` (or with a message holding only ``role`` and ``content``) loads
as before: it had a reference answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actions.config.quoting import quote

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
    hold it). Every column of the row's file, None where the row lacks the key (as a Hugging
    Face dataset gives it), so every batch passes the same columns (``fields.to_rows``)."""
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
    naming ``where`` and the line for bad UTF-8, bad JSON, a line that is not an object, a key
    twice in one object or a string holding an unpaired surrogate (:func:`load_json`)."""
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
            obj = load_json(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}:{lineno}: not valid JSON ({exc.msg}); each line must be one object") from None
        except RowProblem as exc:
            raise ValueError(f"{where}:{lineno}: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}:{lineno}: a {type(obj).__name__}, not an object; each line must be one "
                             "JSON object")
        objects.append((lineno, obj))
    return objects


def json_array(data: bytes, *, where: str) -> list[tuple[int, dict[str, Any]]]:
    """The objects of ``data``, UTF-8 text holding one JSON array of objects (as ``json.dump``
    writes a list), as ``(place in the array from 1, object)`` pairs. Raises ValueError naming
    ``where``, the line and the element for what :func:`json_objects` refuses in a row."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(not_utf8(data, exc, where, "JSON")) from None
    rows: list[tuple[int, dict[str, Any]]] = []
    at = _JSON_SPACE.match(text, text.index("[") + 1).end()  # the caller saw "[" first
    closed = text.startswith("]", at)
    at += closed  # past the "]" of an empty array
    while not closed:
        start, number = at, len(rows) + 1
        try:
            row, at = load_json(text, at)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}:{exc.lineno}: not valid JSON ({exc.msg}); a .json file holds JSON Lines or "
                             "one array of objects") from None
        except RowProblem as exc:
            raise ValueError(f"{where}:{text.count(chr(10), 0, start) + 1}: element {number} of the array: {exc}"
                             ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: element {number} of the array is a {type(row).__name__}, not an object; "
                             "each element must be one JSON object")
        rows.append((number, row))
        at = _JSON_SPACE.match(text, at).end()
        closed = text.startswith("]", at)
        if not closed and not text.startswith(",", at):
            break
        at = _JSON_SPACE.match(text, at + 1).end()
    if not closed or text[at:].strip(" \t\n\r"):
        line, problem = text.count("\n", 0, at) + 1, "Extra data" if closed else "Expecting ',' delimiter"
        raise ValueError(f"{where}:{line}: not valid JSON ({problem} "
                         "after an element of the array); a .json file holds JSON Lines or one array of objects")
    return rows


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def one_object(data: bytes, name: str, field: str) -> str | None:
    """Why ``data`` (the file ``name`` that ``field`` names), which is not JSON Lines, is not
    rows, when it is one JSON object as a whole: pretty-printed over several lines, or wrapping
    its rows (``{"data": [{...}, ...]}``, as some exports write them); the fix names the key
    holding the rows. None when it is not one object over several lines (one line is a row,
    whose own error stands)."""
    if b"\n" not in data.strip():
        return None
    try:
        whole = json.loads(data)
    except ValueError:  # not JSON as a whole either (UnicodeDecodeError included)
        return None
    if not isinstance(whole, dict):
        return None
    lists = [k for k, v in whole.items() if isinstance(v, list)]
    if not lists:
        return (f"holds one JSON object over several lines, not one object per line (JSON Lines); write it on one "
                f"line (jq -c . {name} > rows.jsonl) and point {field} at that file")
    key = next((k for k in lists if whole[k] and all(isinstance(r, dict) for r in whole[k])), lists[0])
    held = ", ".join(f"{quote(k, 40)} ({len(whole[k])} items)" for k in lists[:4])
    step = f".{key}" if key.isidentifier() else f".[{json.dumps(key)}]"
    return (f"holds one JSON object whose keys hold lists ({held}), not rows; write the rows one object per line, "
            f"e.g. jq -c '{step}[]' {name} > rows.jsonl, and point {field} at that file (or at a .json file holding "
            "one array of objects)")


class RowProblem(ValueError):
    """What :func:`load_json` refuses in a JSON text, without where it is: the caller adds the
    file and the line (or element) to the message."""


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""The JSON escape of a UTF-16 surrogate (U+D800..U+DFFF): the one way a string decoded from
UTF-8 text can hold one, so a text without it needs no closer look."""
_ESCAPES = re.compile(r"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\|"
                      r"(?P<lone>u[dD][89a-fA-F][0-9a-fA-F]{2}))")
"""Read left to right: a surrogate pair (one character), an escaped backslash (a doubled
backslash before ``ud800`` makes it text, not an escape), or a surrogate escape alone."""


def load_json(text: str, start: int = 0) -> Any:
    """``json.loads(text)`` (or, from ``start``, the one value there: ``(value, end)``, as
    ``JSONDecoder.raw_decode``), refusing what it would accept silently: a key twice in one
    object (it keeps the last value) and a string or key holding an unpaired surrogate escape
    (``"\\ud800"`` alone: a str that no UTF-8 encoder, tokenizer or store write accepts, failing
    far from the row). Raises json.JSONDecodeError, or :class:`RowProblem` naming the key,
    the value and the fix.
    """
    if start == 0 and text.startswith("\ufeff"):  # as json.loads says it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    result = _DECODER.decode(text) if start == 0 else _DECODER.raw_decode(text, start)
    end = len(text) if start == 0 else result[1]
    if _SURROGATE_ESCAPE.search(text, start, end) and any(m["lone"] for m in _ESCAPES.finditer(text, start, end)):
        found = _unpaired_surrogate(result if start == 0 else result[0], "")
        if found is not None:
            at, value = found
            i = next(i for i, c in enumerate(value) if "\ud800" <= c <= "\udfff")  # a pair decodes as one character
            around = ("..." if i > 20 else "") + quote(value[max(0, i - 20):i + 21], 60) + \
                ("..." if i + 21 < len(value) else "")
            raise RowProblem(f"{at} holds an unpaired surrogate escape (character {i + 1}: {around}); fix the JSON "
                             r"escape: a \uD800-\uDBFF escape must be followed by its \uDC00-\uDFFF pair (one "
                             "character beyond U+FFFF, e.g. an emoji), or write the character itself as UTF-8, or "
                             "remove it")
    return result


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):  # a repeated key: find the first, to name it
        first: dict[str, Any] = {}
        for key, value in pairs:
            if key in first:
                raise RowProblem(f"key {quote(key, 60)} appears twice in one object ({quote(first[key], 40)}, then "
                                 f"{quote(value, 40)}); keep one of them (a JSON object holds each key once; "
                                 "which one counts depends on the reader)")
            first[key] = value
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def _unpaired_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """(where in the row: ``key 'prompt'``, ``key 'prompt'[1]['content']``, ``a key name in
    ...``; the string) of the first string or key in ``value`` (within the row at ``path``,
    "" for the row itself) that does not encode as UTF-8; None if every one does."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, value
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str):
            if _unpaired_surrogate(key, "") is not None:
                return f"a key name{' in ' + path if path else ''}", key
            inner = f"{path}[{quote(key, 60)}]" if path else f"key {quote(key, 60)}"
        else:
            inner = f"{path}[{key}]"
        found = _unpaired_surrogate(item, inner)
        if found is not None:
            return found
    return None


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
