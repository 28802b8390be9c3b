"""Which failures the CLI reports in one line, and Prefect's console kept to that one line.

A failed action, a store that refuses, bad input found mid-run: ``rlhfless`` ends with one line
naming the error and its fix (``cli.main``). Prefect's flow engine logs the same exception
first, with its traceback, once per flow run it unwinds through (the step flow and the
campaign flow: about 225 lines through Prefect's own frames before the line that matters).
:func:`one_line_console` removes the traceback of those records from the console handlers
only; the message line stays, and Prefect's API handler still sends the whole record, so the
UI and a deployment's worker log keep every traceback. An exception of any other type is a
bug: the CLI re-raises it, and its traceback stays on the console too.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def reported_in_one_line(exc: BaseException) -> bool:
    """Whether ``main`` answers ``exc`` with one ``rlhfless: error:`` line (exit 2) rather
    than a traceback: bad input (``ValueError``, ``OSError``), the store's refusals, a failed
    action, the local Prefect API, the local pool's workers that would not start, or a step's
    flow run cancelled in Prefect (the campaign stopped after committing it)."""
    from actions.store import StoreError
    from flows.commands.local_api import LocalApiError
    from flows.invokers.base import ActionError
    from flows.invokers.local_pool import PoolStartFailed

    # a StepRunCancelled exists only once the campaign module is loaded; importing it here would
    # load Prefect (seconds) before any other command's error line
    campaign = sys.modules.get("flows.campaign.run")
    cancelled = (campaign.StepRunCancelled,) if campaign is not None else ()
    return isinstance(exc, (ValueError, OSError, StoreError, ActionError, LocalApiError, PoolStartFailed, *cancelled))


def _formatting_without_reported_tracebacks(format_record):
    """``Handler.format`` that formats a copy of a record whose exception the CLI reports in
    one line, without that exception: the record itself is shared with the other handlers
    (Prefect's API handler), so it is never changed."""

    def format_(record: logging.LogRecord) -> str:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and reported_in_one_line(exc):
            record = copy.copy(record)
            record.exc_info = None
            record.exc_text = None
        return format_record(record)

    return format_


def _console_handlers() -> list[logging.Handler]:
    """Handlers that write to a terminal stream (Prefect's console handler among them), on the
    root logger and on the loggers that do not propagate to it."""
    loggers = [logging.getLogger(), *list(logging.root.manager.loggerDict.values())]
    found: dict[int, logging.Handler] = {}
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # a PlaceHolder has none
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                found[id(handler)] = handler
    return list(found.values())


@contextmanager
def one_line_console() -> Iterator[None]:
    """Inside the block, console handlers format records without the tracebacks of exceptions
    the CLI reports in one line. Call after Prefect set up its logging (importing the flow
    does); handlers added later are not covered."""
    handlers = [(h, h.__dict__.get("format")) for h in _console_handlers()]
    for handler, _ in handlers:
        handler.format = _formatting_without_reported_tracebacks(handler.format)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for handler, before in handlers:
            if before is None:
                del handler.format  # the class's own method again
            else:
                handler.format = before  # type: ignore[method-assign]
