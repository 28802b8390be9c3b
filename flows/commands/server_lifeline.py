"""A watchdog that stops Prefect's temporary server when the process that started it dies.

Prefect starts its temporary API server (``SubprocessASGIServer``) as a child process and
stops it from an ``atexit`` hook, which never runs when the CLI is killed (SIGKILL, an OOM
kill): the server was reparented to PID 1 and kept its port and about 200 MB for good.

:func:`guard_server` starts this module as a small process (``python -m
flows.commands.server_lifeline``) holding the read end of a pipe whose write end only the CLI
holds, as the pool's workers do (``actions.runtime.lifeline``). However the CLI ends, the
kernel closes that write end; the watchdog reads end-of-file, stops the server (SIGTERM, then
SIGKILL after a grace period) and exits. It checks the server's start time before signalling,
so a recycled pid is never hit. It runs in a session of its own (and ignores SIGINT besides):
a Ctrl-C, ``timeout``'s SIGTERM or a hang-up sent to the CLI's whole process group must not
take the watchdog down before the server, which runs in a session of its own too
(``flows/commands/guarded_server.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

GRACE_S = 3.0
_keep: list[int] = []  # the write end of each watchdog's pipe: open for this process's whole life


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of ``/proc/<pid>/stat``), None if gone
    or unknown (no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def guard_server(server_pid: int) -> subprocess.Popen | None:
    """Start a watchdog that stops ``server_pid`` once this process is gone. None where
    ``/proc`` is missing (the start time cannot be checked, so nothing is signalled)."""
    started = start_time(server_pid)
    if started is None:
        return None
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flows.commands.server_lifeline", "--fd", str(read_end),
                                 "--pid", str(server_pid), "--start-time", started],
                                pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _keep.append(write_end)
    return proc


def _stop(pid: int, started: str) -> None:
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        if start_time(pid) != started:
            return  # gone (or its pid reused): nothing of ours to stop
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and start_time(pid) == started:
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="stop a process when the pipe's writer is gone")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--start-time", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while os.read(args.fd, 64):
            pass
    except OSError:
        pass
    _stop(args.pid, args.start_time)


if __name__ == "__main__":
    main()
