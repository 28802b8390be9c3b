"""Ctrl-C and SIGTERM reach the main thread at once, whatever it is waiting on.

Python runs signal handlers in the main thread, but the kernel delivers a signal sent to the
process to any thread that does not block it. Delivered to another thread (an HTTP client's, a
lease renewer's, Prefect's), it only marks the handler due: a main thread blocked in a wait (a
lock, a socket read, a sleep) runs it when the wait ends, minutes later, and `timeout` or a
container stop then kills the process before its clean-up. Threads started after
:func:`route_stop_signals` block SIGINT and SIGTERM, so the kernel delivers them to the main
thread, whose wait returns at once (PEP 475) and runs the handler. Threads started before it are
not covered: call it first.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def route_stop_signals() -> None:
    """Make every thread the ``threading`` module starts from now on block SIGINT and SIGTERM
    (its first profile event does, then removes itself). Idempotent; the main thread keeps
    receiving them."""
    threading.setprofile(_block_in_new_thread)


def _block_in_new_thread(frame: Any, event: str, arg: Any) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    sys.setprofile(None)  # once per thread: no profiling cost after its first call
