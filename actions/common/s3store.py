"""S3 backend of the object store: any S3 endpoint (MinIO, AWS S3, SeaweedFS, Ceph RGW).

``S3Store.from_uri("s3://bucket/prefix")`` takes the endpoint, credentials and region from the
standard AWS environment variables and checks them once (:meth:`S3Store.check`), so a bad
configuration fails with a one-line error before anything is written. Choices:

* Path-style addressing whenever an endpoint is given (S3-compatible servers rarely have
  wildcard DNS); boto3's default (virtual-hosted) for AWS itself.
* ``request_checksum_calculation`` / ``response_checksum_validation`` = ``when_required``:
  boto3 >= 1.36 otherwise sends CRC trailers that some S3-compatible servers reject. Integrity
  of campaign data is checked end to end by sha256 in manifests instead.
* Retries: botocore "standard" mode (transient errors only: 5xx, throttling, connection
  errors; jittered exponential backoff) with ``max_attempts``; plus our own retry of a GET
  whose body stream breaks after the headers arrived (botocore cannot retry that).
* Large objects: ``put`` uses multipart above ``multipart_threshold`` (8 MiB) through one
  shared, bounded s3transfer manager; reads above it are parallel ranged GETs pinned to the
  first response's ETag.
* Blobs (``put_content``, used by ``put_artifact``): one conditional PUT with
  ``Expect: 100-continue`` up to ``max_single_put`` (64 MiB) -- when the blob already exists
  the server answers 412 before the body is sent, so an unchanged tensor costs one small
  request and no HEAD. The body streams from the caller's buffers (no concatenation copy),
  and the SigV4 payload hash reuses the blob's sha256 instead of hashing the bytes again.
* Reads go through presigned URLs on the client's own connection pool and land directly in
  one ``bytearray``: a full botocore call costs ~1.5 ms of Python per request, which
  dominates when a policy is hundreds of small blobs.
* ``put_if_absent``: ``PutObject`` with ``If-None-Match: *`` (412 -> False). Some stores
  (older MinIO, older Ceph RGW) silently ignore the header and overwrite. The first call
  probes this once per store (create a probe key twice under the prefix, then delete it);
  on such stores, or with ``conditional_writes=False`` / RLHFLESS_S3_CONDITIONAL_WRITES=off,
  it falls back to HEAD-then-PUT, which has a race: two writers that HEAD at the same moment
  both "create" the key and the last PUT wins. ``commit_pointer`` reads its record back,
  which narrows that window to the two PUTs landing between one writer's PUT and GET.

Secrets never appear in messages or reprs: key ids are masked (``AKIA****``) and every error
text goes through :func:`actions.common.credentials.redact`.
"""

from __future__ import annotations

import http.client
import io
import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn
from xml.etree import ElementTree

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore import exceptions as bce
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config

from actions.common.credentials import S3Credentials, mask_key_id, redact
from actions.common.endpoints import is_http_url
from actions.common.storage import (
    BucketNotFound,
    IntegrityError,
    ObjectNotFound,
    StoreAccessDenied,
    StoreCredentialsError,
    StoreError,
    StoreUnreachable,
    _check_key,
    as_parts,
)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
_PRESIGN_TTL_S = 900
_SMALL_BODY = 64 * 1024  # bodies up to this size are sent without Expect: 100-continue
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
# Failures while reading a response body: the request succeeded, the stream broke.
_STREAM_ERRORS = (bce.ResponseStreamingError, bce.IncompleteReadError, bce.ReadTimeoutError,
                  bce.ConnectionClosedError)  # fmt: skip


