"""Names that come from the store are data: the checks before one becomes a path or a key.

A manifest's file table, a commit record's keys, a KV bundle's tensor names and a request's
object keys are written by whoever can write the store (or reach an action). Loading a model
turns file names into paths, so an unchecked ``../../.bashrc`` or ``/etc/cron.d/x`` would be a
file written anywhere the training user can write. Every such name passes :func:`check_name`
before use:

* a ``/``-separated relative path: no leading ``/``, no empty, ``.`` or ``..`` component;
* no backslash and no drive prefix (``C:``), which mean other things on other systems;
* no NUL or other control character (C0, DEL);
* at most :data:`MAX_NAME_CHARS` characters, each component at most
  :data:`MAX_COMPONENT_BYTES` UTF-8 bytes (S3's key limit and the usual NAME_MAX).

Files are then opened beneath their target directory one component at a time with
``O_NOFOLLOW`` (:func:`parent_dir`, :func:`write_beneath`): a symlink anywhere below the
target directory is refused, even one that stays inside it, so a name can never resolve
outside. That is the whole rule; it needs no ``realpath`` and has no check-then-use race.

Run ids become path components (``runs/<run_id>/...``) and get a stricter rule of their own
(:func:`check_run_id`).

What this does not cover: the contents of files (digests do, see ``store/artifacts.py``), and
platforms without ``dir_fd`` support for ``os.open`` (Windows; the project runs on POSIX).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MAX_NAME_CHARS = 1024
MAX_COMPONENT_BYTES = 255
MAX_RUN_ID_CHARS = 128

_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class UnsafeName(ValueError):
    """A name from the store or a request that must not become a path or a key.

    A ``ValueError``: retrying cannot help, so actions answer it as an application error and
    the CLI as one line with exit 2.
    """


def shown(name: Any) -> str:
    """``repr(name)``, cut to a readable length (an oversized name must not flood a log line)."""
    if isinstance(name, str) and len(name) > 80:
        return f"{name[:60]!r}... ({len(name)} characters)"
    return repr(name)


def name_problem(name: Any) -> str | None:
    """Why ``name`` is not a safe relative path, or None when it is."""
    if not isinstance(name, str):
        return f"a {type(name).__name__}, not a string"
    if not name:
        return "empty"
    if len(name) > MAX_NAME_CHARS:
        return f"longer than {MAX_NAME_CHARS} characters"
    if _CONTROL.search(name):
        return "contains a NUL or control character"
    if "\\" in name:
        return "contains a backslash"
    if _DRIVE.match(name):
        return "starts with a drive letter"
    if name.startswith("/"):
        return "an absolute path"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"has a {part!r} path component" if part else "has an empty path component"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"has a component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


STORE_FIX = "refusing to use it: the store was tampered with or corrupted; re-publish it from a trusted source"


def check_name(name: Any, *, where: str, what: str = "name",
               fix: str = "use a relative path of plain names ('a/b.json')") -> str:
    """``name`` itself when it is a safe relative path (see the module docstring).

    Args:
        name: the untrusted value.
        where: what it came from, for the error ("manifest 'runs/r1/base/manifest.json'").
        what: what it is ("file", "key", "tensor").
        fix: the advice ending the error (:data:`STORE_FIX` for names read from the store).

    Raises:
        UnsafeName: one line naming ``where``, the value, the reason and the fix.
    """
    problem = name_problem(name)
    if problem is not None:
        raise UnsafeName(f"{where}: {what} {shown(name)} is not a safe relative path ({problem}); {fix}")
    return name


def check_run_id(run_id: Any) -> str:
    """``run_id`` when it can name a directory: ASCII letters, digits, ``.``, ``_`` and ``-``,
    starting with a letter or digit (so never ``.`` or ``..``), at most 128 characters.

    Raises:
        UnsafeName: one line naming ``run_id``, the value and the fix.
    """
    if (not isinstance(run_id, str) or not _RUN_ID.match(run_id) or len(run_id) > MAX_RUN_ID_CHARS
            or not run_id.isascii()):
        raise UnsafeName(f"run_id {shown(run_id)} may use only letters, digits, '-', '_' and '.', must start with "
                         f"a letter or digit and be 1 to {MAX_RUN_ID_CHARS} characters; pick another run id")
    return run_id


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _symlink_error(name: str, where: str) -> UnsafeName:
    return UnsafeName(f"{where}: {shown(name)} passes through a symlink, and symlinks are not followed beneath "
                      "a store or model directory; replace the link with the real file")


def open_component(part: str, dir_fd: int, flags: int, *, name: str, where: str, mode: int = 0o600) -> int:
    """``os.open(part, flags | O_NOFOLLOW, dir_fd=dir_fd)``; a symlink raises UnsafeName."""
    try:
        return os.open(part, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dir_fd)
    except OSError as exc:
        # O_NOFOLLOW on a symlink fails with ELOOP (ENOTDIR with O_DIRECTORY on some systems).
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and _is_symlink(part, dir_fd):
            raise _symlink_error(name, where) from None
        raise


@contextmanager
def parent_dir(root: str | os.PathLike[str], name: str, *, where: str, create: bool = False,
               what: str = "name", fix: str = STORE_FIX) -> Iterator[tuple[int, str]]:
    """``(fd of the directory that holds name, name's last component)`` beneath ``root``.

    Each directory component is opened with ``O_NOFOLLOW``; with ``create``, missing ones
    (and ``root`` itself) are made. The fd is closed on exit.

    Raises:
        UnsafeName: ``name`` is unsafe, or a component is a symlink.
        FileNotFoundError / NotADirectoryError: a component is missing (without ``create``)
            or is a file.
    """
    parts = check_name(name, where=where, what=what, fix=fix).split("/")
    if create:
        Path(root).mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts[:-1]:
            flags = os.O_RDONLY | os.O_DIRECTORY
            try:
                child = open_component(part, fd, flags, name=name, where=where)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                    os.fsync(fd)  # the new entry is durable before anything is written beneath it
                except FileExistsError:
                    pass  # made by a concurrent writer
                child = open_component(part, fd, flags, name=name, where=where)
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def write_beneath(root: str | os.PathLike[str], name: str, data: bytes, *, where: str) -> Path:
    """Create file ``name`` beneath ``root`` (which must be a directory the caller owns, e.g. a
    fresh temporary one) and write ``data``. Never follows a symlink and never overwrites:
    an existing file or link at ``name`` is an error.

    Returns:
        The file's path.
    """
    with parent_dir(root, name, where=where, create=True, what="file") as (dir_fd, last):
        try:
            fd = open_component(last, dir_fd, os.O_WRONLY | os.O_CREAT | os.O_EXCL, name=name, where=where)
        except FileExistsError:
            raise UnsafeName(f"{where}: file {shown(name)} is listed twice or already exists; {STORE_FIX}") from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    return Path(root, name)
