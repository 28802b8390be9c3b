"""S3 backend of the object store: any S3 endpoint (MinIO, AWS S3, SeaweedFS, Ceph RGW).

``S3Store.from_uri("s3://bucket/prefix")`` takes the endpoint, credentials and region from the
standard AWS environment variables and checks them once (:meth:`S3Store.check`), so a bad
configuration fails with a one-line error before anything is written. Choices:

* Path-style addressing whenever an endpoint is given (S3-compatible servers rarely have
  wildcard DNS); boto3's default (virtual-hosted) for AWS itself.
* ``request_checksum_calculation`` / ``response_checksum_validation`` = ``when_required``:
  boto3 >= 1.36 otherwise sends CRC trailers that some S3-compatible servers reject. Integrity
  of campaign data is checked end to end by sha256 in manifests instead.
* :meth:`S3Store.check`, the probe every open makes, has a budget of its own
  (``PROBE_ATTEMPTS`` requests, ``PROBE_TIMEOUT_S`` connect and read timeouts): an endpoint
  that accepts connections and never answers is named in about half a minute, not after
  ``max_attempts`` x ``read_timeout`` (5 minutes at the defaults), which a large object's read
  may need but one ``ListObjectsV2(MaxKeys=1)`` never does.
* Retries: botocore "standard" mode (transient errors only: 5xx, throttling, connection
  errors; jittered exponential backoff) with ``max_attempts``. Reads are retried at one level
  only, whole, by :meth:`S3Store.get_buffer` (which also covers a body stream that breaks after
  the headers arrived, which botocore cannot retry). A conditional write that botocore sent
  again may have been carried out by the attempt whose reply was lost; its 412 is then checked
  against the object (:mod:`.s3_conditional`).
* Large objects: ``put`` uses multipart above ``multipart_threshold`` (8 MiB) through one
  shared, bounded s3transfer manager; reads above it are parallel ranged GETs pinned to the
  first response's ETag (:mod:`.s3_reads`).
* Blobs (``put_content``, used by ``put_artifact``): one conditional PUT with
  ``Expect: 100-continue`` up to ``max_single_put`` (64 MiB) -- when the blob already exists
  the server answers 412 before the body is sent, so an unchanged tensor costs one small
  request and no HEAD. The body streams from the caller's buffers and the SigV4 payload hash
  reuses the blob's sha256; reads are presigned GETs filling one ``bytearray``. These rely on
  botocore internals and are kept apart, with their fallbacks, in :mod:`.s3_fastpath`.
* ``put_if_absent``: ``PutObject`` with ``If-None-Match: *`` (412 -> False). Some stores
  (older MinIO, older Ceph RGW) silently ignore the header and overwrite. The first call
  probes this once per store (create a probe key twice under the prefix, then delete it);
  on such stores, or with ``conditional_writes=False`` / RLHFLESS_S3_CONDITIONAL_WRITES=off,
  it falls back to HEAD-then-PUT, which has a race: two writers that HEAD at the same moment
  both "create" the key and the last PUT wins. ``commit_pointer`` reads its record back,
  which narrows that window to the two PUTs landing between one writer's PUT and GET.
  Conditional writes live in :mod:`.s3_conditional`.

Secrets never appear in messages or reprs (:mod:`.s3_errors`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NoReturn

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore import exceptions as bce

from actions.store.credentials import S3Credentials, mask_key_id
from actions.store.protocol import ObjectNotFound, as_parts, check_key
from actions.store.s3_conditional import SMALL_BODY, ConditionalWrites
from actions.store.s3_errors import (
    NOT_FOUND_CODES,
    ErrorContext,
    backoff,
    code,
    is_transient,
    status,
    translate,
)
from actions.store.s3_fastpath import PartsReader, attach, known_payload
from actions.store.s3_reads import RangedReader, RetriedRequest
from actions.store.s3_settings import BUCKET_FIX, BUCKET_RE, make_client, settings_from_env, split_uri
from actions.store.safe_paths import name_problem

log = logging.getLogger(__name__)

MiB = 1024 * 1024
PROBE_ATTEMPTS = 2
PROBE_TIMEOUT_S = 15.0
"""The probe's budget (:meth:`S3Store.check`): requests, and the cap on its connect and read
timeouts in seconds. A healthy endpoint answers it in milliseconds; a loaded one well within
15 s."""


class S3Store(ConditionalWrites):
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
        endpoint_from: the setting ``endpoint_url`` came from, which messages blaming the
            endpoint name (``from_uri``: its environment variable); None names this argument.

    Attributes:
        fast_path: which parts of :mod:`.s3_fastpath` this client got (fixed at construction).
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
        endpoint_from: str | None = None,
    ) -> None:
        if not BUCKET_RE.match(bucket):
            raise ValueError(f"S3 bucket name {bucket!r} is invalid: {BUCKET_FIX}")
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
        self._credentials = credentials  # for the probe's client (check); its repr masks the secret
        self._conditional = conditional_writes
        self._lock = threading.Lock()
        self._client = make_client(self.endpoint_url, region, credentials, max_attempts=max_attempts,
                                   connect_timeout=connect_timeout, read_timeout=read_timeout,
                                   max_concurrency=max_concurrency)
        self.fast_path = attach(self._client)
        self._transfer = create_transfer_manager(
            self._client,
            TransferConfig(
                multipart_threshold=multipart_threshold,
                multipart_chunksize=multipart_chunksize,
                max_concurrency=max_concurrency,
            ),
        )
        where = self.endpoint_url or "AWS S3"
        self._reader = RangedReader(self._client, self.fast_path, bucket, chunk_size=multipart_chunksize,
                                    max_concurrency=max_concurrency, where=where)
        self._errors = ErrorContext(where, bucket, self.uri, mask_key_id(self._key_id), connect_timeout, read_timeout,
                                    endpoint_from or "the endpoint_url S3Store was given",
                                    bool(credentials and credentials.session_token))

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_uri(
        cls, uri: str, *, env: Mapping[str, str] | None = None, check: bool = True, **options: Any
    ) -> S3Store:
        """Open ``s3://bucket[/prefix]`` with settings from the environment.

        See :func:`.s3_settings.settings_from_env` for the variables read.

        Args:
            uri: the store URI.
            env: environment to read (default ``os.environ``).
            check: run :meth:`check` before returning.
            options: constructor keyword arguments that override the defaults.
        """
        bucket, prefix = split_uri(uri)
        settings = settings_from_env(os.environ if env is None else env)
        if "endpoint_url" in options:  # the caller's endpoint, not the environment's
            settings["endpoint_from"] = options.get("endpoint_from")
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
        self._reader.close()

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ errors

    def _raise(self, exc: Exception, op: str, key: str | None = None, tries: str = "") -> NoReturn:
        """Turn a botocore exception into a one-line StoreError (secrets redacted)."""
        target = f"s3://{self.bucket}/{self._full(key)}" if key else self.uri
        raise translate(exc, op, self._errors, target, tries) from None

    def check(self) -> None:
        """Validate endpoint, credentials and bucket with one cheap request.

        Uses ``ListObjectsV2(MaxKeys=1)`` on the prefix rather than ``HeadBucket``: a HEAD
        response has no body, so a 403 cannot tell a wrong secret from a policy denial, and a
        policy scoped to the run prefix may deny HeadBucket while allowing this call. Sent
        through a client of its own with the probe's budget (``PROBE_ATTEMPTS`` requests,
        timeouts at most ``PROBE_TIMEOUT_S`` seconds): a hung endpoint fails it in about
        ``PROBE_ATTEMPTS x PROBE_TIMEOUT_S`` seconds.
        """
        attempts = min(self.max_attempts, PROBE_ATTEMPTS)
        connect_timeout = min(self.connect_timeout, PROBE_TIMEOUT_S)
        read_timeout = min(self.read_timeout, PROBE_TIMEOUT_S)
        probe = make_client(self.endpoint_url, self.region, self._credentials, max_attempts=attempts,
                            connect_timeout=connect_timeout, read_timeout=read_timeout, max_concurrency=1)
        started = time.monotonic()
        try:
            probe.list_objects_v2(Bucket=self.bucket, Prefix=self._base(), MaxKeys=1)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            context = replace(self._errors, connect_timeout=connect_timeout, read_timeout=read_timeout)
            # botocore retried a transient failure to the budget; anything else was sent once
            tries = (f"{attempts} request{'s' if attempts != 1 else ''} in {time.monotonic() - started:.1f} s"
                     if is_transient(exc) else "")
            raise translate(exc, "check", context, self.uri, tries) from None
        finally:
            probe.close()

    # ------------------------------------------------------------------ keys

    def _full(self, key: str) -> str:
        """Bucket key for a store key."""
        check_key(key)
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
                self._transfer.upload(PartsReader(parts), self.bucket, full).result()
            else:
                body: Any = b"".join(parts) if size <= SMALL_BODY else PartsReader(parts)
                with known_payload(sha256):
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

    def get(self, key: str) -> bytes:
        buf = self.get_buffer(key)
        return bytes(buf)

    def get_buffer(self, key: str, size: int | None = None) -> bytearray:
        """Read ``key`` into a fresh writable ``bytearray`` (no further copy).

        Objects larger than ``multipart_chunksize`` are fetched as parallel ranged GETs, each
        pinned to the ETag of the first response so an overwrite in between cannot mix
        versions. ``size`` (expected bytes, e.g. from a manifest) lets a small object be
        fetched with a plain GET, and a different real size raises IntegrityError from the
        response headers, before the body is read.

        Retries happen here only: a read that fails transiently (connection or read timeout,
        5xx, throttling, a body that breaks) is started over, ``max_attempts`` reads in all,
        with backoff; each presigned GET is sent once. Without the fast path, botocore retries
        ``get_object`` itself and only a broken body is retried here. The error names how many
        reads were made and how long they took.
        """
        started = time.monotonic()
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self._reader.read(self._full(key), size, f"object {key!r} in {self.uri}")
            except RetriedRequest as wrapped:  # botocore retried it already: do not send it again
                exc, again, by = wrapped.error, False, ", the last retried by botocore"
            except (bce.BotoCoreError, bce.ClientError) as error:
                exc, again, by = error, is_transient(error), ""
            error_code = code(exc) if isinstance(exc, bce.ClientError) else ""
            if error_code in NOT_FOUND_CODES:
                raise ObjectNotFound(f"object {key!r} not found in store {self.uri}") from None
            if (again or error_code == "PreconditionFailed") and attempt < self.max_attempts:
                if error_code != "PreconditionFailed":  # overwritten between ranges: start over at once
                    backoff(attempt - 1)
                continue
            gave_up = again or by or attempt > 1
            reads = f"{attempt} read{'s' if attempt > 1 else ''} in {time.monotonic() - started:.1f} s{by}"
            self._raise(exc, "get", key, reads if gave_up else "")
        raise AssertionError("unreachable")

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._full(key))
            return True
        except bce.ClientError as exc:
            if code(exc) in NOT_FOUND_CODES:
                return False
            if status(exc) == 403:
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
            if code(exc) not in NOT_FOUND_CODES:
                self._raise(exc, "delete", key)
        except bce.BotoCoreError as exc:
            self._raise(exc, "delete", key)

    def list(self, prefix: str) -> list[str]:
        return sorted(self.list_stats(prefix))

    def list_stats(self, prefix: str) -> dict[str, tuple[float, int]]:
        """Key -> (``LastModified`` in epoch seconds, size in bytes) for the keys under
        ``prefix``, from the same listing as :meth:`list`. The time is the server's (for a
        multipart object it may be the start of the upload), and a conditional PUT answered 412
        leaves it as it was.

        Bucket keys that are not valid store keys are left out: "folder markers" (empty
        objects ending in ``/`` that consoles, rclone and s3fs create) and names with empty,
        ``.`` or ``..`` components. No store call could read or delete them (``check_key``
        refuses them), so listing them would only make garbage collection fail on them; they
        are not ours and stay where they are."""
        return {key: (obj["LastModified"].timestamp(), int(obj["Size"])) for key, obj in self._listing(prefix)}

    def list_tags(self, prefix: str) -> dict[str, str | None]:
        """Key -> its ``ETag`` (size prefixed) for the keys under ``prefix``, from the same listing
        as :meth:`list` (every key; None where the listing gives no ETag): a tag that changes
        whenever the object's bytes may have (for a single-part PUT, the MD5 of its bytes).
        Garbage collection keeps what it read of a manifest while its tag stays the same
        (``flows/campaign/collect.py``)."""
        return {key: f"{obj['Size']}:{obj['ETag']}" if obj.get("ETag") else None for key, obj in self._listing(prefix)}

    def _listing(self, prefix: str) -> list[tuple[str, dict]]:
        """(store key, the ``list_objects_v2`` entry) for the valid store keys under ``prefix``."""
        base = self._base()
        if prefix:
            if prefix.startswith("/") or ".." in prefix.split("/"):
                raise ValueError(f"list prefix {prefix!r} is invalid: use a relative path without '..'")
        out = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix
            )
            for page in pages:
                out.extend((obj["Key"][len(base) :], obj) for obj in page.get("Contents", [])
                           if name_problem(obj["Key"][len(base) :]) is None)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, "list", prefix or None)
        return out

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

