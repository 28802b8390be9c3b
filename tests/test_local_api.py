"""Prefect's local API start is serialised per PREFECT_HOME (flows/commands/local_api.py): two
first-ever runs never set up the same fresh database at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows.commands.local_api import LOCK_NAME, LocalApiError, exclusive, start_local_api

REPO = Path(__file__).resolve().parents[1]
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flows.commands.local_api import exclusive
    lock, log, hold = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    print("ready", flush=True)
    with exclusive(lock, timeout_s=60, what="testing"):
        log.write_text(f"{time.monotonic()}\\n")
        time.sleep(hold)
        log.write_text(log.read_text() + f"{time.monotonic()}\\n")
""")


def _holder(lock: Path, log: Path, hold_s: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(log), str(hold_s)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_two_processes_never_hold_the_start_lock_together(tmp_path: Path) -> None:
    lock = tmp_path / "home" / LOCK_NAME  # the home directory does not exist yet: a fresh PREFECT_HOME
    procs = [_holder(lock, tmp_path / f"log{i}", 0.5) for i in range(2)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    (a0, a1), (b0, b1) = (tuple(map(float, (tmp_path / f"log{i}").read_text().split())) for i in range(2))
    assert a1 <= b0 or b1 <= a0, f"held together: {a0:.2f}-{a1:.2f} and {b0:.2f}-{b1:.2f}"


def test_a_held_lock_times_out_with_one_line_naming_the_fix(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_NAME
    with exclusive(lock, timeout_s=5, what="starting"):
        start = time.monotonic()
        with pytest.raises(LocalApiError) as info:
            with exclusive(lock, timeout_s=0.3, what="starting Prefect's local server"):
                pass
    assert time.monotonic() - start < 5
    text = str(info.value)
    assert "\n" not in text and str(lock) in text and "set PREFECT_API_URL" in text


def test_a_killed_holder_releases_the_lock(tmp_path: Path) -> None:
    lock, log = tmp_path / LOCK_NAME, tmp_path / "log"
    proc = _holder(lock, log, 60)
    deadline = time.monotonic() + 30
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with exclusive(lock, timeout_s=2, what="starting"):
        pass


def test_nothing_is_started_or_locked_with_a_remote_api(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api", PREFECT_HOME: str(tmp_path / "home")}):
        assert start_local_api() is None
    assert not (tmp_path / "home").exists()


CONCURRENT = textwrap.dedent("""
    from flows.commands.local_api import start_local_api
    from prefect.client.orchestration import get_client
    start_local_api()
    with get_client(sync_client=True) as client:
        print("status", client.hello().status_code, flush=True)
""")


@pytest.mark.slow
def test_two_first_ever_starts_on_a_fresh_prefect_home_both_succeed(tmp_path: Path) -> None:
    """The real thing: two processes, one fresh PREFECT_HOME, no PREFECT_API_URL (~1-2 min on
    2 loaded cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=540) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0 and "status 200" in out, err[-2000:]
        assert "Traceback" not in err


def test_the_temporary_sqlite_server_runs_without_its_event_persister(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    from flows.commands.local_api import local_server_env

    name = "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"
    monkeypatch.delenv(name, raising=False)
    assert local_server_env() == {name: "false"}  # the default database is SQLite
    monkeypatch.setenv(name, "true")  # the user's choice stands
    assert local_server_env() == {}
    monkeypatch.delenv(name)
    with temporary_settings({PREFECT_SERVER_DATABASE_CONNECTION_URL: "postgresql+asyncpg://u:p@db:5432/prefect"}):
        assert local_server_env() == {}  # no SQLite contention: the events feed stays
