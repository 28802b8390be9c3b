"""Prefect client settings for the campaign's background requests: a busy server retried in milliseconds.

On the local SQLite server two writes that meet fail one of them at once (``SQLITE_BUSY`` on a
read-then-write transaction, whatever the busy timeout); the server answers 503 and Prefect's
client waits ``2 ** attempt`` seconds before trying again: 2 s for a collision that was over in
milliseconds. The flow runs created ahead of the steps (``flows/campaign/prestart.py``) are
written while the server records the running step's task runs, so some of those writes meet.

:data:`RETRY_SOON` is ``httpx`` settings for :func:`prefect.get_client`: a response hook gives a
503 that carries no ``Retry-After`` one from :data:`BUSY_RETRY_AFTER_S` (by attempt), which
Prefect's client honours in place of its back-off. The number of attempts is still Prefect's
(``PREFECT_CLIENT_MAX_RETRIES``, 5); the waits add up to about 42 s, against Prefect's 62 s, so
a server that stays busy fails a request about as late as before. Other status codes are left
to Prefect.
"""

from __future__ import annotations

from typing import Any

BUSY_RETRY_AFTER_S = (0.05, 0.25, 2.0, 8.0, 32.0)
"""Seconds to wait before retrying a 503, by attempt (the last repeats)."""

_ATTEMPTS = "rlhfless_busy_attempts"  # counter in the request's extensions (the same object is re-sent)


def retry_busy_soon(response: Any) -> None:
    """httpx response hook: a 503 without ``Retry-After`` gets one from :data:`BUSY_RETRY_AFTER_S`."""
    if response.status_code != 503 or "retry-after" in response.headers:
        return
    attempt = response.request.extensions.get(_ATTEMPTS, 0)
    response.request.extensions[_ATTEMPTS] = attempt + 1
    response.headers["Retry-After"] = str(BUSY_RETRY_AFTER_S[min(attempt, len(BUSY_RETRY_AFTER_S) - 1)])


RETRY_SOON: dict[str, Any] = {"event_hooks": {"response": [retry_busy_soon]}}
"""``httpx_settings`` for :func:`prefect.get_client`, for the campaign's background requests only.

Not for a :class:`prefect.context.SyncClientContext` around the steps: Prefect reuses a
context's client only for ``get_client()`` calls with equal settings, so every other call
inside (the task runs') would build a client of its own, with a connection and a CSRF request
each: measured, 50 ms more per step."""
