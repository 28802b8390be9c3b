"""The run lease (flows/campaign/lease.py) on the local store and on the real S3 server: one holder,
a held run refused with its holder named, stale and broken leases taken over by exactly one
taker, renewal, and a lost lease stopping the campaign before it commits."""

from __future__ import annotations

import os
import threading
import time

import pytest

from actions.store import LocalStore
from flows.campaign.lease import (
    SKEW_S,
    LeaseHeld,
    LeaseLost,
    LeaseRecord,
    RunLease,
    check_not_held,
    lease_key,
    read_lease,
    takeover_reason,
)


def _record(**kw) -> LeaseRecord:
    base = dict(run_id="r", host="h1", pid=10, token="t", since=100.0, renewed=100.0, expires=160.0)
    return LeaseRecord(**{**base, **kw})


# ----------------------------------------------------------------------------- pure rule


def test_takeover_reason_expiry_dead_pid_and_break() -> None:
    alive = lambda pid: pid == 10  # noqa: E731
    rec = _record()
    # another host, before expiry + skew: held
    assert takeover_reason(rec, now=160.0 + SKEW_S, host="h2", pid=1, pid_alive=alive, break_lease=False) is None
    assert "expired" in takeover_reason(rec, now=160.1 + SKEW_S, host="h2", pid=1, pid_alive=alive, break_lease=False)
    # same host: held while pid 10 runs; gone when it does not, or when it is this very pid (a reuse)
    assert takeover_reason(rec, now=120.0, host="h1", pid=11, pid_alive=alive, break_lease=False) is None
    assert "pid 12" in takeover_reason(_record(pid=12), now=120.0, host="h1", pid=11, pid_alive=alive,
                                       break_lease=False)
    assert "gone" in takeover_reason(rec, now=120.0, host="h1", pid=10, pid_alive=alive, break_lease=False)
    assert takeover_reason(rec, now=120.0, host="h2", pid=1, pid_alive=alive, break_lease=True) == "--break-lease"


# ----------------------------------------------------------------------------- both backends


def _foreign(store, run_id: str, *, expires_in: float, host: str = "elsewhere", pid: int = 4242) -> bytes:
    """Write a lease held by a process of another host; returns its bytes."""
    now = time.time()
    rec = LeaseRecord(run_id=run_id, host=host, pid=pid, token="f" * 32, since=now - 30, renewed=now,
                      expires=now + expires_in)
    assert store.put_if_absent(lease_key(run_id), rec.encode())
    return rec.encode()


def test_second_taker_is_refused_naming_the_holder(backend_store) -> None:
    with RunLease.acquire(backend_store, "r1", renew=False, progress=lambda m: None) as lease:
        with pytest.raises(LeaseHeld) as err:
            RunLease.acquire(backend_store, "r1", host="other-host", pid=1, renew=False)
        msg = str(err.value)
        assert lease.record.host in msg and f"pid {lease.record.pid}" in msg and "since" in msg
        assert "--break-lease" in msg and "\n" not in msg
        assert "the parameter break_lease=true of a deployment run" in msg  # the flow's own override
        lease.check()  # the refused taker changed nothing
    assert read_lease(backend_store, "r1") is None  # released
    RunLease.acquire(backend_store, "r1", renew=False).release()  # free again


def test_a_second_taker_in_the_same_process_is_refused(tmp_path) -> None:
    store = LocalStore(tmp_path / "s")
    with RunLease.acquire(store, "r9", renew=False):
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
            RunLease.acquire(store, "r9", renew=False)


def test_live_foreign_lease_is_refused_by_the_read_only_check(backend_store) -> None:
    _foreign(backend_store, "r2", expires_in=60)
    with pytest.raises(LeaseHeld, match="host 'elsewhere' pid 4242 since .* UTC .*--break-lease"):
        check_not_held(backend_store, "r2")
    check_not_held(backend_store, "r2", break_lease=True)


def test_stale_lease_is_taken_over_by_exactly_one_of_many(backend_store) -> None:
    """Eight threads take over one expired lease at once, three times: one winner each time."""
    for round_ in range(3):
        run = f"stale{round_}"
        _foreign(backend_store, run, expires_in=-(SKEW_S + 5))
        wins, refused, barrier = [], [], threading.Barrier(8)

        def take(i: int) -> None:
            barrier.wait()
            try:
                wins.append(RunLease.acquire(backend_store, run, host=f"taker{i}", pid=i, renew=False,
                                             progress=lambda m: None))
            except LeaseHeld as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1 and len(refused) == 7, (wins, refused)
        assert all(f"host '{wins[0].record.host}'" in m for m in refused)
        wins[0].check()
        assert read_lease(backend_store, run).token == wins[0].record.token


