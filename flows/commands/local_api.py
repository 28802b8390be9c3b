"""Starting Prefect's local API safely when several ``rlhfless`` processes start at once.

Without ``PREFECT_API_URL``, each process that runs a flow starts its own temporary Prefect
API server on the SQLite database in ``PREFECT_HOME``, creating and migrating that database on
first use. Two first-ever runs that start together migrate the same fresh database at once and
die with raw tracebacks (or time out on a loaded machine). :func:`start_local_api` takes an
exclusive lock file in ``PREFECT_HOME`` around the start, so the first process creates the
database while the second waits, then starts its own server on the finished database; the
flow later reuses the started server (Prefect keeps one per process). A start that still fails
is one line naming ``PREFECT_HOME`` and the fix.

The temporary server runs without its event persister (:func:`local_server_env`): on SQLite,
the persister's batched writes of the events feed make the next flow-run or task-run write fail
with ``SQLITE_BUSY``; the server answers 503 and Prefect's client retries after 2 s. That cost
about 2 s on every other step of a campaign. Flow runs, task runs, their states, logs and
artifacts are recorded all the same; only the server's events feed stays empty. Set
``PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED=true`` to keep it; a Postgres-backed server
(``infra/prefect``) has no such contention and keeps its own settings.

The server runs in a session of its own, so a Ctrl-C or ``timeout`` sent to the CLI's process
group leaves it up while the flow records its crash, and it dies with this process even when
no ``atexit`` hook runs (SIGKILL, during its start too): a watchdog process, attached as soon as
the server's process exists, stops it once this one is gone (``flows/commands/guarded_server.py``,
``flows/commands/server_lifeline.py``).

What this does not cover: a remote API (``PREFECT_API_URL`` set: nothing to start or lock)
and platforms without ``fcntl`` (no lock; Prefect's own behaviour).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".rlhfless-local-api.lock"
DEFAULT_TIMEOUT_S = 300.0


class LocalApiError(RuntimeError):
    """Prefect's local API could not be started (one line, with the fix)."""


@contextmanager
def exclusive(path: Path, *, timeout_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block.

    The lock belongs to the open file, so it also ends when the process dies: a killed
    starter never leaves the next one waiting.

    Raises:
        LocalApiError: another process held it for more than ``timeout_s`` seconds.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LocalApiError(f"another process has been {what} (lock {path}) for over {timeout_s:.0f} s; "
                                        "wait for it to finish, or set PREFECT_API_URL to a running server") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def local_server_env() -> dict[str, str]:
    """Settings for a temporary server on SQLite that the user has not set (module docstring)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    on_sqlite = url is None or url.get_secret_value().startswith("sqlite")
    name = "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"
    return {name: "false"} if on_sqlite and name not in os.environ else {}


def start_local_api(timeout_s: float = DEFAULT_TIMEOUT_S) -> str | None:
    """Start this process's temporary Prefect API under the ``PREFECT_HOME`` lock.

    Returns:
        The API URL, or None when ``PREFECT_API_URL`` is set (or temporary servers are
        disabled, where Prefect reports its own error).

    Raises:
        LocalApiError: the server did not start (one line: the cause and the fix).
    """
    from prefect.settings import (PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_EPHEMERAL_ENABLED,
                                  PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    from flows.commands.guarded_server import GuardedServer
    from flows.commands.server_lifeline import guard_server

    home = Path(PREFECT_HOME.value()).expanduser()
    os.environ.update(local_server_env())  # read by the server's subprocess only
    server = GuardedServer()  # one per process: the flow's client reuses this one
    # A first start creates and migrates the database: allow more than Prefect's default 20 s.
    startup_s = int(max(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), timeout_s / 2))
    with exclusive(home / LOCK_NAME, timeout_s=timeout_s, what="starting Prefect's local server in PREFECT_HOME"):
        try:
            server.start(timeout=startup_s)
        except Exception as exc:  # Prefect raises RuntimeError with the server's whole output
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise LocalApiError(f"Prefect's local server did not start (PREFECT_HOME={home}): {first}; "
                                "retry, or set PREFECT_API_URL to a running server") from None
    if not isinstance(server, GuardedServer) and server.server_process is not None:
        guard_server(server.server_process.pid)  # Prefect's own, started earlier in this process: guard it now
    return server.api_url
