"""From dataset rows to prompt rows: which key holds the prompt, the answer and the id.

``prompt_key`` holds a non-empty string or a non-empty list of chat messages, each a dict with
a ``role`` of ``chat.ROLES`` and a ``content`` that is a string or null (an assistant turn that
only calls tools; a user's is never empty: ``chat.message_problem``), kept as written with every
other key (``tool_calls``, ``name``, ...) in ``source_prompt``: the chat template and the reward
functions get whole messages, as TRL's do.
``answer_key`` a string or a finite number (some datasets store final answers as numbers; a NaN
or infinite one is an error, whatever reads it): ``answer`` is its text, and a number is also
kept as it is in ``source_answer`` for the plug-in reward functions. A Parquet decimal column's
value (``decimal.Decimal``) is a number too: ``answer`` is its exact text without an exponent
(``0.50``), ``source_answer`` a float (an int where it is written without a fraction). A row may have no
reference answer (``answer_key`` None, or its column absent, null, an empty or blank string or
of another type in the row: ``answer`` "", ``has_answer`` false) unless something reads it (``FieldMap.answer_need``);
then each such row is an error naming what reads it.
``id_key`` (optional) holds an int, or a string that is hashed to one; without it a
``prompt_id`` column is used when any row has a value there (null is none), and then every row
must; else the id is a hash of the row's prompt and answer, so the same row gets the same id in
every run. A row whose prompt and answer an earlier row has, but not all its other columns
(a ``difficulty`` a reward function reads), is a row of its own: its id is a hash over its
columns too (:func:`content_id`), the same in every run of the same file.
Every column but the prompt, the id column included, is kept for the reward functions, and
every row has every column of its file: None where a JSON Lines row leaves the key out, as
Hugging Face datasets (and so TRL) give it and as a Parquet row has it, so every batch passes
every column to the reward functions. The fill comes after the row's id and the check for a
repeated row, which read the columns as written: ids stay what they were before it.

Without an id column, a row equal to an earlier row in every column is dropped (counted); two
different rows with one id are an error. Errors name the file, the row, the key and the fix
(for a folder of several Parquet files, the file of the folder and the row in it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from actions.config.quoting import quote
from actions.tasks.chat import message_problem
from actions.tasks.dataset import PromptRow, record_where
from actions.tasks.input_limits import check_prompt_size
from actions.tasks.sources import Record, Records

ID_BITS = 48
"""Content-derived ids stay below 2**48: exact in JSON numbers and in float64."""


@dataclass(frozen=True)
class FieldMap:
    prompt_key: str = "prompt"
    answer_key: str | None = "answer"
    """None: the dataset has no reference answers."""
    id_key: str | None = None
    answer_need: tuple[str, str] | None = None
    """``(what reads the reference answer, the other way out)`` when something does
    (``WorkloadConfig.answer_need``): every row must then have one. None: a row may have none."""


@dataclass
class MappingStats:
    rows_read: int = 0
    duplicates_dropped: int = 0


def content_id(prompt: Any, answer: str, columns: dict[str, Any] | None = None) -> int:
    """A stable id for a row without one: the first 48 bits of sha256 over prompt and answer,
    and over ``columns`` (every column but the prompt, as JSON holds them) where given: the id
    of a row whose prompt and answer an earlier row has, with other columns.

    >>> content_id("2+2?", "4") == content_id("2+2?", "4"), content_id("2+2?", "4") < 2**48
    (True, True)
    >>> content_id("2+2?", "4", {"level": 1}) != content_id("2+2?", "4", {"level": 2})
    True
    """
    parts = [prompt, answer] if columns is None else [prompt, answer, columns]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - ID_BITS)


def to_rows(records: Sequence[Record], fields: FieldMap, *, source: str) -> tuple[list[PromptRow], MappingStats]:
    """Validate and map every record. ``source`` names the file in errors (``data.train_path x.jsonl``);
    records read from several Parquet files (:class:`sources.Records`) are named by file and row.

    Raises:
        ValueError: the first bad row, as ``<source>:<row>: key 'k' ...; <fix>``.
    """
    stats = MappingStats(rows_read=len(records))
    if not records:
        raise ValueError(f"{source}: no rows; add at least one row with {fields.prompt_key!r}"
                         + (f" (and {fields.answer_key!r}, where a reward or warm-up reads reference answers)"
                            if fields.answer_key else ""))
    _check_answer_column(records, fields, source)
    place = records.place if isinstance(records, Records) else lambda n: (n, None)
    picked = fields.id_key is None and _check_id_column(records, source, place)  # the id column chosen for the user
    id_key = fields.id_key or ("prompt_id" if picked else None)
    names = _column_names(records, fields.prompt_key)
    rows: list[PromptRow] = []
    seen: dict[int, tuple[str, Any, str, dict[str, Any]]] = {}  # id: (where, prompt, answer, the row)
    for number, rec in records:
        line, file = place(number)
        where = record_where(source, line, file)
        prompt = _prompt(rec, fields.prompt_key, where)
        value = _reference(rec, fields, where)
        answer = "" if value is None else value if isinstance(value, str) else \
            format(value, "f") if isinstance(value, Decimal) else str(value)
        if id_key:
            pid = _row_id(rec, id_key, picked, where)
        else:
            pid, repeated = _content_row_id(prompt, answer, rec, fields.prompt_key, seen)
            if repeated:
                stats.duplicates_dropped += 1
                continue
        if pid in seen:
            raise ValueError(_repeated_id(where, seen[pid][0], id_key, rec.get(id_key, pid) if id_key else pid,
                                          picked))
        seen[pid] = (f"{file} row {line}" if file else f"row {line}", prompt, answer, rec)
        # a reference under `answer` is held by answer/source_answer; anything else there is a column of its own
        skip = (fields.prompt_key, "answer") if fields.answer_key == "answer" and value is not None \
            else (fields.prompt_key,)
        rows.append(PromptRow(prompt_id=pid, prompt=prompt if isinstance(prompt, str) else "", answer=answer,
                              has_answer=value is not None, source_prompt=prompt, line=line, file=file,
                              source_answer=None if value is None or isinstance(value, str) else _number(value),
                              columns=_filled_columns(rec, names, skip)))
    return rows, stats


def _column_names(records: Sequence[Record], prompt_key: str) -> list[str]:
    """Every key any row of ``records`` has but the prompt, in the order they first appear."""
    return [k for k in dict.fromkeys(k for _, rec in records for k in rec) if k != prompt_key]


def _filled_columns(rec: dict[str, Any], names: Sequence[str], skip: tuple[str, ...]) -> dict[str, Any]:
    """The row's columns (JSON values) but ``skip``, with None under each of ``names`` it lacks.
    Only the stored row gets the Nones: the row's id was computed from ``rec`` as written."""
    columns = {k: _jsonable(v) for k, v in rec.items() if k not in skip}
    return columns | {k: None for k in names if k not in rec and k not in skip}


