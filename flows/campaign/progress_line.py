"""The campaign's default progress output: :func:`print_line`."""

from __future__ import annotations


def print_line(line: str) -> None:
    """Print ``line`` through the ``print`` of the moment of the call.

    The default of every ``progress``/``warn`` argument in the campaign. ``print`` itself as a
    default would be the function bound when the module was imported, which Prefect's
    ``log_prints`` (it replaces ``builtins.print`` while a flow runs) never sees: a deployment
    run's progress lines and warnings would reach the worker's stdout only, not the run's log.
    """
    print(line)
