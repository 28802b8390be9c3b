"""The campaign's default progress output: :func:`print_line`."""

from __future__ import annotations

import sys

_PRINT = print
"""The builtin ``print``, kept before a flow's ``log_prints`` replaces it with a logger call that
the CLI's WARNING log level would drop."""


def print_line(line: str) -> None:
    """Print ``line`` on standard output and, inside a Prefect flow run, log it to the run's log
    at INFO, where the UI and the API show a deployment run's progress.

    The default of every ``progress``/``warn`` argument in the campaign. ``print`` itself as a
    default wrote to the process's stdout only, never the run's log; a ``print`` replaced by
    ``log_prints`` would log only, and ``rlhfless train`` (Prefect's logging at WARNING) would
    show nothing.
    """
    _PRINT(line, flush=True)
    if "prefect" not in sys.modules:  # no flow ran in this process: nothing to log to
        return
    from prefect.context import FlowRunContext
    from prefect.logging import get_run_logger

    if FlowRunContext.get() is not None:
        get_run_logger().info(line)
