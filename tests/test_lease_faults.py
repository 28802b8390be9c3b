"""The run lease under store faults: the renewal thread survives transient errors, a permanent
one ends the lease naming it, a release never hides the error that ends a run, and a store that
turns read-only in the middle of a campaign stops it with the store's own error."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from actions.store import LocalStore
from flows.campaign.holder import machine_identity, same_pid_space
from flows.campaign.lease import LeaseLost, LeaseRecord, RunLease, read_lease, takeover_reason

WRITES = ("put", "put_if_absent", "put_content", "replace_if", "delete_if", "delete")


class FaultyStore:
    """A local store whose writes raise ``fault`` (an exception instance) while it is set;
    ``spare`` keys (suffixes) still work."""

    def __init__(self, inner: LocalStore, spare: tuple[str, ...] = ()) -> None:
        self.inner, self.spare, self.fault, self.calls = inner, spare, None, 0

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if name not in WRITES:
            return attr

        def write(key: str, *args, **kwargs):
            self.calls += 1
            if self.fault is not None and not key.endswith(self.spare):
                raise self.fault
            return attr(key, *args, **kwargs)

        return write


def _wait(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_renewal_survives_transient_errors_and_stops_on_a_permanent_one(tmp_path) -> None:
    store = FaultyStore(LocalStore(tmp_path / "s"))
    lease = RunLease.acquire(store, "r", ttl_s=3.0, progress=lambda m: None)  # renewed every second
    try:
        for fault in (TimeoutError("read timed out"), OSError(errno.EAGAIN, "Resource temporarily unavailable")):
            store.fault, seen = fault, store.calls
            assert _wait(lambda: store.calls > seen)  # a failed renewal
            store.fault = None
            first = lease.record.expires
            assert _wait(lambda: lease.record.expires > first)  # renewed again: the thread lives
            assert lease.lost is None
        store.fault = OSError(errno.EROFS, "Read-only file system")
        assert _wait(lambda: lease.lost is not None)
        with pytest.raises(LeaseLost, match=r"renewing it failed: OSError: \[Errno 30\] Read-only file system"):
            lease.check()
    finally:
        store.fault = None
        lease.release()
    assert read_lease(store.inner, "r") is None


def test_release_never_raises_over_the_error_that_ends_a_run(tmp_path) -> None:
    store = FaultyStore(LocalStore(tmp_path / "s"))
    lease = RunLease.acquire(store, "r", renew=False, progress=lambda m: None)
    store.fault = OSError(errno.EROFS, "Read-only file system")
    with pytest.raises(ValueError, match="the real error"):
        with lease:
            raise ValueError("the real error")


def test_release_waits_for_a_store_that_does_not_answer_at_most_release_wait_s(tmp_path, monkeypatch, caplog) -> None:
    """A hung store would hold the release for max_attempts x its read timeout per request:
    the release gives up after RELEASE_WAIT_S, says the lease expires by itself, and the
    deletion still lands if the store answers later."""
    monkeypatch.setattr("flows.campaign.lease.RELEASE_WAIT_S", 0.2)
    answer = threading.Event()

    class HungStore(FaultyStore):
        def delete_if(self, key: str, expected: bytes) -> bool:
            answer.wait(20)
            return self.inner.delete_if(key, expected)

    store = HungStore(LocalStore(tmp_path / "s"))
    lease = RunLease.acquire(store, "r", ttl_s=45, renew=False, progress=lambda m: None)
    started = time.monotonic()
    lease.release()
    assert time.monotonic() - started < 10  # not the 20 s the store would take
    assert "the store did not answer within 0.2 s; it expires 45 s after its last renewal" in caplog.text
    assert read_lease(store, "r") is not None
    answer.set()
    assert _wait(lambda: read_lease(store, "r") is None)


class LostReplyStore(FaultyStore):
    """A local store whose compare-and-swap, while ``fault`` is set, is carried out and then
    raises it: the reply was lost after the store's own retries."""

    def replace_if(self, key: str, expected: bytes, data: bytes) -> bool:
        done = self.inner.replace_if(key, expected, data)
        if self.fault is not None:
            raise self.fault
        return done


def test_a_renewal_that_was_written_but_raised_does_not_lose_the_lease(tmp_path) -> None:
    """The next check finds this holder's own token in a record it did not see written: a
    renewal of its own, adopted, not "held by" this very process."""
    store = LostReplyStore(LocalStore(tmp_path / "s"))
    lease = RunLease.acquire(store, "r", renew=False, progress=lambda m: None)
    try:
        first = lease.record
        store.fault = TimeoutError("read timed out")
        with pytest.raises(TimeoutError):
            lease.renew()
        store.fault = None
        stored = read_lease(store, "r")
        assert stored != first and stored.token == first.token  # written, though the call raised
        lease.check()
        assert lease.record == stored and lease.lost is None
        lease.renew()  # and renewals go on from the adopted record
        assert read_lease(store, "r") == lease.record and lease.record.expires >= stored.expires
    finally:
        lease.release()
    assert read_lease(store.inner, "r") is None


def test_a_lease_names_its_machine_and_pid_namespace_and_only_there_a_pid_probe_decides(tmp_path) -> None:
    lease = RunLease.acquire(LocalStore(tmp_path / "s"), "r", renew=False, progress=lambda m: None)
    assert lease.record.machine == machine_identity()
    lease.release()
    boot, ns = "b1", "pid:[1]"
    record = LeaseRecord(run_id="r", host="h", pid=7, token="t", since=0.0, renewed=0.0, expires=100.0,
                         machine=f"{boot}/{ns}")
    dead = lambda pid: False  # noqa: E731 - pid 7 does not run *here*
    # another container with the same host name (another PID namespace): wait for the expiry
    assert takeover_reason(record, now=50.0, host="h", pid=8, pid_alive=dead, break_lease=False,
                           machine=f"{boot}/pid:[2]") is None
    # the same namespace: the pid probe decides; after a reboot the holder is gone
    assert "gone" in takeover_reason(record, now=50.0, host="h", pid=8, pid_alive=dead, break_lease=False,
                                     machine=f"{boot}/{ns}")
    assert "rebooted" in takeover_reason(record, now=50.0, host="h", pid=8, pid_alive=dead, break_lease=False,
                                         machine=f"b2/{ns}")
    assert same_pid_space("", "x") is True  # a lease from before identities: the host decides, as before


@pytest.mark.slow
@pytest.mark.parametrize("lease_writable", [True, False], ids=["data-read-only", "all-read-only"])
def test_a_store_turning_read_only_mid_run_stops_it_naming_the_real_error(tiny_config, prefect_harness,
                                                                          lease_writable) -> None:
    from flows.campaign.run import run_campaign
    from flows.campaign.state import load_state

    cfg = tiny_config("invoker.kind=inprocess", "run_id=ro", "steps=3")
    store = FaultyStore(LocalStore(cfg.store.uri), spare=("lease.json",) if lease_writable else ())

    def progress(line: str) -> None:
        if line.startswith("[") and "step 1/3" in line:  # step 1 committed: the store turns read-only
            store.fault = OSError(errno.EROFS, "Read-only file system")

    with pytest.raises(Exception) as err:
        run_campaign(cfg, progress=progress, store=store)
    text = f"{type(err.value).__name__}: {err.value}"
    assert "Read-only file system" in text and "lease.json" not in text, text
    store.fault = None
    assert load_state(store.inner, "ro").step == 1
    left = read_lease(store.inner, "ro")
    if lease_writable:
        assert left is None  # released on the way out
    else:  # it could not be deleted; this host takes it over at once (its process is gone)
        assert left is not None and left.machine == machine_identity()