def test_break_lease_takes_a_live_lease_and_the_old_holder_stops(backend_store) -> None:
    old = RunLease.acquire(backend_store, "r3", renew=False)
    new = RunLease.acquire(backend_store, "r3", host="rescuer", pid=7, renew=False, break_lease=True,
                           progress=lambda m: None)
    with pytest.raises(LeaseLost, match="host 'rescuer' pid 7"):
        old.check()
    old.release()  # must not delete the new holder's lease
    new.check()
    new.release()
    assert read_lease(backend_store, "r3") is None


def test_renewal_extends_expiry_and_detects_loss(backend_store) -> None:
    lease = RunLease.acquire(backend_store, "r4", ttl_s=6.0, progress=lambda m: None)
    first = lease.record.expires
    deadline = time.time() + 30  # renewed every 2 s: waited for, not slept for (a loaded machine is late)
    while lease.record.expires == first and time.time() < deadline:
        time.sleep(0.05)
    assert lease.record.expires > first and lease.lost is None
    lease.check()
    # another process breaks it: the next renewal (within ttl/3) marks it lost
    RunLease.acquire(backend_store, "r4", host="rescuer", pid=7, renew=False, break_lease=True,
                     progress=lambda m: None)
    deadline = time.time() + 30
    while lease.lost is None and time.time() < deadline:
        time.sleep(0.1)
    assert lease.lost is not None and "rescuer" in lease.lost
    with pytest.raises(LeaseLost):
        lease.check()
    lease.release()
    assert read_lease(backend_store, "r4").host == "rescuer"


def test_an_expired_holder_never_renews(tmp_path) -> None:
    store = LocalStore(tmp_path / "s")
    clock = [1000.0]
    lease = RunLease.acquire(store, "r5", ttl_s=10, renew=False, clock=lambda: clock[0])
    clock[0] = 1011.0  # it stalled past its expiry: someone may have taken it over
    lease.renew()
    assert lease.lost and "expired" in lease.lost
    with pytest.raises(LeaseLost, match="expired"):
        lease.check()


def test_damaged_lease_names_the_key_and_the_fix(tmp_path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put(lease_key("r6"), b"{not json")
    with pytest.raises(LeaseHeld, match=r"runs/r6/lease.json is damaged.*--break-lease \(or the parameter "
                                        r"break_lease=true of a deployment run\)$"):
        RunLease.acquire(store, "r6", renew=False)
    RunLease.acquire(store, "r6", renew=False, break_lease=True, progress=lambda m: None).release()


def test_same_host_dead_pid_is_taken_over_at_once(tmp_path) -> None:
    import socket
    import subprocess
    import sys

    store = LocalStore(tmp_path / "s")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _foreign(store, "r7", expires_in=600, host=socket.gethostname(), pid=int(dead.stdout))
    said = []
    lease = RunLease.acquire(store, "r7", renew=False, progress=said.append)
    assert "is gone" in said[0] and lease.record.pid != int(dead.stdout)
    lease.release()


# ----------------------------------------------------------------------------- in the campaign


def test_losing_the_lease_stops_the_campaign_before_its_commit(tiny_config, prefect_harness) -> None:
    from flows.campaign.run import run_campaign
    from flows.campaign.state import load_state

    cfg = tiny_config("invoker.kind=inprocess", "run_id=lost", "steps=3")
    store = LocalStore(cfg.store.uri)

    def progress(line: str) -> None:
        if line.startswith("[") and "step 1/3" in line:  # step 1 committed: another process breaks in
            RunLease.acquire(store, "lost", host="intruder", pid=99, renew=False, break_lease=True,
                             progress=lambda m: None)

    with pytest.raises(LeaseLost, match="lost its lease .*host .intruder. pid 99.*--resume "
                                        "\\(a deployment run: the parameter resume=true\\)"):
        run_campaign(cfg, progress=progress)
    assert load_state(store, "lost").step == 1  # step 2 was never committed
    assert read_lease(store, "lost").host == "intruder"  # and the loser left the new lease alone


def test_campaign_refuses_a_held_run(tiny_config, prefect_harness) -> None:
    from flows.campaign.run import run_campaign

    cfg = tiny_config("invoker.kind=inprocess", "run_id=held")
    store = LocalStore(cfg.store.uri)
    _foreign(store, "held", expires_in=60)
    with pytest.raises(LeaseHeld, match="host 'elsewhere'"):
        run_campaign(cfg, progress=lambda m: None)
    assert store.list("runs/held/") == ["runs/held/lease.json"]  # nothing written