def _content_row_id(prompt: Any, answer: str, rec: dict[str, Any], prompt_key: str,
                    seen: dict[int, tuple[str, Any, str, dict[str, Any]]]) -> tuple[int, bool]:
    """(the id of a row without an id column, whether it repeats an earlier row in every column).
    The id is :func:`content_id` of its prompt and answer, as ever; where an earlier row has
    them with other columns, the hash over its columns too (the earlier row keeps its id). An
    id held by an earlier row of another prompt or answer is returned as it is: the caller
    refuses it."""
    pid = content_id(prompt, answer)
    for _ in range(2):  # the prompt and answer's id, then the columns'
        if pid not in seen or seen[pid][1:3] != (prompt, answer):
            return pid, False
        columns = _row_columns(rec, prompt_key)
        if _canonical(_row_columns(seen[pid][3], prompt_key)) == _canonical(columns):
            return pid, True
        pid = content_id(prompt, answer, columns)
    return pid, False


def _row_columns(rec: dict[str, Any], prompt_key: str) -> dict[str, Any]:
    """Every column of ``rec`` but the prompt, as JSON holds them."""
    return {k: _jsonable(v) for k, v in rec.items() if k != prompt_key}


def _canonical(columns: dict[str, Any]) -> str:
    """``columns`` as :func:`content_id` hashes them: 1 and 1.0, "1" and 1 differ, as the reward
    functions get them, and a NaN equals a NaN."""
    return json.dumps(columns, sort_keys=True)


