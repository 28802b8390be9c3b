"""The S3 backend's fast path: what it takes from botocore and urllib3 beyond their public API.

Why it exists. An artifact (a policy's weights, a KV bundle) is hundreds of small blobs, each
hashed once by :mod:`.artifacts`. Through boto3's public calls alone:

* every GET costs ~1.5 ms of Python in botocore (parameter validation, handlers, response
  parsing) before a byte moves, which dominates for small blobs;
* every PUT hashes its body again for the SigV4 signature, although the blob's sha256 is
  already known (it is the blob's key);
* urllib3's ``readinto`` reads into a temporary buffer and copies, so a downloaded tensor is
  copied once more than needed.

What it does, and what it relies on:

1. **Presigned reads** (:func:`open_range_presigned`): a GET is presigned (~0.3 ms, public
   ``generate_presigned_url``) and sent on the client's own HTTP session -- same connection
   pool, proxies and TLS settings -- reached through the private ``client._endpoint.
   http_session`` (botocore's ``URLLib3Session``; ``send(AWSRequest.prepare())`` with
   ``stream_output=True`` returns a response whose ``.raw`` is the urllib3 response). botocore's
   retry handler is not involved, so retries (connection errors, 5xx, SlowDown) are done here
   and errors become the same ``ClientError``/``BotoCoreError`` types as a botocore call's.
2. **Known-payload signing** (:func:`install_known_payload_signer`, :func:`known_payload`):
   the client's private ``_request_signer.get_auth_instance`` is wrapped (per client, nothing
   global) so that the plain ``S3SigV4Auth`` signer becomes :class:`_S3SigV4KnownPayload`,
   which signs with the sha256 the calling thread declared. It calls the private
   ``S3SigV4Auth._is_streaming_checksum_payload`` and ``_should_sha256_sign_payload`` to sign
   the known hash only where botocore itself would hash the payload. The hash declared is
   always the blob's own sha256, computed from the same buffers just before; AWS S3 and MinIO
   would refuse a body that did not match it (``XAmzContentSHA256Mismatch``).
3. **Streamed bodies** (:class:`PartsReader`): a blob made of a header and a tensor's memory
   is sent as a seekable file over those buffers, never joined into one bytes object. A
   file-like body also makes botocore send ``Expect: 100-continue``, so a conditional PUT of a
   blob that exists is answered 412 before the body is sent. (Public API only.)
4. **Reading into the caller's buffer** (:func:`fill_from_raw`): through the private
   ``raw._fp`` (the ``http.client.HTTPResponse`` under urllib3's response), whose
   ``readinto`` fills the caller's buffer in place.

If botocore or urllib3 change. Each dependency is checked where it is used -- (1) and (2) when
a client is built (:func:`attach`), (4) on every response -- and a missing one falls back to
the public path (``get_object``; botocore hashing the body itself; urllib3's ``readinto``)
with one warning per process naming what is missing. Behaviour stays correct, only slower.
``tests/test_s3_fastpath.py`` asserts that every part is engaged with the installed versions
and that each fallback works against the real S3 server, so an upgrade that breaks a part
fails that test instead of silently slowing the store down.
"""

from __future__ import annotations

import http.client
import io
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from botocore import exceptions as bce
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

log = logging.getLogger(__name__)

PRESIGN_TTL_S = 900
# The private names this module relies on, in one place (tests rename them to play a botocore
# or urllib3 that changed): attribute paths from a client, methods of S3SigV4Auth, and the
# urllib3 response's http.client response.
HTTP_SESSION_PATH = ("_endpoint", "http_session")
SIGNER_FACTORY_PATH = ("_request_signer", "get_auth_instance")
SIGNER_METHODS = ("_is_streaming_checksum_payload", "_should_sha256_sign_payload")
RAW_FP = "_fp"
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(what: str, consequence: str) -> None:
    """Log that a fast-path dependency is missing, once per process and dependency."""
    with _warned_lock:
        if what in _warned:
            return
        _warned.add(what)
    log.warning("S3 fast path: %s is missing in this botocore/urllib3; %s (correct, slower)", what, consequence)


@dataclass(frozen=True)
class FastPath:
    """Which parts of the fast path one client has, fixed when it is built.

    Attributes:
        http: the client's ``URLLib3Session`` for presigned GETs; None: reads use ``get_object``.
        known_payload: whether PUTs inside :func:`known_payload` sign the declared sha256.
    """

    http: Any | None
    known_payload: bool


def attach(client: Any) -> FastPath:
    """Install what this client can take of the fast path and say what it got."""
    return FastPath(http=http_session(client), known_payload=install_known_payload_signer(client))


def _lookup(obj: Any, path: tuple[str, ...]) -> Any | None:
    for name in path:
        obj = getattr(obj, name, None)
    return obj


def http_session(client: Any) -> Any | None:
    """The client's own HTTP session (``client._endpoint.http_session``), or None (warned)."""
    session = _lookup(client, HTTP_SESSION_PATH)
    if session is None or not callable(getattr(session, "send", None)):
        _warn_once("client." + ".".join(HTTP_SESSION_PATH), "reads go through get_object")
        return None
    return session


# ----------------------------------------------------------------------- streamed bodies


class PartsReader(io.RawIOBase):
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


# ----------------------------------------------------------------------- known-payload signing

# The sha256 of the body being sent by this thread, when the caller already knows it (a
# content-addressed blob): SigV4 needs exactly that hash, so botocore need not hash it again.
_KNOWN_PAYLOAD = threading.local()


