"""The control plane's own time: no heartbeat wait for step subflows, artifacts off the
critical path, and ``timing_s/overhead`` measured around the step."""

from __future__ import annotations

import contextvars
import threading

import pytest

import flows.campaign.overhead as overhead
from flows.campaign.overhead import Background, StepClock, quiet_step_flows


def test_step_subflows_run_without_heartbeats_and_the_setting_comes_back():
    from prefect.settings import get_current_settings

    before = get_current_settings().flows.heartbeat_frequency
    assert before is not None  # Prefect's default (180 s): the campaign's own run keeps it
    with quiet_step_flows():
        assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().flows.heartbeat_frequency == before


def test_a_flow_engine_started_inside_reads_no_heartbeat_interval():
    from prefect import flow
    from prefect.flow_engine import FlowRunEngine

    @flow(name="empty-step")
    def empty_step() -> int:
        return 1

    # The engine starts its heartbeat thread (and joins it, in 1 s ticks, on exit) only when
    # this is not None.
    assert FlowRunEngine(flow=empty_step).heartbeat_seconds is not None
    with quiet_step_flows():
        assert FlowRunEngine(flow=empty_step).heartbeat_seconds is None


def test_background_runs_in_order_in_the_callers_context_and_reports_failures():
    var = contextvars.ContextVar("var", default="unset")
    var.set("flow-run")
    seen: list[tuple[int, str, str]] = []
    bg = Background()
    for i in range(5):
        bg.submit(lambda i=i: seen.append((i, var.get(), threading.current_thread().name)))
    bg.submit(lambda: (_ for _ in ()).throw(RuntimeError("artifact API down")))
    with pytest.raises(RuntimeError, match="artifact API down"):
        bg.wait()
    assert [s[0] for s in seen] == [0, 1, 2, 3, 4]
    assert all(s[1] == "flow-run" and s[2].startswith("publish") for s in seen)


def test_step_clock_charges_every_second_between_commits_once(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(overhead.time, "time", lambda: now[0])
    clock = StepClock()
    now[0] = 102.0  # step 0: 2 s of wall, 1.5 s of it the step's work
    assert clock.close_period(1.5) == (2.0, 0.5)
    clock.add_work(0.25)  # its commit and collection, after the period closed
    now[0] = 103.5  # step 1: commit of step 0 (work), an evaluation of 0.5 s, step work 0.5 s
    clock.add_work(0.5)
    assert clock.close_period(0.5) == (1.5, 0.25)
    now[0] = 104.0
    assert clock.close_period(1.0) == (0.5, 0.0)  # never negative


def test_a_first_job_goes_ahead_of_the_queued_ones_and_a_gated_one_can_be_cancelled_until_it_starts():
    gate = threading.Event()
    bg = Background(gate)
    order: list[str] = []
    dropped = bg.submit(order.append, "dropped")  # at the head, waiting for the gate
    bg.submit(order.append, "a")
    bg.submit(order.append, "b")
    bg.submit(order.append, "urgent", first=True)
    assert dropped.cancel()  # not started: the gate is shut
    gate.set()
    bg.wait()
    assert order == ["urgent", "a", "b"]


def test_settle_waits_for_the_job_in_flight_only():
    gate = threading.Event()
    bg = Background(gate)
    started, release = threading.Event(), threading.Event()
    bg.submit(lambda: (started.set(), release.wait(5)), gated=False)
    bg.submit(lambda: None)  # gated: queued, never started while the gate is shut
    assert started.wait(5)
    assert not bg.settle(0.05)  # the first job still runs
    release.set()
    assert bg.settle(5)  # it ended; the gated one is not waited for
    bg.wait()
