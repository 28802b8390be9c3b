"""Reading one S3 object into one fresh ``bytearray``: a plain GET, or parallel ranged GETs.

Objects larger than one chunk are fetched as ranged GETs on a bounded thread pool, each
pinned to the ETag of the first response (``If-Match``) so an overwrite in between cannot mix
versions; the caller retries the whole read on ``PreconditionFailed``. Each GET goes through
the fast path's presigned request when the client has one (:mod:`.s3_fastpath`), else through
``get_object``. Failures are raised as botocore exceptions; the backend (:mod:`.s3`)
retries whole reads and translates them. Nothing here retries: a ``get_object`` failure that
botocore has already retried comes wrapped in :class:`RetriedRequest`, so that it is not sent
again at a second level.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore import exceptions as bce

from actions.store.protocol import SizeMismatch
from actions.store.s3_errors import code
from actions.store.s3_fastpath import FastPath, RangeResponse, open_range_presigned


class RetriedRequest(Exception):
    """A ``get_object`` request that failed after botocore's own retries (``max_attempts``):
    the read must not be retried again. ``error`` is the botocore exception."""

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


class RangedReader:
    """Reads objects of one bucket.

    Args:
        client: the boto3 S3 client.
        fast_path: what of the fast path the client has (:func:`.s3_fastpath.attach`).
        bucket: the bucket name.
        chunk_size: bytes per ranged GET (the store's ``multipart_chunksize``).
        max_concurrency: threads for the ranges of one object.
        where: the endpoint, for connection errors.
    """

    def __init__(self, client: Any, fast_path: FastPath, bucket: str, *, chunk_size: int, max_concurrency: int,
                 where: str) -> None:
        self._client = client
        self.http = fast_path.http  # None: GETs go through get_object
        self.bucket = bucket
        self.chunk_size = chunk_size
        self.max_concurrency = max_concurrency
        self.where = where
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the range threads (if any were started)."""
        if self._pool is not None:
            self._pool.shutdown()

    def read(self, full: str, size: int | None, name: str) -> bytearray:
        """Bytes of bucket key ``full``.

        Args:
            full: the bucket key.
            size: the expected byte size when known (e.g. from a manifest): an object smaller
                than a chunk is then fetched with one plain GET, and a different real size
                raises SizeMismatch before anything is allocated or downloaded.
            name: how error messages name the object (``object 'k' in s3://b/p``).
        """
        chunk = self.chunk_size
        try:
            if size is not None and size < chunk:
                first = self.open_range(full, None, None)  # a plain GET costs the server less
            else:
                first = self.open_range(full, 0, chunk)
        except bce.ClientError as exc:
            if code(exc) != "InvalidRange":
                raise
            return bytearray()  # a ranged GET of an empty object is 416
        # "bytes 0-8388607/104857600"; absent if the server ignored Range and sent it all
        total = int(first.content_range.rsplit("/", 1)[1]) if first.content_range else first.length
        if size is not None and total != size:
            first.close()
            # A blob whose length differs from its manifest's is corrupt: say so before
            # allocating (a hostile store could claim terabytes) or downloading it.
            raise SizeMismatch(f"{name} is {total} bytes where its manifest says {size}; re-publish the artifact",
                               expected=size, found=total)
        buf = bytearray(total)
        view = memoryview(buf)
        first.fill(view[: first.length])
        if first.length < total:
            starts = range(first.length, total, chunk)

            def fetch_range(start: int) -> None:
                end = min(start + chunk, total)
                self.open_range(full, start, end, if_match=first.etag).fill(view[start:end])

            if self.max_concurrency <= 1:
                for start in starts:
                    fetch_range(start)
            else:
                list(self._ranges().map(fetch_range, starts))
        return buf

    def open_range(self, full: str, start: int | None, end: int | None, if_match: str | None = None) -> RangeResponse:
        """GET bytes [start, end) of a bucket key (all of it if start is None); the body is
        read by ``.fill(view)``. A presigned GET is sent once; ``get_object`` is retried by
        botocore, and a failure after that is raised as :class:`RetriedRequest`."""
        if self.http is not None:
            return open_range_presigned(self._client, self.http, self.bucket, full, start, end, if_match,
                                        where=self.where)
        extra: dict[str, str] = {"IfMatch": if_match} if if_match else {}
        if start is not None:
            extra["Range"] = f"bytes={start}-{end - 1}"  # type: ignore[operator]
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=full, **extra)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            if isinstance(exc, bce.ClientError) and code(exc) == "InvalidRange":
                raise  # an empty object: read() handles it
            raise RetriedRequest(exc) from None
        body = resp["Body"]
        return RangeResponse(resp["ContentLength"], resp.get("ContentRange"), resp.get("ETag", ""),
                             lambda view: _read_exactly(body, view), body.close)  # fmt: skip

    def _ranges(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3-range")
        return self._pool


def _read_exactly(body: Any, view: memoryview) -> None:
    """Fill ``view`` from a botocore streaming body, or raise IncompleteReadError."""
    filled = 0
    try:
        while filled < len(view):
            n = body.readinto(view[filled:])
            if not n:
                raise bce.IncompleteReadError(actual_bytes=filled, expected_bytes=len(view))
            filled += n
    finally:
        body.close()
