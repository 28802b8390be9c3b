"""Object-store contract (run on the local and S3 backends), artifacts, the commit pointer,
local-only behaviour and secret redaction."""

from __future__ import annotations

import base64
import errno
import json
import os
import threading
import time

import pytest

from actions.store import (
    CommitConflict,
    IntegrityError,
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    StoreAccessDenied,
    StoreError,
    blob_key,
    commit_key,
    commit_pointer,
    delete_if,
    get_artifact,
    open_store,
    put_artifact,
    read_manifest,
    read_pointer,
    replace_if,
    sha256_hex,
)
from actions.store.credentials import S3Credentials, mask_key_id, redact, register_secret

# ----------------------------------------------------------------------------- contract


def test_put_get_exists_delete(backend_store: ObjectStore) -> None:
    s = backend_store
    assert isinstance(s, ObjectStore)
    assert not s.exists("a/b.bin")
    s.put("a/b.bin", b"one")
    assert s.exists("a/b.bin") and s.get("a/b.bin") == b"one"
    s.put("a/b.bin", b"two")  # overwrite
    assert s.get("a/b.bin") == b"two"
    s.put("empty", b"")
    assert s.get("empty") == b""
    s.delete("a/b.bin")
    s.delete("a/b.bin")  # deleting a missing key is not an error
    assert not s.exists("a/b.bin")
    with pytest.raises(ObjectNotFound, match="'a/b.bin' not found"):
        s.get("a/b.bin")


def test_list_is_sorted_and_scoped_to_prefix(backend_store: ObjectStore) -> None:
    for key in ["runs/r2/x", "runs/r1/b", "runs/r1/a", "other/z", "runs/r10/c"]:
        backend_store.put(key, b"1")
    assert backend_store.list("runs/r1/") == ["runs/r1/a", "runs/r1/b"]
    assert backend_store.list("runs/r1") == ["runs/r1/a", "runs/r1/b", "runs/r10/c"]
    assert backend_store.list("nothing/") == []
    assert backend_store.list("") == sorted(["runs/r2/x", "runs/r1/b", "runs/r1/a", "other/z", "runs/r10/c"])


def test_put_if_absent_creates_once(backend_store: ObjectStore) -> None:
    assert backend_store.put_if_absent("marker", b"first") is True
    assert backend_store.put_if_absent("marker", b"second") is False
    assert backend_store.get("marker") == b"first"


def test_put_if_absent_has_one_winner_under_contention(backend_store: ObjectStore) -> None:
    results: list[bool] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        created = backend_store.put_if_absent("race", f"writer-{i}".encode())
        with lock:
            results.append(created)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", ".."])
def test_invalid_keys_are_rejected(backend_store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="not a safe relative path"):
        backend_store.put(key, b"x")


def test_artifact_round_trip(backend_store: ObjectStore) -> None:
    files = {"a.txt": b"alpha", "b.bin": bytes(range(256)) * 4000, "c": b""}
    stats = put_artifact(backend_store, "art/manifest.json", files, {"step": 3})
    assert (stats.num_files, stats.num_uploaded) == (3, 3)
    assert stats.bytes_uploaded == sum(map(len, files.values()))
    got, meta = get_artifact(backend_store, "art/manifest.json")
    assert got == files and meta == {"step": 3}
    assert all(type(data) is bytes for data in got.values())  # read as buffers, handed out as bytes
    some, _ = get_artifact(backend_store, "art/manifest.json", names=["a.txt"])
    assert some == {"a.txt": b"alpha"}
    with pytest.raises(ObjectNotFound, match="'zzz' is not listed"):
        get_artifact(backend_store, "art/manifest.json", names=["zzz"])


def test_unchanged_blobs_are_not_uploaded_again(backend_store: ObjectStore) -> None:
    big = b"x" * 400_000  # above SMALL_BLOB_BYTES: existence is checked before sending
    put_artifact(backend_store, "v1/manifest.json", {"small": b"s", "big": big, "c": b"c1"})
    stats = put_artifact(backend_store, "v2/manifest.json", {"small": b"s", "big": big, "c": b"c2"})
    assert (stats.num_uploaded, stats.bytes_uploaded) == (1, 2)