class S3Store:
    """An S3 bucket (optionally under a key prefix) as an :class:`ObjectStore`.

    Args:
        bucket: bucket name.
        prefix: key prefix inside the bucket (no leading/trailing slash); all keys live under it.
        endpoint_url: e.g. ``http://minio:9000``; None for AWS S3.
        credentials: static credentials; None uses boto3's default chain (profile, IRSA, role).
        region: signing region (S3-compatible servers accept ``us-east-1``).
        max_attempts: total attempts per request, first one included (botocore standard mode).
        connect_timeout, read_timeout: seconds.
        multipart_threshold, multipart_chunksize: bytes; objects at or above the threshold are
            sent as multipart uploads and fetched as parallel ranged GETs of chunksize.
        max_concurrency: threads for one large object's parts, and for the blobs of one
            artifact (``put_artifact`` reads this attribute).
        max_single_put: content-addressed blobs up to this size go up as one conditional
            PUT (no HEAD, no re-hash); larger ones as multipart after a HEAD.
        conditional_writes: True/False to state whether the server honours If-None-Match;
            None probes on first use.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        credentials: S3Credentials | None = None,
        region: str = "us-east-1",
        max_attempts: int = 5,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        multipart_threshold: int = 8 * MiB,
        multipart_chunksize: int = 8 * MiB,
        max_concurrency: int = 8,
        max_single_put: int = 64 * MiB,
        conditional_writes: bool | None = None,
    ) -> None:
        if not _BUCKET_RE.match(bucket):
            raise ValueError(
                f"S3 bucket name {bucket!r} is invalid: use 3-63 lowercase letters, digits, '.', '-'"
            )
        if multipart_chunksize < 5 * MiB:
            raise ValueError(f"multipart_chunksize={multipart_chunksize} is below S3's 5 MiB part minimum")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url.rstrip("/") if endpoint_url else None
        self.region = region
        self.max_attempts = max_attempts
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = multipart_chunksize
        self.max_concurrency = max_concurrency
        self.max_single_put = max_single_put
        self._key_id = credentials.access_key_id if credentials else None
        self._conditional = conditional_writes
        self._lock = threading.Lock()
        self._client = self._make_client(credentials)
        _install_known_payload_signer(self._client)
        self._transfer = create_transfer_manager(
            self._client,
            TransferConfig(
                multipart_threshold=multipart_threshold,
                multipart_chunksize=multipart_chunksize,
                max_concurrency=max_concurrency,
            ),
        )
        self._range_pool: ThreadPoolExecutor | None = None
        # The client's own HTTP session (same pool, proxies, TLS settings) for presigned GETs;
        # None falls back to get_object (see _open_range_presigned).
        self._http = getattr(getattr(self._client, "_endpoint", None), "http_session", None)

    # ------------------------------------------------------------------ construction

    def _make_client(self, credentials: S3Credentials | None) -> Any:
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": self.max_attempts, "mode": "standard"},
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            # one connection per part thread plus one per blob thread
            max_pool_connections=max(10, 2 * self.max_concurrency + 2),
            # the endpoint is resolved here (from_uri), not again from the environment
            ignore_configured_endpoint_urls=True,
        )
        session = boto3.session.Session()
        kwargs: dict[str, Any] = {}
        if credentials is not None:
            kwargs = {
                "aws_access_key_id": credentials.access_key_id,
                "aws_secret_access_key": credentials.secret_access_key,
                "aws_session_token": credentials.session_token,
            }
        return session.client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config, **kwargs
        )

    @classmethod
    def from_uri(
        cls, uri: str, *, env: Mapping[str, str] | None = None, check: bool = True, **options: Any
    ) -> S3Store:
        """Open ``s3://bucket[/prefix]`` with settings from the environment.

        Reads AWS_ENDPOINT_URL_S3 (else AWS_ENDPOINT_URL), AWS_ACCESS_KEY_ID,
        AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (else AWS_DEFAULT_REGION, else
        us-east-1) and RLHFLESS_S3_CONDITIONAL_WRITES (``auto``/``on``/``off``).

        Args:
            uri: the store URI.
            env: environment to read (default ``os.environ``).
            check: run :meth:`check` before returning.
            options: constructor keyword arguments that override the defaults.
        """
        if not uri.startswith("s3://"):
            raise ValueError(f"store.uri {uri!r} is not an s3:// URI")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        if not _BUCKET_RE.match(bucket):
            raise ValueError(
                f"store.uri {uri!r}: bucket name {bucket!r} is invalid; use 3-63 lowercase letters, digits, '.', '-'"
            )
        env = os.environ if env is None else env
        mode = env.get("RLHFLESS_S3_CONDITIONAL_WRITES", "auto").lower()
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"RLHFLESS_S3_CONDITIONAL_WRITES={mode!r}: use auto, on or off")
        endpoint_var = "AWS_ENDPOINT_URL_S3" if env.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
        endpoint = env.get(endpoint_var) or None
        if endpoint is not None and not is_http_url(endpoint):
            raise ValueError(
                f"{endpoint_var}={endpoint!r} is not an http(s) URL; set it to e.g. http://127.0.0.1:9000"
            )
        settings: dict[str, Any] = {
            "endpoint_url": endpoint,
            "credentials": S3Credentials.from_env(env),
            "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            "conditional_writes": {"auto": None, "on": True, "off": False}[mode],
        }
        store = cls(bucket, prefix, **{**settings, **options})
        if check:
            store.check()
        return store

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        endpoint = self.endpoint_url or "aws"
        return f"S3Store(uri={self.uri!r}, endpoint={endpoint!r}, key_id={mask_key_id(self._key_id)!r})"

    __str__ = __repr__

    def close(self) -> None:
        """Release transfer threads and connections (optional; a process exit does it too)."""
        self._transfer.shutdown()
        if self._range_pool is not None:
            self._range_pool.shutdown()

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ errors

    def _where(self) -> str:
        return self.endpoint_url or "AWS S3"

    def _raise(self, exc: Exception, op: str, key: str | None = None) -> NoReturn:
        """Turn a botocore exception into a one-line StoreError (secrets redacted)."""
        raise _translate(self, exc, op, key) from None

    def check(self) -> None:
        """Validate endpoint, credentials and bucket with one cheap request.

        Uses ``ListObjectsV2(MaxKeys=1)`` on the prefix rather than ``HeadBucket``: a HEAD
        response has no body, so a 403 cannot tell a wrong secret from a policy denial, and a
        policy scoped to the run prefix may deny HeadBucket while allowing this call.
        """
        try:
            self._client.list_objects_v2(Bucket=self.bucket, Prefix=self._base(), MaxKeys=1)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, "check")

    # ------------------------------------------------------------------ keys

    def _full(self, key: str) -> str:
        """Bucket key for a store key."""
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _base(self) -> str:
        """Bucket-key prefix of every key of this store ("" at the bucket root)."""
        return f"{self.prefix}/" if self.prefix else ""

    # ------------------------------------------------------------------ ObjectStore

    def put(self, key: str, data: bytes) -> None:
        self._write(key, as_parts(data))

    def _write(
        self, key: str, parts: tuple[memoryview, ...], sha256: str | None = None, *, single: bool = False
    ) -> None:
        full = self._full(key)
        size = sum(p.nbytes for p in parts)
        try:
            if size >= self.multipart_threshold and not single:
                # Multipart completes atomically: readers see the old object or the new one.
                self._transfer.upload(_PartsReader(parts), self.bucket, full).result()
            else:
                body: Any = b"".join(parts) if size <= _SMALL_BODY else _PartsReader(parts)
                with _known_payload(sha256):
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=body)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, "put", key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._write_once(key, as_parts(data), None)

    def put_content(self, key: str, parts: Any, sha256: str) -> bool:
        """Create a content-addressed object from ``parts`` (buffers whose concatenation has
        sha256 ``sha256``) unless it exists. Returns whether bytes were uploaded."""
        parts = as_parts(parts)
        # Blobs of one artifact already move in parallel, so multipart buys little below
        # max_single_put; a single PUT can be conditional and reuse the known sha256.
        if sum(p.nbytes for p in parts) > max(self.max_single_put, self.multipart_threshold):
            # Multipart cannot be conditional through s3transfer: check first. Two writers of
            # the same content race harmlessly (same bytes).
            if self.exists(key):
                return False
            self._write(key, parts)
            return True
        return self._write_once(key, parts, sha256)

    def _write_once(self, key: str, parts: tuple[memoryview, ...], sha256: str | None) -> bool:
        if self.conditional_writes():
            created = self._put_if_none_match(key, parts, sha256)
            if created is not None:
                return created
        # Fallback (store ignores If-None-Match): HEAD then PUT. Racy between writers; see
        # the module docstring.
        if self.exists(key):
            return False
        self._write(key, parts, sha256, single=True)
        return True

    def _put_if_none_match(self, key: str, parts: tuple[memoryview, ...], sha256: str | None) -> bool | None:
        """True created, False exists, None: the server does not implement the header."""
        full = self._full(key)
        size = sum(p.nbytes for p in parts)
        for attempt in range(self.max_attempts):
            # A file-like body makes botocore send Expect: 100-continue, so a 412 arrives
            # before the body is sent; a tiny body is cheaper to send than to wait for that.
            body: Any = b"".join(parts) if size <= _SMALL_BODY else _PartsReader(parts)
            try:
                with _known_payload(sha256):
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=body, IfNoneMatch="*")
                return True
            except bce.ClientError as exc:
                code = _code(exc)
                if code == "PreconditionFailed" or _status(exc) == 412:
                    return False
                if code == "ConditionalRequestConflict" and attempt + 1 < self.max_attempts:
                    _backoff(attempt)  # AWS: a concurrent conditional write is in flight
                    continue
                if code in ("NotImplemented", "InvalidArgument") or _status(exc) == 501:
                    log.warning("%s does not implement If-None-Match; using HEAD+PUT", self)
                    self._conditional = False
                    return None
                self._raise(exc, "put", key)
            except bce.BotoCoreError as exc:
                self._raise(exc, "put", key)
        raise AssertionError("unreachable")

    def conditional_writes(self) -> bool:
        """Whether ``put_if_absent`` is an atomic create on this store (probed once when the
        mode is ``auto``); False means it is HEAD-then-PUT, which two writers can both win."""
        if self._conditional is None:
            with self._lock:
                if self._conditional is None:
                    self._conditional = self._probe_conditional_writes()
        return bool(self._conditional)

    def _get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, ETag) of a small object, or None when it does not exist."""
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
            return resp["Body"].read(), resp["ETag"]
        except bce.ClientError as exc:
            if _code(exc) in _NOT_FOUND_CODES:
                return None
            self._raise(exc, "get", key)
        except bce.BotoCoreError as exc:
            self._raise(exc, "get", key)

    def replace_if(self, key: str, expected: bytes, data: bytes) -> bool:
        """Replace a small object only if it holds ``expected``: GET, compare, then PUT with
        ``If-Match`` on the ETag read, so a write in between makes the PUT fail (412).

        SeaweedFS 4.48 checks If-Match and then writes without a lock: of 30 races of 8
        concurrent If-Match PUTs on one ETag, 6 had two winners (If-None-Match had one winner
        in 150 races of 12). Callers must not rely on this for mutual exclusion between
        concurrent writers; the run lease uses it only to detect a lost lease.
        """
        return self._if_unchanged(key, expected, "put", lambda etag: self._client.put_object(
            Bucket=self.bucket, Key=self._full(key), Body=data, IfMatch=etag))

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Delete a small object only if it holds ``expected`` (``If-Match`` on its ETag)."""
        return self._if_unchanged(key, expected, "delete", lambda etag: self._client.delete_object(
            Bucket=self.bucket, Key=self._full(key), IfMatch=etag))

    def _if_unchanged(self, key: str, expected: bytes, op: str, request: Callable[[str], object]) -> bool:
        """Run ``request(etag)`` (a PUT or DELETE carrying ``If-Match: etag``) only if ``key``
        holds ``expected`` now; False when it does not, is gone, or changed in between (412)."""
        current = self._get_with_etag(key)
        if current is None or current[0] != expected:
            return False
        try:
            request(current[1])
            return True
        except bce.ClientError as exc:
            if _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict") or _status(exc) == 412:
                return False
            if _code(exc) in _NOT_FOUND_CODES:
                return False
            self._raise(exc, op, key)
        except bce.BotoCoreError as exc:
            self._raise(exc, op, key)

    def _probe_conditional_writes(self) -> bool:
        """Whether the server honours If-None-Match: write a probe key twice and see."""
        key = f".rlhfless/conditional-probe-{uuid.uuid4().hex}"
        full = self._full(key)
        try:
            self._client.put_object(Bucket=self.bucket, Key=full, Body=b"1", IfNoneMatch="*")
            self._client.put_object(Bucket=self.bucket, Key=full, Body=b"2", IfNoneMatch="*")
        except bce.ClientError as exc:
            if _code(exc) == "PreconditionFailed" or _status(exc) == 412:
                return True
            if _code(exc) in ("NotImplemented", "InvalidArgument") or _status(exc) == 501:
                return False
            self._raise(exc, "put", key)
        except bce.BotoCoreError as exc:
            self._raise(exc, "put", key)
        finally:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=full)
            except (bce.BotoCoreError, bce.ClientError):
                pass  # a leftover 1-byte probe key is harmless
        log.warning("%s ignores If-None-Match (overwrote a key); put_if_absent uses HEAD+PUT", self)
        return False

    def get(self, key: str) -> bytes:
        buf = self.get_buffer(key)
        return bytes(buf)

    def get_buffer(self, key: str, size: int | None = None) -> bytearray:
        """Read ``key`` into a fresh writable ``bytearray`` (no further copy).

        Objects larger than ``multipart_chunksize`` are fetched as parallel ranged GETs, each
        pinned to the ETag of the first response so an overwrite in between cannot mix
        versions. ``size`` (expected bytes, e.g. from a manifest) lets a small object be
        fetched with a plain GET. A body stream that breaks mid-read is retried (bounded,
        with backoff).
        """
        for attempt in range(self.max_attempts):
            try:
                return self._fetch(key, size)
            except _STREAM_ERRORS as exc:
                if attempt + 1 >= self.max_attempts:
                    self._raise(exc, "get", key)
                _backoff(attempt)
            except bce.ClientError as exc:
                if _code(exc) == "PreconditionFailed" and attempt + 1 < self.max_attempts:
                    continue  # overwritten between ranges: start over on the new version
                if _code(exc) in _NOT_FOUND_CODES:
                    raise ObjectNotFound(f"object {key!r} not found in store {self.uri}") from None
                self._raise(exc, "get", key)
            except bce.BotoCoreError as exc:
                self._raise(exc, "get", key)
        raise AssertionError("unreachable")

    def _fetch(self, key: str, size: int | None = None) -> bytearray:
        full = self._full(key)
        chunk = self.multipart_chunksize
        try:
            if size is not None and size < chunk:
                first = self._open_range(full, None, None)  # a plain GET costs the server less
            else:
                first = self._open_range(full, 0, chunk)
        except bce.ClientError as exc:
            if _code(exc) != "InvalidRange":
                raise
            return bytearray()  # a ranged GET of an empty object is 416
        # "bytes 0-8388607/104857600"; absent if the server ignored Range and sent it all
        total = int(first.content_range.rsplit("/", 1)[1]) if first.content_range else first.length
        if size is not None and total != size:
            first.close()
            # A blob whose length differs from its manifest's is corrupt: say so before
            # allocating (a hostile store could claim terabytes) or downloading it.
            raise IntegrityError(f"object {key!r} in {self.uri} is {total} bytes where its manifest says "
                                 f"{size}; re-publish the artifact")
        buf = bytearray(total)
        view = memoryview(buf)
        first.fill(view[: first.length])
        if first.length < total:
            starts = range(first.length, total, chunk)

            def fetch_range(start: int) -> None:
                end = min(start + chunk, total)
                self._open_range(full, start, end, if_match=first.etag).fill(view[start:end])

            if self.max_concurrency <= 1:
                for start in starts:
                    fetch_range(start)
            else:
                list(self._ranges().map(fetch_range, starts))
        return buf

    def _open_range(
        self, full: str, start: int | None, end: int | None, if_match: str | None = None
    ) -> _RangeResponse:
        """GET bytes [start, end) of a bucket key (all of it if start is None); the body is
        read by ``.fill(view)``."""
        if self._http is None:
            extra: dict[str, str] = {"IfMatch": if_match} if if_match else {}
            if start is not None:
                extra["Range"] = f"bytes={start}-{end - 1}"  # type: ignore[operator]
            resp = self._client.get_object(Bucket=self.bucket, Key=full, **extra)
            body = resp["Body"]
            return _RangeResponse(resp["ContentLength"], resp.get("ContentRange"), resp.get("ETag", ""),
                                  lambda view: _read_exactly(body, view), body.close)  # fmt: skip
        return self._open_range_presigned(full, start, end, if_match)

    def _open_range_presigned(
        self, full: str, start: int | None, end: int | None, if_match: str | None
    ) -> _RangeResponse:
        """The same GET through a presigned URL on the client's own connection pool.

        A full botocore call costs ~1.5 ms of Python per request (parameter validation,
        response parsing, user agent), which dominates when an artifact is many small blobs;
        presigning costs ~0.3 ms. The body is read straight into the caller's buffer. Retries
        (connection errors, 5xx, SlowDown) are done here since botocore's retry handler is
        not involved; errors become the same ClientError/BotoCoreError types.
        """
        url = self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": full}, ExpiresIn=_PRESIGN_TTL_S
        )
        headers = {} if start is None else {"Range": f"bytes={start}-{end - 1}"}  # type: ignore[operator]
        if if_match:
            headers["If-Match"] = if_match
        request = AWSRequest(method="GET", url=url, headers=headers)
        request.stream_output = True  # else the session reads the whole body into .content
        prepared = request.prepare()
        for attempt in range(self.max_attempts):
            last = attempt + 1 >= self.max_attempts
            try:
                resp = self._http.send(prepared)
            except (bce.ConnectionError, bce.HTTPClientError) as exc:
                if last:
                    raise _without_url(exc, self._where()) from None
                _backoff(attempt)
                continue
            if resp.status_code in (200, 206):
                h = resp.headers
                return _RangeResponse(int(h["Content-Length"]), h.get("Content-Range"), h.get("ETag", ""),
                                      lambda view: _fill_from_raw(resp.raw, view), resp.raw.close)  # fmt: skip
            error = _client_error(resp.status_code, resp.content, "GetObject")
            if not last and (resp.status_code >= 500 or _code(error) in ("SlowDown", "RequestTimeout")):
                _backoff(attempt)
                continue
            raise error
        raise AssertionError("unreachable")

    def _ranges(self) -> ThreadPoolExecutor:
        if self._range_pool is None:
            with self._lock:
                if self._range_pool is None:
                    self._range_pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="s3-range")
        return self._range_pool

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._full(key))
            return True
        except bce.ClientError as exc:
            if _code(exc) in _NOT_FOUND_CODES:
                return False
            if _status(exc) == 403:
                self._diagnose_denied_head(exc, key)
            self._raise(exc, "head", key)
        except bce.BotoCoreError as exc:
            self._raise(exc, "head", key)

    def _diagnose_denied_head(self, exc: bce.ClientError, key: str) -> NoReturn:
        """A 403 to HEAD carries no reason; a 1-byte GET's error document names it (wrong
        key, wrong secret, or a policy denial)."""
        try:
            self._client.get_object(Bucket=self.bucket, Key=self._full(key), Range="bytes=0-0")
        except (bce.ClientError, bce.BotoCoreError) as detail:
            self._raise(detail, "head", key)
        self._raise(exc, "head", key)

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))
        except bce.ClientError as exc:
            if _code(exc) not in _NOT_FOUND_CODES:
                self._raise(exc, "delete", key)
        except bce.BotoCoreError as exc:
            self._raise(exc, "delete", key)

    def list(self, prefix: str) -> list[str]:
        base = self._base()
        if prefix:
            if prefix.startswith("/") or ".." in prefix.split("/"):
                raise ValueError(f"list prefix {prefix!r} is invalid: use a relative path without '..'")
        keys = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix
            )
            for page in pages:
                keys.extend(obj["Key"][len(base) :] for obj in page.get("Contents", []))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, "list", prefix or None)
        return sorted(keys)

    # ------------------------------------------------------------------ presigned URLs

    def presign_get(self, key: str, expires_s: int = 3600) -> str:
        """A URL that lets its holder GET ``key`` for ``expires_s`` seconds, no credentials."""
        return self._presign("get_object", key, expires_s)

    def presign_put(self, key: str, expires_s: int = 3600) -> str:
        """A URL that lets its holder PUT ``key`` (plain HTTP PUT of the body)."""
        return self._presign("put_object", key, expires_s)

    def _presign(self, method: str, key: str, expires_s: int) -> str:
        try:
            return self._client.generate_presigned_url(
                method, Params={"Bucket": self.bucket, "Key": self._full(key)}, ExpiresIn=expires_s
            )
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, "presign", key)


# ---------------------------------------------------------------------- helpers


class _PartsReader(io.RawIOBase):
    """A seekable read-only file over a sequence of buffers (their concatenation), so a blob
    made of a header and a tensor's memory can be streamed without joining them."""

    def __init__(self, parts: tuple[memoryview, ...]) -> None:
        super().__init__()
        self._parts = parts
        self._size = sum(p.nbytes for p in parts)
        self._pos = 0

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        filled, start = 0, 0
        for part in self._parts:
            end = start + part.nbytes
            if self._pos < end and filled < out.nbytes:
                lo = self._pos - start
                n = min(part.nbytes - lo, out.nbytes - filled)
                out[filled : filled + n] = part[lo : lo + n]
                filled += n
                self._pos += n
            start = end
        return filled

    def read(self, size: int = -1) -> bytes:
        remaining = self._size - self._pos
        size = remaining if size is None or size < 0 else min(size, remaining)
        if size <= 0:
            return b""
        start = 0
        for part in self._parts:  # the common case, a slice of one part: one copy
            if start <= self._pos and self._pos + size <= start + part.nbytes:
                lo = self._pos - start
                self._pos += size
                return part[lo : lo + size].tobytes()
            start += part.nbytes
        buf = bytearray(size)
        self.readinto(buf)
        return bytes(buf)


