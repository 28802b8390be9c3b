"""Reading prompt datasets from local files: JSON Lines, Parquet, or a ``save_to_disk`` folder.

What is read, by path:

* a ``.jsonl`` / ``.json`` file (UTF-8, a leading byte-order mark ignored): JSON Lines, one
  object per line; a ``.json`` file holding one JSON array of objects (``[{...}, {...}]``, as
  ``json.dump`` writes a list) is read too, its elements numbered from 1 as rows. A file that
  is one JSON object as a whole (``{"data": [...]}``) is refused naming the keys holding lists,
  and so are a key twice in one object and an unpaired surrogate escape (``dataset.load_json``);
* a ``.parquet`` file, or a folder of ``*.parquet`` files (the suffix in any case, read in name
  order; a folder that also holds ``.jsonl``, ``.json``, ``.csv``, ... data files is refused
  naming them, rather than leaving them unread), through
  ``datasets.Dataset.from_parquet``. Where the file names declare splits, as a hub snapshot's do
  (``train-00000-of-00001.parquet``, ``test-00000-of-00001.parquet``), ``data.train_path``
  reads the ``train`` files and ``data.eval_path`` the ``test`` (else ``validation``) files:
  the rule of a hub id (``actions/models/hub.py``), so a local copy reads as the id would.
  A file of no rows (an empty shard) is skipped; a damaged file is named, and so are the row
  and column of a string that is not UTF-8 (Arrow reads text without checking it);
* a folder written by ``datasets.Dataset.save_to_disk`` (it holds ``state.json``), through
  ``datasets.load_from_disk``; for a ``DatasetDict`` folder (``dataset_dict.json`` and one
  folder per split) the same rule picks the split.

A folder whose names declare splits, none of them one the setting reads, is refused, naming
the splits (``train_sft-*`` and ``test_sft-*``: read whole, training would hold the test rows);
a folder of one split alone that no setting reads (``train_sft-*``) is read whole, but one of
``train-*`` files alone is the train split, which ``data.eval_path`` refuses (as
``data.train_path`` refuses ``test-*`` or ``validation-*`` files alone: a single file is read
whatever its name). ``data-*`` shards declare no split.
Only local files are read here: the ``datasets`` library never contacts the hub
(``HF_DATASETS_OFFLINE``; hub ids are fetched before, by ``actions/models/hub.py``),
and Parquet is converted in a temporary cache that is removed afterwards. JSON Lines is parsed
here, line by line, rather than by the Arrow JSON reader: that reader stops at the first row
whose type differs from the others without saying which line it is, and this loader's errors
name the file, the row and the key.

Rows come back as plain dicts with their 1-based row number (in a folder of several Parquet
files, counted across them: ``Records.place`` gives the file and the row in it, which errors
name); what they must hold is checked by ``fields.py``.
"""

from __future__ import annotations

import codecs
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from actions.config.quoting import quote, unusable_path
from actions.models.hub import KNOWN_SPLITS, SPLITS, files_by_split, pick_split
from actions.tasks.dataset import json_array, json_objects, one_object
from actions.tasks.input_limits import check_dataset_size, check_line_lengths

Record = tuple[int, dict[str, Any]]
"""(1-based row number in the file, the row)."""


class Records(list[Record]):
    """The rows :func:`read_records` gives. Read from a folder of several Parquet files, a row's
    number counts across them, in order, and ``shards`` holds each file's name and row count
    (empty otherwise): :meth:`place` turns the number into the file and the row within it, as
    errors name a row. A slice is a plain list: its numbers stay unique, but name no file."""

    shards: tuple[tuple[str, int], ...] = ()

    def place(self, number: int) -> tuple[int, str | None]:
        """(row within its file from 1, the file's name or None) of the row numbered ``number``."""
        return _place(self.shards, number)


def _place(shards: Sequence[tuple[str, int]], number: int) -> tuple[int, str | None]:
    """(row within its file, its file) of row ``number`` of the files ``shards`` ((name, rows),
    in order; none: ``number`` as it is, no file)."""
    for name, count in shards:
        if number <= count:
            return number, name
        number -= count
    return number, None


