"""Who holds a lease: host name, process id, and the machine and PID namespace it runs in.

A process id means something only in its PID namespace on one boot of one machine. Two
containers can share a host name (``--hostname``, Kubernetes pods of one StatefulSet name on
different nodes) without sharing PIDs, and a machine that rebooted reuses PIDs. A lease
therefore records, beside host and pid, ``machine``: the kernel's boot id
(``/proc/sys/kernel/random/boot_id``, new at every boot, shared by every container of one
kernel) and the PID namespace's id (``/proc/self/ns/pid``). The "its process is gone" probe
runs only where both match this process's own; elsewhere the lease is waited out to its expiry.
Where ``/proc`` is missing (not Linux) the identity is empty and the host name alone decides.
"""

from __future__ import annotations

import os
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PID_NAMESPACE = "/proc/self/ns/pid"


def machine_identity() -> str:
    """``<boot id>/<pid namespace>``, e.g. ``1793...a3/pid:[4026531836]``; "" where unknown."""
    try:
        boot = BOOT_ID.read_text().strip()
        namespace = os.readlink(PID_NAMESPACE)
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def same_pid_space(recorded: str, mine: str) -> bool | None:
    """Whether a recorded machine identity shares this process's PID space.

    True: same boot and namespace (a pid probe is meaningful). False: the same namespace on
    an earlier boot (the machine rebooted: the holder is gone). None: unknown or another
    namespace (the pid says nothing; only the lease's expiry does).
    """
    if not recorded or not mine:
        return True  # a lease written before identities were recorded: the host name decides
    if recorded == mine:
        return True
    boot, _, namespace = recorded.partition("/")
    my_boot, _, my_namespace = mine.partition("/")
    if namespace == my_namespace and boot != my_boot:
        return False
    return None