# The sha256 of the body being sent by this thread, when the caller already knows it (a
# content-addressed blob): SigV4 needs exactly that hash, so botocore need not hash it again.
_KNOWN_PAYLOAD = threading.local()


class _known_payload:
    def __init__(self, sha256: str | None) -> None:
        self.sha256 = sha256

    def __enter__(self) -> None:
        _KNOWN_PAYLOAD.sha256 = self.sha256

    def __exit__(self, *exc: object) -> None:
        _KNOWN_PAYLOAD.sha256 = None


class _S3SigV4KnownPayload(S3SigV4Auth):
    """S3 SigV4 signer that signs with a payload hash computed earlier. If the hash were
    wrong the server would reject the request (XAmzContentSHA256Mismatch), never store it."""

    def payload(self, request: Any) -> str:
        known = getattr(_KNOWN_PAYLOAD, "sha256", None)
        if (
            known
            and not self._is_streaming_checksum_payload(request)
            and self._should_sha256_sign_payload(request)
        ):
            return known
        return super().payload(request)


def _install_known_payload_signer(client: Any) -> None:
    """Make this client's plain S3 SigV4 signer honour :data:`_KNOWN_PAYLOAD`.

    botocore has no public hook for a precomputed payload hash; this wraps the client's own
    signer factory (per client, nothing global). If botocore's internals change, the client
    simply keeps hashing bodies itself.
    """
    signer = getattr(client, "_request_signer", None)
    original = getattr(signer, "get_auth_instance", None)
    if original is None:
        return

    def get_auth_instance(*args: Any, **kwargs: Any) -> Any:
        auth = original(*args, **kwargs)
        if type(auth) is S3SigV4Auth:
            auth.__class__ = _S3SigV4KnownPayload
        return auth

    signer.get_auth_instance = get_auth_instance