def read_records(path: str, *, field: str) -> Records:
    """All rows of the dataset at ``path``. ``field`` names the setting that gave the path
    (``data.train_path`` or ``data.eval_path``) in error messages, and so which split a folder
    of several gives.

    Raises:
        ValueError: missing or unreadable path, unknown format, no split for ``field``, a
            malformed row (file and line).
    """
    p = Path(path)
    where = f"{field} {quote(str(p))}"
    which = "eval" if field == "data.eval_path" else "train"
    try:
        found = p.exists()
    except OSError as exc:  # ENAMETOOLONG, EACCES: pathlib raises them rather than answer False
        raise ValueError(unusable_path(field, path, exc)) from None
    if not found and any(c in p.name for c in "*?[{"):
        raise ValueError(f"{where} is a pattern, which is not expanded; name the folder that holds the files "
                         f"instead (a folder of *.parquet files reads as one dataset, in name order)")
    if not found:
        raise ValueError(f"{where} does not exist; fix {field} (a .jsonl, .json or .parquet file, a folder of "
                         ".parquet files, a save_to_disk folder or a hub id owner/name[/subset])")
    if p.is_dir():
        if (p / "dataset_dict.json").is_file():
            p = _dict_split(p, which, where, field)
        if (p / "state.json").is_file():
            check_dataset_size([f for f in p.rglob("*") if f.is_file()], where, field)
            return Records(_numbered(_load_from_disk(p, where)))
        parquet = _parquet_files(p, where, field)
        parquet = _folder_split(parquet, which, where, field)
        check_dataset_size(parquet, where, field)
        return _load_parquet([str(f) for f in parquet], where)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json", ".parquet"):
        check_dataset_size([p], where, field)
    if suffix in (".jsonl", ".json"):
        return Records(_read_jsonl(p, field))
    if suffix == ".parquet":
        return _load_parquet([str(p)], where)
    raise ValueError(f"{where} has an unknown format ({suffix or 'no suffix'}); use .jsonl, .parquet or a "
                     "save_to_disk folder")


OTHER_DATA = (".jsonl", ".json", ".ndjson", ".csv", ".tsv", ".arrow")
"""Suffixes of data files a folder is not read as (a folder is Parquet files or a save_to_disk folder)."""
METADATA = ("dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json")
"""The ``datasets`` library's descriptions of a dataset, kept beside its data files: no rows."""


def _parquet_files(folder: Path, where: str, field: str) -> list[Path]:
    """The Parquet files of ``folder`` (``.parquet`` in any case: a single ``.PARQUET`` file is
    read too), in name order. A folder holding data files of another format (``.jsonl``,
    ``.csv``, ...; :data:`METADATA` aside) is refused naming them, beside Parquet files (they would
    be left out, unread) or without any (a folder is not read as them)."""
    files = sorted(f for f in folder.iterdir() if f.is_file())
    parquet = [f for f in files if f.suffix.lower() == ".parquet"]
    others = [f.name for f in files if f.suffix.lower() in OTHER_DATA and f.name not in METADATA]
    if parquet and others:
        raise ValueError(f"{where} holds Parquet files ({_names([f.name for f in parquet])}) and data files of "
                         f"another format ({_names(others)}), which a folder of Parquet files does not read; keep "
                         f"one format per folder (move {others[0]} out, or write its rows as Parquet), or point "
                         f"{field} at one file")
    if not parquet:
        held = f" (it holds {_names(others)}, which a folder is not read as)" if others else ""
        raise ValueError(f"{where} is a folder without state.json or *.parquet files{held}; point {field} at a "
                         ".jsonl or .parquet file or a save_to_disk folder")
    return parquet


def _names(names: list[str]) -> str:
    """Up to three file names, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _suggest(splits: list[str], which: str) -> str:
    """The split to name in a refusal: the first named after one the setting reads (``train_sft``
    for ``data.train_path``, ``test_prefs`` for ``data.eval_path``), else the first that the
    other setting would not read. Only named: which split to use is the user's choice."""
    own, other = SPLITS[which], SPLITS["train" if which == "eval" else "eval"]
    return next((s for s in splits if s.startswith(own)), None) or next((s for s in splits if s not in other),
                                                                        splits[0])


def _dict_split(folder: Path, which: str, where: str, field: str) -> Path:
    """The split folder of the DatasetDict at ``folder`` that ``data.<which>_path`` reads."""
    splits = sorted(c.name for c in folder.iterdir() if (c / "state.json").is_file())
    split = pick_split(splits, which)
    if split is None:
        hint = f"e.g. {folder / _suggest(splits, which)}" if splits else "or save the split with Dataset.save_to_disk"
        raise ValueError(f"{where} holds a DatasetDict with splits {', '.join(splits) or '(none)'}, none of them "
                         f"{' or '.join(SPLITS[which])}; point {field} at the split folder to use, {hint}")
    return folder / split