class known_payload:  # noqa: N801 -- used as a context manager, like contextlib's
    """``with known_payload(sha256): client.put_object(...)`` signs ``sha256`` as the body's
    hash (on a client set up by :func:`install_known_payload_signer`; None: hash as usual)."""

    def __init__(self, sha256: str | None) -> None:
        self.sha256 = sha256

    def __enter__(self) -> None:
        _KNOWN_PAYLOAD.sha256 = self.sha256

    def __exit__(self, *exc: object) -> None:
        _KNOWN_PAYLOAD.sha256 = None


class _S3SigV4KnownPayload(S3SigV4Auth):
    """S3 SigV4 signer that signs with the payload hash the calling thread declared
    (:class:`known_payload`), where botocore would otherwise hash the body itself."""

    def payload(self, request: Any) -> str:
        known = getattr(_KNOWN_PAYLOAD, "sha256", None)
        if (
            known
            and not self._is_streaming_checksum_payload(request)
            and self._should_sha256_sign_payload(request)
        ):
            return known
        return super().payload(request)


def install_known_payload_signer(client: Any) -> bool:
    """Make this client's plain S3 SigV4 signer honour :class:`known_payload`.

    botocore has no public hook for a precomputed payload hash; this wraps the client's own
    signer factory. Returns False (and warns once) when the private attributes it needs are
    missing: the client then keeps hashing bodies itself.
    """
    signer = _lookup(client, SIGNER_FACTORY_PATH[:-1])
    original = getattr(signer, SIGNER_FACTORY_PATH[-1], None)
    missing = [f"S3SigV4Auth.{name}" for name in SIGNER_METHODS if not callable(getattr(S3SigV4Auth, name, None))]
    if original is None:
        missing.insert(0, "client." + ".".join(SIGNER_FACTORY_PATH))
    if missing:
        _warn_once(missing[0], "PUT bodies are hashed again for SigV4")
        return False

    def get_auth_instance(*args: Any, **kwargs: Any) -> Any:
        auth = original(*args, **kwargs)
        if type(auth) is S3SigV4Auth:
            auth.__class__ = _S3SigV4KnownPayload
        return auth

    setattr(signer, SIGNER_FACTORY_PATH[-1], get_auth_instance)
    return True


# ----------------------------------------------------------------------- presigned reads


@dataclass
class RangeResponse:
    """Headers of a ranged GET; ``fill(view)`` reads exactly ``length`` body bytes into view."""

    length: int
    content_range: str | None
    etag: str
    fill: Callable[[memoryview], None]
    close: Callable[[], None]
    """Drop the body unread (the connection is not reused)."""


def open_range_presigned(client: Any, http: Any, bucket: str, full: str, start: int | None, end: int | None,
                         if_match: str | None, *, where: str) -> RangeResponse:
    """GET bytes [start, end) of bucket key ``full`` (all of it if start is None) through a
    presigned URL on ``http`` (the client's session, :func:`http_session`).

    Sends the request once: the caller (``S3Store.get_buffer``) retries whole reads, so a hung
    server costs ``max_attempts`` requests, not that many squared. Raises the ClientError
    botocore would (from the S3 error document), or a connection error naming ``where`` (the
    endpoint) instead of the URL, which carries a signature.
    """
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": full}, ExpiresIn=PRESIGN_TTL_S
    )
    headers = {} if start is None else {"Range": f"bytes={start}-{end - 1}"}  # type: ignore[operator]
    if if_match:
        headers["If-Match"] = if_match
    request = AWSRequest(method="GET", url=url, headers=headers)
    request.stream_output = True  # else the session reads the whole body into .content
    try:
        resp = http.send(request.prepare())
    except (bce.ConnectionError, bce.HTTPClientError) as exc:
        raise _without_url(exc, where) from None
    if resp.status_code in (200, 206):
        h = resp.headers
        return RangeResponse(int(h["Content-Length"]), h.get("Content-Range"), h.get("ETag", ""),
                             lambda view: fill_from_raw(resp.raw, view), resp.raw.close)  # fmt: skip
    raise client_error(resp.status_code, resp.content, "GetObject")


def fill_from_raw(raw: Any, view: memoryview) -> None:
    """Read a urllib3 response body into ``view``, then return the connection to the pool.

    Reads through the underlying ``http.client`` response (``raw._fp``) when there is one (it
    fills the buffer in place; urllib3's own readinto reads into a temporary and copies).
    Raises IncompleteReadError when the body is shorter, ResponseStreamingError when it breaks.
    """
    fp = getattr(raw, RAW_FP, None)
    direct = fp is not None and hasattr(fp, "readinto") and hasattr(fp, "isclosed")
    if not direct:
        _warn_once(f"urllib3 HTTPResponse.{RAW_FP}", "response bodies are copied once more")
    direct = direct and not raw.headers.get("Content-Encoding")
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


def client_error(http_status: int, body: bytes, operation: str) -> bce.ClientError:
    """A botocore ClientError from an S3 XML error response (or a bare status)."""
    error_code, message = str(http_status), ""
    try:
        root = ElementTree.fromstring(body) if body else None
        if root is not None:
            error_code = root.findtext("Code") or error_code
            message = root.findtext("Message") or ""
    except ElementTree.ParseError:
        pass
    response = {"Error": {"Code": error_code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": http_status}}
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
