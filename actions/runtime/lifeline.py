"""A local pool worker's tie to the process that started it: the secret, and dying with it.

The pool hands each worker a *control pipe* (``--control-fd``): the pool writes the worker's
request secret as the first line and keeps the write end open for the worker's whole life. The
secret therefore never appears on a command line, in the environment or in a log. Once the
secret is read, a thread blocks on the pipe: end-of-file means the pool process is gone (however
it died, SIGKILL included: the kernel closes its descriptors), and the worker exits at once.
This works on every POSIX system.

On Linux the worker also asks the kernel for ``PR_SET_PDEATHSIG`` (SIGKILL), which fires even
while the worker is stuck in native code that never lets the watcher thread run. That signal is
tied to the parent *thread* that forked the worker, so the pool forks from one long-lived
thread (``flows.invokers.local_pool``). It is set here, after ``exec``, rather than in a
``preexec_fn`` (unsafe in a threaded parent); the parent may die between the fork and the
``prctl``, so the worker then checks that its parent is still the pool and exits if not.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
MAX_SECRET_BYTES = 4096


def die_with_parent(parent_pid: int) -> None:
    """Exit now if ``parent_pid`` is no longer this process's parent; on Linux also arrange a
    SIGKILL for when the parent thread exits."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            print(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}; relying on the control pipe",
                  file=sys.stderr, flush=True)
    if os.getppid() != parent_pid:  # reparented before the prctl took effect: no signal will come
        print(f"parent process {parent_pid} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(1)


def read_secret(fd: int) -> str:
    """The first line written to the control pipe (the request secret), without its newline.

    Raises:
        RuntimeError: the pipe closed before a whole line arrived, or the line is too long.
    """
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)  # byte by byte: nothing after the line may be consumed here
        if not chunk:
            raise RuntimeError("the control pipe closed before the secret arrived")
        data += chunk
        if len(data) > MAX_SECRET_BYTES:
            raise RuntimeError("the control pipe sent an over-long secret line")
    return data[:-1].decode()


def watch_parent(fd: int) -> threading.Thread:
    """Start a daemon thread that exits the process when the control pipe reaches end-of-file."""

    def watch() -> None:
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        print("the pool process is gone (control pipe closed); exiting", file=sys.stderr, flush=True)
        os._exit(0)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
