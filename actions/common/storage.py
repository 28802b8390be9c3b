"""Object store: the only place where campaign bytes live.

Every action and flow reads and writes through an :class:`ObjectStore`; nothing else in the
code base talks to a filesystem path or an S3 SDK for campaign data. Two backends share one
contract:

* :class:`LocalStore` -- a directory on local disk (the embedded default). Writes go to a
  temporary file that is renamed into place, so a reader never sees a half-written object.
  Blobs are read through a private memory map, not copied.
* ``S3Store`` (``actions.common.s3store``) -- any S3 endpoint (MinIO, AWS S3, SeaweedFS).

On top of raw objects this module provides:

* *artifacts*: a set of named files stored as content-addressed blobs
  (``blobs/sha256/<2>/<64 hex>``) plus one JSON manifest, written last. An artifact exists only
  once its manifest exists; readers go through the manifest and verify every blob's sha256, so
  a corrupted or missing blob is named in a clear error. Blobs move through a bounded thread
  pool (``store.max_concurrency``) and a blob already present is never uploaded again.
* the *commit pointer* (:func:`commit_pointer` / :func:`read_pointer`): create-once,
  step-numbered commit records plus a ``latest.json`` hint, read without listing.

* *compare-and-swap* (:func:`replace_if` / :func:`delete_if`): replace or delete an object only
  while it still holds the bytes the caller last read (the run lease, ``flows/lease.py``).

What this module does not cover: retries, multipart transfers and credentials (S3 backend);
garbage collection (``flows/gc.py``), which finds manifests by their key ending in
``manifest.json``: every artifact's manifest key must end that way.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, Union, runtime_checkable

from actions.common.safe_paths import STORE_FIX, UnsafeName, check_name, open_component, parent_dir, shown

#: A blob may be given as bytes or as a sequence of buffers to be concatenated (e.g. a
#: safetensors header and the tensor's own memory), so it is never copied into one bytes object.
Buffer = Union[bytes, bytearray, memoryview]
BlobData = Union[Buffer, tuple[Buffer, ...], list[Buffer]]

BLOB_PREFIX = "blobs/sha256"
MANIFEST_SCHEMA = "rlhfless.artifact/v1"
COMMIT_SCHEMA = "rlhfless.commit/v1"

# Blobs up to this size are written with one conditional PUT (put_if_absent) instead of an
# existence check followed by a PUT: for small objects the request, not the bytes, is the cost.
# Larger blobs are checked first so that unchanged bytes are never sent again.
SMALL_BLOB_BYTES = 256 * 1024
DEFAULT_MAX_CONCURRENCY = 8


class StoreError(RuntimeError):
    """An infrastructure problem with the store (unreachable, denied, misconfigured)."""


class ObjectNotFound(StoreError, KeyError):
    """A key that should exist does not."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "object not found"


class IntegrityError(StoreError):
    """A blob's bytes do not match the sha256 its manifest promises."""


class StoreUnreachable(StoreError):
    """The store endpoint cannot be reached (refused, DNS, timeout)."""


class StoreCredentialsError(StoreError):
    """The store rejected the credentials (unknown key id or wrong secret)."""


class StoreAccessDenied(StoreError):
    """The credentials are valid but a policy forbids the operation."""


class BucketNotFound(StoreError):
    """The bucket named by the store URI does not exist."""


class CommitConflict(StoreError):
    """A step was already committed with different content (two writers, or a replay that
    produced different results)."""


