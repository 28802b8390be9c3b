"""Mutual authentication between the local pool and its workers, without sending a secret.

Each worker has its own secret, which only the pool and that worker know (it travels on the
worker's control pipe, ``lifeline.py``). No request carries it. Instead:

* **request**: ``Authorization: RLHFless-HMAC <nonce>:<mac>``, where ``nonce`` is fresh per
  request and ``mac = HMAC-SHA256(secret, "request" | nonce | method | path)``. The worker
  accepts a nonce once (a replayed request gets 401) and answers anything else with 401.
* **response**: ``X-RLHFless-Reply-MAC: HMAC-SHA256(secret, "response" | nonce | status | body)``.
  The pool accepts a reply only with this header right, so a process that answers on a dead
  worker's freed port can forge no result: it sees one nonce and one request MAC, neither of
  which any worker accepts again (each worker checks its own secret, and nonces are single use).

What this does not cover: the request body is not MAC'd (a man in the middle on loopback, who
could rewrite it, could read the process memory anyway); the runtime images under OpenWhisk
run without a secret, where the invoker's private container network is the boundary.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict

SCHEME = "RLHFless-HMAC"
REPLY_HEADER = "X-RLHFless-Reply-MAC"
MAX_NONCES = 4096
"""Nonces a worker remembers (a replay within the last this many requests is refused)."""


def _mac(secret: str, *parts: str | bytes) -> str:
    digest = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))  # length-prefixed: no ambiguity between parts
        digest.update(data)
    return digest.hexdigest()


def sign_request(secret: str, method: str, path: str) -> tuple[str, str]:
    """(nonce, ``Authorization`` header value) for one request."""
    nonce = secrets.token_hex(16)
    return nonce, f"{SCHEME} {nonce}:{_mac(secret, 'request', nonce, method.upper(), path)}"


def reply_mac(secret: str, nonce: str, status: int, body: bytes) -> str:
    """The ``X-RLHFless-Reply-MAC`` value of a reply to the request with ``nonce``."""
    return _mac(secret, "response", nonce, str(status), body)


def reply_is_authentic(secret: str, nonce: str, status: int, body: bytes, mac: str | None) -> bool:
    """Whether a reply carries the right MAC (constant-time comparison)."""
    return mac is not None and hmac.compare_digest(mac.encode(), reply_mac(secret, nonce, status, body).encode())


class NonceCheck:
    """A worker's side: checks request MACs and refuses nonces it has seen."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, header: str | None, method: str, path: str) -> str | None:
        """The request's nonce if ``header`` authenticates it (first use), else None."""
        scheme, _, token = (header or "").partition(" ")
        nonce, _, mac = token.partition(":")
        if scheme != SCHEME or not nonce or len(nonce) > 64 or not mac:
            return None
        expected = _mac(self.secret, "request", nonce, method.upper(), path)
        if not hmac.compare_digest(mac.encode("utf-8", "surrogateescape"), expected.encode()):
            return None
        with self._lock:
            if nonce in self._seen:
                return None
            self._seen[nonce] = None
            if len(self._seen) > MAX_NONCES:
                self._seen.popitem(last=False)
        return nonce