def _code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: bce.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _backoff(attempt: int, base: float = 0.2, cap: float = 5.0) -> None:
    time.sleep(random.uniform(0, min(cap, base * 2**attempt)))


@dataclass
class _RangeResponse:
    """Headers of a ranged GET; ``fill(view)`` reads exactly ``length`` body bytes into view."""

    length: int
    content_range: str | None
    etag: str
    fill: Callable[[memoryview], None]
    close: Callable[[], None]
    """Drop the body unread (the connection is not reused)."""


def _fill_from_raw(raw: Any, view: memoryview) -> None:
    """Read a urllib3 response body into ``view``, then return the connection to the pool.

    Reads through the underlying ``http.client`` response when there is one (it fills the
    buffer in place; urllib3's own readinto reads into a temporary and copies).
    """
    fp = getattr(raw, "_fp", None)
    direct = fp is not None and hasattr(fp, "readinto") and not raw.headers.get("Content-Encoding")
    readinto = fp.readinto if direct else raw.readinto
    filled = 0
    try:
        while filled < len(view):
            n = readinto(view[filled:])
            if not n:
                raise bce.IncompleteReadError(actual_bytes=filled, expected_bytes=len(view))
            filled += n
    except (OSError, http.client.HTTPException) as exc:
        raw.close()
        raise bce.ResponseStreamingError(error=exc) from None
    except BaseException:
        raw.close()
        raise
    if direct and not fp.isclosed():
        raw.close()  # unexpected trailing bytes: do not reuse this connection
    else:
        raw.release_conn()