@runtime_checkable
class ObjectStore(Protocol):
    """Minimal key/value contract shared by all backends.

    Keys are ``/``-separated relative paths without a leading slash. Values are bytes.
    Backends may also offer, as optional fast paths:

    * ``max_concurrency`` -- threads used for the blobs of one artifact;
    * ``get_buffer(key, size=None)`` -- a writable bytes-like object instead of a bytes copy
      (``size``: the expected length when known, a hint);
    * ``put_content(key, parts, sha256) -> bool`` -- create a content-addressed object from a
      sequence of buffers whose sha256 is known, if absent, in one round trip; returns
      whether bytes were uploaded.
    """

    uri: str

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` atomically (readers see the old or the new bytes)."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if it does not exist. Returns True if this call created it."""

    def get(self, key: str) -> bytes:
        """Read ``key``; raises :class:`ObjectNotFound` if it is missing."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    def delete(self, key: str) -> None:
        """Remove ``key`` if present (missing keys are not an error)."""

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix``, sorted. For operators and garbage collection only:
        the training path never lists, it follows manifests and pointers."""


def _check_key(key: str) -> str:
    """``key`` when it is a safe relative key (``safe_paths.check_name``), else UnsafeName."""
    return check_name(key, where="object store", what="key", fix="use a relative key without '..'")


class LocalStore:
    """A directory used as an object store (the embedded default).

    Keys are opened beneath the root one component at a time without following symlinks
    (``safe_paths.parent_dir``): a symlink placed in the store is refused, so no key can read
    or write outside the root.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_concurrency: int | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)
        self.max_concurrency = max_concurrency or min(DEFAULT_MAX_CONCURRENCY, os.cpu_count() or 1)

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r})"

    def _dir(self, key: str, *, create: bool = False) -> Any:
        """Context manager: (fd of key's directory, key's last component)."""
        return parent_dir(self.root, key, where=f"store {self.uri}", create=create, what="key",
                          fix="use a relative key without '..'")

    def _not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"object {key!r} not found in store {self.uri}")

    def _open(self, key: str) -> int:
        """A read-only fd of ``key``'s file (ObjectNotFound when it is missing)."""
        try:
            with self._dir(key) as (dir_fd, last):
                return open_component(last, dir_fd, os.O_RDONLY, name=key, where=f"store {self.uri}")
        except (FileNotFoundError, NotADirectoryError):
            raise self._not_found(key) from None

    def _write(self, key: str, data: BlobData, publish: Callable[[str, int, str], bool]) -> bool:
        """Write ``data`` to a temporary file beside ``key``, then ``publish(tmp, dir_fd, last)``
        (rename or link it into place); the temporary file never outlives the call."""
        with self._dir(key, create=True) as (dir_fd, last):
            tmp = f".tmp-{secrets.token_hex(8)}"
            fd = open_component(tmp, dir_fd, os.O_WRONLY | os.O_CREAT | os.O_EXCL, name=key, where=f"store {self.uri}")
            try:
                with os.fdopen(fd, "wb") as fh:
                    for part in as_parts(data):
                        fh.write(part)
                    fh.flush()
                    os.fsync(fh.fileno())
                return publish(tmp, dir_fd, last)
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
                return False

        return self._write(key, data, link)

    def put_content(self, key: str, parts: BlobData, sha256: str) -> bool:
        """Create a content-addressed object if absent (no temp file when it exists)."""
        if self.exists(key):
            return False
        return self.put_if_absent(key, parts)  # type: ignore[arg-type]

    def _if_holds(self, key: str, expected: bytes, then: Callable[[int, str], None]) -> bool:
        """Under an exclusive flock of ``key``'s directory (compare-and-swap callers on this
        host serialise on it): if ``key`` holds exactly ``expected``, run ``then(dir_fd, last)``
        and return True; else False (a missing key included)."""
        try:
            with self._dir(key) as (dir_fd, last):
                fcntl.flock(dir_fd, fcntl.LOCK_EX)  # released when the directory fd closes
                try:
                    fd = open_component(last, dir_fd, os.O_RDONLY, name=key, where=f"store {self.uri}")
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
        """Delete ``key`` only if it holds exactly ``expected`` (under the directory's lock)."""
        return self._if_holds(key, expected, lambda dir_fd, last: os.unlink(last, dir_fd=dir_fd))

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
        try:
            with self._dir(key) as (dir_fd, last):
                os.unlink(last, dir_fd=dir_fd)  # removes a symlink itself, never its target
        except (FileNotFoundError, NotADirectoryError):
            pass

    def list(self, prefix: str) -> list[str]:
        # Walk only the deepest directory the prefix names, not the whole store, and never
        # descend into or report a symlink.
        base = self.root / _check_key(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        if base.is_symlink() or not base.is_dir() or not base.resolve().is_relative_to(self.root):
            return []
        out = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            for name in filenames:
                path = Path(dirpath, name)
                if not name.startswith(".tmp-") and not path.is_symlink():
                    rel = path.relative_to(self.root).as_posix()
                    if rel.startswith(prefix):
                        out.append(rel)
        return sorted(out)


def open_store(uri: str) -> ObjectStore:
    """Open the store named by ``uri``.

    Args:
        uri: ``s3://bucket[/prefix]`` for S3 (endpoint and credentials come from the standard
            AWS environment variables; the endpoint, credentials and bucket are checked once
            here), ``file:///abs/dir`` or a plain directory path for the local backend.
    """
    if uri.startswith("s3://"):
        from actions.common.s3store import S3Store  # boto3 is imported only when needed

        return S3Store.from_uri(uri)
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if "://" in uri:
        raise ValueError(
            f"store.uri {uri!r} has an unsupported scheme: use a directory path or s3://bucket/prefix"
        )
    return LocalStore(uri)


# ----------------------------------------------------------------------------- bounded pool

T = TypeVar("T")
R = TypeVar("R")


def _concurrency(store: ObjectStore, num_items: int) -> int:
    return max(1, min(int(getattr(store, "max_concurrency", 1)), num_items))


def map_bounded(fn: Callable[[T], R], items: Iterable[T], max_workers: int) -> list[R]:
    """``[fn(x) for x in items]`` on at most ``max_workers`` threads, results in item order.

    On the first failure, work not yet started is cancelled and that exception is raised
    (transfers already running finish; their objects are harmless: nothing points at them).
    """
    items = list(items)
    if max_workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="store") as pool:
        futures = [pool.submit(fn, x) for x in items]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        for f in futures:  # the first failure in item order, for a deterministic message
            if f in done and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


# ----------------------------------------------------------------------------- artifacts


def as_parts(data: BlobData) -> tuple[memoryview, ...]:
    """``data`` as a tuple of flat byte views (no copy)."""
    if isinstance(data, (tuple, list)):
        return tuple(memoryview(p).cast("B") for p in data)
    return (memoryview(data).cast("B"),)


def sha256_hex(data: BlobData | mmap.mmap) -> str:
    if isinstance(data, (tuple, list)):
        h = hashlib.sha256()
        for part in data:
            h.update(part)  # hashlib releases the GIL on large buffers
        return h.hexdigest()
    return hashlib.sha256(data).hexdigest()


def _nbytes(data: BlobData) -> int:
    return sum(p.nbytes for p in as_parts(data))


def blob_key(digest: str) -> str:
    return f"{BLOB_PREFIX}/{digest[:2]}/{digest}"


def put_blob(store: ObjectStore, data: BlobData, digest: str | None = None) -> tuple[str, bool]:
    """Store ``data`` (bytes, or a sequence of buffers) content-addressed.

    Returns:
        (sha256, uploaded) -- uploaded is False when an identical blob was already present:
        unchanged bytes are never sent twice.

    Uses the store's ``put_content`` when it has one (S3: one conditional PUT whose body is
    not sent if the blob exists). Otherwise small blobs go up with ``put_if_absent`` and
    large ones are checked with ``exists`` first.
    """
    digest = digest or sha256_hex(data)
    key = blob_key(digest)
    put_content = getattr(store, "put_content", None)
    if put_content is not None:
        return digest, put_content(key, data, digest)
    if not isinstance(data, bytes):
        data = b"".join(as_parts(data))
    if len(data) <= SMALL_BLOB_BYTES:
        return digest, store.put_if_absent(key, data)
    if store.exists(key):
        return digest, False
    store.put(key, data)
    return digest, True


def _missing_blob(store: ObjectStore, key: str, name: str, manifest_key: str) -> ObjectNotFound:
    what = f" (file {name!r})" if name else ""
    where = f"manifest {manifest_key!r}" if manifest_key else "a manifest"
    return ObjectNotFound(f"blob {key}{what} listed in {where} is missing from {store.uri}")


def _verify(key: str, data: Any, digest: str, name: str, size: int | None, manifest_key: str) -> None:
    """Raise IntegrityError unless ``data`` has ``size`` bytes (checked first: free) and sha256
    ``digest``. The one pass over the bytes is the hash itself: the buffer is the one the caller
    keeps (a memory map or the downloaded bytearray), never read a second time."""
    what = f" for file {name!r}" if name else ""
    where = f" (manifest {manifest_key!r})" if manifest_key else ""
    if size is not None and len(data) != size:
        raise IntegrityError(f"blob {key}{what} is truncated or padded{where}: expected {size} bytes, "
                             f"found {len(data)}; re-publish the artifact")
    actual = sha256_hex(data)
    if actual != digest:
        raise IntegrityError(f"blob {key}{what} is corrupted{where}: expected sha256 {digest}, found {actual}; "
                             "re-publish the artifact")


def get_blob(store: ObjectStore, digest: str, *, name: str = "", size: int | None = None,
             manifest_key: str = "") -> bytes:
    """Read a blob and verify its size (when given) and sha256 (:class:`IntegrityError` on a
    mismatch, naming the blob key, the file, the manifest and both digests)."""
    key = blob_key(digest)
    try:
        data = store.get(key)
    except ObjectNotFound:
        raise _missing_blob(store, key, name, manifest_key) from None
    _verify(key, data, digest, name, size, manifest_key)
    return data


def get_blob_buffer(
    store: ObjectStore, digest: str, *, name: str = "", size: int | None = None, manifest_key: str = ""
) -> Any:
    """Like :func:`get_blob` but returns the backend's cheapest buffer: a private memory map
    (local) or a writable ``bytearray`` (S3), so callers can view it without copying."""
    get_buffer = getattr(store, "get_buffer", None)
    if get_buffer is None:
        return get_blob(store, digest, name=name, size=size, manifest_key=manifest_key)
    key = blob_key(digest)
    try:
        data = get_buffer(key, size=size)
    except ObjectNotFound:
        raise _missing_blob(store, key, name, manifest_key) from None
    _verify(key, data, digest, name, size, manifest_key)
    return data


@dataclass(frozen=True)
class PutStats:
    """What publishing an artifact cost: how many files and bytes were actually uploaded."""

    manifest_key: str
    num_files: int
    num_uploaded: int
    bytes_uploaded: int


def put_artifact(
    store: ObjectStore,
    manifest_key: str,
    files: Mapping[str, BlobData],
    meta: Mapping[str, Any] | Callable[[dict[str, dict[str, Any]]], Mapping[str, Any]] | None = None,
) -> PutStats:
    """Publish ``files`` as blobs (in parallel, bounded by ``store.max_concurrency``), then
    write the manifest last.

    Args:
        store: the object store.
        manifest_key: where the manifest goes; the artifact exists once this key exists.
        files: name -> bytes, or name -> sequence of buffers (concatenated, never copied).
        meta: JSON-serialisable dict stored in the manifest, or a callable that receives the
            file table (``{name: {"sha256", "size"}}``) once the blobs are up and returns it
            (lets the caller derive meta from the blob digests without hashing again).

    Idempotent: publishing the same files and meta twice writes the same bytes. If any blob
    fails, the manifest is not written and the artifact does not exist.
    """
    names = sorted(files)
    results = map_bounded(lambda n: put_blob(store, files[n]), names, _concurrency(store, len(names)))
    entries = {}
    num_uploaded = bytes_uploaded = 0
    for name, (digest, uploaded) in zip(names, results):
        size = _nbytes(files[name])
        entries[name] = {"sha256": digest, "size": size}
        if uploaded:
            num_uploaded += 1
            bytes_uploaded += size
    meta = meta(entries) if callable(meta) else meta
    manifest = {"schema": MANIFEST_SCHEMA, "files": entries, "meta": dict(meta or {})}
    store.put(manifest_key, json.dumps(manifest, sort_keys=True, indent=1).encode())
    return PutStats(manifest_key, len(entries), num_uploaded, bytes_uploaded)


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def read_manifest(store: ObjectStore, manifest_key: str) -> dict[str, Any]:
    """Load a manifest and check everything in it that will be used as a name or a key.

    The store is not trusted: every file name must be a safe relative path
    (``safe_paths.check_name``: it may become a file under a model directory), and every entry
    must carry a sha256 digest (64 lowercase hex, so the blob key it makes is a key of this
    store's blob area and nothing else) and a byte size.

    Raises:
        IntegrityError / UnsafeName: one line naming the manifest key, the file and the fix.
    """
    raw = store.get(manifest_key)
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"manifest {manifest_key!r} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA \
            or not isinstance(manifest.get("files"), dict):
        raise IntegrityError(f"manifest {manifest_key!r} has no {MANIFEST_SCHEMA} file table")
    if not isinstance(manifest.get("meta", {}), dict):
        raise IntegrityError(f"manifest {manifest_key!r} has a meta that is not a JSON object")
    where = f"manifest {manifest_key!r}"
    for name, entry in manifest["files"].items():
        check_name(name, where=where, what="file", fix=STORE_FIX)
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not _is_digest(digest):
            raise IntegrityError(f"{where}: file {shown(name)} has no valid sha256 digest ({shown(digest)}); "
                                 "re-publish the artifact (every manifest entry needs one)")
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise IntegrityError(f"{where}: file {shown(name)} has no valid byte size ({shown(size)}); "
                                 "re-publish the artifact")
    return manifest


def _fetch_files(store: ObjectStore, manifest_key: str, manifest: dict[str, Any], names: list[str] | None,
                 get: Callable[..., Any]) -> dict[str, Any]:
    table = manifest["files"]
    wanted = sorted(table) if names is None else list(names)
    for name in wanted:
        if name not in table:
            raise ObjectNotFound(f"file {name!r} is not listed in manifest {manifest_key!r}")
    datas = map_bounded(
        lambda n: get(store, table[n]["sha256"], name=n, size=table[n]["size"], manifest_key=manifest_key),
        wanted, _concurrency(store, len(wanted)),
    )
    return dict(zip(wanted, datas))


def get_artifact_buffers(
    store: ObjectStore, manifest_key: str, names: list[str] | None = None, *,
    manifest: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Like :func:`get_artifact`, but each file is the backend's zero-copy buffer
    (see :func:`get_blob_buffer`). Blobs are fetched in parallel. ``manifest``: the result of
    :func:`read_manifest` when the caller already read it."""
    manifest = manifest if manifest is not None else read_manifest(store, manifest_key)
    return _fetch_files(store, manifest_key, manifest, names, get_blob_buffer), manifest.get("meta", {})


def get_artifact(
    store: ObjectStore, manifest_key: str, names: list[str] | None = None
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Read an artifact's files (all, or only ``names``) with size and sha256 verification.

    Returns:
        (files by name, the manifest's meta dict)
    """
    manifest = read_manifest(store, manifest_key)
    return _fetch_files(store, manifest_key, manifest, names, get_blob), manifest.get("meta", {})


def replace_if(store: ObjectStore, key: str, expected: bytes, data: bytes) -> bool:
    """Compare-and-swap: write ``data`` at ``key`` only if ``key`` still holds ``expected``.

    Uses the backend's ``replace_if`` (local: under a directory lock; S3: ``If-Match`` on the
    ETag of the bytes compared). A backend without one gets a read, a compare and a write,
    which is not atomic against another writer.
    """
    method = getattr(store, "replace_if", None)
    if method is not None:
        return bool(method(key, expected, data))
    try:
        if store.get(key) != expected:
            return False
    except ObjectNotFound:
        return False
    store.put(key, data)
    return True


def delete_if(store: ObjectStore, key: str, expected: bytes) -> bool:
    """Delete ``key`` only if it still holds ``expected`` (see :func:`replace_if`)."""
    method = getattr(store, "delete_if", None)
    if method is not None:
        return bool(method(key, expected))
    try:
        if store.get(key) != expected:
            return False
    except ObjectNotFound:
        return False
    store.delete(key)
    return True


def put_json(store: ObjectStore, key: str, obj: Any) -> None:
    store.put(key, json.dumps(obj, sort_keys=True).encode())


def get_json(store: ObjectStore, key: str) -> Any:
    return json.loads(store.get(key))


# ----------------------------------------------------------------------------- commit pointer
#
# Layout under a pointer key K (e.g. "runs/r1/campaign"):
#   K/commits/step-000012.json   create-once (put_if_absent); the commit record itself
#   K/latest.json                overwritten after each commit; a hint, never the truth
# Steps are committed consecutively, starting at 0 or 1. The highest committed step is the
# highest N whose commit record exists; since existence is monotone in N (consecutive), a
# reader can find it by probing upward -- from latest.json's step when that hint is valid,
# else by galloping from the first step -- in O(log distance) GETs/HEADs and no listing.


def commit_key(key: str, step: int) -> str:
    """Key of the commit record for ``step`` under pointer ``key``."""
    return f"{key}/commits/step-{step:06d}.json"


def _encode_commit(payload: Mapping[str, Any]) -> bytes:
    if "_schema" in payload:
        raise ValueError("commit payload key '_schema' is reserved for the record format")
    return json.dumps({"_schema": COMMIT_SCHEMA, **payload}, sort_keys=True).encode()


def commit_pointer(store: ObjectStore, key: str, payload: Mapping[str, Any]) -> str:
    """Commit ``payload`` as step ``payload["step"]`` of pointer ``key``.

    Writes ``key/commits/step-NNNNNN.json`` create-once, then ``key/latest.json``. Committing
    the same payload again is a no-op (replay after a crash between the two writes).

    Args:
        store: the object store.
        key: the pointer's key prefix, e.g. ``runs/<run_id>/campaign``.
        payload: JSON-serialisable dict with an int ``"step"`` >= 0 (plus anything the reader
            needs: policy version, manifest keys, metrics).

    Returns:
        The commit record's key.

    Raises:
        ValueError: ``step`` is missing or negative, or step-1 was never committed (steps must
            be consecutive from 0 or 1, or readers could not find them without listing).
        CommitConflict: the step is already committed with a different payload.
    """
    step = payload.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"commit payload needs an int 'step' >= 0, got {step!r}")
    if step > 1 and not store.exists(commit_key(key, step - 1)):
        raise ValueError(
            f"cannot commit step {step} of {key!r}: step {step - 1} is not committed "
            "(commits must be consecutive)"
        )
    record_key = commit_key(key, step)
    data = _encode_commit(payload)
    store.put_if_absent(record_key, data)
    # Read back whether or not this call created the record: a replay with the same payload
    # is fine, a different payload is a second writer. (On stores that ignore If-None-Match,
    # put_if_absent is HEAD+PUT and this also catches most of that race.)
    if store.get(record_key) != data:
        raise CommitConflict(
            f"step {step} of {key!r} is already committed with a different payload "
            f"({record_key}); another writer owns this campaign or the replay diverged"
        )
    put_json(store, f"{key}/latest.json", {"_schema": COMMIT_SCHEMA, "step": step, "commit": record_key})
    return record_key


def _read_commit(store: ObjectStore, key: str, step: int) -> dict[str, Any] | None:
    record_key = commit_key(key, step)
    try:
        record = json.loads(store.get(record_key))
    except ObjectNotFound:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"commit record {record_key!r} is not valid JSON: {exc}") from None
    if not isinstance(record, dict) or record.pop("_schema", None) != COMMIT_SCHEMA:
        raise IntegrityError(f"commit record {record_key!r} is not a {COMMIT_SCHEMA} record")
    return record


def _latest_hint(store: ObjectStore, key: str) -> int | None:
    try:
        hint = json.loads(store.get(f"{key}/latest.json"))
        step = hint["step"]
        return step if isinstance(step, int) and step >= 0 else None
    except (ObjectNotFound, ValueError, KeyError, TypeError):
        return None  # a missing or damaged hint only costs a few more probes


def read_pointer(store: ObjectStore, key: str) -> dict[str, Any] | None:
    """The payload of the highest committed step of pointer ``key``, or None if none.

    Reads ``latest.json``, checks that its step's commit record exists, then probes upward
    (1, 2, 4, ... steps ahead, then bisects) in case a writer crashed between the commit and
    the hint update. Never lists.
    """
    hint = _latest_hint(store, key)
    if hint is not None and store.exists(commit_key(key, hint)):
        low = hint
    else:
        low = next((s for s in (0, 1) if store.exists(commit_key(key, s))), None)
        if low is None:
            return None
    # Gallop: find a missing step above `low`, then bisect between the last present and it.
    gap = 1
    while store.exists(commit_key(key, low + gap)):
        low, gap = low + gap, gap * 2
    high = low + gap  # known missing
    while high - low > 1:
        mid = (low + high) // 2
        if store.exists(commit_key(key, mid)):
            low = mid
        else:
            high = mid
    return _read_commit(store, key, low)
