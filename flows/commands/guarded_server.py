"""Prefect's temporary API server, started apart from the CLI's signals and guarded from birth.

Prefect's ``SubprocessASGIServer`` starts uvicorn as a plain child, which has two faults for a
command line (both found by killing ``rlhfless train`` part-way):

- The server shared the CLI's process group, so a Ctrl-C at the terminal (SIGINT to the whole
  group) or ``timeout`` (SIGTERM to the whole group) stopped it together with the CLI. The
  flow, unwinding, then reported its crash to a dead API: Prefect's client retried with backoff
  for about 75 s and its final ``httpx.ConnectError`` (a 100-line traceback, exit status 1)
  replaced the interrupt. :class:`GuardedServer` starts uvicorn in a session of its own, so no
  signal sent to the CLI's group reaches it: the flow records its crash, and the server is
  stopped afterwards, in order, by Prefect's ``atexit`` hook.
- The watchdog that stops the server when the CLI dies (``flows/commands/server_lifeline.py``)
  was attached only once the server answered, which on a fresh ``PREFECT_HOME`` (database
  creation and migration) takes 10 s or more: a SIGKILL in that window left uvicorn listening
  for good. Here it is attached right after the server's process starts, and again for each
  restart (Prefect starts another on exit status 3, a port taken meanwhile).

The command is Prefect 3.8's own (``SubprocessASGIServer._run_uvicorn_command``; the project
pins ``prefect<3.9``), with a new session and no terminal input added;
``tests/test_server_lifetime.py`` checks that the two stay the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

from flows.commands.server_lifeline import guard_server


def uvicorn_command(port: int) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment Prefect 3.8 starts its temporary server with."""
    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    return argv, env


class GuardedServer(SubprocessASGIServer):
    """A ``SubprocessASGIServer`` whose uvicorn runs in its own session under a watchdog.

    Prefect keeps one server per process (``SubprocessASGIServer._instances``, shared with this
    subclass), so a flow's client started afterwards finds and uses this one.
    """

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        assert self.port is not None, "start() picks the port first"
        argv, env = uvicorn_command(self.port)
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            guard_server(proc.pid)
        except BaseException:  # unguarded it could outlive us: never leave it running
            proc.kill()
            proc.wait()
            raise
        return proc