def _folder_split(files: list[Path], which: str, where: str, field: str) -> list[Path]:
    """The files of ``files`` that ``data.<which>_path`` reads: all of them when no name declares
    a split, or when they declare one split of another name alone (``train_sft-*.parquet``: the
    folder holds that split), else those of the split :func:`pick_split` chooses. Several splits
    of other names (``train_sft-*``, ``test_sft-*``) are refused, naming them: read whole,
    training would hold the test rows and evaluation the training rows."""
    splits = files_by_split(files)
    if not splits or (len(splits) == 1 and not set(splits) & set(KNOWN_SPLITS)):
        return files
    split = pick_split(list(splits), which)
    if split is None:
        names = sorted(splits)
        suggested = _suggest(names, which)
        shards = splits[suggested]
        example = _split_example(shards, suggested, which)
        raise ValueError(f"{where} holds Parquet files of splits {', '.join(names)}, none of them "
                         f"{' or '.join(SPLITS[which])}; point {field} at the files of the split to use, e.g. "
                         f"{example}")
    return splits[split]


def _split_example(shards: list[Path], split: str, which: str) -> str:
    """How to point ``data.<which>_path`` at the files of ``split`` alone: one file is read
    whatever its name; a folder of several is read whole only where its one split is none that
    a setting reads (``train_sft``), so the files of a split another setting reads (``train``
    for ``data.eval_path``) are renamed to a split this one reads."""
    if split not in KNOWN_SPLITS:
        return (f"{shards[0]}, or at a folder holding only them" if len(shards) == 1 else
                f"a folder holding only its {len(shards)} {split}-*.parquet files")
    if len(shards) == 1:
        return f"{shards[0]} (a file is read whatever its name)"
    own = SPLITS[which][0]
    return (f"a folder holding only its {len(shards)} {split}-*.parquet files renamed to {own}-*.parquet "
            f"(a folder's {split}-* files are its {split} split, which data.{which}_path does not read), or one "
            ".parquet file holding their rows")


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
    return iter(_decoded(ds, where, []))


def _load_parquet(files: list[str], where: str) -> Records:
    """The rows of ``files`` in order, numbered across them (``Records.shards`` names the files
    when there are several). A file of no rows (a valid Parquet file, as an empty shard of a
    split is) is skipped: ``datasets`` fails on it as if it were damaged. No rows in any file
    gives no rows, which ``fields.to_rows`` refuses as an empty JSON Lines file."""
    counts = {name: _parquet_rows(name, where) for name in files}
    kept = [name for name in files if counts[name]]
    if not kept:
        return Records()
    _check_shards_agree(kept, where)
    _offline()
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    verbosity = datasets.logging.get_verbosity()
    # a damaged page is reported below, naming the file; datasets would first log a line of its own
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        with tempfile.TemporaryDirectory(prefix="rlhfless-parquet-") as cache:
            try:
                ds = datasets.Dataset.from_parquet(kept, cache_dir=cache, keep_in_memory=True)
            except Exception as exc:  # pyarrow raises several unrelated types for a damaged file
                raise ValueError(_unreadable(kept, where, exc)) from None
            shards = [(Path(name).name, counts[name]) for name in kept]
            records = Records(_numbered(iter(_decoded(ds, where, shards))))
            if len(shards) > 1:  # one file's rows are numbered in it already
                records.shards = tuple(shards)
            return records
    finally:
        datasets.logging.set_verbosity(verbosity)


