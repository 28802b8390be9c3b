"""Failed attempts are billed: an activation that crashed, was killed or returned an error
comes back with its accounting (``ActionError.failed_attempts``) from every local invoker, and
the step's invoke task collects it for the step's cost metrics (billed, never useful). The
OpenWhisk invoker's cases are in ``tests/test_openwhisk.py``; a whole campaign with killed
workers in ``tests/test_faults.py``."""

from __future__ import annotations

import tempfile
import time
from types import SimpleNamespace

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


def test_an_unreachable_store_is_retried_once_by_the_task_other_transient_crashes_four_times(monkeypatch):
    """The action's store client has retried already (up to 5 x 60 s on a hung endpoint): the
    task tries one more activation, not four. Each invoker names the crash's type."""
    import actions.noop
    from actions.store import StoreUnreachable
    from flows.invokers.local_pool import LocalPoolInvoker
    from flows.step.invoke import STORE_UNREACHABLE_RETRIES, _transient_only

    def unreachable(args):
        raise StoreUnreachable("cannot reach S3 endpoint http://minio:9000 : no response within the 60 s read timeout")

    monkeypatch.setattr(actions.noop, "main", unreachable)
    with pytest.raises(ActionError) as info:
        InProcessInvoker(num_cores=1).invoke("noop", {})
    pooled = LocalPoolInvoker._failure("noop", 502, {"type": "StoreUnreachable", "message": "m", "transient": True},
                                       SimpleNamespace(log_path="w.log"), info.value.failed_attempts[0])
    refused = ActionError.from_crash("noop", {"type": "ConnectionRefusedError", "message": "m", "transient": True})

    def retried(exc: ActionError, run_count: int) -> bool:
        def result():
            raise exc
        return _transient_only(None, SimpleNamespace(run_count=run_count), SimpleNamespace(result=result))

    for exc in (info.value, pooled):
        assert exc.crash_type == "StoreUnreachable" and exc.transient
        assert [retried(exc, n) for n in (1, 2, 3)] == [True, False, False] and STORE_UNREACHABLE_RETRIES == 1
    assert pooled.message == "StoreUnreachable: m; worker log w.log"
    assert [retried(refused, n) for n in (1, 2, 3, 4)] == [True] * 4
    assert not retried(ActionError("noop", "bad payload", transient=False), 1)


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


def test_a_lost_worker_no_new_one_replaces_still_fails_as_an_action_error_with_its_accounting(tmp_path,
                                                                                               monkeypatch):
    """A replacement that fails to start leaves the pool a worker short: the lost activation is
    still billed and retried while a worker is left to run the retry, and permanent once none is
    (a retry would wait for an idle worker forever)."""
    pool = LocalPoolInvoker(2, log_dir=tmp_path)

    def fails_to_start(name):
        raise RuntimeError(f"local worker {name} failed to start (exited with code 1)")

    monkeypatch.setattr(pool, "_spawn", fails_to_start)
    try:
        for left, transient in ((1, True), (0, False)):
            with pytest.raises(ActionError, match="no worker replaces it .local worker worker-. failed") as info:
                pool.invoke("noop", {"__inject_kill_after_s": 0.2})
            [spent] = info.value.failed_attempts
            assert spent.billed_s >= 0.2 and info.value.transient is transient and pool.size == left
            if left:
                assert pool.invoke("noop", {}).result["ok"] is True  # the retry's worker
    finally:
        pool.close()


def test_closing_the_pool_mid_activation_fails_it_as_an_action_error_and_starts_no_worker(tmp_path):
    """The campaign closes its pool (Ctrl-C) while a step's activation is in flight: that
    activation fails as an ActionError with its accounting, not retried, and no replacement
    outlives the pool."""
    import threading

    pool = LocalPoolInvoker(1, log_dir=tmp_path)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            pool.invoke("noop", {"__inject_kill_after_s": 5.0})
        except BaseException as exc:
            raised.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    pool.close()
    caller.join(timeout=30)
    [error] = raised
    assert isinstance(error, ActionError) and not error.transient, error
    assert "no worker replaces it (the pool is closing)" in error.message and len(error.failed_attempts) == 1
    assert pool.size == 0 and pool.worker_pids() == []


