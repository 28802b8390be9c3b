"""A local store whose disk, or whose user's quota, fills up mid-write: one line naming the
store, what is full and the fix, and no part of the object left behind (the old object stays
whole, no temporary file remains)."""

from __future__ import annotations

import errno
import os

import pytest

from actions.store import LocalStore, StoreAccessDenied, StoreError

FIX = "free space on the disk holding the store, or point store.uri at a directory on another disk"


class _FillsUp:
    """A file opened for writing whose disk fills after a few bytes: the bytes before it land
    in the file (a real half-written temporary file), the write then fails with ``code``."""

    def __init__(self, fh, code: int) -> None:
        self.fh, self.code = fh, code

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()

    def write(self, data) -> int:
        self.fh.write(bytes(data[:3]))
        self.fh.flush()
        raise OSError(self.code, os.strerror(self.code))

    def __getattr__(self, name):
        return getattr(self.fh, name)


def _temporaries(store: LocalStore) -> list[str]:
    return [name for _, _, names in os.walk(store.root) for name in names if name.startswith(".tmp-")]


@pytest.mark.parametrize(("code", "what"), [(errno.ENOSPC, "No space left on device; the disk is full"),
                                            (errno.EDQUOT, "Disk quota exceeded; this user's disk quota there is "
                                                           "used up")])
def test_a_write_to_a_full_disk_or_quota_is_one_line_and_leaves_no_part_of_the_object(tmp_path, monkeypatch,
                                                                                       code, what) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("runs/r/a.json", b"old bytes")
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        fh = real_fdopen(fd, mode, *args, **kwargs)
        return _FillsUp(fh, code) if "w" in mode else fh

    monkeypatch.setattr(os, "fdopen", fdopen)
    line = rf"^store {store.uri}: key 'runs/r/(a|b)\.json': {what}: {FIX}$"
    for write in (lambda: store.put("runs/r/a.json", b"new bytes"), lambda: store.put("runs/r/b.json", b"new"),
                  lambda: store.put_if_absent("runs/r/b.json", b"new")):
        with pytest.raises(StoreError, match=line) as err:
            write()
        assert not isinstance(err.value, StoreAccessDenied)  # nothing to do with permissions
        assert _temporaries(store) == []  # the half-written temporary file is gone
    monkeypatch.undo()
    assert store.get("runs/r/a.json") == b"old bytes" and not store.exists("runs/r/b.json")
    assert store.list("runs/") == ["runs/r/a.json"]


def test_a_full_disk_when_a_keys_directory_is_made_names_the_store_and_the_fix(tmp_path, monkeypatch) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("runs/r/a.json", b"1")
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777, *, dir_fd=None):
        if dir_fd is not None:  # a directory beneath the root: no room for it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(StoreError, match=rf"^store {store.uri}: key 'runs/s/a.json': No space left on device; the "
                                         rf"disk is full: {FIX}$"):
        store.put("runs/s/a.json", b"2")
    monkeypatch.undo()
    assert store.list("runs/") == ["runs/r/a.json"] and _temporaries(store) == []


def test_a_blob_whose_time_this_user_may_not_set_is_still_present(tmp_path, monkeypatch):
    """``put_content`` of a blob already stored by another user: its time cannot be refreshed
    (EPERM), but the bytes are there, so the write is done, not refused."""
    from actions.store import sha256_hex

    store = LocalStore(str(tmp_path))
    assert store.put_content("blobs/b", (b"x",), sha256_hex(b"x"))

    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "utime", refused)
    assert store.put_content("blobs/b", (b"x",), sha256_hex(b"x")) is False  # present: nothing written
    assert store.get("blobs/b") == b"x"
