"""botocore failures of the S3 backend: how to classify them, back off, and report them.

Every failure leaves the backend as one :class:`~actions.store.protocol.StoreError`
subclass with a one-line message that names the operation, the target and the endpoint, and
says what to check. Secrets never appear: key ids are masked (``AKIA****``), every text goes
through :func:`actions.store.credentials.redact`, and an exception whose text may carry a
(presigned) URL is named by its type only.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass

from botocore import exceptions as bce

from actions.store.credentials import redact
from actions.store.protocol import (
    BucketNotFound,
    StoreAccessDenied,
    StoreCredentialsError,
    StoreError,
    StoreUnreachable,
)

CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
#: Failures while reading a response body: the request succeeded, the stream broke.
STREAM_ERRORS = (bce.ResponseStreamingError, bce.IncompleteReadError, bce.ReadTimeoutError,
                 bce.ConnectionClosedError)  # fmt: skip


def code(exc: bce.ClientError) -> str:
    """The S3 error code of a ClientError (``NoSuchKey``, ``PreconditionFailed``, ``"404"``...)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def status(exc: bce.ClientError) -> int:
    """The HTTP status of a ClientError (0 when unknown)."""
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_precondition_failed(exc: bce.ClientError) -> bool:
    """An ``If-Match`` / ``If-None-Match`` condition did not hold (412)."""
    return code(exc) == "PreconditionFailed" or status(exc) == 412


def retried(exc: bce.ClientError) -> bool:
    """Whether botocore sent the request more than once before this answer (its
    ``RetryAttempts``): an earlier attempt may have been carried out with its reply lost."""
    return bool(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))


#: Error codes of a request the server refused for now (throttling, a timeout of its own).
TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "Throttling", "ThrottlingException", "RequestThrottled",
                   "ServiceUnavailable", "InternalError"}


def is_transient(exc: Exception) -> bool:
    """Whether a failed request may succeed when sent again: a connection or read failure, a
    broken or short body, a 5xx or throttling answer (botocore's "standard" retry rules)."""
    if isinstance(exc, bce.ClientError):
        return status(exc) >= 500 or status(exc) == 429 or code(exc) in TRANSIENT_CODES
    return isinstance(exc, (bce.ConnectionError, bce.HTTPClientError, bce.IncompleteReadError))


def is_not_implemented(exc: bce.ClientError) -> bool:
    """The server does not implement a conditional header."""
    return code(exc) in ("NotImplemented", "InvalidArgument") or status(exc) == 501


def backoff(attempt: int, base: float = 0.2, cap: float = 5.0) -> None:
    """Sleep before retry ``attempt + 1``: full jitter, exponential up to ``cap`` seconds."""
    time.sleep(random.uniform(0, min(cap, base * 2**attempt)))


@dataclass(frozen=True)
class ErrorContext:
    """What an error message may say about the store: nothing secret.

    Attributes:
        where: the endpoint URL, or ``"AWS S3"``.
        bucket: the bucket name.
        uri: the store URI (``s3://bucket/prefix``).
        key_id: the masked access key id.
        connect_timeout, read_timeout: seconds, to name the one that expired.
        endpoint_from: the setting the endpoint came from, named where the endpoint is to blame:
            ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (also when both are unset: AWS S3),
            or the argument of the code that opened the store.
        session_token: whether a session token (``AWS_SESSION_TOKEN``) is sent with the keys; its
            value is never held here.
    """

    where: str
    bucket: str
    uri: str
    key_id: str
    connect_timeout: float
    read_timeout: float
    endpoint_from: str = "AWS_ENDPOINT_URL"
    session_token: bool = False


def _connection_reason(exc: Exception, ctx: ErrorContext) -> str:
    text = str(getattr(exc, "kwargs", {}).get("error", exc)).lower()
    if isinstance(exc, bce.ConnectTimeoutError):
        return f"no answer within the {ctx.connect_timeout:g} s connect timeout"
    if isinstance(exc, bce.ReadTimeoutError):
        return f"no response within the {ctx.read_timeout:g} s read timeout"
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text or "resolution" in text:
        return "host name not found"
    if isinstance(exc, bce.SSLError):
        return "TLS handshake failed"
    return "connection failed"


