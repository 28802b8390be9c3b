"""Which failures of a lease renewal end the run, and which are tried again.

A renewal is one small compare-and-swap every ``ttl_s / 3``; a missed one costs nothing while
the lease has time left, so anything that may pass by itself is retried: the store's own
transient errors (``actions.runtime.errors.is_transient``: timeouts, refused or reset
connections, 429/503) and an interrupted or busy local write. A failure that will not pass (a
read-only or full file system, denied access, rejected credentials) would only make the run
fail later at its next check, with an error about the lease instead of the store: it ends the
lease at once, and the run stops naming it.
"""

from __future__ import annotations

import errno

from actions.runtime.errors import is_transient, one_line

RETRIED_ERRNOS = frozenset({errno.EINTR, errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.EIO})
"""Local file-system errors a later renewal may not meet."""


def renewal_failure(exc: BaseException) -> str | None:
    """None for a failure worth retrying; else one line naming it (type and message)."""
    if is_transient(exc):
        return None
    if isinstance(exc, OSError) and exc.errno in RETRIED_ERRNOS:
        return None
    return one_line(f"{type(exc).__name__}: {exc}", 300)