def test_corrupted_blob_raises_integrity_error_naming_the_key(backend_store: ObjectStore) -> None:
    put_artifact(backend_store, "m.json", {"w": b"good bytes"})
    key = blob_key(sha256_hex(b"good bytes"))
    backend_store.put(key, b"evil bytes")
    with pytest.raises(IntegrityError, match=rf"{key} for file 'w' is corrupted"):
        get_artifact(backend_store, "m.json")


def test_missing_blob_raises_object_not_found_naming_the_blob(backend_store: ObjectStore) -> None:
    put_artifact(backend_store, "m.json", {"w": b"bytes", "v": b"other"})
    key = blob_key(sha256_hex(b"bytes"))
    backend_store.delete(key)
    with pytest.raises(ObjectNotFound, match=rf"blob {key} \(file 'w'\) listed in manifest 'm.json' is missing"):
        get_artifact(backend_store, "m.json")


def test_damaged_manifest_is_an_integrity_error(backend_store: ObjectStore) -> None:
    backend_store.put("m.json", b"{not json")
    with pytest.raises(IntegrityError, match="not valid JSON"):
        read_manifest(backend_store, "m.json")
    backend_store.put("m.json", b'{"files": {}}')
    with pytest.raises(IntegrityError, match="no rlhfless.artifact/v1 file table"):
        read_manifest(backend_store, "m.json")