def _decoded(ds: Any, where: str, files: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Every row of the ``datasets.Dataset`` ``ds`` as a dict. Arrow checks no text for UTF-8
    when it reads a file, so a string that is not UTF-8 first fails here: ValueError naming the
    file of ``files`` ((name, rows) in the order ``ds`` holds them; none: the dataset as a
    whole), the row in it from 1 and the column."""
    rows: list[dict[str, Any]] = []
    try:
        for row in ds:
            rows.append(row)
    except UnicodeDecodeError as exc:
        number, file = _place(files, len(rows) + 1)
        name = f"{file} " if file else ""
        byte = exc.object[exc.start:exc.start + 1].hex()
        raise ValueError(f"{where}: {name}row {number}{_bad_column(ds, len(rows))} holds text that is not UTF-8 "
                         f"(byte 0x{byte}); write the {'file' if files else 'dataset'} again with its text as UTF-8"
                         ) from None
    return rows


def _bad_column(ds: Any, index: int) -> str:
    """", column 'name'" for the first column of row ``index`` whose text does not decode ("" if none is found)."""
    row = ds.data.table.slice(index, 1)
    for name in row.column_names:
        try:
            row.column(name).to_pylist()
        except UnicodeDecodeError:
            return f", column {name!r}"
    return ""


def _parquet_rows(name: str, where: str) -> int:
    """The row count in ``name``'s footer; ValueError naming the file when it has no Parquet
    magic at both ends or no readable footer (checked here, before ``datasets`` reads it)."""
    import pyarrow.parquet as pq

    with open(name, "rb") as fh:
        head = fh.read(4)
        fh.seek(max(0, Path(name).stat().st_size - 4))
        if head != b"PAR1" or fh.read(4) != b"PAR1":
            raise ValueError(f"{where}: {Path(name).name} is not a readable Parquet file (no PAR1 magic); "
                             "write it again, e.g. with Dataset.to_parquet")
    try:
        return pq.ParquetFile(name).metadata.num_rows
    except Exception as exc:  # a damaged footer: pyarrow raises OSError, ArrowInvalid, ...
        raise ValueError(f"{where}: {Path(name).name} is not a readable Parquet file ({_first_line(exc)}); "
                         "write it again, e.g. with Dataset.to_parquet") from None


def _check_shards_agree(files: list[str], where: str) -> None:
    """Refuse Parquet shards that ``datasets`` would fail on or read wrongly: shards whose
    columns differ, either way (a column the first lacks fails; one a later shard lacks would
    read as null in all its rows, which a reward function reading it cannot tell from a row
    without a value), or a column holding another kind of value than in the first shard (text,
    integers, floating-point numbers, booleans, lists, structs, ...: numbers beside text are
    read as text and integers after floats as floats, silently; untyped nulls first and values
    later fail). Floats after integers read as integers when every one is whole, and are
    refused naming the column and both shards when one is not (``datasets`` would fail naming
    neither); a later shard's untyped nulls read as the first's type."""
    import pyarrow.parquet as pq

    first = pq.read_schema(files[0])
    for name in files[1:]:
        schema = pq.read_schema(name)
        a, b = Path(files[0]).name, Path(name).name
        _check_same_columns(set(first.names), set(schema.names), a, b, where)
        for column in schema.names:
            want, got = first.field(column).type, schema.field(column).type
            if not _agrees(want, got):
                raise ValueError(f"{where}: column {column!r} holds {_described(got)} in {b} but {_described(want)} "
                                 f"in {a}; write every shard with the same type in {column!r} (cast it before "
                                 "writing)")
            if want != got and _holds_float_as_int(want, got):
                _check_whole(name, column, want, got, a, where)


def _check_same_columns(first: set[str], later: set[str], a: str, b: str, where: str) -> None:
    """Refuse shards ``a`` (the first, columns ``first``) and ``b`` (``later``) whose columns
    differ, naming the columns, the shard that lacks them and the one that has them."""
    for lacking, having, names in ((b, a, sorted(first - later)), (a, b, sorted(later - first))):
        if names:
            listed = ", ".join(repr(n) for n in names)
            one = len(names) == 1
            raise ValueError(f"{where}: {lacking} has no column{'' if one else 's'} {listed}, which {having} has; "
                             f"write every shard with the same columns: add {'it' if one else 'them'} to {lacking} "
                             f"with its type in {having} (null where a row has no value), or drop "
                             f"{'it' if one else 'them'} from every shard")


def _holds_float_as_int(first: Any, later: Any) -> bool:
    """Whether a later shard's type holds floating-point numbers where the first's holds
    integers, at the top or inside lists and structs (the one difference ``_agrees`` allows that
    depends on the values)."""
    import pyarrow as pa

    first, later = (t.value_type if pa.types.is_dictionary(t) else t for t in (first, later))
    want, got = _kind(first), _kind(later)
    if (want, got) == ("integers", "floating-point numbers"):
        return True
    if want == got == "lists":
        return _holds_float_as_int(first.value_type, later.value_type)
    if want == got == "structs":
        fields = {f.name: f.type for f in first}
        return any(f.name in fields and _holds_float_as_int(fields[f.name], f.type) for f in later)
    return False


def _check_whole(name: str, column: str, want: Any, got: Any, a: str, where: str) -> None:
    """Refuse column ``column`` of shard ``name`` (type ``got``) when it does not cast to the
    first shard's ``want`` without loss, as ``datasets`` casts it: a float that is not whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = pq.read_table(name, columns=[column]).column(column)
    try:
        values.cast(want, safe=True)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{where}: column {column!r} holds {_described(got)} in {Path(name).name}, not all whole "
                         f"({_first_line(exc)}), but {_described(want)} in {a}; write every shard with the same "
                         f"type in {column!r} (floating-point numbers in every shard, to keep the fractions)"
                         ) from None
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # a cast pyarrow lacks: datasets' own error names it
        return


