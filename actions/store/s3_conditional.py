"""Conditional writes of the S3 backend: create-once (``If-None-Match: *``) and
compare-and-swap (``If-Match`` on an ETag), mixed into :class:`~actions.store.s3.S3Store`.

A lost reply. botocore retries a request whose reply was lost (a reset connection, a read
timeout) or answered 5xx. For a conditional request the attempt it gave up on may have been
carried out: a create that worked is then answered 412 ("exists") on the retry, a
compare-and-swap 412 ("changed"), a delete 412 or 404 ("gone"). Reported as such, a lease
renewal that worked would stop a healthy run naming its own pid. So when botocore sent a
conditional request more than once (``RetryAttempts`` in the answer), such a refusal is
checked against the object: the call succeeded if the key now holds exactly the bytes it
sent (for a delete: if the key is gone). Why identical bytes written by another process would
be no different for the callers is said where each method is.

What the mixing class provides: ``_client``, ``bucket``, ``max_attempts``, ``_conditional``
(True/False/None: probe), ``_lock``, ``_full(key)``, ``_raise(exc, op, key)``, ``exists(key)``
and ``_write(key, parts, sha256, single=True)``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from botocore import exceptions as bce

from actions.store.s3_errors import (
    NOT_FOUND_CODES,
    backoff,
    code,
    is_not_implemented,
    is_precondition_failed,
    retried,
)
from actions.store.s3_fastpath import PartsReader, known_payload

log = logging.getLogger(__name__)

SMALL_BODY = 64 * 1024  # bodies up to this size are sent without Expect: 100-continue


class ConditionalWrites:
    """``put_if_absent``'s conditional PUT, its probe and fallback, and ``replace_if`` /
    ``delete_if`` for :class:`~actions.store.s3.S3Store` (see the module docstring)."""

    _client: Any
    bucket: str
    max_attempts: int
    _conditional: bool | None
    _lock: Any

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
        """True created, False exists, None: the server does not implement the header.

        A 412 to a request botocore sent more than once may answer our own earlier attempt,
        whose reply was lost: the key then counts as created by this call if it holds exactly
        our bytes. Identical bytes written by someone else are no different to any caller: a
        lease record carries its holder's random token (no other process writes those bytes),
        commit records and history segments are read back and accepted when identical (a
        replay), and blobs are content-addressed. A blob (``sha256`` given) is not read back:
        its key guarantees its bytes, and "uploaded" only feeds statistics.
        """
        full = self._full(key)
        size = sum(p.nbytes for p in parts)
        uncertain = False  # an earlier attempt of this call may have created the key
        for attempt in range(self.max_attempts):
            # A file-like body makes botocore send Expect: 100-continue, so a 412 arrives
            # before the body is sent; a tiny body is cheaper to send than to wait for that.
            body: Any = b"".join(parts) if size <= SMALL_BODY else PartsReader(parts)
            try:
                with known_payload(sha256):
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=body, IfNoneMatch="*")
                return True
            except bce.ClientError as exc:
                uncertain = uncertain or retried(exc)
                if is_precondition_failed(exc):
                    return uncertain and sha256 is None and self._holds(key, b"".join(parts))
                if code(exc) == "ConditionalRequestConflict" and attempt + 1 < self.max_attempts:
                    backoff(attempt)  # AWS: a concurrent conditional write is in flight
                    continue
                if is_not_implemented(exc):
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

    def _holds(self, key: str, data: bytes | None) -> bool:
        """Whether ``key`` holds exactly ``data`` now (None: whether it is gone): how a
        conditional request whose reply was lost is told apart from one that lost its race."""
        current = self._get_with_etag(key)
        return current is None if data is None else current is not None and current[0] == data

    def _get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, ETag) of a small object, or None when it does not exist."""
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
            return resp["Body"].read(), resp["ETag"]
        except bce.ClientError as exc:
            if code(exc) in NOT_FOUND_CODES:
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

        When botocore sent the PUT more than once (a lost reply, a 5xx after the write), the
        412 may answer our own first attempt: the call then succeeded if the key holds exactly
        ``data``. Safe for the one caller, the lease renewal: its record carries the holder's
        random token and renewal time, bytes no other process writes.
        """
        return self._if_unchanged(key, expected, "put", data, lambda etag: self._client.put_object(
            Bucket=self.bucket, Key=self._full(key), Body=data, IfMatch=etag))

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Delete a small object only if it holds ``expected`` (``If-Match`` on its ETag).

        When botocore sent the DELETE more than once, a 412 or 404 may answer our own first
        attempt: the call counts as done if the key is gone. Another process may have deleted
        it instead; the callers (taking over or releasing a lease) only need it gone."""
        return self._if_unchanged(key, expected, "delete", None, lambda etag: self._client.delete_object(
            Bucket=self.bucket, Key=self._full(key), IfMatch=etag))

    def _if_unchanged(self, key: str, expected: bytes, op: str, after: bytes | None,
                      request: Callable[[str], object]) -> bool:
        """Run ``request(etag)`` (a PUT or DELETE carrying ``If-Match: etag``) only if ``key``
        holds ``expected`` now; False when it does not, is gone, or changed in between (412)
        -- unless the request was sent more than once and ``key`` now holds ``after`` (None:
        is gone), what the request leaves."""
        current = self._get_with_etag(key)
        if current is None or current[0] != expected:
            return False
        try:
            request(current[1])
            return True
        except bce.ClientError as exc:
            if is_precondition_failed(exc) or code(exc) in ("ConditionalRequestConflict", *NOT_FOUND_CODES):
                return retried(exc) and self._holds(key, after)
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
            if is_precondition_failed(exc):
                return True
            if is_not_implemented(exc):
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
