"""Prefect's temporary server dies with the CLI that started it, SIGKILL included: a watchdog
(flows/commands/server_lifeline.py) stops it when the CLI's end of a pipe closes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

try:
    from test_pool_lifetime import _cli_args, alive, wait_gone
except ImportError:  # tests/ imported as a package
    from tests.test_pool_lifetime import _cli_args, alive, wait_gone

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")


def test_sigkill_of_the_starter_stops_the_guarded_process():
    """A stand-in server (a sleeping child) outlives a SIGKILLed parent only without the guard."""
    code = textwrap.dedent("""
        import subprocess, sys, time
        from flows.commands.server_lifeline import guard_server
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        watchdog = guard_server(server.pid)
        print(server.pid, watchdog.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone(pids, 5.0) == []


def test_the_watchdog_never_signals_a_recycled_pid():
    from flows.commands.server_lifeline import _stop, start_time

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _stop(victim.pid, "1")  # another start time: the pid belongs to someone else now
        assert alive(victim.pid)
        _stop(victim.pid, start_time(victim.pid))
        assert wait_gone([victim.pid], 5.0) == []
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.slow
def test_sigkill_of_the_cli_mid_campaign_leaves_no_process_it_started(tmp_path):
    """The real thing: ``rlhfless train`` with its own temporary Prefect server (a fresh
    PREFECT_HOME, no PREFECT_API_URL) and the local pool, SIGKILLed while generation runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    slow = ["--set", "faults.latency_fraction=1", "--set", "faults.latency_s=3", "--set", "faults.actions=[generate]"]
    cli = subprocess.Popen(_cli_args(tmp_path) + slow, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = tmp_path / "out" / "logs"
    deadline = time.monotonic() + 480
    while not any("generate activation" in p.read_text() for p in logs.glob("worker-*.log")):
        assert cli.poll() is None, f"the CLI exited with {cli.returncode} before generating"
        assert time.monotonic() < deadline, "no generation started within 480 s"
        time.sleep(0.2)
    started = [p.pid for p in psutil.Process(cli.pid).children(recursive=True)]
    names = " ".join(" ".join(psutil.Process(p).cmdline()) for p in started)
    assert "uvicorn" in names and "actions.runtime.server" in names, names  # the server and the workers
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    assert wait_gone(started, 5.0) == []