class FailingStore:
    """Delegates to a store, failing the Nth blob put (a crash mid-publish)."""

    def __init__(self, inner: ObjectStore, fail_at: int) -> None:
        self.inner, self.fail_at, self.num_puts = inner, fail_at, 0
        self.uri = inner.uri
        self.max_concurrency = 1
        self._lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.num_puts += 1
            if key.startswith("blobs/") and self.num_puts >= self.fail_at:
                raise OSError(f"injected failure writing {key}")

    def put(self, key: str, data: bytes) -> None:
        self._count(key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._count(key)
        return self.inner.put_if_absent(key, data)

    def put_content(self, key: str, parts, sha256: str) -> bool:
        self._count(key)
        return self.inner.put_content(key, parts, sha256)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_failed_publish_leaves_no_manifest(backend_store: ObjectStore) -> None:
    files = {f"f{i}": bytes([i]) * 10 for i in range(6)}
    with pytest.raises(OSError, match="injected"):
        put_artifact(FailingStore(backend_store, fail_at=3), "m.json", files)
    assert not backend_store.exists("m.json")
    put_artifact(backend_store, "m.json", files)  # a retry completes the artifact
    assert get_artifact(backend_store, "m.json")[0] == files


# ----------------------------------------------------------------------------- commit pointer


class NoListStore:
    """Proves the reader path never lists."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.uri = inner, inner.uri

    def list(self, prefix: str) -> list[str]:
        raise AssertionError("the commit pointer must not list")

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _commit_steps(store: ObjectStore, steps: range) -> None:
    for step in steps:
        commit_pointer(store, "run/campaign", {"step": step, "policy": f"policy/v{step}"})


def test_commit_pointer_reads_the_highest_committed_step(backend_store: ObjectStore) -> None:
    store = NoListStore(backend_store)
    assert read_pointer(store, "run/campaign") is None
    _commit_steps(store, range(0, 6))
    assert read_pointer(store, "run/campaign") == {"step": 5, "policy": "policy/v5"}
    assert backend_store.exists("run/campaign/commits/step-000005.json")
    latest = json.loads(backend_store.get("run/campaign/latest.json"))
    assert latest["step"] == 5 and latest["commit"] == commit_key("run/campaign", 5)


@pytest.mark.parametrize("damage", ["stale", "missing", "garbage", "ahead"])
def test_commit_pointer_survives_a_bad_latest_hint(backend_store: ObjectStore, damage: str) -> None:
    store = NoListStore(backend_store)
    _commit_steps(store, range(1, 12))  # steps may start at 1
    latest = "run/campaign/latest.json"
    if damage == "stale":  # a writer crashed between commit and hint update
        backend_store.put(latest, json.dumps({"step": 2}).encode())
    elif damage == "missing":
        backend_store.delete(latest)
    elif damage == "garbage":
        backend_store.put(latest, b"\x00not json")
    else:  # the hint names a commit that is gone
        backend_store.put(latest, json.dumps({"step": 40}).encode())
    assert read_pointer(store, "run/campaign")["step"] == 11


def test_commit_pointer_is_create_once_and_idempotent(backend_store: ObjectStore) -> None:
    _commit_steps(backend_store, range(0, 3))
    commit_pointer(backend_store, "run/campaign", {"step": 2, "policy": "policy/v2"})  # replay: ok
    with pytest.raises(CommitConflict, match="step 2 of 'run/campaign' is already committed"):
        commit_pointer(backend_store, "run/campaign", {"step": 2, "policy": "policy/OTHER"})
    assert read_pointer(backend_store, "run/campaign")["policy"] == "policy/v2"


def test_commit_pointer_rejects_gaps_and_bad_steps(backend_store: ObjectStore) -> None:
    _commit_steps(backend_store, range(0, 3))
    with pytest.raises(ValueError, match="step 4 is not committed"):
        commit_pointer(backend_store, "run/campaign", {"step": 5})
    fresh = "run/other"
    commit_pointer(backend_store, fresh, {"step": 0})
    with pytest.raises(ValueError, match="step 1 is not committed"):  # the smallest gap
        commit_pointer(backend_store, fresh, {"step": 2})
    for bad in [{"step": -1}, {"step": "3"}, {"policy": "x"}, {"step": True}]:
        with pytest.raises(ValueError, match="int 'step'"):
            commit_pointer(backend_store, "run/campaign", bad)


# ----------------------------------------------------------------------------- local only


def test_open_store_local_forms(tmp_path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(f"file://{tmp_path}").uri == str(tmp_path.resolve())
    with pytest.raises(ValueError, match="unsupported scheme"):
        open_store("gs://bucket/x")


def test_local_buffer_is_copy_on_write(tmp_path) -> None:
    store = LocalStore(tmp_path)
    store.put("k", b"abcdef")
    buf = store.get_buffer("k")
    buf[0:3] = b"XYZ"  # writable, but private
    assert bytes(buf) == b"XYZdef" and store.get("k") == b"abcdef"
    with pytest.raises(ObjectNotFound):
        store.get_buffer("nope")


def test_local_put_leaves_no_temp_files(tmp_path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/b", b"1")
    store.put_if_absent("a/b", b"2")
    store.put_if_absent("a/c", b"3")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b", "c"]


def test_a_local_delete_removes_the_directories_it_empties_and_a_racing_write_makes_them_again(tmp_path) -> None:
    """A delete leaves no empty directory behind, up to the root; a writer whose directory such a
    delete removes between making it and creating its temporary file there makes it again."""
    from contextlib import contextmanager

    class Racing(LocalStore):
        races = 2  # the put's directory, then the put_if_absent's

        @contextmanager
        def _dir(self, key, *, create=False):
            with super()._dir(key, create=create) as found:
                if create and Racing.races:
                    Racing.races -= 1
                    os.rmdir(self.root / key.rsplit("/", 1)[0])  # a delete of its last object, just now
                yield found

    store = Racing(tmp_path / "s")
    store.put("a/b/c", b"1")
    assert store.put_if_absent("a/d/e", b"2") and Racing.races == 0
    assert (store.get("a/b/c"), store.get("a/d/e")) == (b"1", b"2")
    store.delete("a/b/c")
    assert sorted(p.name for p in (tmp_path / "s" / "a").iterdir()) == ["d"]
    store.delete("a/d/e")
    store.delete("a/d/e")  # missing: nothing to do
    assert (tmp_path / "s").is_dir() and list((tmp_path / "s").iterdir()) == []
    store.put("runs/r/lease.json", b"held")  # a compare-and-delete prunes too: no empty run directory
    assert delete_if(store, "runs/r/lease.json", b"other") is False and (tmp_path / "s" / "runs" / "r").is_dir()
    assert delete_if(store, "runs/r/lease.json", b"held") is True
    assert list((tmp_path / "s").iterdir()) == []


def test_a_key_that_is_a_prefix_of_other_keys_reads_as_missing(backend_store: ObjectStore) -> None:
    """``d/x`` holds no object when only ``d/x/y`` was written (on S3 it is a prefix, locally a
    directory): reading finds nothing, deleting is a no-op, compare-and-swap is False."""
    store = backend_store
    store.put("d/x/y", b"1")
    for read in (store.get, store.get_buffer):
        with pytest.raises(ObjectNotFound, match="object 'd/x' not found"):
            read("d/x")
    assert not store.exists("d/x")
    store.delete("d/x")
    assert replace_if(store, "d/x", b"", b"2") is False and delete_if(store, "d/x", b"") is False
    assert store.get("d/x/y") == b"1" and store.list("d/") == ["d/x/y"]


def test_a_local_key_cannot_also_be_a_prefix_of_other_keys(tmp_path) -> None:
    """S3 holds ``f/x`` and ``f/x/y`` side by side; a directory tree cannot, and says so."""
    store = LocalStore(tmp_path / "store")
    store.put("d/x/y", b"1")
    store.put("f/x", b"2")
    writes = {"put": lambda k: store.put(k, b"3"), "put_if_absent": lambda k: store.put_if_absent(k, b"3"),
              "put_content": lambda k: store.put_content(k, (b"3",), sha256_hex(b"3"))}
    for name, write in writes.items():
        with pytest.raises(StoreError, match=r"cannot write key 'd/x': other keys are stored beneath it "
                                             r"\('d/x/\.\.\.'\).*local store cannot hold.*\(S3 can\)") as info:
            write("d/x")
        assert not isinstance(info.value, ObjectNotFound), name
        with pytest.raises(StoreError, match=r"cannot write key 'f/x/y': 'f/x' is an object, so nothing can be "
                                             r"stored beneath it; .*\(S3 can\)"):
            write("f/x/y")
    assert store.get("d/x/y") == b"1" and store.get("f/x") == b"2"
    assert store.list("") == ["d/x/y", "f/x"] and not store._walk("", temporaries=True)  # no temporary left


def test_a_local_root_that_is_a_file_or_lies_beneath_one_is_refused_naming_store_uri(tmp_path) -> None:
    """Not ``[Errno 17] File exists`` on the first write, nor a key conflict below the root:
    one line naming store.uri, the file and the fix, when the store is opened."""
    (tmp_path / "afile").write_text("x")
    refused = {f"{tmp_path}/afile": rf"store.uri '{tmp_path}/afile' is a file, not a directory; ",
               f"{tmp_path}/afile/store": rf"store.uri '{tmp_path}/afile/store': '{tmp_path}/afile' is a file, not a "
                                          "directory; ",
               f"file://{tmp_path}/afile/a/b": rf"store.uri '{tmp_path}/afile/a/b': '{tmp_path}/afile' is a file"}
    for uri, named in refused.items():
        with pytest.raises(ValueError, match=named + ".*point store.uri at a directory"):
            open_store(uri)
    store = LocalStore(tmp_path / "gone")  # made a file after it was opened: the same line, not a key conflict
    (tmp_path / "gone").write_text("x")
    for write in (lambda: store.put("runs/x1/lease.json", b"1"), lambda: store.put_if_absent("k", b"1")):
        with pytest.raises(ValueError, match=rf"store.uri '{tmp_path}/gone' is a file, not a directory; point"):
            write()
    assert (tmp_path / "afile").read_text() == "x" and (tmp_path / "gone").read_text() == "x"


def test_an_access_the_system_refuses_is_one_store_access_denied_line(tmp_path, monkeypatch) -> None:
    """Permissions (or a read-only filesystem) on a key: a StoreAccessDenied naming the store,
    the key and the fix, not a bare ``[Errno 13]``; a listing never reads as empty."""
    store = LocalStore(tmp_path / "store")
    store.put("runs/r/a.json", b"1")
    real_open, real_scandir = os.open, os.scandir
    refusal = {"errno": errno.EACCES}

    def refuse(path):  # what the system answers this user for anything in the store
        if str(path).startswith(str(store.root)):
            raise OSError(refusal["errno"], os.strerror(refusal["errno"]), str(path))

    def open_(path, flags, *args, dir_fd=None, **kwargs):
        refuse(store.root if dir_fd is not None else path)
        return real_open(path, flags, *args, dir_fd=dir_fd, **kwargs)

    def scandir(path="."):
        refuse(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "scandir", scandir)
    fix = "make the store directory readable and writable by this user, or point store.uri at another"
    for call in (lambda: store.get("runs/r/a.json"), lambda: store.put("runs/r/b.json", b"2"),
                 lambda: store.exists("runs/r/a.json"), lambda: store.list("runs/")):
        with pytest.raises(StoreAccessDenied, match=rf"^store {store.uri}: (key 'runs/r/.\.json'|listing 'runs/'): "
                                                    rf"Permission denied at '{store.root}(/runs)?'; {fix}$"):
            call()
    refusal["errno"] = errno.EROFS
    with pytest.raises(StoreAccessDenied, match=r"key 'runs/r/b.json': Read-only file system at .*; the file system "
                                                r"holding the store is mounted read-only: remount it read-write, or "
                                                r"point store.uri at a writable directory$"):
        store.put("runs/r/b.json", b"2")
    monkeypatch.undo()
    assert store.list("runs/") == ["runs/r/a.json"]


def test_the_sweep_for_temporaries_skips_a_foreign_directory_it_may_not_read(tmp_path, monkeypatch) -> None:
    """A store root at a volume's mount point holds the volume's ``lost+found``, which its user
    may not read: the best-effort sweep of killed writes' temporary files passes it by (else
    every collection, and so every resume, would stop on it), while a listing of keys under an
    unreadable directory still raises."""
    store = LocalStore(tmp_path / "store")
    store.put("runs/r/a.json", b"1")
    stale = store.root / "runs" / "r" / ".tmp-0123456789abcdef"
    stale.write_bytes(b"half")
    os.utime(stale, (1, 1))
    foreign = store.root / "lost+found"
    foreign.mkdir()
    real_scandir = os.scandir

    def scandir(path="."):  # what the system answers a user who may not read lost+found
        if str(path).startswith(str(foreign)):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert store.remove_stale_temporaries(older_than=time.time()) == (1, 4) and not stale.exists()
    with pytest.raises(StoreAccessDenied, match="listing 'lost\\+found/'"):
        store.list("lost+found/")


def test_list_stats_gives_each_keys_time_and_size(backend_store: ObjectStore) -> None:
    import time

    backend_store.put("a/x", b"123")
    backend_store.put("a/y", b"12345")
    backend_store.put("b/z", b"1")
    stats = backend_store.list_stats("a/")
    assert sorted(stats) == backend_store.list("a/") == ["a/x", "a/y"]
    assert [size for _, size in stats.values()] == [3, 5]
    assert all(abs(mtime - time.time()) < 120 for mtime, _ in stats.values())  # the server's clock on S3


def test_local_stale_temporaries_and_delete_if_older(tmp_path) -> None:
    """Only a write's own temporary files (``.tmp-`` + 16 hex), and only old ones, are removed;
    ``delete_if_older`` deletes by age."""
    import os
    import time

    store = LocalStore(tmp_path)
    store.put("a/k", b"key")
    old, young, other = tmp_path / "a" / ".tmp-0123456789abcdef", tmp_path / ".tmp-fedcba9876543210", \
        tmp_path / "a" / ".tmp-notawrite"
    for path in (old, young, other):
        path.write_bytes(b"12345")
    for path in (old, other, tmp_path / "a" / "k"):
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    assert store.remove_stale_temporaries(time.time() - 3600, dry_run=True) == (1, 5) and old.exists()
    assert store.remove_stale_temporaries(time.time() - 3600) == (1, 5)
    assert not old.exists() and young.exists() and other.exists() and store.list("") == ["a/k"]
    assert store.delete_if_older("a/k", time.time() - 10800) is False and store.exists("a/k")
    assert store.delete_if_older("a/k", time.time() - 3600) is True and not store.exists("a/k")
    assert store.delete_if_older("a/k", time.time()) is False
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".tmp-notawrite"]
    # an old object deleted by age takes the directories it leaves empty with it, as delete() does
    store.put("b/c/k", b"key")
    os.utime(tmp_path / "b" / "c" / "k", (time.time() - 7200, time.time() - 7200))
    assert store.delete_if_older("b/c/k", time.time() - 3600) is True
    assert not (tmp_path / "b").exists() and (tmp_path / "a").is_dir()


# ----------------------------------------------------------------------------- redaction


def test_redact_scrubs_env_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("__OW_API_KEY", "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP")
    monkeypatch.delenv("WSK_AUTH", raising=False)
    auth = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP"
    text = (
        "secret=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY key=AKIAIOSFODNN7EXAMPLE "
        f"auth={auth} header=Basic {base64.b64encode(auth.encode()).decode()} "
        f"half={auth.split(':')[1]}"
    )
    out = redact(text)
    assert "wJalrXUtnFEMI" not in out and "123zO3xZCLrMN6v2BKK" not in out
    assert base64.b64encode(auth.encode()).decode() not in out
    assert "AKIAIOSFODNN7EXAMPLE" not in out and "key=AKIA****" in out
    assert out.count("[REDACTED]") == 4


def test_an_auth_variable_holding_a_url_keeps_the_scheme_in_messages() -> None:
    """Host and key swapped: WSK_AUTH holds the URL. The URL is scrubbed whole, but its scheme is
    not a secret half, so the message that says how to set WSK_APIHOST keeps its https://."""
    env = {"WSK_AUTH": "https://openwhisk.example.com"}
    out = redact("set WSK_APIHOST to https://host[:port] (got https://openwhisk.example.com)", env=env)
    assert out == "set WSK_APIHOST to https://host[:port] (got [REDACTED])"
    # a key that is not a uuid still has both halves scrubbed
    assert redact("user=someuser pw=pass1234", env={"WSK_AUTH": "someuser:pass1234"}) == "user=[REDACTED] pw=[REDACTED]"