def test_a_stalled_attempt_is_work_of_its_phase_not_overhead():
    """A train_step stalled until invoker.timeout_s (15 s) and retried (1 s): the phase took
    16.2 s, and the step's work holds both attempts, so the period's overhead (period - work)
    does not count the stall a second time."""
    from types import SimpleNamespace

    from flows.invokers.base import Activation
    from flows.step.metrics import step_metrics

    def spent(action, shard, start, end, busy):
        return Activation(action, shard, {}, start, start, end, busy, shard=shard)

    records = (spent("generate", "gen-0", 0.0, 0.5, 0.5), spent("train_step", "train", 16.2, 17.2, 1.0))
    stalled = spent("train_step", "train", 0.7, 15.7, 0.0)  # no reply: held until the timeout
    out = SimpleNamespace(records=records, failed=(stalled,), generate=(), score=(), prefill=None,
                          train=SimpleNamespace(metrics={}), num_continuations=0, continued_from={},
                          timing={"prefill": 0.0, "generate": 0.5, "score": 0.0, "train": 16.5, "step": 17.2})
    plan = SimpleNamespace(num_actors=1, predicted_time_s=0.5, planning_ms=1.0)
    phase = SimpleNamespace(plan=plan, predicted_prefill_s=0.0, activation_s=0.1, predicted={}, prefill=None,
                            calibration=SimpleNamespace(prefill_fixed_s=0.0, decode_scale=1.0), engine_start_s=0.0)
    m = step_metrics(out, phase, price=0.0, gpus_per_actor=1, timing_plan=0.1)
    assert m["timing_s/work"] == pytest.approx(0.5 + 15.0 + 1.0 + 0.1)
    # left to overhead: the 0.2 s before the first attempt and the 0.5 s retry delay, the flow's own
    assert m["timing_s/step"] - m["timing_s/work"] == pytest.approx(0.7)
    assert "timing_s/commit" not in m  # the campaign's: the previous commit, measured where it runs


def test_workers_that_died_idle_are_replaced_before_an_activation_not_sent_it(tmp_path):
    """Workers killed while idle (kill -9, the OOM killer) are replaced when the pool next takes
    one: the activation runs on a live worker at its first attempt, with nothing billed for the
    dead ones; a pool a dead worker leaves empty fails the action for good, not forever."""
    import os
    import signal

    pool = LocalPoolInvoker(3, log_dir=tmp_path)
    try:
        dead = pool.worker_pids()
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        done = pool.invoke("noop", {})
        assert done.result["ok"] is True and done.failed_attempts == ()
        assert pool.size == 3 and not set(dead) & set(pool.worker_pids())
    finally:
        pool.close()

    pool = LocalPoolInvoker(1, log_dir=tmp_path / "short")
    try:
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        time.sleep(0.5)

        def fails_to_start(name):
            raise RuntimeError(f"local worker {name} failed to start (exited with code 1)")

        pool._spawn = fails_to_start
        with pytest.raises(ActionError, match=r"worker worker-0 died while idle \(killed by SIGKILL\) and no worker "
                                              r"replaces it \(local worker worker-0 failed to start") as info:
            pool.invoke("noop", {})
        assert not info.value.transient and pool.size == 0
    finally:
        pool.close()


def test_an_activation_past_the_timeout_names_invoker_timeout_s_and_is_not_retried(tmp_path):
    pool = LocalPoolInvoker(1, log_dir=tmp_path, timeout_s=1.0)
    try:
        with pytest.raises(ActionError, match=r"no answer within invoker.timeout_s=1 s; raise invoker.timeout_s if "
                                              r"the action needs longer") as info:
            pool.invoke("generate", {"__inject_latency_s": 5.0})  # sleeps before it reads its request
        # not retried: the same work would run as long again (a 600 s action, four times more)
        assert not info.value.transient and len(info.value.failed_attempts) == 1
        assert pool.invoke("noop", {}).result == {"ok": True}  # a new worker took the killed one's place
    finally:
        pool.close()


def test_a_call_waiting_for_a_worker_fails_when_the_pool_loses_its_last_one(tmp_path):
    """One worker busy, the other dead while idle and not replaceable: a call waits for the
    busy one; when that one is lost too and nothing replaces it, the waiting call fails for
    good instead of waiting for a worker that will never come."""
    import os
    import signal
    import threading

    pool = LocalPoolInvoker(2, log_dir=tmp_path, timeout_s=60)
    outcomes, call = _recorded_calls(pool)

    try:
        pids = dict(zip((w.name for w in pool._workers), pool.worker_pids()))
        busy = threading.Thread(target=call, args=("busy", "generate", {"__inject_latency_s": 5.0}), daemon=True)
        busy.start()
        deadline = time.time() + 10
        while len(pool._idle._workers) != 1 and time.time() < deadline:
            time.sleep(0.05)
        [idle] = pool._idle._workers
        os.kill(pids[idle.name], signal.SIGKILL)
        time.sleep(0.3)

        def fails_to_start(name):
            raise RuntimeError(f"local worker {name} failed to start (out of memory)")

        pool._spawn = fails_to_start
        waiting = threading.Thread(target=call, args=("waiting", "noop", {}), daemon=True)
        waiting.start()
        time.sleep(1.0)
        assert waiting.is_alive()  # the dead idle worker is gone; it waits for the busy one
        os.kill(next(pid for name, pid in pids.items() if name != idle.name), signal.SIGKILL)
        busy.join(15)
        waiting.join(15)
        assert not waiting.is_alive() and pool.size == 0
        error = outcomes["waiting"]
        assert isinstance(error, ActionError) and not error.transient
        assert "the local pool has no worker left" in error.message and "out of memory" in error.message
    finally:
        pool.close()


