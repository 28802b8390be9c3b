"""The object-store contract: what every backend does, what it may raise, how bytes are passed.

A backend (:mod:`.local`, :mod:`.s3`) implements :class:`ObjectStore`; everything above it
(artifacts, commits, JSON objects, compare-and-swap) is written against this protocol only.
The errors are infrastructure failures (not bad input, not a bug): they propagate to the action adapter or
the flow, which decide about retries. :class:`IntegrityError` is raised for bytes that do not
match what a manifest or commit promised.
"""

from __future__ import annotations

from typing import Protocol, Union, runtime_checkable

from actions.store.safe_paths import check_name

#: A blob may be given as bytes or as a sequence of buffers to be concatenated (e.g. a
#: safetensors header and the tensor's own memory), so it is never copied into one bytes object.
Buffer = Union[bytes, bytearray, memoryview]
BlobData = Union[Buffer, tuple[Buffer, ...], list[Buffer]]


class StoreError(RuntimeError):
    """An infrastructure problem with the store (unreachable, denied, misconfigured)."""


class ObjectNotFound(StoreError, KeyError):
    """A key that should exist does not."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "object not found"


class IntegrityError(StoreError):
    """A blob's bytes do not match the sha256 its manifest promises."""


class SizeMismatch(IntegrityError):
    """An object is not the size its manifest promises (``expected`` and ``found`` bytes),
    found before its bytes are read."""

    def __init__(self, message: str, *, expected: int, found: int) -> None:
        super().__init__(message)
        self.expected, self.found = expected, found


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
      whether bytes were uploaded;
    * ``replace_if(key, expected, data)`` / ``delete_if(key, expected)`` -- atomic
      compare-and-swap (see :mod:`.objects`);
    * ``list_stats(prefix)`` -- ``{key: (modification time in epoch seconds, size)}``, the
      ages the orphan sweep of garbage collection needs (a backend without it is not swept);
    * ``list_tags(prefix)`` -- ``{key: tag}`` for every key :meth:`list` gives, the tag a string
      that changes whenever the object's bytes may have (S3: its ETag; local: inode, time and
      size), or None where the backend cannot tell: garbage collection reads a manifest again
      only when its tag changed (one without a tag, and every manifest of a backend without
      ``list_tags``: at every collection);
    * ``delete_if_older(key, older_than) -> bool`` -- delete only if not modified since
      ``older_than``, checked atomically with the delete (else the sweep deletes by the
      listing's age);
    * ``remove_stale_temporaries(older_than, dry_run=False) -> (count, bytes)`` -- remove what
      killed writes left behind (a backend whose writes leave nothing has none).
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


def check_key(key: str) -> str:
    """``key`` when it is a safe relative key (``safe_paths.check_name``), else UnsafeName."""
    return check_name(key, where="object store", what="key", fix="use a relative key without '..'")


def as_parts(data: BlobData) -> tuple[memoryview, ...]:
    """``data`` as a tuple of flat byte views (no copy)."""
    if isinstance(data, (tuple, list)):
        return tuple(memoryview(p).cast("B") for p in data)
    return (memoryview(data).cast("B"),)


def num_bytes(data: BlobData) -> int:
    """Total length of ``data`` in bytes (all parts)."""
    return sum(p.nbytes for p in as_parts(data))
