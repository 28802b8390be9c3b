"""The sha256 of the files a dataset path names, recorded when a run stores its copy of the data.

``prepare`` stores the rows it read (``runs/<run>/data/``), and every step of the run, resumed
or not, reads that copy. The files at ``data.train_path`` / ``data.eval_path`` may be edited
since; a resume compares them by this digest (``flows/campaign/data_copies.py``) and says, in
one warning line, that the run keeps training on the copy it stored, rather than leave the user
believing the edit is trained on.

A digest hashes every byte of the files (about 3 s per GiB on one CPU core): names, sizes and
modification times alone would miss a file rewritten in place with the same length, and would
report a plain ``touch`` or copy as a change.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path


def source_digest(path: str) -> str | None:
    """sha256 (hex) over each file at ``path`` in name order: its name relative to ``path``, its
    size in bytes and its own sha256. A file is itself (named ``""``); a folder, every file
    under it. None when ``path`` names nothing this process can read (moved, removed, a
    permission), which a caller treats as nothing to compare."""
    root = Path(path)
    try:
        if root.is_file():
            files = [("", root)]
        elif root.is_dir():
            files = sorted((f.relative_to(root).as_posix(), f) for f in root.rglob("*") if f.is_file())
        else:
            return None
        digest = hashlib.sha256()
        for name, f in files:
            stat = f.stat()
            sha = file_sha256(os.path.realpath(f), stat.st_size, stat.st_mtime_ns)
            digest.update(f"{name}\0{stat.st_size}\0{sha}\n".encode())
        return digest.hexdigest()
    except OSError:
        return None


@functools.lru_cache(maxsize=256)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 (hex) of the file at ``path``, read in chunks; cached while its ``size`` and
    ``mtime_ns`` are these (the CLI and the flow it starts both compare, in one process)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def recorded_sources(paths: dict[str, str | None], fetched: dict[str, str]) -> dict[str, dict[str, str]]:
    """setting -> {"path": as typed, "sha256": ``source_digest``} for each local dataset path of
    ``paths`` (setting -> path; None: unset), as ``Prepared.data["sources"]`` records them. A
    setting in ``fetched`` was a hub id (its revision names its files), and a path that cannot
    be read has nothing to record."""
    out = {}
    for setting, path in paths.items():
        if path and setting not in fetched and (digest := source_digest(path)) is not None:
            out[setting] = {"path": path, "sha256": digest}
    return out
