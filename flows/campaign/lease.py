"""One writer per run: a lease object in the store, taken atomically and renewed while a run
writes.

``runs/<run_id>/lease.json`` names its holder (host, pid, the machine and PID namespace it
runs in (``holder.py``), a random token, since when) and an expiry. The protocol uses only primitives every supported store has:

* **take**: create the object once (``put_if_absent``: ``If-None-Match: *`` on S3, ``link``
  locally). If it exists and its holder is alive, refuse with :class:`LeaseHeld`, one line
  naming the holder and ``--break-lease`` (the flow parameter ``break_lease`` of a deployment run).
* **take over** a stale lease (expired, or held by a process of this host that is gone) or,
  with ``break_lease``, any lease: delete it only if it still holds the bytes just read
  (:func:`~actions.store.delete_if`), then create it once as above. Two takers can
  both delete; only one create succeeds, so only one wins.
* **renew** (a background thread, every ``ttl_s / 3``): compare-and-swap of the holder's own
  bytes (:func:`~actions.store.replace_if`). If the bytes changed, the lease was
  taken: it is marked lost. A holder never renews after its expiry, so a takeover of an
  expired lease cannot race with a renewal (clocks must agree to within ``SKEW_S``).
* **check** before every write a campaign commits (:meth:`RunLease.check`): the lease is
  lost, expired, or holds another token -> :class:`LeaseLost`, which stops the run.
* **release**: delete the object if it still holds the holder's bytes, waiting at most
  ``RELEASE_WAIT_S``: a store that stopped answering (often why the run is ending) would keep
  the process up for ``max_attempts`` x its read timeout per request. A lease left behind
  expires ``ttl_s`` after its last renewal, and a run on this host takes it over at once.

The stores cannot check a token on each write (no fencing), so a holder that stalls past its
expiry can still write between its last check and noticing the loss. Every key a step writes
is derived from (run, step, shard), and commits are create-once, so such a late write cannot
replace a committed step.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from actions.store import ObjectNotFound, ObjectStore, StoreError, delete_if, replace_if
from flows.campaign.holder import machine_identity, same_pid_space
from flows.campaign.progress_line import print_line
from flows.campaign.renewal import renewal_failure

log = logging.getLogger(__name__)

LEASE_SCHEMA = "rlhfless.lease/v1"
DEFAULT_TTL_S = 60.0
SKEW_S = 2.0
"""A lease counts as expired only this long after its expiry time (clock differences)."""
_ATTEMPTS = 5
RELEASE_WAIT_S = 30.0
"""How long :meth:`RunLease.release` waits for the store to delete the lease, in seconds."""
BREAK_LEASE = "--break-lease (or the parameter break_lease=true of a deployment run)"
"""How a refusal names the override: the flag of `rlhfless train` and `gc`, and the campaign flow's parameter."""


class LeaseHeld(ValueError):
    """Another live process holds the run's lease (exit code 2 at the CLI)."""


class LeaseLost(StoreError):
    """This process no longer holds the lease of the run it writes: the run must stop."""


def lease_key(run_id: str) -> str:
    return f"runs/{run_id}/lease.json"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


