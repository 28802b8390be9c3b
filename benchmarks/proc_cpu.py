"""CPU time of processes from Linux ``/proc``, for benchmarks that account for work done in
other processes (workers, the Prefect server, an S3 server). Ticks are 10 ms on Linux."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_s(pid: int | None, *, reaped: bool = False) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (0.0 if unknown); with
    ``reaped``, plus those of its children it has waited for (which /proc no longer lists)."""
    if pid is None:
        return 0.0
    fields = _stat_fields(pid)
    return sum(int(x) for x in fields[11:15 if reaped else 13]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int, exclude: set[int] = frozenset(), *, reaped: bool = False) -> float:
    """CPU seconds of ``root`` and its live descendants, skipping the subtrees of ``exclude``
    (``reaped``: see ``process_cpu_s``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat_fields(entry)[1]), []).append(int(entry))
            except OSError:
                continue  # the process ended meanwhile
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        try:
            total += process_cpu_s(pid, reaped=reaped)
        except OSError:
            continue
        todo.extend(children.get(pid, []))
    return total
