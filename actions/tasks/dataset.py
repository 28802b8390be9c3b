"""Prompt datasets: rows with an id, a prompt and a reference answer, as JSONL.

A dataset file is JSON Lines, one object per prompt::

    {"prompt_id": 17, "prompt": "...", "answer": "..."}

``prompt_id`` must be unique; it keys the response-length history and every sample's random
stream. ``answer`` is the reference used by the reward function and, in the first epoch, as
the length prediction. Validation errors name the file, the line and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError


class PromptRow(BaseModel):
    """One prompt with its reference answer."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_id: int
    prompt: str
    answer: str


def rows_to_jsonl(rows: Iterable[PromptRow]) -> bytes:
    return "".join(json.dumps(r.model_dump(), sort_keys=True) + "\n" for r in rows).encode()


def parse_jsonl(data: bytes, *, source: str) -> list[PromptRow]:
    """Parse and validate JSONL bytes. Raises ValueError naming source, line and field."""
    rows: list[PromptRow] = []
    seen: set[int] = set()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source}: byte {exc.start} is not UTF-8; a dataset is UTF-8 JSON Lines") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}:{lineno}: not valid JSON ({exc.msg}); each line must be one object") from None
        try:
            row = PromptRow.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "row"
            got = obj.get(field, "<missing>") if isinstance(obj, dict) else obj
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


def load_jsonl(path: str | Path, *, field: str = "dataset") -> list[PromptRow]:
    """Read a JSONL dataset from local disk. ``field`` names the setting that gave ``path``
    (e.g. ``data.train_path``) in error messages."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{field} {str(p)!r} does not exist; fix {field} (a JSONL file)") from None
    except OSError as exc:
        raise ValueError(f"{field} {str(p)!r} cannot be read ({exc.strerror}); fix {field} (a JSONL file)") from None
    return parse_jsonl(data, source=f"{field} {p}")
