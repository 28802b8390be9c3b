"""A reader gone from the command's stdout (``rlhfless status | head -1``): the command ends
quietly with status 141, as a shell reports a process killed by SIGPIPE, rather than with an
error about a broken pipe, or Python's "Exception ignored" notice and status 120 at exit.
Python ignores SIGPIPE, so the write raises BrokenPipeError instead; any other broken pipe (a
connection to a server) stays an error."""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable

CLOSED = 141


def reader_gone() -> bool:
    """Whether stdout is a pipe with no reader left (its write end polls as an error)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # not a file descriptor (a test's capture)
        return False


def quiet_exit() -> int:
    """Point stdout at /dev/null, so that the exit's own flush does not fail again; 141."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return CLOSED


def closed_or(exc: BrokenPipeError, failed: Callable[[BaseException], int]) -> int:
    """141 where stdout's reader is gone, else ``failed(exc)`` (another pipe broke)."""
    return quiet_exit() if reader_gone() else failed(exc)


def flushed(status: int, failed: Callable[[BaseException], int]) -> int:
    """``status`` once stdout is flushed: here, not at exit, where a reader gone would make
    Python print an "Exception ignored" notice and exit 120."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): nothing to flush
        return status
    try:
        sys.stdout.flush()
    except BrokenPipeError as exc:
        return closed_or(exc, failed)
    return status