@dataclass(frozen=True)
class LeaseRecord:
    """What ``lease.json`` holds. Times are Unix seconds (the writer's clock)."""

    run_id: str
    host: str
    pid: int
    token: str
    since: float
    renewed: float
    expires: float
    machine: str = ""
    """Boot id and PID namespace of the holder (``holder.machine_identity``); "" in leases
    written before it was recorded."""

    def encode(self) -> bytes:
        return json.dumps({"schema": LEASE_SCHEMA, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes, key: str) -> LeaseRecord:
        try:
            obj = json.loads(raw)
            if obj.pop("schema") != LEASE_SCHEMA:
                raise ValueError("schema")
            return cls(**obj)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise LeaseHeld(f"lease {key} is damaged (not a {LEASE_SCHEMA} record); if no process trains this "
                            f"run, pass {BREAK_LEASE}") from None

    def describe(self, now: float) -> str:
        """``host 'h' pid 12 since 2026-11-23 14:50:01 UTC (expires in 41 s)``."""
        left = self.expires - now
        when = f"expires in {left:.0f} s" if left >= 0 else f"expired {-left:.0f} s ago"
        return f"host {self.host!r} pid {self.pid} since {_utc(self.since)} ({when})"


def takeover_reason(record: LeaseRecord, *, now: float, host: str, pid: int, pid_alive: Callable[[int], bool],
                    break_lease: bool, machine: str = "") -> str | None:
    """Why ``record`` may be taken over by process ``pid`` on ``host`` in ``machine`` (boot
    and PID namespace, ``holder.py``), or None if it is held.

    Pure: the caller passes the clock and the liveness probe. A lease of this host and PID
    space whose pid is this process's (a previous incarnation reusing the pid, e.g. a
    restarted container) or no longer runs is stale at once, and so is one of this host from
    an earlier boot; any other lease (another host, or a container that shares the host name
    but not the PIDs) only ``SKEW_S`` after its expiry.
    """
    if break_lease:
        return "--break-lease"
    if now > record.expires + SKEW_S:
        return f"it expired at {_utc(record.expires)}"
    if record.host != host:
        return None
    space = same_pid_space(record.machine, machine)
    if space is False:
        return "its machine rebooted since"
    if space and (record.pid == pid or not pid_alive(record.pid)):
        return f"its process (pid {record.pid}) is gone"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (signal 0 probes without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


# Leases this process holds, by (store URI, run id): the CLI takes the lease before Prefect
# starts and the campaign flow, running in the same process, adopts it.
_HELD: dict[tuple[str, str], RunLease] = {}
_HELD_LOCK = threading.Lock()


def held_lease(store: ObjectStore, run_id: str) -> RunLease | None:
    with _HELD_LOCK:
        return _HELD.get((store.uri, run_id))


class RunLease:
    """A held lease on one run; obtain with :meth:`acquire`, end with :meth:`release`."""

    def __init__(self, store: ObjectStore, record: LeaseRecord, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.record, self.ttl_s, self._clock = store, record, ttl_s, clock
        self.key = lease_key(record.run_id)
        self._raw = record.encode()
        self._lost: str | None = None
        # held around "store I/O + self._raw" so check() never compares against bytes that a
        # renewal in the other thread has written but not yet recorded
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking

    @classmethod
    def acquire(cls, store: ObjectStore, run_id: str, *, ttl_s: float = DEFAULT_TTL_S, break_lease: bool = False,
                renew: bool = True, progress: Callable[[str], None] = print_line, host: str | None = None,
                pid: int | None = None, clock: Callable[[], float] = time.time,
                alive: Callable[[int], bool] = pid_alive) -> RunLease:
        """Take the lease of ``run_id`` (see the module docstring) and, with ``renew``, start
        renewing it in a daemon thread.

        Raises:
            LeaseHeld: a live holder has it; the message names it and ``--break-lease``.
            StoreError: the store cannot create objects atomically (S3 without conditional
                writes; set RLHFLESS_S3_CONDITIONAL_WRITES=off to accept a best-effort lease).
        """
        _check_atomic_create(store)
        mine_already = held_lease(store, run_id) if pid is None else None
        if mine_already is not None and not break_lease:  # this very process: the pid rule would not see it
            raise LeaseHeld(_held_message(run_id, mine_already.record, clock()))
        host = host or socket.gethostname()
        machine = machine_identity() if pid is None else ""
        pid = os.getpid() if pid is None else pid
        key = lease_key(run_id)
        for _ in range(_ATTEMPTS):
            now = clock()
            mine = LeaseRecord(run_id=run_id, host=host, pid=pid, token=secrets.token_hex(16), since=now,
                               renewed=now, expires=now + ttl_s, machine=machine)
            if store.put_if_absent(key, mine.encode()):
                return cls(store, mine, ttl_s, clock)._held(renew)
            try:
                raw = store.get(key)
            except ObjectNotFound:
                continue  # released in between: create again
            current = LeaseRecord.decode(raw, key) if not break_lease else _decode_or_none(raw, key)
            reason = None if current is None else takeover_reason(
                current, now=now, host=host, pid=pid, pid_alive=alive, break_lease=break_lease, machine=machine)
            if current is not None and reason is None:
                raise LeaseHeld(_held_message(run_id, current, now))
            if delete_if(store, key, raw):
                who = current.describe(now) if current else "a damaged lease"
                progress(f"taking over the lease of run {run_id!r} from {who}: {reason or '--break-lease'}")
            # Deleted by us or by another taker: whoever creates it next holds it.
        raise LeaseHeld(f"run {run_id!r}: its lease changed hands {_ATTEMPTS} times while this process tried to "
                        "take it; another process is starting on it; try again")

    def _held(self, renew: bool) -> RunLease:
        # Read back: on a store whose create is not atomic, a second writer shows here.
        self.check()
        if self.record.pid == os.getpid():  # (tests take leases in the name of other processes)
            with _HELD_LOCK:
                _HELD[(self.store.uri, self.record.run_id)] = self
        if renew:
            self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.record.run_id}", daemon=True)
            self._thread.start()
        return self

    # ------------------------------------------------------------------ holding

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, or None while it is held (as far as renewals know)."""
        return self._lost

    def _lose(self, why: str) -> None:
        with self._lock:
            self._lost = self._lost or why

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this process still holds the lease: not marked
        lost, not past its expiry, and the stored lease still carries this token (one GET). A
        stored record with this token that differs from the last one recorded is a renewal of
        this holder whose call failed after the write; it is adopted."""
        with self._lock:
            if self._lost is None:
                now = self._clock()
                if now >= self.record.expires:
                    self._lose(f"it expired at {_utc(self.record.expires)} before it was renewed")
                else:
                    try:
                        raw = self.store.get(self.key)
                    except ObjectNotFound:
                        raw = b""
                    other = _decode_or_none(raw, self.key) if raw != self._raw else None
                    if other is not None and other.token == self.record.token:
                        # A renewal of ours that was written but raised (its reply lost after the
                        # store's retries): no other process knows the token, so the lease is ours.
                        self.record, self._raw = other, raw
                    elif raw != self._raw:
                        self._lose(f"it is now held by {other.describe(now)}" if other else "it was deleted")
        if self._lost is not None:
            raise LeaseLost(f"run {self.record.run_id!r} stopped: this process lost its lease ({self._lost}); "
                            "another process may be writing the run; resume it with --resume (a deployment run: the "
                            "parameter resume=true) once that one ends")

    def renew(self) -> None:
        """Extend the expiry by ``ttl_s`` (compare-and-swap of this holder's bytes)."""
        with self._lock:
            now = self._clock()
            if self._lost is not None:
                return
            if now >= self.record.expires:
                self._lose(f"it expired at {_utc(self.record.expires)} before it could be renewed")
                return
            new = LeaseRecord(**{**asdict(self.record), "renewed": now, "expires": now + self.ttl_s})
            raw = new.encode()
            if replace_if(self.store, self.key, self._raw, raw):
                self.record, self._raw = new, raw
                return
            try:
                self.check()  # marks it lost, naming the new holder
            except LeaseLost:
                pass

    def _renew_loop(self) -> None:
        """Renew every ``ttl_s / 3`` until released. A transient failure (a timeout, a reset
        connection, a busy disk) is retried at the next tick, and check() fails once the lease
        expires; a permanent one (a read-only or full store, denied access) marks the lease
        lost with that error, so the run stops at its next check naming it. The thread never
        dies of an exception."""
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - classified: nothing may end this thread silently
                permanent = renewal_failure(exc)
                log.warning("renewing the lease of run %s failed: %s", self.record.run_id, exc)
                if permanent is not None:
                    self._lose(f"renewing it failed: {permanent}")
            if self._lost is not None:
                log.error("run %s lost its lease: %s", self.record.run_id, self._lost)
                return

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this holder's (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with _HELD_LOCK:
            if _HELD.get((self.store.uri, self.record.run_id)) is self:
                del _HELD[(self.store.uri, self.record.run_id)]
        deleted = threading.Event()

        def delete() -> None:
            try:
                delete_if(self.store, self.key, self._raw)
            except Exception as exc:  # noqa: BLE001 - it expires by itself; never hide the error that ends the run
                log.warning("could not release the lease of run %s: %s", self.record.run_id, exc)
            finally:
                deleted.set()

        # a daemon thread: a store that does not answer keeps neither the caller nor the exit waiting
        threading.Thread(target=delete, name=f"lease-release-{self.record.run_id}", daemon=True).start()
        if not deleted.wait(RELEASE_WAIT_S):
            log.warning("could not release the lease of run %s: the store did not answer within %g s; it expires "
                        "%g s after its last renewal (a run started on this host takes it over at once)",
                        self.record.run_id, RELEASE_WAIT_S, self.ttl_s)

    def __enter__(self) -> RunLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_lease(store: ObjectStore, run_id: str) -> LeaseRecord | None:
    """The run's current lease record, or None (no lease, or a damaged one)."""
    try:
        return _decode_or_none(store.get(lease_key(run_id)), lease_key(run_id))
    except ObjectNotFound:
        return None


def check_not_held(store: ObjectStore, run_id: str, *, break_lease: bool = False,
                   clock: Callable[[], float] = time.time) -> None:
    """Read-only pre-check: raise :class:`LeaseHeld` if a live holder has the run (so a CLI
    refuses before it validates further or writes anything). :meth:`RunLease.acquire` decides."""
    if break_lease:
        return
    key = lease_key(run_id)
    try:
        raw = store.get(key)
    except ObjectNotFound:
        return
    record = LeaseRecord.decode(raw, key)
    now = clock()
    if takeover_reason(record, now=now, host=socket.gethostname(), pid=os.getpid(), pid_alive=pid_alive,
                       break_lease=False, machine=machine_identity()) is None:
        raise LeaseHeld(_held_message(run_id, record, now))


def _held_message(run_id: str, record: LeaseRecord, now: float) -> str:
    return (f"run {run_id!r} is being trained by {record.describe(now)}; wait for it to end, "
            f"or pass {BREAK_LEASE} if that process is gone")


def _decode_or_none(raw: bytes, key: str) -> LeaseRecord | None:
    try:
        return LeaseRecord.decode(raw, key)
    except LeaseHeld:
        return None


def _check_atomic_create(store: ObjectStore) -> None:
    probe = getattr(store, "conditional_writes", None)
    if probe is None or probe():
        return
    if os.environ.get("RLHFLESS_S3_CONDITIONAL_WRITES", "auto").lower() == "off":
        log.warning("%s: conditional writes are off; the run lease is best effort (two runs starting "
                    "at the same moment could both take it)", store)
        return
    raise StoreError(f"store {store.uri} ignores If-None-Match, so two runs could take the same run lease; "
                     "use a store with conditional writes (AWS S3, SeaweedFS, MinIO 2024+), or set "
                     "RLHFLESS_S3_CONDITIONAL_WRITES=off to accept a best-effort lease")