def _client_error(status: int, body: bytes, operation: str) -> bce.ClientError:
    """A botocore ClientError from an S3 XML error response (or a bare status)."""
    code, message = str(status), ""
    try:
        root = ElementTree.fromstring(body) if body else None
        if root is not None:
            code = root.findtext("Code") or code
            message = root.findtext("Message") or ""
    except ElementTree.ParseError:
        pass
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return bce.ClientError(response, operation)  # type: ignore[arg-type]


def _without_url(exc: Exception, where: str) -> Exception:
    """The same connection error, naming the endpoint instead of the presigned URL (which
    carries the access key id and a signature)."""
    error = getattr(exc, "kwargs", {}).get("error", exc)
    for cls in (type(exc), bce.EndpointConnectionError):
        try:
            return cls(endpoint_url=where, error=error)
        except Exception:  # a subclass with other required fields
            continue
    return bce.EndpointConnectionError(endpoint_url=where, error=error)


def _read_exactly(body: Any, view: memoryview) -> None:
    """Fill ``view`` from a streaming body, or raise IncompleteReadError."""
    filled = 0
    try:
        while filled < len(view):
            n = body.readinto(view[filled:])
            if not n:
                raise bce.IncompleteReadError(actual_bytes=filled, expected_bytes=len(view))
            filled += n
    finally:
        body.close()


