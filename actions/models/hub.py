"""Hugging Face hub ids in ``model.path`` and ``data.train_path`` / ``data.eval_path``.

A value that is not a local path and reads as a hub id is fetched from the hub once, by the
``prepare`` action (and by the CLI's input check before it, into the same local cache), and
from then on the campaign reads only what ``prepare`` put into the store: no other action
touches the network. Downloads happen only where the user allows them, as the hub library
itself decides: ``HF_HUB_OFFLINE`` unset or false. Offline, a hub id is refused in one line
naming the variable to set.

Forms:

* ``model.path: org/name`` - a model repository: its config, tokenizer and safetensors files.
* ``data.*_path: org/name[/folder]`` - a dataset repository holding Parquet or JSON Lines files
  per split (``<split>-*.parquet``, ``<split>.jsonl``, or a ``<split>/`` folder of them), e.g.
  ``openai/gsm8k/main``. ``train_path`` reads split ``train``; ``eval_path`` reads ``test``
  (else ``validation``). ``folder`` picks a subset where the repository holds several.

Which file belongs to which split (:func:`files_by_split`) and which split a setting reads
(:func:`pick_split`) are decided here once, for hub snapshots and for the local folders and
``DatasetDict`` folders that ``actions/tasks/sources.py`` reads, so a local copy of a hub
dataset is read as the hub id would be.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from actions.config.quoting import unusable_path

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:/(?P<folder>[\w.-]+(?:/[\w.-]+)*))?$")
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
DATA_SUFFIXES = (".parquet", ".jsonl")
SPLITS = {"train": ("train",), "eval": ("test", "validation")}
"""The splits ``data.<which>_path`` reads, in order of preference."""
KNOWN_SPLITS = tuple(s for names in SPLITS.values() for s in names)
_SHARD = re.compile(r"^(?P<split>[A-Za-z]\w*)-\d+-of-\d+\.")  # the hub's shard names: train-00000-of-00002.parquet
NO_SPLIT = "data"
"""The shard prefix ``datasets`` gives the files of one split where it names none
(``train/data-00000-of-00001.arrow``, ``Dataset.save_to_disk``): never a split's name."""