NULLS = "only nulls (no type)"


def _agrees(first: Any, later: Any) -> bool:
    """Whether a later shard's Arrow type reads right as the first shard's: the same kind, in
    lists and structs too; untyped nulls as any; floats as integers (whole ones: the values are
    checked by ``_check_whole``). Integers after floats would read as floats (2 as 2.0, unlike
    the same rows in JSON Lines)."""
    import pyarrow as pa

    first, later = (t.value_type if pa.types.is_dictionary(t) else t for t in (first, later))  # categoricals
    want, got = _kind(first), _kind(later)
    if got == NULLS or (want, got) == ("integers", "floating-point numbers"):
        return True
    if want != got:
        return False
    if want == "lists":
        return _agrees(first.value_type, later.value_type)
    if want == "structs":
        fields = {f.name: f.type for f in first}
        return all(f.name in fields and _agrees(fields[f.name], f.type) for f in later)
    return True


def _described(dtype: Any) -> str:
    """An Arrow type as a message names it: its kind, and what a list or struct holds."""
    kind = _kind(dtype)
    if kind == "lists":
        return f"lists of {_described(dtype.value_type)}"
    if kind == "structs":
        return "structs {" + ", ".join(f"{f.name}: {_described(f.type)}" for f in list(dtype)[:6]) + "}"
    return kind


def _kind(dtype: Any) -> str:
    """The kind of value an Arrow type holds, as shards must agree on it (widths aside)."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(dtype):  # a categorical column: its values' kind
        return _kind(dtype.value_type)
    for kind, test in ((NULLS, t.is_null), ("text", lambda d: t.is_string(d) or t.is_large_string(d)),
                       ("integers", t.is_integer), ("floating-point numbers", lambda d: t.is_floating(d) or
                                                        t.is_decimal(d)),
                       ("booleans", t.is_boolean), ("bytes", lambda d: t.is_binary(d) or t.is_large_binary(d)),
                       ("lists", lambda d: t.is_list(d) or t.is_large_list(d) or t.is_fixed_size_list(d)),
                       ("structs", t.is_struct), ("times", t.is_temporal)):
        if test(dtype):
            return kind
    return str(dtype)


def _unreadable(files: list[str], where: str, exc: Exception) -> str:
    """The error line for Parquet files that ``datasets`` could not read: naming the first file
    that pyarrow cannot read alone (a damaged page), else the folder (files that do not agree)."""
    import pyarrow.parquet as pq

    for name in files:
        try:
            pq.read_table(name)
        except Exception as own:  # the damaged shard
            return (f"{where}: {Path(name).name} is not a readable Parquet file ({_first_line(own)}); "
                    "write it again, e.g. with Dataset.to_parquet")
    return (f"{where}: its Parquet files cannot be read as one dataset ({_first_line(exc.__cause__ or exc)}); "
            "give every shard the column types of the first, or write them again")


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def _read_jsonl(path: Path, field: str) -> list[Record]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{field} {str(path)!r} cannot be read ({exc.strerror}); fix {field}") from None
    where = f"{field} {path}"
    data = data.removeprefix(codecs.BOM_UTF8)  # as some Windows editors save UTF-8; it is no part of the first row
    if data.lstrip()[:1] == b"[":  # never a JSON Lines row, which is an object
        if path.suffix.lower() != ".json":
            raise ValueError(f"{where} starts with a JSON array, not an object; JSON Lines holds one object per line: "
                             f"convert it (jq -c '.[]' {path.name}), or name a file holding one array .json")
        return json_array(data, where=where)
    if b"\r" in data and b"\n" not in data:  # rows ended by "\r" alone (classic Mac OS, some exports)
        data = data.replace(b"\r", b"\n")   # a raw "\r" inside a JSON string is invalid, so none is lost
    check_line_lengths(data, where)
    try:
        return json_objects(data, where=where)
    except ValueError:
        whole = one_object(data, path.name, field) if data.lstrip()[:1] == b"{" else None
        if whole is None:
            raise
        raise ValueError(f"{where} {whole}") from None