def translate(exc: Exception, op: str, ctx: ErrorContext, target: str, tries: str = "") -> StoreError:
    """A one-line StoreError for a botocore failure of ``op`` on ``target`` (an ``s3://``
    bucket key, or the store URI); never carries a secret. ``tries`` (e.g. ``"5 attempts in
    12.3 s"``) says how long the caller kept trying; it is shown in parentheses after the reason."""
    where = ctx.where
    note = f" ({tries})" if tries else ""
    if isinstance(exc, bce.NoCredentialsError):
        err: StoreError = StoreCredentialsError(
            f"no S3 credentials found for bucket {ctx.bucket!r}; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    elif isinstance(exc, (bce.ConnectionError, bce.HTTPClientError)) and not isinstance(
        exc, bce.ResponseStreamingError
    ):
        err = StoreUnreachable(
            f"cannot reach S3 endpoint {where} : {_connection_reason(exc, ctx)}{note}; check {ctx.endpoint_from}"
        )
    elif isinstance(exc, bce.ClientError):
        err = _client_error(exc, op, ctx, target, note)
    else:  # the exception text may carry a (presigned) URL: name the type only
        err = StoreError(f"S3 {op} on {target} failed at {where}: {type(exc).__name__}{note}")
    return type(err)(redact(str(err)))


def _expected_region(message: str) -> str | None:
    """The region a wrong-region reply names (AWS and MinIO: "... expecting 'eu-central-1'").

    >>> _expected_region("the region 'us-east-1' is wrong; expecting 'eu-central-1'")
    'eu-central-1'
    """
    found = re.search(r"expecting '([a-z0-9-]+)'", message)
    return found.group(1) if found else None


def _client_error(exc: bce.ClientError, op: str, ctx: ErrorContext, target: str, note: str) -> StoreError:
    where, key_id = ctx.where, ctx.key_id
    error_code, http_status = code(exc), status(exc)
    message = exc.response.get("Error", {}).get("Message", "")
    region = (exc.response.get("Error", {}).get("Region") or _expected_region(message)
              if error_code == "AuthorizationHeaderMalformed" else None)
    if region:  # signed for another region: not the keys
        return StoreCredentialsError(
            f"S3 at {where} expects requests signed for region {region!r} ({error_code}); set AWS_REGION={region}"
        )
    if error_code in CREDENTIAL_CODES:
        # a session token the server refuses is answered like a wrong key: name it, never its value
        keys = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        if ctx.session_token:
            keys += ("/AWS_SESSION_TOKEN (it is set: a temporary token goes with the key pair it was issued "
                     "with, and expires; unset it for long-term keys)")
        return StoreCredentialsError(
            f"S3 rejected the credentials (key {key_id}) for bucket {ctx.bucket!r} at {where} "
            f"({error_code}); check {keys}"
        )
    if error_code == "NoSuchBucket":
        return BucketNotFound(f"bucket {ctx.bucket!r} does not exist at {where}; create it or fix store.uri")
    if op == "check" and (not error_code or error_code.isdigit()):
        # A GET answered without an S3 error document (a bare status, or XML such as an HTML
        # page that names no error code): something else listens there.
        return StoreError(
            f"S3 endpoint {where} answered HTTP {http_status} without an S3 error to a bucket "
            f"listing; is {ctx.endpoint_from} an S3 server?"
        )
    if error_code == "AccessDenied" or http_status == 403:
        bare = not error_code or error_code.isdigit()  # HEAD: a status, no error document
        hint = (
            " (a HEAD response carries no reason: run store.check() to tell wrong"
            " credentials from a policy denial)"
        ) if bare else ""
        return StoreAccessDenied(
            f"S3 denied {op} on {target} for key {key_id}; the bucket policy must allow it "
            f"(see infra/minio/policy-actions.json){hint}"
        )
    return StoreError(f"S3 {op} on {target} failed at {where}: {error_code or http_status} {message}".rstrip() + note)
