"""Running one function on N ranks inside one activation: spawned processes, a rendezvous on
loopback, one classified error when any rank fails, and no rank left running.

The activation's process is the supervisor, not a rank: it owns the rendezvous store (a
``TCPStore`` bound to a free loopback port, so two activations never race for a port) and starts
``world`` fresh interpreters (``python -m actions.rl.ranks``: a forked copy of a threaded server,
or of a process that has touched CUDA, is not safe, and ``multiprocessing``'s spawn would re-run
the caller's main script). Each rank reads the pickled function reference and arguments on its
standard input and writes one pickled message to its result pipe, ``("ok", value)`` or
``("error", crash)`` (``errors.describe_crash``); the pipe reaching end-of-file is how the
supervisor learns that a rank has exited, with or without a message (killed by a signal, the
out-of-memory killer for one). On the first failure every other rank is killed, since the
survivors would wait in a collective for a peer that will never come, and the activation raises
:class:`RankFailed`. Ranks also die with their supervisor (``lifeline.die_with_parent``).

Starting the ranks is not free: each is a fresh interpreter that imports torch and the
function's module and joins the rendezvous (seconds each on a CPU machine, the ranks competing
for its cores). A rank reads how long that took with :func:`spawn_seconds`.
"""

from __future__ import annotations

import datetime
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from actions.runtime.errors import LINE_LIMIT, crash_text, describe_crash

RENDEZVOUS_TIMEOUT_S = 300.0
"""How long a rank waits for its peers at the rendezvous and in a collective."""

_spawn_s = 0.0  # this rank's spawn_seconds(), set by _rank_main before it calls the function


