"""Running one function on N ranks inside one activation: spawned processes, a rendezvous on
loopback, one classified error when any rank fails, and no rank left running.

The activation's process is the supervisor, not a rank: it owns the rendezvous store (a
``TCPStore`` bound to a free loopback port, so two activations never race for a port), starts
``world`` processes with the ``spawn`` method (a forked copy of a threaded server, or of a
process that has touched CUDA, is not safe), and waits on their result pipes and their exit
sentinels together. Each rank sends one message, ``("ok", value)`` or ``("error", crash)``
(``errors.describe_crash``); a rank that exits without one (killed by a signal, the out-of-memory
killer for one) is noticed by its sentinel. On the first failure every other rank is killed,
since the survivors would wait in a collective for a peer that will never come, and the
activation raises :class:`RankFailed`. Ranks also die with their supervisor (``lifeline``).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from actions.runtime.errors import crash_text, describe_crash

RENDEZVOUS_TIMEOUT_S = 300.0
"""How long a rank waits for its peers at the rendezvous and in a collective."""


class RankFailed(RuntimeError):
    """A rank of a multi-rank activation failed; ``transient`` is that rank's own classification
    (a rank killed by a signal counts as a crashed container: transient)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def _rank_entry(fn: Callable[..., Any], rank: int, world: int, port: int, backend: str, args: tuple,
                conn: Connection, parent_pid: int) -> None:
    from actions.runtime.lifeline import die_with_parent

    die_with_parent(parent_pid)
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, None, is_master=False,
                              timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
        try:
            value = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        conn.send(("ok", value))
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, then this rank exits
        conn.send(("error", describe_crash(exc)))
        conn.close()
        os._exit(1)
    conn.close()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without a result"


def run_on_ranks(fn: Callable[..., Any], world: int, args: tuple = (), *, backend: str = "gloo",
                 what: str = "rank") -> Any:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes joined in one process group;
    return rank 0's value (it must pickle; the others' are dropped).

    Raises:
        RankFailed: a rank raised (its crash, one line) or died; every rank has been stopped.
    """
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
    procs, conns = [], []
    try:
        for rank in range(world):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_rank_entry, name=f"{what}-{rank}", daemon=True,
                               args=(fn, rank, world, store.port, backend, args, send, os.getpid()))
            proc.start()
            send.close()
            procs.append(proc)
            conns.append(recv)
        return _collect(procs, conns, what)[0]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for conn in conns:
            conn.close()
        del store


def _collect(procs: list, conns: list[Connection], what: str) -> dict[int, Any]:
    """Every rank's value, or RankFailed at the first rank that fails."""
    world = len(procs)
    results: dict[int, Any] = {}
    while len(results) < world:
        waiting = [r for r in range(world) if r not in results]
        ready = wait([conns[r] for r in waiting] + [procs[r].sentinel for r in waiting])
        for r in waiting:
            if conns[r] in ready or procs[r].sentinel in ready:
                message = _receive(conns[r])
                if message is None:  # exited, or closing its pipe on the way out, without a result
                    procs[r].join(timeout=10)
                    raise RankFailed(f"{what} {r} of {world} {_exit_text(procs[r].exitcode)}; the other ranks were "
                                     "stopped", transient=procs[r].exitcode is not None and procs[r].exitcode < 0)
                kind, value = message
                if kind == "error":
                    raise RankFailed(f"{what} {r} of {world} failed: {crash_text(value)}",
                                     transient=bool(value.get("transient")))
                results[r] = value
    for proc in procs:
        proc.join(timeout=RENDEZVOUS_TIMEOUT_S)
    return results


def _receive(conn: Connection) -> tuple[str, Any] | None:
    """The rank's message if one is waiting, None if none (or the rank closed its end without one)."""
    try:
        return conn.recv() if conn.poll() else None
    except (EOFError, OSError):
        return None
