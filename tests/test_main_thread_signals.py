"""Ctrl-C and SIGTERM go to the main thread: threads started after ``route_stop_signals`` block
them (``flows/commands/main_thread_signals.py``), so the kernel cannot hand them to a thread
whose handler-less delivery would leave the main thread waiting."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent("""
    import signal, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from flows.commands.main_thread_signals import STOP_SIGNALS, route_stop_signals

    def mask():
        return signal.pthread_sigmask(signal.SIG_BLOCK, [])

    before = []
    threading.Thread(target=lambda: before.append(mask())).start()
    time.sleep(0.2)
    route_stop_signals()
    after = []
    threading.Thread(target=lambda: after.append(mask())).start()
    with ThreadPoolExecutor(1) as pool:
        pooled = pool.submit(mask).result()
    time.sleep(0.2)
    assert not STOP_SIGNALS & before[0], before  # threads started before it are not covered
    assert STOP_SIGNALS <= after[0] and STOP_SIGNALS <= pooled, (after, pooled)
    assert not STOP_SIGNALS & mask()  # the main thread still takes them
    # many threads waiting beside a main thread that waits too: SIGTERM still ends it at once
    stop = threading.Event()
    for _ in range(16):
        threading.Thread(target=stop.wait, daemon=True).start()
    try:  # "ready" inside: a SIGTERM that comes as soon as it is read still finds the handler below
        print("ready", flush=True)
        threading.Event().wait(300)
    except SystemExit as exc:
        print("stopped", exc.code, flush=True)
        raise
""")


def test_threads_started_after_routing_leave_stop_signals_to_the_main_thread():
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys\n"
                             "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))\n" + CHILD],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=30)[1]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 143 and "stopped 143" in out, err
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()
        proc.wait()


def test_a_pool_worker_started_from_a_blocking_thread_takes_sigterm(tmp_path):
    """The pool starts its workers from a thread of its own, which blocks the stop signals; a
    worker (and what it starts) takes SIGTERM as before."""
    from flows.commands.main_thread_signals import route_stop_signals
    from flows.invokers.local_pool import LocalPoolInvoker

    route_stop_signals()
    pool = LocalPoolInvoker(1, log_dir=tmp_path)
    try:
        [worker] = pool._workers
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # its mask, once its server has unblocked it
            with open(f"/proc/{worker.proc.pid}/status") as fh:
                blocked = int(next(line for line in fh if line.startswith("SigBlk:")).split()[1], 16)
            if not blocked & (1 << (signal.SIGTERM - 1)):
                break
            time.sleep(0.05)
        assert not blocked & (1 << (signal.SIGTERM - 1))
        worker.proc.terminate()
        assert worker.proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        pool.close()
