"""Pool workers die with the process that started them, by either of two independent means:
the control pipe's end-of-file (every POSIX system) and Linux's parent-death signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

try:
    from conftest import LEARNING, TINY_OVERRIDES, assert_learned
except ImportError:  # tests/ imported as a package
    from tests.conftest import LEARNING, TINY_OVERRIDES, assert_learned


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


def _start_server(*extra: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A server taking SIGINT as an interactive one does (this test may run where it is
    ignored: a background job's children inherit that), listening once this returns."""
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(_server_argv("--ready-fd", str(ready_w), *extra), pass_fds=(ready_w, *pass_fds),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(ready_w)
    with os.fdopen(ready_r) as fh:
        assert fh.readline().strip(), f"the server exited with {proc.wait()}: {proc.stderr.read()[-2000:]}"
    return proc


def test_a_pool_worker_ignores_ctrl_c_and_stops_with_its_control_pipe():
    """Ctrl-C reaches the CLI's whole process group: a worker (``--control-fd``) carries on, with
    no KeyboardInterrupt in its log, until the pool closes its pipe."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"a-secret\n")
    proc = _start_server("--control-fd", str(read_fd), pass_fds=(read_fd,))
    os.close(read_fd)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        os.close(write_fd)
    assert proc.wait(timeout=5) == 0
    assert "KeyboardInterrupt" not in proc.stderr.read()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_ctrl_c_the_instant_a_pool_worker_is_forked_does_not_kill_it(tmp_path, monkeypatch):
    """Ctrl-C may come before a starting worker's ``main`` ignores SIGINT: the pool forks it with
    SIGINT blocked, so it starts, serves, and then ignores SIGINT with the usual mask."""
    from flows.invokers import local_pool

    popen = subprocess.Popen

    def ctrl_c_at_once(*args, **kwargs):
        proc = popen(*args, **kwargs)
        proc.send_signal(signal.SIGINT)  # before the child's interpreter has even started, usually
        return proc

    monkeypatch.setattr(local_pool.subprocess, "Popen", ctrl_c_at_once)
    # as at a terminal, where the children start with SIGINT's default action (killed)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        pool = local_pool.LocalPoolInvoker(2, log_dir=tmp_path / "logs")
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        assert pool.invoke("noop", {}).result["ok"] is True
        for pid in pool.worker_pids():
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":\t" in line)
            sigint = 1 << (signal.SIGINT - 1)
            assert int(status["SigIgn"], 16) & sigint and not int(status["SigBlk"], 16) & sigint, status
    finally:
        pool.close()


def test_a_server_started_by_hand_stops_on_ctrl_c():
    proc = _start_server()
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) != 0
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_whose_parent_is_already_gone_exits_at_start():
    """The race between fork and prctl: a parent pid that is not ours means exit at once."""
    proc = subprocess.run(_server_argv("--parent-pid", "1" if os.getpid() != 1 else "2"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "is gone; exiting" in proc.stderr


def _run_script(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "starter.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))


def test_workers_that_fail_to_start_give_one_error_and_no_thread_traceback(tmp_path):
    """Workers that exit at start (here: a flag their server refuses): the pool's one error names
    how many failed and the first one's exit and log; no start thread prints a traceback."""
    done = _run_script(tmp_path, f"""
        from flows.invokers import local_pool
        spawn = local_pool.LocalPoolInvoker._spawn

        def spawn_refused(self, name):
            self._limits = [*self._limits, "--no-such-flag"]
            return spawn(self, name)

        local_pool.LocalPoolInvoker._spawn = spawn_refused
        from flows.commands.reported_errors import reported_in_one_line
        try:
            local_pool.LocalPoolInvoker(2, log_dir={str(tmp_path / 'logs')!r})
        except local_pool.PoolStartFailed as exc:  # the CLI's one error line, not a traceback
            assert reported_in_one_line(exc)
            print(exc)
    """)
    assert done.returncode == 0 and "Exception in thread" not in done.stderr, done.stderr[-3000:]
    [line] = done.stdout.splitlines()
    assert "could not start all its workers (2 of 2 failed; first: local worker worker-" in line, line
    assert "exited with code 2" in line and str(tmp_path / "logs") in line, line


def test_sigterm_while_workers_start_closes_the_pool_without_a_thread_traceback(tmp_path):
    """SIGTERM to the whole process group kills the starting workers and unwinds the main thread
    (as ``rlhfless train`` does): the pool closes, and the starts it ends fail silently, so the
    command's own line is all that reaches stderr."""
    done = _run_script(tmp_path, f"""
        import signal, sys, threading, time
        from flows.invokers import local_pool

        def unwind(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, unwind)
        all_forked = threading.Barrier(3, timeout=10)

        def killed_by_the_same_signal(self, name):
            all_forked.wait()
            if name == "worker-0":
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            deadline = time.monotonic() + 5  # the start fails once the pool closes (or after 5 s)
            while not self._closing and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RuntimeError(f"local worker {{name}} failed to start (killed by SIGTERM)")

        local_pool.LocalPoolInvoker._spawn = killed_by_the_same_signal
        try:
            local_pool.LocalPoolInvoker(3, log_dir={str(tmp_path / 'logs')!r})
        except SystemExit:
            print("stopped", file=sys.stderr)
            raise
    """)
    assert done.returncode == 143 and done.stderr == "stopped\n", done.stderr[-3000:]


def test_sigterm_while_a_worker_start_hangs_exits_at_once(tmp_path):
    """A worker whose start never ends (an import stuck on a network file system, a server that
    never writes its ready line): SIGTERM still ends the process at once, the start thread left
    behind, not waited for at exit."""
    started = time.monotonic()
    done = _run_script(tmp_path, f"""
        import signal, sys, threading, time
        from flows.invokers import local_pool

        def unwind(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, unwind)

        def hung(self, name):
            if name == "worker-0":
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            time.sleep(3600)

        local_pool.LocalPoolInvoker._spawn = hung
        local_pool.LocalPoolInvoker(2, log_dir={str(tmp_path / 'logs')!r})
    """)
    assert done.returncode == 143, done.stderr[-3000:]
    assert time.monotonic() - started < 30


def _cli_args(tmp_path: Path) -> list[str]:
    args = []
    for override in (*TINY_OVERRIDES, *LEARNING, f"store.uri={tmp_path / 'store'}", "invoker.kind=local",
                     "invoker.num_workers=2"):
        args += ["--set", override]
    return [sys.executable, "-m", "flows.commands.cli", "train", *args, "--run-id", "k9", "--out", str(tmp_path / "out")]


def _worker_pids(log_dir: Path) -> list[int]:
    pids = []
    for log in log_dir.glob("worker-*.log"):
        pids += [int(line.split()[4]) for line in log.read_text().splitlines()
                 if line.startswith("[rlhfless] action server pid")]
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_sigkill_of_the_cli_mid_generation_then_resume(tmp_path, prefect_harness, clean_summary):
    """SIGKILL of ``rlhfless train`` while generation runs: no worker of the run is left after
    5 s, and ``--resume`` ends with the weights of an uninterrupted run."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())  # no server start per CLI run
    logs = tmp_path / "out" / "logs"
    # Generation sleeps 3 s (fault injection's latency; faults never change results), so the
    # kill lands while the generation actions run.
    slow = ["--set", "faults.latency_fraction=1", "--set", "faults.latency_s=3", "--set", "faults.actions=[generate]"]
    cli = subprocess.Popen(_cli_args(tmp_path) + slow, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    # both workers up (under load the second may still be starting when the first generates)
    while not (any("generate activation" in p.read_text() for p in logs.glob("worker-*.log"))
               and len(_worker_pids(logs)) == 2):
        assert cli.poll() is None, f"the CLI exited with {cli.returncode} before generating"
        assert time.monotonic() < deadline, f"no generation on both workers within 240 s: {_worker_pids(logs)}"
        time.sleep(0.1)
    time.sleep(0.5)
    pids = _worker_pids(logs)
    assert len(pids) == 2 and all(alive(p) for p in pids), pids
    cli.send_signal(signal.SIGKILL)
    cli.wait()
    assert wait_gone(pids, 5.0) == []

    resumed = subprocess.run([*_cli_args(tmp_path), "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["steps_completed"] == 2
    assert_learned(clean_summary)
    assert summary["weights_sha256"] == clean_summary["weights_sha256"]
    assert wait_gone(_worker_pids(logs), 5.0) == []  # the resumed run's workers ended with it
