"""From dataset rows to prompt rows: which key holds the prompt, the answer and the id.

``prompt_key`` holds a non-empty string or a non-empty list of chat messages
(``{"role": str, "content": str}``), kept as written in ``source_prompt``; ``answer_key`` a
string or a number (some datasets store final answers as numbers): ``answer`` is its text, and
a number is also kept as it is in ``source_answer`` for the plug-in reward functions.
``id_key`` (optional) holds an int, or a string that is hashed to one; without it a
``prompt_id`` column is used when present, else the id is a hash of the row's prompt and
answer, so the same row gets the same id in every run.
Every other column is kept for the reward functions.

Rows whose prompt and answer are identical to an earlier row's are dropped (counted); two
different rows with one id are an error. Errors name the file, the row, the key and the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actions.config.quoting import quote
from actions.tasks.dataset import PromptRow
from actions.tasks.input_limits import check_prompt_size
from actions.tasks.sources import Record

ID_BITS = 48
"""Content-derived ids stay below 2**48: exact in JSON numbers and in float64."""


@dataclass(frozen=True)
class FieldMap:
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    id_key: str | None = None


@dataclass
class MappingStats:
    rows_read: int = 0
    duplicates_dropped: int = 0


def content_id(prompt: Any, answer: str) -> int:
    """A stable id for a row without one: the first 48 bits of sha256 over prompt and answer.

    >>> content_id("2+2?", "4") == content_id("2+2?", "4"), content_id("2+2?", "4") < 2**48
    (True, True)
    """
    digest = hashlib.sha256(json.dumps([prompt, answer], sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - ID_BITS)


def to_rows(records: Sequence[Record], fields: FieldMap, *, source: str) -> tuple[list[PromptRow], MappingStats]:
    """Validate and map every record. ``source`` names the file in errors (``data.train_path x.jsonl``).

    Raises:
        ValueError: the first bad row, as ``<source>:<row>: key 'k' ...; <fix>``.
    """
    stats = MappingStats(rows_read=len(records))
    if not records:
        raise ValueError(f"{source}: no rows; add at least one row with {fields.prompt_key!r} and {fields.answer_key!r}")
    id_key = fields.id_key or ("prompt_id" if "prompt_id" in records[0][1] else None)
    rows: list[PromptRow] = []
    seen: dict[int, tuple[int, Any, str]] = {}
    for number, rec in records:
        where = f"{source}:{number}"
        prompt = _prompt(rec, fields.prompt_key, where)
        value = _answer(rec, fields.answer_key, where)
        answer = value if isinstance(value, str) else str(value)
        pid = _row_id(rec, id_key, where) if id_key else content_id(prompt, answer)
        if pid in seen:
            first, p0, a0 = seen[pid]
            if id_key is None and (p0, a0) == (prompt, answer):
                stats.duplicates_dropped += 1
                continue
            raise ValueError(f"{where}: {id_key or 'prompt_id'} {pid} appears twice (first at row {first}); "
                             "make every prompt_id unique")
        seen[pid] = (number, prompt, answer)
        columns = {k: _jsonable(v) for k, v in rec.items() if k not in (fields.prompt_key, id_key)
                   and not (k == fields.answer_key == "answer")}
        rows.append(PromptRow(prompt_id=pid, prompt=prompt if isinstance(prompt, str) else "", answer=answer,
                              source_prompt=prompt, source_answer=None if isinstance(value, str) else value,
                              columns=columns))
    return rows, stats


def _prompt(rec: dict[str, Any], key: str, where: str) -> str | list[dict[str, str]]:
    if key not in rec:
        raise ValueError(f"{where}: key {key!r} is missing (row keys: {', '.join(sorted(rec)[:8])}); "
                         "set data.prompt_key to the column holding the prompt")
    value = rec[key]
    if isinstance(value, str):
        check_prompt_size(len(value), where, key)
        if not value.strip():
            raise ValueError(f"{where}: key {key!r} is an empty prompt; remove the row or fill in its prompt")
        return value
    if isinstance(value, list) and value:
        for i, m in enumerate(value):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"{where}: key {key!r} message {i} is {_short(m)}; each chat message must be "
                                 '{"role": str, "content": str}')
        check_prompt_size(sum(len(m["content"]) for m in value), where, key)
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"{where}: key {key!r} is {_short(value)} ({type(value).__name__}); a prompt is a non-empty "
                     "string or a list of chat messages")


def _answer(rec: dict[str, Any], key: str, where: str) -> str | int | float:
    if key not in rec:
        raise ValueError(f"{where}: key {key!r} is missing (row keys: {', '.join(sorted(rec)[:8])}); every row needs "
                         "a reference answer: set data.answer_key to the column holding it")
    value = rec[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}: key {key!r} is {_short(value)} ({type(value).__name__}); the reference answer "
                         "must be a string or a number")
    return value


def _row_id(rec: dict[str, Any], key: str, where: str) -> int:
    if key not in rec:
        raise ValueError(f"{where}: key {key!r} is missing; give every row an id or unset data.id_key")
    value = rec[key]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**ID_BITS:
        return value
    if isinstance(value, str) and value:
        return int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big") >> (64 - ID_BITS)
    raise ValueError(f"{where}: key {key!r} is {_short(value)}; an id is an int in [0, 2**48) or a non-empty string")


def _jsonable(value: Any) -> Any:
    """Columns travel as JSON: values JSON cannot hold (bytes, dates) become their text."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _short(value: Any) -> str:
    return quote(value, 60)