def _repeated_id(where: str, first: str, id_key: str | None, value: Any, picked: bool) -> str:
    """The error line for a row whose id an earlier row (``first``: ``row N``) has."""
    head = f"{where}: {id_key or 'prompt_id'} {_short(value)} appears twice (first at {first}); "
    if picked:
        return head + ("the dataset's 'prompt_id' column is the id because data.id_key is unset: make its values "
                       "unique, set data.id_key to a column of unique values, or rename the column (ids then come "
                       "from each row's prompt and answer)")
    if id_key:
        return head + f"make every {id_key} unique (data.id_key names the id column)"
    return head + "make every prompt_id unique"


def _check_id_column(records: Sequence[Record], source: str, place: Callable[[int], tuple[int, str | None]]
                     ) -> bool:
    """Whether the ``prompt_id`` column is the id (``data.id_key`` unset): when any row has a
    value there, whichever row it is, and then every row must have one (ValueError naming the
    first that has none, and the first that has one). A null is none, as a JSON Lines row may
    write null or leave the key out."""
    having = next((n for n, rec in records if rec.get("prompt_id") is not None), None)
    if having is None:
        return False
    lacking = next(((n, rec) for n, rec in records if rec.get("prompt_id") is None), None)
    if lacking is not None:
        number, rec = lacking
        other, file = place(having)
        raise ValueError(f"{record_where(source, *place(number))}: key 'prompt_id' is "
                         f"{'null' if 'prompt_id' in rec else 'missing'}, but {file + ' ' if file else ''}row {other} "
                         "has one: the dataset's 'prompt_id' column is the id because data.id_key is unset, so every "
                         "row needs one; fill it in, set data.id_key to a column of unique ids every row has, or "
                         "remove the column (ids then come from each row's prompt and answer)")
    return True


def _check_answer_column(records: Sequence[Record], fields: FieldMap, source: str) -> None:
    """An ``answer_key`` other than the default that no row has is a misspelt name, not a
    dataset without answers (that is ``answer_key`` None)."""
    key = fields.answer_key
    if key is None or key == "answer" or any(key in rec for _, rec in records):
        return
    fix = _key_fix(source, "data.answer_key", "the answer",
                   "fix the name, or set data.answer_key: null for a dataset without reference answers")
    raise ValueError(f"{source}: no row has the column {key!r} named by data.answer_key (row keys: "
                     f"{', '.join(sorted(records[0][1])[:8])}); {fix}")


def _key_fix(where: str, setting: str, what: str, otherwise: str | None = None) -> str:
    """The fix for a missing column: the setting names it in both files, so in the eval file
    (``where`` starts ``data.eval_path``) the column is renamed to the train file's name;
    elsewhere ``otherwise``, by default to set the setting to the column's name."""
    if where.startswith("data.eval_path"):
        return (f"the eval file must name its columns as the train file does ({setting} applies to both): "
                f"rename its column holding {what}")
    return otherwise or f"set {setting} to the column holding {what}"


def _wrapped_fix(rec: dict[str, Any], key: str, where: str) -> str | None:
    """The fix for a row that wraps the rows (``{"data": [{"prompt": ...}, ...]}`` on one line,
    as some exports write a whole file), naming its key: None for any other row."""
    wrapper = next((k for k, v in rec.items() if isinstance(v, list) and v
                    and all(isinstance(r, dict) and key in r for r in v)), None)
    if wrapper is None:
        return None
    setting = where.split(" ")[0] if where.startswith("data.") else "the data path"
    step = f".{wrapper}" if wrapper.isidentifier() else f".[{json.dumps(wrapper)}]"
    return (f"its key {_short(wrapper)} holds a list of {len(rec[wrapper])} objects with {key!r}: the file wraps its "
            f"rows in one object; write them one object per line (jq -c '{step}[]' on the file, into a .jsonl file) "
            f"and point {setting} at that file")