def hub_allowed() -> bool:
    """Whether the user allows downloads: ``HF_HUB_OFFLINE`` unset or false (the hub
    library's own reading of the variable)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() not in {"1", "ON", "YES", "TRUE"}


def parse_hub_id(value: str, *, model: bool, field: str | None = None) -> tuple[str, str | None] | None:
    """(repository, folder) when ``value`` is not a local path and reads as a hub id, else None.

    Raises:
        ValueError: the system refuses to look ``value`` up as a path (a name over 255 bytes, a
            directory this user may not enter): one line naming ``field`` (the setting that gave
            it; default ``model.path`` or ``data path``), the value and the fix.
    """
    if not value or _is_local(value, field or ("model.path" if model else "data path")) \
            or value.startswith((".", "/", "~")):
        return None
    m = HUB_ID.match(value)
    if not m or (model and m.group("folder")):
        return None
    if Path(value).suffix.lower() in (".jsonl", ".json", ".parquet"):  # a missing local file
        return None
    return m.group("repo"), m.group("folder")


def _is_local(value: str, field: str) -> bool:
    try:
        return Path(value).expanduser().exists()
    except OSError as exc:  # ENAMETOOLONG, EACCES: pathlib raises them rather than answer False
        raise ValueError(unusable_path(field, value, exc)) from None


def _refuse_offline(field: str, value: str) -> ValueError:
    return ValueError(f"{field} {value!r} is not a local path and reads as a Hugging Face hub id, but downloads are "
                      f"off (HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')}); set HF_HUB_OFFLINE=0 to fetch it "
                      "once into the store, or point it at a local copy")


def _download(repo: str, repo_type: str, patterns: list[str], field: str, value: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, repo_type=repo_type, allow_patterns=patterns))
    except Exception as exc:  # not found, gated, no network: the hub library raises many types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"{field} {value!r}: the {repo_type} cannot be fetched from the hub ({type(exc).__name__}: "
                         f"{first[:200]}); check the id, `hf auth login` for a gated one, or use a local copy"
                         ) from None


def split_name(name: str) -> str | None:
    """The split a data file's name declares, else None.

    >>> [split_name(n) for n in ("train-00000-of-00001.parquet", "test.jsonl", "validation-1.parquet",
    ...                          "train_sft-00000-of-00001.parquet", "part-0.parquet", "trainer.parquet",
    ...                          "data-00000-of-00002.parquet")]
    ['train', 'test', 'validation', 'train_sft', None, None, None]
    """
    shard = _SHARD.match(name)  # the hub's numbering names a split whatever it is called
    if shard:
        return None if shard.group("split") == NO_SPLIT else shard.group("split")
    return next((s for s in KNOWN_SPLITS if name.startswith((f"{s}-", f"{s}."))), None)


def files_by_split(files: list[Path], *, by_folder: bool = False) -> dict[str, list[Path]]:
    """``files`` grouped by the split their names declare (:func:`split_name`) or, with
    ``by_folder``, the split a parent folder named ``train``, ``test`` or ``validation`` declares
    (the folder wins: ``train/data-00000-of-00001.parquet`` is train); files that declare none
    are left out. Empty when no file declares a split (``data-00000-of-00002.parquet`` or
    ``part-0.parquet`` alone): such files are one dataset. Splits a setting does not read
    (``train_sft``, ``test_prefs``) are kept, so that the caller refuses them by name rather
    than reading every split as one dataset.

    >>> files_by_split([Path("data-00000-of-00002.parquet"), Path("data-00001-of-00002.parquet")])
    {}
    >>> sorted(files_by_split([Path("train_sft-00000-of-00001.parquet"), Path("test_sft-00000-of-00001.parquet")]))
    ['test_sft', 'train_sft']
    """
    splits: dict[str, list[Path]] = {}
    for f in files:
        split = (f.parent.name if by_folder and f.parent.name in KNOWN_SPLITS else None) or split_name(f.name)
        if split:
            splits.setdefault(split, []).append(f)
    return splits


def pick_split(splits: list[str], which: str) -> str | None:
    """The split of ``splits`` that ``data.<which>_path`` reads (``which``: ``train`` or
    ``eval``): the first of ``SPLITS[which]`` present, else None.

    >>> pick_split(["test", "train", "validation"], "eval"), pick_split(["test"], "train")
    ('test', None)
    """
    return next((s for s in SPLITS[which] if s in splits), None)


def _split_files(root: Path, folder: str | None, which: str, field: str, value: str) -> Path:
    """The one folder or file that holds split ``which`` of the snapshot at ``root``."""
    base = root / folder if folder else root
    files = sorted(p for p in base.rglob("*") if p.suffix.lower() in DATA_SUFFIXES and p.is_file())
    splits = files_by_split(files, by_folder=True)
    split = pick_split(list(splits), which)
    if split is None:
        found = f" (it holds {', '.join(sorted(splits))})" if splits else ""
        raise ValueError(f"{field} {value!r} holds no {' or '.join(SPLITS[which])} split as Parquet or JSON Lines "
                         f"files{found}; download it and point at a local file")
    chosen = splits[split]
    parquet = [p for p in chosen if p.suffix.lower() == ".parquet"]
    chosen = parquet or chosen  # a split given in both formats (a Parquet export beside the JSON Lines): one
    parents = sorted({p.parent for p in chosen})
    if len(parents) > 1:
        subsets = ", ".join(str(p.relative_to(root)) for p in parents)
        raise ValueError(f"{field} {value!r} holds split {split!r} in several folders ({subsets}); "
                         f"name one, e.g. {value}/{parents[0].relative_to(base).parts[0]}")
    return chosen[0] if len(chosen) == 1 else _shard_folder(chosen)


def _shard_folder(shards: list[Path]) -> Path:
    """A folder holding only ``shards`` (links to them): the snapshot's folder may hold other
    splits beside them, and a folder of one split's Parquet files reads as that split
    (``actions/tasks/sources.py``)."""
    import hashlib
    import tempfile

    key = hashlib.sha256("\n".join(map(str, shards)).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "rlhfless-hub-splits" / key
    folder.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        link = folder / shard.name
        if not link.exists():
            link.symlink_to(shard.resolve())
    return folder


def resolve_model(value: str | None) -> str | None:
    """``model.path`` as a local directory (downloaded once when it is a hub id)."""
    hub = parse_hub_id(value or "", model=True, field="model.path")
    if hub is None:
        return value
    if not hub_allowed():
        raise _refuse_offline("model.path", value or "")
    return str(_download(hub[0], "model", MODEL_FILES, "model.path", value or ""))


def resolve_data(value: str | None, which: str) -> str | None:
    """``data.<which>_path`` as a local file or folder (downloaded once when it is a hub id)."""
    field = f"data.{which}_path"
    hub = parse_hub_id(value or "", model=False, field=field)
    if hub is None:
        return value
    if not hub_allowed():
        raise _refuse_offline(field, value or "")
    repo, folder = hub
    prefix = f"{folder}/" if folder else ""
    root = _download(repo, "dataset", [f"{prefix}*{s}" for s in DATA_SUFFIXES], field, value or "")
    return str(_split_files(root, folder, which, field, value or ""))


def resolve_hub_ids(cfg: Any) -> tuple[Any, dict[str, str]]:
    """``cfg`` (a WorkloadConfig) with hub ids replaced by local paths, and which settings
    were hub ids (setting -> the id as written), for the run's summary."""
    model = resolve_model(cfg.model.path)
    train = resolve_data(cfg.data.train_path, "train")
    evals = resolve_data(cfg.data.eval_path, "eval")
    fetched = {name: old for name, old, new in (("model.path", cfg.model.path, model),
                                                ("data.train_path", cfg.data.train_path, train),
                                                ("data.eval_path", cfg.data.eval_path, evals)) if old != new}
    if not fetched:
        return cfg, {}
    local = cfg.model_copy(deep=True)
    local.model.path, local.data.train_path, local.data.eval_path = model, train, evals
    return local, fetched
