"""Artifacts: a set of named files stored as content-addressed blobs plus one manifest.

Layout: every file's bytes are a blob at ``blobs/sha256/<2 hex>/<64 hex>``; the manifest (a
JSON object ``{"schema", "files": {name: {"sha256", "size"}}, "meta"}``) is written last, at a
key the caller chooses. An artifact exists only once its manifest exists; readers go
through the manifest, never a listing, and verify every blob's size and sha256, so a corrupted
or missing blob is named in a clear error. Blobs move through a bounded thread pool
(``store.max_concurrency``) and a blob already present is never uploaded again.

Garbage collection (``flows/campaign/collect.py``) finds manifests by their key ending in
``manifest.json``: every artifact's manifest key must end that way.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from actions.store.pool import map_bounded, transfer_threads
from actions.store.protocol import (
    BlobData,
    IntegrityError,
    ObjectNotFound,
    ObjectStore,
    SizeMismatch,
    as_parts,
    num_bytes,
)
from actions.store.safe_paths import STORE_FIX, check_name, shown

BLOB_PREFIX = "blobs/sha256"
MANIFEST_SCHEMA = "rlhfless.artifact/v1"

# Blobs up to this size are written with one conditional PUT (put_if_absent) instead of an
# existence check followed by a PUT: for small objects the request, not the bytes, is the cost.
# Larger blobs are checked first so that unchanged bytes are never sent again.
SMALL_BLOB_BYTES = 256 * 1024

#: What ``get_artifact`` returns: (files by name, the manifest's meta dict).
Files = dict[str, Any]


def sha256_hex(data: BlobData | mmap.mmap) -> str:
    """sha256 of ``data`` (of the parts' concatenation for a sequence), as 64 lowercase hex."""
    if isinstance(data, (tuple, list)):
        h = hashlib.sha256()
        for part in data:
            h.update(part)  # hashlib releases the GIL on large buffers
        return h.hexdigest()
    return hashlib.sha256(data).hexdigest()


def blob_key(digest: str) -> str:
    """Store key of the blob whose sha256 is ``digest``."""
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


def get_blob(store: ObjectStore, digest: str, *, name: str = "", size: int | None = None,
             manifest_key: str = "", zero_copy: bool = False) -> Any:
    """Read a blob and verify its size (when given, checked first: free) and sha256.

    The blob is read through the backend's ``get_buffer`` when it has one, ``size`` passed
    along, whatever ``zero_copy`` says: S3 then refuses a blob of another size from the
    response headers, before its body is downloaded (a hostile store could serve gigabytes
    where the manifest says ten bytes), and the local store maps the file without reading it.

    Args:
        store: the object store.
        digest: the blob's sha256 (its key, :func:`blob_key`).
        name, manifest_key: the file and manifest that list the blob, for error messages.
        size: the byte size the manifest promises.
        zero_copy: return the backend's cheapest buffer (``get_buffer``: a private memory map
            locally, a writable ``bytearray`` from S3) so callers can view it without copying;
            else ``bytes`` (one copy, made once the bytes are verified).

    Raises:
        ObjectNotFound: the blob is missing (naming the file and the manifest).
        IntegrityError: wrong size or sha256 (naming the blob key, file, manifest and digests).

    The one pass over the bytes is the hash itself: the buffer returned is the one hashed.
    """
    key = blob_key(digest)
    get_buffer = getattr(store, "get_buffer", None)
    what = f" for file {name!r}" if name else ""
    where = f" (manifest {manifest_key!r})" if manifest_key else ""
    try:
        data = get_buffer(key, size=size) if get_buffer is not None else store.get(key)
        found = len(data)
    except ObjectNotFound:
        file = f" (file {name!r})" if name else ""
        listed = f"manifest {manifest_key!r}" if manifest_key else "a manifest"
        raise ObjectNotFound(f"blob {key}{file} listed in {listed} is missing from {store.uri}") from None
    except SizeMismatch as exc:  # caught from the response headers: nothing was downloaded
        found = exc.found
    if size is not None and found != size:
        raise IntegrityError(f"blob {key}{what} is truncated or padded{where}: expected {size} bytes, "
                             f"found {found}; re-publish the artifact")
    actual = sha256_hex(data)
    if actual != digest:
        raise IntegrityError(f"blob {key}{what} is corrupted{where}: expected sha256 {digest}, found {actual}; "
                             "re-publish the artifact")
    return data if zero_copy or isinstance(data, bytes) else bytes(data)


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
    files: Mapping[str, BlobData | Callable[[], BlobData]],
    meta: Mapping[str, Any] | Callable[[dict[str, dict[str, Any]]], Mapping[str, Any]] | None = None,
) -> PutStats:
    """Publish ``files`` as blobs (in parallel, bounded by ``store.max_concurrency``), then
    write the manifest last.

    Args:
        store: the object store.
        manifest_key: where the manifest goes; the artifact exists once this key exists.
        files: name -> bytes, or name -> sequence of buffers (concatenated, never copied), or
            name -> a callable returning either, called by the thread that uploads the file and
            dropped once it is up: at most ``max_concurrency`` such files exist at once (a GPU
            tensor's host copy: ``weights.publish_tensors``).
        meta: JSON-serialisable dict stored in the manifest, or a callable that receives the
            file table (``{name: {"sha256", "size"}}``) once the blobs are up and returns it
            (lets the caller derive meta from the blob digests without hashing again).

    Idempotent: publishing the same files and meta twice writes the same bytes. If any blob
    fails, the manifest is not written and the artifact does not exist.
    """
    names = sorted(files)

    def put(name: str) -> tuple[str, bool, int]:
        data = files[name]
        data = data() if callable(data) else data
        return (*put_blob(store, data), num_bytes(data))

    results = map_bounded(put, names, transfer_threads(store, len(names)))
    entries = {}
    num_uploaded = bytes_uploaded = 0
    for name, (digest, uploaded, size) in zip(names, results):
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


def get_artifact(
    store: ObjectStore, manifest_key: str, names: list[str] | None = None, *,
    manifest: dict[str, Any] | None = None, zero_copy: bool = False,
) -> tuple[Files, dict[str, Any]]:
    """Read an artifact's files (all, or only ``names``), each verified by size and sha256.

    Args:
        store: the object store.
        manifest_key: the artifact's manifest key.
        names: the files wanted (default: every file in the manifest).
        manifest: the result of :func:`read_manifest` when the caller already read it.
        zero_copy: each file is the backend's zero-copy buffer instead of ``bytes``
            (see :func:`get_blob`).

    Returns:
        (files by name, the manifest's meta dict). Blobs are fetched in parallel.

    Raises:
        ObjectNotFound: the manifest, a named file or a blob is missing.
        IntegrityError: a blob's bytes do not match the manifest.
    """
    manifest = manifest if manifest is not None else read_manifest(store, manifest_key)
    table = manifest["files"]
    wanted = sorted(table) if names is None else list(names)
    for name in wanted:
        if name not in table:
            raise ObjectNotFound(f"file {name!r} is not listed in manifest {manifest_key!r}")
    datas = map_bounded(
        lambda n: get_blob(store, table[n]["sha256"], name=n, size=table[n]["size"], manifest_key=manifest_key,
                           zero_copy=zero_copy),
        wanted, transfer_threads(store, len(wanted)),
    )
    return dict(zip(wanted, datas)), manifest.get("meta", {})
