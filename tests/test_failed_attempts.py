"""Failed attempts are billed: an activation that crashed, was killed or returned an error
comes back with its accounting (``ActionError.failed_attempts``) from every local invoker, and
the step's invoke task collects it for the step's cost metrics (billed, never useful). The
OpenWhisk invoker's cases are in ``tests/test_openwhisk.py``; a whole campaign with killed
workers in ``tests/test_faults.py``."""

from __future__ import annotations

import time

import pytest

from flows.invokers.base import ActionError
from flows.invokers.inprocess import InProcessInvoker
from flows.invokers.local_pool import LocalPoolInvoker


def test_an_in_process_crash_and_refusal_carry_their_accounting(monkeypatch):
    import actions.noop

    def crash(args):
        time.sleep(0.2)
        raise ConnectionRefusedError("store unreachable")

    monkeypatch.setattr(actions.noop, "main", crash)
    invoker = InProcessInvoker(num_cores=1)
    with pytest.raises(ActionError) as info:
        invoker.invoke("noop", {})
    [spent] = info.value.failed_attempts
    assert info.value.transient and spent.action == "noop" and spent.activation_id == info.value.activation_id
    assert spent.billed_s >= 0.2 and spent.result == {}
    with pytest.raises(ActionError) as info:
        invoker.invoke("generate", {})  # refused: an application error, billed all the same
    assert not info.value.transient and len(info.value.failed_attempts) == 1


def test_a_killed_pool_worker_bills_its_activation_until_it_died(tmp_path):
    pool = LocalPoolInvoker(1, log_dir=tmp_path)
    try:
        with pytest.raises(ActionError, match="lost mid-activation") as info:
            pool.invoke("noop", {"__inject_kill_after_s": 0.5})
        [spent] = info.value.failed_attempts
        assert spent.billed_s >= 0.5 and spent.busy_s == 0.0 and spent.worker == "worker-0"
        with pytest.raises(ActionError) as info:
            pool.invoke("generate", {})  # refused by the replacement worker
        [refused] = info.value.failed_attempts
        assert refused.activation_id == info.value.activation_id and refused.billed_s > 0.0
        assert pool.invoke("noop", {}).failed_attempts == ()
    finally:
        pool.close()