def test_redact_leaves_ordinary_text_and_short_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ab")  # too short to scrub meaningfully
    monkeypatch.delenv("WSK_AUTH", raising=False)
    assert redact("a plain message about abc") == "a plain message about abc"
    register_secret("explicit-secret-123")
    assert redact("x explicit-secret-123 y") == "x [REDACTED] y"


def test_s3_credentials_never_show_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY01", "AWS_SECRET_ACCESS_KEY": "very-secret-value"}
    creds = S3Credentials.from_env(env)
    assert "very-secret" not in repr(creds) and "AKIAEXAMPLEKEY01" not in repr(creds)
    assert mask_key_id(creds.access_key_id) in repr(creds)
    assert S3Credentials.from_env({}) is None
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY is not set"):
        S3Credentials.from_env({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY01"})


@pytest.mark.parametrize("secret", ["wJal/K7MD/bPxEXAMPLEKEY", "pass?word=x", "pa#ss", "pa:ss:word", "p@ss/w?r#d:x"])
def test_a_url_password_holding_url_delimiters_is_refused_unquoted_and_redacted(secret: str) -> None:
    """A URL parser ends the host part at the first '/', '?' or '#', so it would see no password
    in ``http://key:wJal/K7MD@host``; the checks and the redaction must not rely on it."""
    from actions.store.endpoints import has_userinfo
    from actions.store.s3_settings import settings_from_env, split_uri

    endpoint = f"http://AKIAX:{secret}@minio:9000"
    assert has_userinfo(endpoint) and has_userinfo(f"AKIAX:{secret}@minio:9000")
    assert not has_userinfo("http://minio:9000/some/path?x=1#y")
    for check, value, says in ((lambda v: settings_from_env({"AWS_ENDPOINT_URL": v}), endpoint, "AWS_ENDPOINT_URL"),
                               (split_uri, f"s3://AKIAX:{secret}@bucket/run", "store.uri carries credentials"),
                               (open_store, f"ftp://AKIAX:{secret}@host/dir", "store.uri carries a user name")):
        with pytest.raises(ValueError, match=says) as info:
            check(value)
        assert secret not in str(info.value) and "AKIAX" not in str(info.value)
    for text in (f"cannot reach {endpoint} now", f"AWS_ENDPOINT_URL={endpoint!r} is bad",
                 f"store 's3://AKIAX:{secret}@bucket/run' failed"):
        out = redact(text, env={})
        assert out.count("[REDACTED]") == 1 and "AKIAX" not in out, out
        assert not any(part in out for part in secret.replace("@", "/").split("/") if len(part) > 3), out
    assert split_uri("s3://bucket/team@site/run") == ("bucket", "team@site/run")  # '@' in a key is no password


@pytest.mark.parametrize("uri", ["s3://bucket/dbl//pre", "s3://bucket/../x", "s3://bucket/a/./b", "s3://bucket/a/.."])
def test_an_s3_prefix_with_an_empty_dot_or_dot_dot_part_is_refused(uri: str) -> None:
    """SeaweedFS stores ``dbl//pre/k`` as ``dbl/pre/k`` and lists nothing under ``dbl//pre/``, so
    such a store trained and resumed while garbage collection deleted nothing; ``.`` and ``..``
    failed every write with a message naming no setting."""
    from actions.store.s3_settings import split_uri

    with pytest.raises(ValueError, match=r"^store.uri .*: its prefix .* has an empty, '.' or '..' part"):
        split_uri(uri)
    assert split_uri("s3://bucket/runs/a.b/") == ("bucket", "runs/a.b/") and split_uri("s3://bucket") == ("bucket", "")


def test_a_wrong_signing_region_names_aws_region_not_the_keys() -> None:
    """MinIO and Ceph answer a request signed for another region with AuthorizationHeaderMalformed,
    a credential code: the fix is AWS_REGION (unset: us-east-1), not the keys."""
    from botocore.exceptions import ClientError

    from actions.store.s3_errors import ErrorContext, translate

    ctx = ErrorContext(where="http://minio:9000", bucket="b", uri="s3://b/run", key_id="AKIA****",
                       connect_timeout=5.0, read_timeout=60.0)
    wrong = {"Error": {"Code": "AuthorizationHeaderMalformed", "Message": "The authorization header is malformed; "
                       "the region 'us-east-1' is wrong; expecting 'eu-central-1'"}}
    said = str(translate(ClientError(wrong, "ListObjectsV2"), "check", ctx, "s3://b/run"))
    assert said.endswith("expects requests signed for region 'eu-central-1' (AuthorizationHeaderMalformed); set "
                         "AWS_REGION=eu-central-1"), said
    malformed = {"Error": {"Code": "AuthorizationHeaderMalformed", "Message": "The authorization header is malformed"}}
    assert "check AWS_ACCESS_KEY_ID" in str(translate(ClientError(malformed, "ListObjectsV2"), "check", ctx, "x"))



def test_a_malformed_aws_region_is_named() -> None:
    from actions.store.s3_settings import settings_from_env

    with pytest.raises(ValueError, match=r"^AWS_REGION='../x' is not a region name; set it"):
        settings_from_env({"AWS_REGION": "../x"})
    assert settings_from_env({"AWS_DEFAULT_REGION": "eu-central-1"})["region"] == "eu-central-1"