def _prompt(rec: dict[str, Any], key: str, where: str) -> str | list[dict[str, Any]]:
    if key not in rec:
        raise ValueError(f"{where}: key {key!r} is missing (row keys: {', '.join(sorted(rec)[:8])}); "
                         f"{_wrapped_fix(rec, key, where) or _key_fix(where, 'data.prompt_key', 'the prompt')}")
    value = rec[key]
    if isinstance(value, str):
        check_prompt_size(len(value), where, key)
        if not value.strip():
            raise ValueError(f"{where}: key {key!r} is an empty prompt; remove the row or fill in its prompt")
        return value
    if isinstance(value, list) and value:
        for i, m in enumerate(value):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
                    and (m["content"] is None or isinstance(m["content"], str))):
                raise ValueError(f"{where}: key {key!r} message {i} is {_short(m)}; each chat message must be "
                                 '{"role": str, "content": str or null, ...} (other keys, e.g. tool_calls, are kept)')
            problem = message_problem(m)
            if problem:
                raise ValueError(f"{where}: key {key!r} message {i} {problem}")
        messages = [{k: _jsonable(v) for k, v in m.items()} for m in value]
        # every key counts towards the size: a tool call's arguments are prompt text too
        check_prompt_size(sum(len(json.dumps(m, ensure_ascii=False)) for m in messages), where, key)
        return messages
    raise ValueError(f"{where}: key {key!r} is {_short(value)} ({type(value).__name__}); a prompt is a non-empty "
                     "string or a list of chat messages")


def _number(value: int | float | Decimal) -> int | float:
    """A reference number as JSON holds it: a Decimal as a float, or an int where its text has
    no fraction (``Decimal("12")``, a decimal column of scale 0)."""
    if isinstance(value, Decimal):
        exponent = value.as_tuple().exponent  # an int: a NaN or infinite one ("n", "F") is refused before
        return int(value) if isinstance(exponent, int) and exponent >= 0 else float(value)
    return value


def _reference(rec: dict[str, Any], fields: FieldMap, where: str) -> str | int | float | Decimal | None:
    """The row's reference answer; None where it has none (an empty or blank string, as CSV
    and pandas exports write a missing one, is none), an error when something reads it."""
    key = fields.answer_key
    value = rec.get(key) if key is not None else None
    if isinstance(value, str) and not value.strip():
        if fields.answer_need is None:
            return None
        what, other = fields.answer_need
        raise ValueError(f"{where}: key {key!r} is {'empty' if not value else 'blank'}; {what}, so every row needs "
                         f"one: fill it in or remove the row, {other}")
    finite = value.is_finite() if isinstance(value, Decimal) else not isinstance(value, float) or math.isfinite(value)
    if not finite:  # stored, it would be the text "nan" and bad JSON
        other = fields.answer_need[1] if fields.answer_need else "or set data.answer_key: null for a dataset " \
            "without reference answers"
        raise ValueError(f"{where}: key {key!r} is {value!r}; a reference answer is a string or a finite number: fix "
                         f"the row (a missing answer is null), {other}")
    if isinstance(value, (str, Decimal)) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    if fields.answer_need is None:
        return None
    what, other = fields.answer_need  # with answer_key null the config refused it (WorkloadConfig)
    if key not in rec:
        raise ValueError(f"{where}: key {key!r} is missing (row keys: {', '.join(sorted(rec)[:8])}); {what}, so "
                         f"every row needs one: {_key_fix(where, 'data.answer_key', 'it')}, {other}")
    if value is None:
        raise ValueError(f"{where}: key {key!r} is null; {what}, so every row needs one: fill it in or remove "
                         f"the row, {other}")
    raise ValueError(f"{where}: key {key!r} is {_short(value)} ({type(value).__name__}); {what}, and the reference "
                     f"answer must be a string or a number: fix the row, {other}")


def _row_id(rec: dict[str, Any], key: str, picked: bool, where: str) -> int:
    """The row's id from column ``key`` (``picked``: the ``prompt_id`` column, used because
    ``data.id_key`` is unset)."""
    other = ("set data.id_key to a column of unique ids, or rename the prompt_id column (used as the id because "
             "data.id_key is unset)" if picked else "unset data.id_key")
    if key not in rec:
        raise ValueError(f"{where}: key {key!r} is missing; give every row an id, or {other}")
    value = rec[key]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**ID_BITS:
        return value
    if isinstance(value, str) and value:
        return int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big") >> (64 - ID_BITS)
    raise ValueError(f"{where}: key {key!r} is {_short(value)}; an id is an int in [0, 2**48) or a non-empty "
                     f"string: fix the row, or {other}")


def _jsonable(value: Any) -> Any:
    """``value`` as a JSON value, leaf by leaf: a struct stays a dict and a list a list, a finite
    Decimal is a number (as the reference answer), bytes are their base64 text, and a value JSON
    has no type for (a date, a timestamp) is its text, ``str(value)``, so "2024-01-01 00:00:00"."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Decimal) and value.is_finite():
        return _number(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _short(value: Any) -> str:
    return quote(value, 60)
