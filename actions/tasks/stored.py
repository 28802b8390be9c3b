"""A stored dataset's prompt rows as actions read them, cached while the container is warm.

The dataset is an artifact (``actions/prepare.py`` writes it) holding one file,
:data:`~actions.tasks.dataset.DATASET_FILE`, in the format of :mod:`actions.tasks.dataset`.
A dataset key never changes once its manifest exists, so a warm hit is always valid.

An action reads the few rows of its prompts: the rows stay JSON text, indexed by prompt id,
and each is validated as a :class:`PromptRow` when first asked for (``prepare`` validated them
all before storing them). On a dataset of 200,000 rows that index builds in a fifth of the
time a whole parse takes, and holds a row's text until the row is read.

Every row read has every column any row of the copy has, None where it lacks one: a copy
stored before ``prepare`` filled a JSON Lines file's sparse columns (an older release's run,
resumed) passes the same columns in every batch as one stored since.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import ValidationError

from actions.models import warm
from actions.models.loading import store_for
from actions.store import get_artifact
from actions.store.keyed_rows import KeyedRows
from actions.tasks.dataset import DATASET_FILE, PromptRow


class StoredRows(KeyedRows[int, PromptRow]):
    """Prompt id -> row of a stored dataset's JSON Lines, each row parsed once, when asked for
    (its text then gives way to the row)."""

    def __init__(self, data: bytes, source: str) -> None:
        self.source = source
        self._rows: dict[int, tuple[int, bytes] | PromptRow] = {}
        columns: dict[str, None] = {}
        for number, line in enumerate(data.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                parsed = json.loads(line)
                prompt_id = parsed["prompt_id"]
                hash(prompt_id)
                columns.update(dict.fromkeys(parsed.get("columns") or ()))
            except (ValueError, KeyError, TypeError, AttributeError):
                prompt_id = None
            if prompt_id is None:
                raise ValueError(f"{source}:{number}: not a stored dataset row (a JSON object with an int "
                                 "prompt_id); the store's copy of the dataset is damaged")
            if prompt_id in self._rows:
                raise ValueError(f"{source}:{number}: prompt_id {prompt_id} appears twice (first at line "
                                 f"{self._rows[prompt_id][0]}); the store's copy of the dataset is damaged")
            self._rows[prompt_id] = (number, line)
        if not self._rows:
            raise ValueError(f"{source}: no rows; add at least one {{prompt_id, prompt, answer}} line")
        self._columns = tuple(columns)

    def __getitem__(self, prompt_id: int) -> PromptRow:
        row = self._rows[prompt_id]
        if isinstance(row, PromptRow):
            return row
        number, line = row
        try:  # json.loads, as the rows were written: it reads every escape json.dumps writes
            parsed = PromptRow.model_validate(json.loads(line))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(part) for part in err["loc"]) or "row"
            raise ValueError(f"{self.source}:{number}: field {field!r}: {err['msg'].lower()}; the store's copy of "
                             "the dataset is damaged") from None
        # a copy stored before sparse columns were filled (module docstring); not `answer`, which a
        # row with its reference there leaves out of its columns (answer/source_answer hold it)
        missing = [k for k in self._columns if k not in parsed.columns and k != "answer"]
        if missing:
            parsed = parsed.model_copy(update={"columns": parsed.columns | dict.fromkeys(missing)})
        self._rows[prompt_id] = parsed
        return parsed


def load_dataset(store_uri: str, dataset_key: str) -> StoredRows:
    """The rows of the dataset at ``dataset_key``, by prompt id (parsed as they are read)."""
    def build() -> StoredRows:
        files, _ = get_artifact(store_for(store_uri), dataset_key, [DATASET_FILE])
        return StoredRows(files[DATASET_FILE], dataset_key)

    return warm.get_or_build(("dataset", store_uri, dataset_key), build)[0]


def rows_for(dataset: Mapping[int, PromptRow], prompt_ids: list[int]) -> list[PromptRow]:
    """The rows of ``prompt_ids``, in that order; ValueError naming the ids not in the dataset."""
    missing = [p for p in prompt_ids if p not in dataset]
    if missing:
        raise ValueError(f"prompt_ids {missing[:5]} are not in the dataset")
    return [dataset[p] for p in prompt_ids]
