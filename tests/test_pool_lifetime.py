"""Pool workers die with the process that started them, by either of two independent means:
the control pipe's end-of-file (every POSIX system) and Linux's parent-death signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    """The pids still alive after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def _server_argv(*extra: str) -> list[str]:
    return [sys.executable, "-m", "actions.runtime.server", "--host", "127.0.0.1", "--port", "0", *extra]


def _spawn_reporting(tmp_path: Path, code: str) -> tuple[subprocess.Popen, list[int]]:
    """Run ``code`` in a child Python that prints worker pids on one line, then sleeps."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(code))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.getcwd()))
    line = parent.stdout.readline()
    assert line.strip(), f"the parent exited with {parent.wait()} before starting its workers"
    return parent, [int(p) for p in line.split()]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_sigkill_of_the_pool_process_leaves_no_worker(tmp_path):
    parent, pids = _spawn_reporting(tmp_path, f"""
        import time
        from flows.invokers.local_pool import LocalPoolInvoker
        pool = LocalPoolInvoker(3, log_dir={str(tmp_path / 'logs')!r})
        print(*pool.worker_pids(), flush=True)
        time.sleep(600)
    """)
    assert len(pids) == 3 and all(alive(p) for p in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone(pids, 5.0) == []


def test_a_closed_control_pipe_stops_the_worker(tmp_path):
    """The portable lifeline alone (no --parent-pid): end-of-file on the pipe ends the worker."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"a-secret\n")
    proc = subprocess.Popen(_server_argv("--control-fd", str(read_fd)), pass_fds=(read_fd,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(read_fd)
    time.sleep(0.5)
    assert proc.poll() is None
    os.close(write_fd)
    assert proc.wait(timeout=5) == 0
    assert "control pipe closed" in proc.stderr.read()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_the_parent_death_signal_alone_stops_the_worker(tmp_path):
    """Linux's lifeline alone (no control pipe): the worker is killed with its parent."""
    parent, pids = _spawn_reporting(tmp_path, f"""
        import os, subprocess, time
        argv = {_server_argv()!r} + ["--parent-pid", str(os.getpid())]
        worker = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        time.sleep(1.0)  # past its prctl
        print(worker.pid, flush=True)
        time.sleep(600)
    """)
    assert alive(pids[0])
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_gone(pids, 5.0) == []


def test_a_worker_whose_parent_is_already_gone_exits_at_start():
    """The race between fork and prctl: a parent pid that is not ours means exit at once."""
    proc = subprocess.run(_server_argv("--parent-pid", "1" if os.getpid() != 1 else "2"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "is gone; exiting" in proc.stderr