class RankFailed(RuntimeError):
    """A rank of a multi-rank activation failed; ``transient`` is that rank's own classification
    (a rank killed by a signal counts as a crashed container: transient)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def spawn_seconds() -> float:
    """Inside a rank (the function :func:`run_on_ranks` runs): seconds from the supervisor
    starting the ranks' processes to this rank joining the process group, its interpreter's
    start, the imports of torch and of the function's module and the rendezvous included (wall
    clock: the supervisor and its ranks share one machine). 0.0 outside a rank."""
    return _spawn_s


def _rank_main(argv: list[str]) -> None:
    """A rank's process: ``python -m actions.rl.ranks RANK WORLD PORT BACKEND RESULT_FD PARENT_PID``."""
    global _spawn_s
    rank, world, port, backend, fd, parent_pid = argv[0], argv[1], argv[2], argv[3], argv[4], argv[5]
    from actions.runtime.lifeline import die_with_parent

    die_with_parent(int(parent_pid))
    out = os.fdopen(int(fd), "wb")
    try:
        fn, args, started = pickle.load(sys.stdin.buffer)  # unpickling fn imports its module
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", int(port), None, is_master=False,
                              timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        dist.init_process_group(backend, store=store, rank=int(rank), world_size=int(world),
                                timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        _spawn_s = time.time() - started
        try:
            message = ("ok", fn(int(rank), int(world), *args))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, then this rank exits
        message = ("error", describe_crash(exc))
    pickle.dump(message, out)
    out.close()
    os._exit(0 if message[0] == "ok" else 1)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without a result"


def run_on_ranks(fn: Callable[..., Any], world: int, args: tuple = (), *, backend: str = "gloo",
                 what: str = "rank") -> Any:
    """Run ``fn(rank, world, *args)`` (a module-level function) in ``world`` processes joined in
    one process group; return rank 0's value (it must pickle; the others' are dropped).

    Raises:
        RankFailed: a rank raised (its crash, one line) or died; every rank has been stopped.
    """
    import torch.distributed as dist

    started = time.time()  # the ranks' spawn_seconds() count from here
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the caller's imports
    payload = pickle.dumps((fn, args, started))
    procs, pipes = [], []
    try:
        for rank in range(world):
            read_fd, write_fd = os.pipe()
            argv = [sys.executable, "-m", "actions.rl.ranks", str(rank), str(world), str(store.port), backend,
                    str(write_fd), str(os.getpid())]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
            os.close(write_fd)
            procs.append(proc)
            pipes.append(os.fdopen(read_fd, "rb"))
            proc.stdin.write(payload)
            proc.stdin.close()
        return _collect(procs, pipes, what)[0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for pipe in pipes:
            pipe.close()
        del store


FAILURE_GRACE_S = 5.0
"""After a rank fails, how long the supervisor waits for the others' reports before choosing
which failure to raise: a peer's failure makes the survivors' collectives fail too, and the
report that arrives first is often that echo rather than the cause."""

PEER_MARKER = "(read by rank "
"""Ends a rank's error that only reports another rank's failure (``state_scatter.PeerReadFailed``):
ranked as an echo, so the owner's own report is the one raised."""

_ECHO_MARKERS = ("connection reset", "connection closed", "broken pipe", "gloo", "nccl", "timed out")


def _rank_of_failure(failure: tuple[int, str, bool]) -> tuple[int, int]:
    """Sort key: a rank's own error first, then a rank that died, then a collective's echo of
    another rank's failure, then a rank's report of another's failed read; lower ranks first
    within each."""
    rank, text, _ = failure
    if PEER_MARKER in text:  # a rank told that a tensor's owner failed to read it (state_scatter.py)
        return 3, rank
    if " killed by " in text or " without a result" in text:
        return 1, rank
    echo = text.split(" failed: ", 1)[-1].startswith("Dist") or any(m in text.lower() for m in _ECHO_MARKERS)
    return (2 if echo else 0), rank


_CUT = " ... "  # marks where _rank_error cut a rank's error


def _rank_error(prefix: str, text: str) -> str:
    """``prefix + text``, cut in the middle of ``text`` to fit what ``describe_crash`` keeps of
    the :class:`RankFailed` raised with it (``LINE_LIMIT`` characters, after ``RankFailed: ``
    where the crash is a CUDA out-of-memory error): a rank's error ends with what to do about it
    (``re-publish the artifact``), and cutting its end, as ``one_line`` does, would lose that
    where the same error on one rank keeps it. The middle is a key or a hash, mostly."""
    text = " ".join(text.split())
    room = LINE_LIMIT - len(prefix) - len(f"{RankFailed.__name__}: ")
    if len(text) <= room:
        return prefix + text
    head = (room - len(_CUT)) // 2
    return prefix + text[:head] + _CUT + text[len(text) - (room - len(_CUT) - head):]


def _collect(procs: list[subprocess.Popen], pipes: list, what: str) -> dict[int, Any]:
    """Every rank's value, or RankFailed naming the failure that caused the others."""
    world = len(procs)
    results: dict[int, Any] = {}
    failures: list[tuple[int, str, bool]] = []  # (rank, one line, transient)
    deadline = None
    while len(results) + len(failures) < world:
        waiting = [r for r in range(world) if r not in results and r not in {f[0] for f in failures}]
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([pipes[r] for r in waiting], timeout=timeout)
        if not ready and deadline is not None:
            break  # the grace period is over: the others are stuck waiting for the failed rank
        for r in waiting:
            if pipes[r] not in ready:
                continue
            data = pipes[r].read()  # to end-of-file: the rank has closed its end, finished or not
            code = procs[r].wait()
            if not data:
                failures.append((r, f"{what} {r} of {world} {_exit_text(code)}", code < 0))
                continue
            kind, value = pickle.loads(data)
            if kind == "error":
                failures.append((r, _rank_error(f"{what} {r} of {world} failed: ", crash_text(value)),
                                 bool(value.get("transient"))))
            else:
                results[r] = value
        if failures and deadline is None:
            deadline = time.monotonic() + FAILURE_GRACE_S
    if failures:
        rank, text, transient = min(failures, key=_rank_of_failure)
        raise RankFailed(f"{text}; the other ranks were stopped" if " failed: " not in text else text,
                         transient=transient)
    return results


if __name__ == "__main__":
    # run by the module as imported, not by this ``__main__`` copy of it: the function reads
    # spawn_seconds() from ``actions.rl.ranks``
    from actions.rl.ranks import _rank_main as rank_main

    rank_main(sys.argv[1:])
