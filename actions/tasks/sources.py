"""Reading prompt datasets from local files: JSON Lines, Parquet, or a ``save_to_disk`` folder.

What is read, by path:

* a ``.jsonl`` / ``.json`` file: JSON Lines, one object per line;
* a ``.parquet`` file, or a folder of ``*.parquet`` files (read in name order), through
  ``datasets.Dataset.from_parquet``;
* a folder written by ``datasets.Dataset.save_to_disk`` (it holds ``state.json``), through
  ``datasets.load_from_disk``. A ``DatasetDict`` folder is refused with the splits to choose from.

Only local files are read here: the ``datasets`` library never contacts the hub
(``HF_DATASETS_OFFLINE``; hub ids are fetched before, by ``actions/models/hub.py``),
and Parquet is converted in a temporary cache that is removed afterwards. JSON Lines is parsed
here, line by line, rather than by the Arrow JSON reader: that reader stops at the first row
whose type differs from the others without saying which line it is, and this loader's errors
name the file, the row and the key.

Rows come back as plain dicts with their 1-based row number; what they must hold is checked by
``fields.py``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actions.tasks.dataset import json_objects
from actions.tasks.input_limits import check_dataset_size, check_line_lengths

Record = tuple[int, dict[str, Any]]
"""(1-based row number in the file, the row)."""


def read_records(path: str, *, field: str) -> list[Record]:
    """All rows of the dataset at ``path``. ``field`` names the setting that gave the path
    (``data.train_path``) in error messages.

    Raises:
        ValueError: missing or unreadable path, unknown format, a malformed row (file and line).
    """
    p = Path(path)
    where = f"{field} {str(p)!r}"
    if not p.exists():
        raise ValueError(f"{where} does not exist; fix {field} (a .jsonl or .parquet file or a save_to_disk folder)")
    if p.is_dir():
        if (p / "dataset_dict.json").is_file():
            splits = sorted(c.name for c in p.iterdir() if (c / "state.json").is_file())
            raise ValueError(f"{where} holds a DatasetDict with splits {', '.join(splits)}; point {field} at one split "
                             f"folder, e.g. {p / (splits[0] if splits else 'train')}")
        if (p / "state.json").is_file():
            check_dataset_size([f for f in p.rglob("*") if f.is_file()], where, field)
            return list(_numbered(_load_from_disk(p, where)))
        parquet = sorted(p.glob("*.parquet"))
        if parquet:
            check_dataset_size(parquet, where, field)
            return list(_numbered(_load_parquet([str(f) for f in parquet], where)))
        raise ValueError(f"{where} is a folder without state.json or *.parquet files; point {field} at a .jsonl or "
                         ".parquet file or a save_to_disk folder")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json", ".parquet"):
        check_dataset_size([p], where, field)
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(p, field)
    if suffix == ".parquet":
        return list(_numbered(_load_parquet([str(p)], where)))
    raise ValueError(f"{where} has an unknown format ({suffix or 'no suffix'}); use .jsonl, .parquet or a "
                     "save_to_disk folder")


def _numbered(rows: Iterator[dict[str, Any]]) -> Iterator[Record]:
    return ((i, row) for i, row in enumerate(rows, start=1))


def _offline() -> None:
    # datasets reads only these local files; hub ids are fetched by actions/models/hub.py,
    # through huggingface_hub, whose HF_HUB_OFFLINE stays the user's
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _load_from_disk(path: Path, where: str) -> Iterator[dict[str, Any]]:
    _offline()
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # a damaged folder: arrow/json errors of every kind
        raise ValueError(f"{where} is not a readable save_to_disk folder ({type(exc).__name__}: {exc}); "
                         "write it again with Dataset.save_to_disk") from None
    if isinstance(ds, datasets.DatasetDict):
        raise ValueError(f"{where} holds a DatasetDict with splits {', '.join(ds)}; point at one split folder")
    return iter(ds)


def _load_parquet(files: list[str], where: str) -> Iterator[dict[str, Any]]:
    for name in files:  # the Parquet magic at both ends; datasets would log a traceback-like line first
        with open(name, "rb") as fh:
            head = fh.read(4)
            fh.seek(max(0, Path(name).stat().st_size - 4))
            if head != b"PAR1" or fh.read(4) != b"PAR1":
                raise ValueError(f"{where}: {Path(name).name} is not a readable Parquet file (no PAR1 magic); "
                                 "write it again, e.g. with Dataset.to_parquet")
    _offline()
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="rlhfless-parquet-") as cache:
        try:
            ds = datasets.Dataset.from_parquet(files, cache_dir=cache, keep_in_memory=True)
        except Exception as exc:  # pyarrow raises several unrelated types for a damaged file
            raise ValueError(f"{where} is not a readable Parquet file ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); write it again") from None
        return iter(list(ds))


def _read_jsonl(path: Path, field: str) -> list[Record]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{field} {str(path)!r} cannot be read ({exc.strerror}); fix {field}") from None
    check_line_lengths(data, f"{field} {path}")
    return json_objects(data, where=f"{field} {path}")