def test_a_call_waiting_for_a_worker_fails_when_the_pool_closes(tmp_path):
    """The one worker busy, a second call waiting for it: closing the pool fails both calls
    for good (the busy one's worker is retired) instead of leaving the second one waiting."""
    import threading

    pool = LocalPoolInvoker(1, log_dir=tmp_path, timeout_s=60)
    outcomes, call = _recorded_calls(pool)
    busy = threading.Thread(target=call, args=("busy", "generate", {"__inject_latency_s": 5.0}), daemon=True)
    busy.start()
    deadline = time.time() + 10
    while pool._idle._workers and time.time() < deadline:
        time.sleep(0.05)
    waiting = threading.Thread(target=call, args=("waiting", "noop", {}), daemon=True)
    waiting.start()
    time.sleep(0.5)
    assert waiting.is_alive()
    pool.close()
    busy.join(15)
    waiting.join(15)
    assert not busy.is_alive() and not waiting.is_alive()
    assert all(isinstance(outcomes[k], ActionError) and not outcomes[k].transient for k in ("busy", "waiting"))
    assert "the local pool has no worker left: the pool is closed" in outcomes["waiting"].message


def test_two_workers_lost_at_once_one_replaced_the_pool_serves_calls_in_turn(tmp_path):
    """Two busy workers lost together; one replacement fails to start while the other is still
    starting: the pool is not empty (a worker is on its way), so the lost calls may be retried,
    and once the other is up, two calls at once both run on it in turn: none fails for a pool
    'with no worker left'."""
    import os
    import signal
    import threading

    pool = LocalPoolInvoker(2, log_dir=tmp_path, timeout_s=60)
    real_spawn = pool._spawn

    def spawn(name):
        if name == "worker-0":  # its start fails while worker-1's replacement is starting
            deadline = time.time() + 20
            while any(w.name == "worker-1" for w in pool._workers) and time.time() < deadline:
                time.sleep(0.001)
            raise RuntimeError(f"local worker {name} failed to start (out of memory)")
        return real_spawn(name)

    pool._spawn = spawn
    outcomes, call = _recorded_calls(pool)

    try:
        pids = pool.worker_pids()
        lost = [threading.Thread(target=call, args=(f"lost-{i}", "generate", {"__inject_latency_s": 5.0}))
                for i in range(2)]
        for t in lost:
            t.start()
        deadline = time.time() + 20
        while pool._idle._workers and time.time() < deadline:  # both busy with their call
            time.sleep(0.05)
        time.sleep(0.5)  # the requests sent
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for t in lost:
            t.join(30)
        assert all(isinstance(outcomes[f"lost-{i}"], ActionError) for i in range(2))
        assert all(outcomes[f"lost-{i}"].transient for i in range(2))  # a worker was on its way
        assert pool.size == 1
        # a holds the one worker for a second (then its empty request is refused); b waits for it
        busy = threading.Thread(target=call, args=("a", "generate", {"__inject_latency_s": 1.0}))
        busy.start()
        time.sleep(0.3)
        call("b", "noop", {})
        busy.join(30)
        assert "no worker left" not in outcomes["a"].message and not outcomes["a"].transient
        assert outcomes["b"] is None, outcomes["b"]
    finally:
        pool.close()


def test_the_workers_temporary_files_go_with_the_pool_however_the_workers_exit(tmp_path):
    """Workers write temporary files under a directory the pool owns (their TMPDIR) and the
    pool removes it when it closes: a worker exits through os._exit or a signal, where no
    clean-up of its own runs (a vLLM engine's model copy would stay in /tmp)."""
    import os
    import signal
    from pathlib import Path

    pool = LocalPoolInvoker(2, log_dir=tmp_path)
    try:
        pids = pool.worker_pids()
        environ = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
        tmp = Path(next(e for e in environ if e.startswith(b"TMPDIR=")).decode()[len("TMPDIR="):])
        assert tmp.is_dir() and tmp != tmp_path and str(tmp).startswith(tempfile.gettempdir())
        (tmp / "rlhfless-vllm-model-x").mkdir()  # what an engine leaves
        (tmp / "rlhfless-vllm-model-x" / "model.safetensors").write_bytes(b"\0" * 1024)
        os.kill(pids[1], signal.SIGKILL)
    finally:
        pool.close()
    assert not tmp.exists()


def _recorded_calls(pool: LocalPoolInvoker):
    """(outcomes, call): ``call(key, action, payload)`` invokes on ``pool`` and records under
    ``key`` None or the ActionError it raised (for calls run on threads)."""
    outcomes: dict[str, BaseException | None] = {}

    def call(key: str, action: str, payload: dict) -> None:
        try:
            pool.invoke(action, payload)
            outcomes[key] = None
        except ActionError as exc:
            outcomes[key] = exc

    return outcomes, call
