"""Local backend of the object store: a directory on local disk (the embedded default).

Writes go to a temporary file that is renamed (``put``) or hard-linked (``put_if_absent``)
into place, so a reader never sees a half-written object and a create-once is atomic. The file
is fsynced before, and its directory after, the rename (and a new directory's parent when it is
made), so an object a call has returned for, a commit record included, survives a power loss. Blobs
are read through a private copy-on-write memory map, not copied. Compare-and-swap runs under
an exclusive ``flock`` of the key's directory, which serialises callers on this host only.

Keys are opened beneath the root one component at a time without following symlinks
(``safe_paths.parent_dir``): a symlink placed in the store is refused, so no key reads or
writes outside the root.

The root must be a directory or a path one can be made at: a root that is a file, or lies
beneath one, is refused when the store is opened (a ``ValueError`` naming ``store.uri``). An
access the system refuses (permissions, a read-only filesystem) is a
:class:`~actions.store.protocol.StoreAccessDenied` naming the store, the key, the path and the
fix; a write that finds the disk or the user's quota full is a ``StoreError`` saying so, and
leaves no part of the object behind (its temporary file is removed).

Keys are paths, so unlike S3 a key cannot also be the prefix of other keys (``a/b`` and
``a/b/c``): writing one where the other exists raises a StoreError naming both. Reading or
deleting a key that is a directory here finds no object, as on S3. A delete removes the
directories it leaves empty, up to the root, so a store holds no directory that lists nothing.

A write killed part-way (SIGKILL, a power loss) leaves its temporary file (``.tmp-`` and 16 hex
digits, beside the key); nothing lists it, and garbage collection removes it once it is old
(:meth:`LocalStore.remove_stale_temporaries`). A blob's modification time is its age for the
orphan sweep of garbage collection (``flows/campaign/collect.py``): a write that finds the blob
present refreshes it (:meth:`LocalStore.put_content`), and :meth:`LocalStore.delete_if_older`
re-checks it while the blob is set aside, so a blob a writer is about to list in a manifest is
never deleted as old.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from actions.config.quoting import quote, unusable_path
from actions.store.protocol import BlobData, ObjectNotFound, StoreAccessDenied, StoreError, as_parts, check_key
from actions.store.safe_paths import UnsafeName, open_component, parent_dir

DEFAULT_MAX_CONCURRENCY = 8

#: Tries of a write whose directory a concurrent delete removes (:meth:`LocalStore._write_beside`).
_DIRECTORY_ATTEMPTS = 5

#: Errors that say this user may not use the store's files: a :class:`StoreAccessDenied`.
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)

#: Errors that say the store's disk, or this user's quota on it, has no room for a write.
_FULL = (errno.ENOSPC, errno.EDQUOT)

#: The temporary file of a write in progress (or of one that was killed): never a key.
_TEMPORARY = re.compile(r"^\.tmp-[0-9a-f]{16}$")


def _temporary_name() -> str:
    return f".tmp-{secrets.token_hex(8)}"


def root_problem(given: str | os.PathLike[str], root: Path) -> str | None:
    """Why ``root`` (``given``, resolved) cannot be a store's directory, or None when it can:
    it, or the nearest of its ancestors that exists, is a file (or anything but a directory).
    A path that cannot be examined (a permission on an ancestor) passes: its first use says why;
    one too long for the system (ENAMETOOLONG, or a missing name longer than the file system
    of the nearest existing ancestor allows) does not, as no use of it can succeed.
    The answer is one line naming ``store.uri``, the value and the fix."""
    for path in (root, *root.parents):
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # missing (made on the first write), or beneath a file found further up
        except OSError as exc:
            return unusable_path("store.uri", os.fspath(given), exc) if exc.errno == errno.ENAMETOOLONG else None
        if stat.S_ISDIR(mode):
            return _name_too_long(given, root, path)
        what = "is a file, not a directory" if stat.S_ISREG(mode) else "is not a directory"
        # both paths whole up to quote's limit: a deep but ordinary store path cut at 60
        # characters hides which folder is in the way
        where = f" {what}" if path == root else f": {quote(str(path))} {what}"
        return f"store.uri {quote(os.fspath(given))}{where}; point store.uri at a directory (a missing one is created)"
    return None


def _name_too_long(given: str | os.PathLike[str], root: Path, existing: Path) -> str | None:
    """The line for a name of ``root`` below the directory ``existing`` (made by the first write)
    that is longer than ``existing``'s file system allows, else None: ``stat`` reports the missing
    parent before it, and ``mkdir`` would fail only when the campaign first writes."""
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):  # no such limit to ask for here: the first write says
        return None
    if any(len(os.fsencode(part)) > limit for part in root.relative_to(existing).parts):
        too_long = OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        return unusable_path("store.uri", os.fspath(given), too_long, name_max=limit)
    return None


class LocalStore:
    """A directory used as an object store (the embedded default).

    Keys are opened beneath the root one component at a time without following symlinks
    (``safe_paths.parent_dir``): a symlink placed in the store is refused, so no key can read
    or write outside the root.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_concurrency: int | None = None) -> None:
        """Open the store at ``root`` (made on the first write if missing).

        Raises:
            ValueError: ``root`` is a file, lies beneath one, or is too long a path (:func:`root_problem`).
        """
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)
        self.max_concurrency = max_concurrency or min(DEFAULT_MAX_CONCURRENCY, os.cpu_count() or 1)
        problem = root_problem(root, self.root)
        if problem is not None:
            raise ValueError(problem)

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r})"

    @contextmanager
    def _dir(self, key: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """Context manager: (fd of key's directory, key's last component). A PermissionError
        (or a read-only filesystem, a full disk or quota) here or in the block becomes the one
        line of :meth:`_denied`."""
        try:
            with parent_dir(self.root, key, where=f"store {self.uri}", create=create, what="key",
                            fix="use a relative key without '..'") as found:
                yield found
        except OSError as exc:
            if exc.errno not in _DENIED + _FULL:
                raise
            raise self._denied(f"key {key!r}", exc) from None

    def _denied(self, what: str, exc: OSError) -> StoreError:
        """The one line for an access the system refused on ``what`` ("key 'a/b'"), naming the
        store, the path where the system names one, why and the fix: a :class:`StoreAccessDenied`
        (permissions, a read-only file system), or a ``StoreError`` (a full disk or quota)."""
        path = os.fspath(exc.filename) if exc.filename else ""
        at = f" at {path!r}" if os.path.isabs(path) else ""  # (a name relative to an open directory says less)
        head = f"store {self.uri}: {what}: {exc.strerror or os.strerror(exc.errno)}{at}; "
        if exc.errno in _FULL:
            full = "this user's disk quota there is used up" if exc.errno == errno.EDQUOT else "the disk is full"
            return StoreError(f"{head}{full}: free space on the disk holding the store, or point store.uri at a "
                              "directory on another disk")
        if exc.errno == errno.EROFS:
            return StoreAccessDenied(f"{head}the file system holding the store is mounted read-only: remount it "
                                     "read-write, or point store.uri at a writable directory")
        return StoreAccessDenied(f"{head}make the store directory readable and writable by this user, or point "
                                 "store.uri at another")

    def _not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"object {key!r} not found in store {self.uri}")

    def _open(self, key: str) -> int:
        """A read-only fd of ``key``'s file (ObjectNotFound when it is missing)."""
        try:
            with self._dir(key) as (dir_fd, last):
                return self._open_file(key, dir_fd, last)
        except (FileNotFoundError, NotADirectoryError):
            raise self._not_found(key) from None

    def _open_file(self, key: str, dir_fd: int, last: str) -> int:
        """A read-only fd of file ``last`` in ``dir_fd``; FileNotFoundError when there is none
        or it is a directory (one holding other keys: a prefix, not an object, as on S3)."""
        fd = open_component(last, dir_fd, os.O_RDONLY, name=key, where=f"store {self.uri}")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "not a file", key)
        return fd

    def _conflict(self, key: str) -> StoreError | ValueError:
        """The error for a write that a key above or below ``key`` blocks (a path cannot be a
        file and a directory at once; S3 keys can), or for one that the root blocks (made a
        file since the store was opened: a ValueError as at opening)."""
        problem = root_problem(self.uri, self.root)
        if problem is not None:
            return ValueError(problem)
        parts = key.split("/")
        above = next((p for p in ("/".join(parts[:i]) for i in range(1, len(parts)))
                      if (self.root / p).is_file()), None)
        clash = (f"{above!r} is an object, so nothing can be stored beneath it" if above else
                 f"other keys are stored beneath it ({key + '/...'!r})")
        return StoreError(f"store {self.uri}: cannot write key {key!r}: {clash}; a local store cannot hold a key that "
                          "is also a prefix of other keys (S3 can): choose keys that are not prefixes of one another")

    def _write(self, key: str, data: BlobData, publish: Callable[[str, int, str], bool]) -> bool:
        """Write ``data`` to a temporary file beside ``key``, then ``publish(tmp, dir_fd, last)``
        (rename or link it into place); the temporary file never outlives the call.

        Raises:
            StoreError: a key above ``key`` is an object, or ``key`` is a directory of other keys.
            ValueError: the root is now a file, or lies beneath one.
        """
        try:
            return self._write_beside(key, data, publish)
        except (NotADirectoryError, IsADirectoryError, FileExistsError):  # FileExistsError: making the root
            raise self._conflict(key) from None

    def _write_beside(self, key: str, data: BlobData, publish: Callable[[str, int, str], bool]) -> bool:
        # A delete removes the directories it empties (:meth:`delete`): one may go between this
        # writer's making or opening it and creating its temporary file in it (ENOENT), so that
        # part is tried again; once the temporary file is in it, it is not empty and stays.
        attempts = _DIRECTORY_ATTEMPTS
        while True:
            created = False
            try:
                with self._dir(key, create=True) as (dir_fd, last):
                    tmp = _temporary_name()
                    fd = open_component(tmp, dir_fd, os.O_WRONLY | os.O_CREAT | os.O_EXCL, name=key,
                                        where=f"store {self.uri}")
                    created = True
                    return self._fill_and_publish(fd, tmp, dir_fd, last, data, publish)
            except FileNotFoundError:
                attempts -= 1
                if created or not attempts:
                    raise

    @staticmethod
    def _fill_and_publish(fd: int, tmp: str, dir_fd: int, last: str, data: BlobData,
                          publish: Callable[[str, int, str], bool]) -> bool:
        """Write ``data`` to the temporary file ``tmp`` (open as ``fd``), then ``publish`` it;
        the temporary file never outlives the call."""
        try:
            with os.fdopen(fd, "wb") as fh:
                for part in as_parts(data):
                    fh.write(part)
                fh.flush()
                os.fsync(fh.fileno())
            published = publish(tmp, dir_fd, last)
            # The rename or link is durable only once the directory is: without this a
            # crash could lose a commit record whose file was already on disk.
            os.fsync(dir_fd)
            return published
        finally:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass  # renamed into place

    def put(self, key: str, data: bytes) -> None:
        # Temp file then rename: rename is atomic on POSIX, so a crash leaves either the old
        # object or none, never a truncated one. A symlink at the key is replaced, not followed.
        def rename(tmp: str, dir_fd: int, last: str) -> bool:
            os.replace(tmp, last, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True

        self._write(key, data, rename)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        # link() fails if the target exists (a symlink included): an atomic create-once, like
        # S3 If-None-Match.
        def link(tmp: str, dir_fd: int, last: str) -> bool:
            try:
                os.link(tmp, last, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                return True
            except FileExistsError:
                try:
                    mode = os.stat(last, dir_fd=dir_fd, follow_symlinks=False).st_mode
                except FileNotFoundError:  # deleted since (a lease taken over): it existed, so not created
                    return False
                if stat.S_ISDIR(mode):
                    raise self._conflict(key) from None
                return False

        return self._write(key, data, link)

    def put_content(self, key: str, parts: BlobData, sha256: str) -> bool:
        """Create a content-addressed object if absent (no temp file when it exists).

        An existing one gets its modification time set to now: the caller is about to list it
        in a manifest, and the orphan sweep deletes only blobs unchanged for hours. If it
        vanishes before the touch (an orphan sweep took it), it is written again."""
        if self.exists(key) and self._touch(key):
            return False
        return self.put_if_absent(key, parts)  # type: ignore[arg-type]

    def _touch(self, key: str) -> bool:
        """Set ``key``'s modification time to now; False if it is gone."""
        try:
            with self._dir(key) as (dir_fd, last):
                try:  # caught here: past the block, _dir makes it a StoreAccessDenied
                    os.utime(last, dir_fd=dir_fd, follow_symlinks=False)
                except PermissionError:
                    pass  # another user's file: present, only its age stays as it was
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _if_holds(self, key: str, expected: bytes, then: Callable[[int, str], None]) -> bool:
        """Under an exclusive flock of ``key``'s directory (compare-and-swap callers on this
        host serialise on it): if ``key`` holds exactly ``expected``, run ``then(dir_fd, last)``
        and return True; else False (a missing key included)."""
        try:
            with self._dir(key) as (dir_fd, last):
                fcntl.flock(dir_fd, fcntl.LOCK_EX)  # released when the directory fd closes
                try:
                    fd = self._open_file(key, dir_fd, last)
                except FileNotFoundError:
                    return False
                with os.fdopen(fd, "rb") as fh:
                    if fh.read() != expected:
                        return False
                then(dir_fd, last)
                return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def replace_if(self, key: str, expected: bytes, data: bytes) -> bool:
        """Replace ``key`` with ``data`` (temporary file, atomic rename) only if it holds
        exactly ``expected``; the compare and the rename happen under the directory's lock."""
        return self._if_holds(key, expected, lambda dir_fd, last: self.put(key, data))

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Delete ``key`` only if it holds exactly ``expected`` (under the directory's lock), then,
        as :meth:`delete`, the directories above it that this leaves empty (a run's lease, the
        last key of a run that failed before its first commit, leaves no empty run directory)."""
        deleted = self._if_holds(key, expected, lambda dir_fd, last: os.unlink(last, dir_fd=dir_fd))
        if deleted:
            self._prune_above(key)
        return deleted

    def get(self, key: str) -> bytes:
        with os.fdopen(self._open(key), "rb") as fh:
            return fh.read()

    def get_buffer(self, key: str, size: int | None = None) -> mmap.mmap | bytes:
        """A private copy-on-write memory map of ``key``: no read copy, and writes by the
        caller (e.g. in-place ops on tensors viewing it) never reach the file. ``size`` is
        accepted for interface parity and not needed here."""
        with os.fdopen(self._open(key), "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return b""
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)

    def exists(self, key: str) -> bool:
        try:
            with self._dir(key) as (dir_fd, last):
                st = os.stat(last, dir_fd=dir_fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeName(f"store {self.uri}: key {key!r} is a symlink; symlinks are not followed "
                             "beneath a store directory -- replace the link with the real file")
        return stat.S_ISREG(st.st_mode)

    def delete(self, key: str) -> None:
        """Remove ``key`` if present, then the directories above it that this leaves empty, up
        to the root (S3 has no directories to leave behind). A directory another writer has put
        its temporary file in is not empty and stays; a writer whose directory goes before that
        makes it again (:meth:`_write_beside`)."""
        try:
            with self._dir(key) as (dir_fd, last):
                os.unlink(last, dir_fd=dir_fd)  # removes a symlink itself, never its target
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return  # missing, or a directory of other keys: no object here, as on S3
        self._prune_above(key)

    def _prune_above(self, key: str) -> None:
        """Remove the directories above ``key`` that are empty, deepest first, up to the root."""
        parts = key.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            try:
                with self._dir("/".join(parts[:depth])) as (dir_fd, last):
                    os.rmdir(last, dir_fd=dir_fd)  # only an empty directory; a symlink is not one
            except (OSError, StoreError, UnsafeName):  # not empty, gone, or a link: the rest stays
                return

    def list(self, prefix: str) -> list[str]:
        return sorted(rel for rel, _ in self._walk(prefix))

    def list_stats(self, prefix: str) -> dict[str, tuple[float, int]]:
        """Key -> (modification time in epoch seconds, size in bytes) for the keys under
        ``prefix`` (those :meth:`list` gives; a key deleted meanwhile is left out)."""
        return {rel: (st.st_mtime, st.st_size) for rel, st in self._stats(prefix)}

    def list_tags(self, prefix: str) -> dict[str, str | None]:
        """Key -> a tag that changes whenever the file's bytes may have: its inode, modification
        time in nanoseconds and size (every ``put`` renames a new file into place). Garbage
        collection keeps what it read of a manifest while its tag stays the same."""
        return {rel: f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}" for rel, st in self._stats(prefix)}

    def _stats(self, prefix: str) -> list[tuple[str, os.stat_result]]:
        """(key, its file's lstat) for the keys under ``prefix``; a key deleted meanwhile is left out."""
        out = []
        for rel, path in self._walk(prefix):
            try:
                out.append((rel, path.lstat()))
            except FileNotFoundError:
                continue
        return out

    def _walk(self, prefix: str, *, temporaries: bool = False) -> list[tuple[str, Path]]:
        """(key, path) of the regular files under ``prefix``; with ``temporaries``, the
        temporary files of writes instead of the keys."""
        # Walk only the deepest directory the prefix names, not the whole store, and never
        # descend into or report a symlink.
        base = self.root / check_key(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        try:
            if base.is_symlink() or not base.is_dir() or not base.resolve().is_relative_to(self.root):
                return []
        except OSError as exc:
            if exc.errno not in _DENIED:
                raise
            raise self._denied(f"listing {prefix!r}", exc) from None

        def unreadable(exc: OSError) -> None:  # else a directory it may not read would list as empty
            if exc.errno in _DENIED:
                raise self._denied(f"listing {prefix!r}", exc)

        out = []
        # the sweep for temporaries is a best effort over the whole root, where a directory the
        # store never wrote may sit (a volume's lost+found): it skips what it may not read
        for dirpath, dirnames, filenames in os.walk(base, onerror=None if temporaries else unreadable,
                                                    followlinks=False):
            for name in filenames:
                path = Path(dirpath, name)
                if name.startswith(".tmp-") == temporaries and not path.is_symlink():
                    rel = path.relative_to(self.root).as_posix()
                    if rel.startswith(prefix) and (not temporaries or _TEMPORARY.match(name)):
                        out.append((rel, path))
        return out

    def remove_stale_temporaries(self, older_than: float, *, dry_run: bool = False) -> tuple[int, int]:
        """Remove the temporary files of writes (``.tmp-`` + 16 hex digits, anywhere in the
        store) last modified before ``older_than`` (epoch seconds): writes that were killed.

        A live write modifies its temporary file with every chunk and renames it within seconds
        of the last, so one untouched for long belongs to a dead writer; should its writer only
        be stalled, its rename then fails and its write raises (nothing half-written appears).

        Returns:
            (files removed, their bytes); with ``dry_run`` those that would be.
        """
        count = size = 0
        for rel, path in self._walk("", temporaries=True):
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue  # published or removed meanwhile
            if stat.S_ISREG(st.st_mode) and st.st_mtime < older_than:
                if not dry_run:
                    self.delete(rel)  # beneath the root, without following a symlink
                count, size = count + 1, size + st.st_size
        return count, size

    def delete_if_older(self, key: str, older_than: float) -> bool:
        """Delete ``key`` if it was last modified before ``older_than`` (epoch seconds), checked
        after the file is renamed aside: a writer that touched it first (:meth:`put_content`)
        made it young, and it is put back; one that comes after finds it gone and writes it
        again. Returns whether it was deleted."""
        try:
            with self._dir(key) as (dir_fd, last):
                if not stat.S_ISREG(os.stat(last, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    return False  # a directory of other keys (or a link): not an object
                aside = _temporary_name()  # a crash from here on leaves a temporary file, swept later
                os.rename(last, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                if os.stat(aside, dir_fd=dir_fd, follow_symlinks=False).st_mtime >= older_than:
                    os.replace(aside, last, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # same bytes if rewritten
                    return False
                os.unlink(aside, dir_fd=dir_fd)
        except (FileNotFoundError, NotADirectoryError):
            return False  # deleted meanwhile
        self._prune_above(key)  # as delete() does: a store holds no directory that lists nothing
        return True