def _connection_reason(exc: Exception, store: S3Store) -> str:
    text = str(getattr(exc, "kwargs", {}).get("error", exc)).lower()
    if isinstance(exc, bce.ConnectTimeoutError):
        return f"no answer within the {store.connect_timeout:g} s connect timeout"
    if isinstance(exc, bce.ReadTimeoutError):
        return f"no response within the {store.read_timeout:g} s read timeout"
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text or "resolution" in text:
        return "host name not found"
    if isinstance(exc, bce.SSLError):
        return "TLS handshake failed"
    return "connection failed"


def _translate(store: S3Store, exc: Exception, op: str, key: str | None) -> StoreError:
    """A one-line StoreError for a botocore failure; never carries a secret."""
    where = store._where()
    target = f"s3://{store.bucket}/{store._full(key)}" if key else store.uri
    key_id = mask_key_id(store._key_id)
    if isinstance(exc, bce.NoCredentialsError):
        err: StoreError = StoreCredentialsError(
            f"no S3 credentials found for bucket {store.bucket!r}; "
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    elif isinstance(exc, (bce.ConnectionError, bce.HTTPClientError)) and not isinstance(
        exc, bce.ResponseStreamingError
    ):
        err = StoreUnreachable(
            f"cannot reach S3 endpoint {where} : {_connection_reason(exc, store)}; check AWS_ENDPOINT_URL"
        )
    elif isinstance(exc, bce.ClientError):
        code, status = _code(exc), _status(exc)
        message = exc.response.get("Error", {}).get("Message", "")
        if code in _CREDENTIAL_CODES:
            err = StoreCredentialsError(
                f"S3 rejected the credentials (key {key_id}) for bucket {store.bucket!r} at {where} "
                f"({code}); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
            )
        elif code == "NoSuchBucket":
            err = BucketNotFound(
                f"bucket {store.bucket!r} does not exist at {where}; create it or fix store.uri"
            )
        elif op == "check" and code.isdigit():
            # A GET answered without an S3 error document: something else listens there.
            err = StoreError(
                f"S3 endpoint {where} answered HTTP {status} without an S3 error to a bucket "
                "listing; is AWS_ENDPOINT_URL an S3 server?"
            )
        elif code == "AccessDenied" or status == 403:
            bare = not code or code.isdigit()  # HEAD: a status, no error document
            hint = (
                " (a HEAD response carries no reason: run store.check() to tell wrong"
                " credentials from a policy denial)"
            ) if bare else ""
            err = StoreAccessDenied(
                f"S3 denied {op} on {target} for key {key_id}; the bucket policy must allow it "
                f"(see infra/minio/policy-actions.json){hint}"
            )
        else:
            err = StoreError(f"S3 {op} on {target} failed at {where}: {code or status} {message}".rstrip())
    else:  # the exception text may carry a (presigned) URL: name the type only
        err = StoreError(f"S3 {op} on {target} failed at {where}: {type(exc).__name__}")
    return type(err)(redact(str(err)))
