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
    assert os.getsid(pids[1]) == pids[1]  # the watchdog: no signal to the CLI's group reaches it
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


def _prefect_env(home: Path) -> dict[str, str]:
    """This process's environment without Prefect settings (no PREFECT_API_URL: each process
    starts its own temporary server), with ``home`` as PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING")
    return env


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_server_command_is_prefects_own(monkeypatch):
    """GuardedServer repeats Prefect's uvicorn command (it only adds a session and no stdin):
    a Prefect upgrade that changes the command fails here, not in the field."""
    import prefect.server.api.server as prefect_server

    from flows.commands.guarded_server import uvicorn_command

    seen = {}
    monkeypatch.setattr(prefect_server.subprocess, "Popen", lambda **kw: seen.update(kw))
    stand_in = prefect_server.SubprocessASGIServer.__new__(prefect_server.SubprocessASGIServer, port=-1)
    prefect_server.SubprocessASGIServer._instances.pop(-1, None)  # never seen by the next server
    stand_in.port = 8765
    prefect_server.SubprocessASGIServer._run_uvicorn_command(stand_in)
    assert (seen["args"], seen["env"]) == uvicorn_command(8765)


GUARDED_AT_BIRTH = textwrap.dedent("""
    import sys, time
    import flows.commands.guarded_server as guarded
    guarded.uvicorn_command = lambda port: ([sys.executable, "-c", "import time; time.sleep(600)"], None)
    server = guarded.GuardedServer.__new__(guarded.GuardedServer, port=8765)
    server.port = 8765
    print(server._run_uvicorn_command().pid, flush=True)  # no start(): nothing waits for it to answer
    time.sleep(600)
""")


def test_the_server_is_guarded_from_its_first_moment_in_a_session_of_its_own():
    """Prefect waits for a new server to answer before it returns (seconds, on a fresh
    PREFECT_HOME); a SIGKILL in that wait must not leave the server behind. And a signal to the
    CLI's process group (Ctrl-C, ``timeout``) must not reach it."""
    parent = subprocess.Popen([sys.executable, "-c", GUARDED_AT_BIRTH], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    server = int(parent.stdout.readline())
    try:
        assert alive(server) and os.getsid(server) == server != os.getsid(parent.pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_gone([server], 10.0) == []
    finally:
        _kill_all([parent.pid, server])


STARTS = "from flows.commands.local_api import start_local_api; start_local_api(); print('started', flush=True)"


def test_sigkill_while_the_server_starts_leaves_no_server(tmp_path):
    """The real thing: a fresh PREFECT_HOME, so the server creates and migrates its database
    (seconds) before it answers, and the process that starts it is SIGKILLed meanwhile."""
    starter = subprocess.Popen([sys.executable, "-c", STARTS], env=_prefect_env(tmp_path / "home"),
                               stdout=subprocess.DEVNULL)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not servers:
            assert starter.poll() is None, f"the starter exited with {starter.returncode}"
            assert time.monotonic() < deadline, "no server process within 120 s"
            servers = [p.pid for p in psutil.Process(starter.pid).children() if "uvicorn" in " ".join(p.cmdline())]
            time.sleep(0.05)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        assert wait_gone(servers, 15.0) == []
    finally:
        _kill_all([starter.pid, *servers])


GROUP_STOP = textwrap.dedent("""
    import faulthandler, signal, sys, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks if it hangs
    from prefect import flow
    from flows.commands.cli import Terminated, sigterm_unwinds, stopped
    from flows.commands.local_api import start_local_api

    @flow
    def waits():
        print("running", flush=True)
        time.sleep(300)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's children ignore it
    try:
        with sigterm_unwinds():  # as `rlhfless train` runs its flow
            start_local_api()
            waits()
    except (KeyboardInterrupt, Terminated) as exc:
        sys.exit(stopped(exc, "r"))
""")


def faulthandler_dump(proc: subprocess.Popen) -> None:
    """Have a hung GROUP_STOP process write every thread's stack to its stderr, then kill it."""
    try:
        children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:  # it ended meanwhile
        children = []
    proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    _kill_all([proc.pid, *children])


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("prefect-home")  # the second test reuses the first's database


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "timeout"])
def test_a_signal_to_the_whole_process_group_stops_the_run_in_seconds(shared_home, sig):
    """A terminal's Ctrl-C and ``timeout`` signal the whole process group. The flow records its
    crash on a server that is still up (it once died of the same signal, and Prefect's client
    retried it for ~75 s before a ConnectError traceback replaced the interrupt); then the
    process exits 130 or 143 with one line of its own, leaving nothing running."""
    proc = subprocess.Popen([sys.executable, "-c", GROUP_STOP], env=_prefect_env(shared_home), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    started: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "running", proc.communicate(timeout=60)[1][-3000:]
        started = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        t0 = time.monotonic()
        os.killpg(proc.pid, sig)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # say where it hung: its threads' stacks and its output
            faulthandler_dump(proc)
            pytest.fail(f"still running 120 s after {sig.name}; its stderr:\n{proc.communicate()[1][-6000:]}")
        took = time.monotonic() - t0
        assert proc.returncode == 128 + sig, err[-3000:]
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("rlhfless: "), err[-3000:]
        assert took < 30, f"{took:.0f} s to stop"  # ~2 s here; it was ~78 s
        assert wait_gone(started, 15.0) == []
    finally:
        _kill_all([proc.pid, *started])
