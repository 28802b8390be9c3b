"""Step flow runs created ahead of their call, and a busy server's 503s retried in milliseconds:
what users see in the Prefect API stays the same (a flow run per call, a child of its tracking
task run in the parent, with its parameters and states)."""

from __future__ import annotations

import threading

import httpx
import pytest

from flows.campaign import prestart
from flows.campaign.api_client import BUSY_RETRY_AFTER_S, retry_busy_soon
from flows.campaign.overhead import Background, open_gate_when_running
from flows.campaign.prestart import FlowRunStarter


def _response(status: int, request: httpx.Request, **headers: str) -> httpx.Response:
    return httpx.Response(status, request=request, headers=headers)


def test_a_busy_answer_is_retried_soon_then_later_and_other_answers_are_left_alone():
    request = httpx.Request("POST", "http://127.0.0.1:4200/api/task_runs/")
    waits = []
    for _ in range(len(BUSY_RETRY_AFTER_S) + 1):  # the same request object is re-sent on a retry
        response = _response(503, request)
        retry_busy_soon(response)
        waits.append(float(response.headers["Retry-After"]))
    assert waits == [0.05, 0.25, 2.0, 8.0, 32.0, 32.0]
    fresh = httpx.Request("POST", "http://127.0.0.1:4200/api/flow_runs/")
    first = _response(503, fresh)
    retry_busy_soon(first)
    assert first.headers["Retry-After"] == "0.05"  # counted per request
    server_said = _response(503, fresh, **{"Retry-After": "7"})
    retry_busy_soon(server_said)
    assert server_said.headers["Retry-After"] == "7"
    for status in (200, 201, 429, 500, 502):
        other = _response(status, fresh)
        retry_busy_soon(other)
        assert "Retry-After" not in other.headers


def test_background_jobs_can_skip_the_gate_and_a_cancelled_one_is_not_waited_for():
    gate = threading.Event()
    bg = Background(gate)
    order: list[str] = []
    started = threading.Event()
    release = threading.Event()
    bg.submit(lambda: (started.set(), release.wait(), order.append("first")), gated=False)
    started.wait(5)
    gated = bg.submit(order.append, "gated")
    ungated = bg.submit(order.append, "ungated", gated=False)
    assert ungated.cancel()  # queued behind a running job: not started yet
    release.set()
    assert bg.submit(lambda: "after", gated=False) is not None
    bg.wait()  # opens the gate; the cancelled job is skipped, not re-raised
    assert order == ["first", "gated"] and gated.done() and ungated.cancelled()


def _child_runs(client, parent_id):
    """The parent's tracking task runs and, per tracking task run, its flow run."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    in_parent = TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[parent_id]))
    tracking = client.read_task_runs(task_run_filter=in_parent)
    ids = [t.id for t in tracking]
    children = client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_task_run_id={"any_": ids})) if ids else []
    by_parent = {c.parent_task_run_id: c for c in children}
    return sorted(tracking, key=lambda t: t.name), by_parent


def test_prepared_flow_runs_look_like_nested_calls_in_the_api(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    @flow(name="prestart-child", validate_parameters=False)
    def child(x: int, label: str) -> str:
        return f"{label}{x}"

    @flow(name="prestart-parent")
    def parent() -> tuple[list[str], str]:
        gate = threading.Event()
        bg = Background(gate)
        starter = FlowRunStarter(open_gate_when_running(child, gate), bg)
        starter.prepare()
        out = []
        for i in range(3):
            gate.clear()
            out.append(starter.run(i, label="s", prepare_next=True))  # the 4th is prepared, never called
        starter.close()
        bg.wait()
        return out, str(FlowRunContext.get().flow_run.id)

    results, parent_id = parent()
    assert results == ["s0", "s1", "s2"]
    with get_client(sync_client=True) as client:
        tracking, children = _child_runs(client, parent_id)
    # one tracking task run per call, named as Prefect names a nested flow's, none left over
    assert [t.name for t in tracking] == ["prestart-child-0", "prestart-child-1", "prestart-child-2"]
    assert all(t.state.is_completed() for t in tracking)
    runs = [children[t.id] for t in tracking]
    assert all(r.state.is_completed() for r in runs)
    assert [r.parameters for r in runs] == [{"x": i, "label": "s"} for i in range(3)]
    assert all(r.start_time is not None and r.end_time is not None for r in runs)
    assert runs[0].end_time <= runs[1].start_time and runs[1].end_time <= runs[2].start_time  # in call order


def test_a_creation_that_has_not_started_is_cancelled_and_the_call_creates_its_run(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    @flow(name="prestart-fallback", validate_parameters=False)
    def child(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x * 2

    @flow(name="prestart-fallback-parent")
    def parent() -> str:
        bg = Background(threading.Event())  # the gate stays shut: a gated job blocks the queue
        bg.submit(lambda: None)
        starter = FlowRunStarter(child, bg)
        starter.prepare()  # queued behind the gated job
        assert starter.run(21) == 42
        starter.prepare()
        with pytest.raises(ValueError, match="negative"):
            starter.run(-1)
        bg.wait()
        return str(FlowRunContext.get().flow_run.id)

    parent_id = parent()
    with get_client(sync_client=True) as client:
        tracking, children = _child_runs(client, parent_id)
    states = [children[t.id].state.type.value for t in tracking]
    assert [t.name for t in tracking] == ["prestart-fallback-0", "prestart-fallback-1"]
    assert states == ["COMPLETED", "FAILED"]


def test_a_campaign_shows_one_step_flow_run_per_step_and_none_left_pending(tiny_config, prefect_harness):
    from prefect.client.orchestration import get_client

    from flows.campaign.run import rlhf_campaign

    # the budget stops the campaign after step 0: the flow run prepared for step 1 is deleted
    cfg = tiny_config("invoker.kind=inprocess", "run_id=prestart", "steps=3", "budget.gpu_seconds=0.001")
    state = rlhf_campaign(config=cfg.model_dump(mode="json"), return_state=True)
    summary = state.result()
    assert summary["steps_completed"] == 1 and "budget.gpu_seconds" in summary["stopped_reason"]
    with get_client(sync_client=True) as client:
        tracking, children = _child_runs(client, state.state_details.flow_run_id)
    steps = [t for t in tracking if t.name.startswith("rlhf-step-")]
    assert [t.name for t in steps] == ["rlhf-step-0"]
    run = children[steps[0].id]
    assert run.state.is_completed() and run.flow_id is not None
    assert run.parameters["inputs"]["step"] == 0 and "plan" in run.parameters["phase"]
    # the step's run is the campaign's only nested flow run: the one prepared for step 1 is gone
    assert list(children.values()) == [run]


def test_outside_a_flow_run_the_prepared_runs_are_top_level(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    @flow(name="prestart-top", validate_parameters=False)
    def top(x: int) -> int:
        return x + 1

    bg = Background()
    starter = FlowRunStarter(top, bg)
    starter.prepare()
    assert starter.run(1, prepare_next=True) == 2
    prepared = starter._next.result()  # the next call's run, made ahead: no parent
    starter.close()
    bg.wait()
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["prestart-top"])))
    assert [(r.parent_task_run_id, r.state.type.value, r.parameters) for r in runs] == [(None, "COMPLETED", {"x": 1})]
    assert prepared.id not in {r.id for r in runs}  # the unused one was deleted


def test_no_background_job_starts_while_a_step_trains(tiny_config, prefect_harness, monkeypatch):
    from functools import partial

    from flows.campaign import overhead, prestart
    from flows.campaign.run import rlhf_campaign
    from flows.invokers.inprocess import InProcessInvoker

    from benchmarks.bench_control_plane import timed as timed_into

    events: list[tuple[str, str, float, float]] = []
    timed = partial(timed_into, events)

    submit, invoke, run = overhead.Background.submit, InProcessInvoker.invoke, prestart.FlowRunStarter.run
    monkeypatch.setattr(overhead.Background, "submit", lambda self, fn, *a, **kw: submit(
        self, timed("job", getattr(fn, "__name__", ""), fn), *a, **kw))
    monkeypatch.setattr(InProcessInvoker, "invoke", lambda self, action, *a, **kw: timed(
        "act", action, invoke)(self, action, *a, **kw))
    monkeypatch.setattr(prestart.FlowRunStarter, "run", lambda self, *a, **kw: timed("step", "", run)(self, *a, **kw))
    cfg = tiny_config("invoker.kind=inprocess", "run_id=held", "steps=3")
    assert rlhf_campaign(config=cfg.model_dump(mode="json"))["steps_completed"] == 3
    jobs = [e for e in events if e[0] == "job"]
    trains = [e for e in events if e[1] == "train_step"]
    steps = sorted(e for e in events if e[0] == "step")
    assert len(trains) == 3 and len(steps) == 3 and {"_create", "_publish", "_write_parameters"} <= {j[1] for j in jobs}
    assert not [(j, t) for j in jobs for t in trains if t[2] <= j[2] <= t[3]]  # none started beside training
    for step in steps[:2]:  # each step's first job creates the next step's flow run
        assert min((j for j in jobs if step[2] <= j[2] <= step[3]), key=lambda j: j[2])[1] == "_create"


def _cancel(flow_run_id) -> None:
    """What ``prefect flow-run cancel ID`` does: propose Cancelling (not forced)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import State, StateType

    with get_client(sync_client=True) as client:
        assert client.set_flow_run_state(flow_run_id, State(type=StateType.CANCELLING)).status.value == "ACCEPT"


def test_a_call_whose_flow_run_is_cancelled_while_it_runs_is_named_and_can_be_ended_cancelled(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    @flow(name="prestart-cancelled", validate_parameters=False)
    def child(x: int) -> int:
        if x == 1:
            _cancel(FlowRunContext.get().flow_run.id)
        return x * 2

    @flow(name="prestart-cancelled-parent")
    def parent() -> list:
        gate = threading.Event()
        bg = Background(gate)
        starter = FlowRunStarter(open_gate_when_running(child, gate), bg)
        seen = []
        for x in (0, 1):  # the first call's run is Prefect's own, the second's was prepared
            gate.clear()
            seen.append((starter.run(x, prepare_next=True), starter.cancelled()))
        starter.mark_cancelled(seen[1][1], "stopped after step 2/9")
        starter.close()
        bg.wait()
        return [(result, None if run is None else run.id) for result, run in seen]

    (first, not_cancelled), (second, cancelled_id) = parent()
    assert (first, not_cancelled, second) == (0, None, 2)  # the cancelled call still returned its result
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(cancelled_id)
    assert run.state.is_cancelled() and run.state.message == "stopped after step 2/9"


def test_a_step_run_cancelled_while_it_runs_is_committed_and_ends_the_campaign_cancelled(tiny_config, prefect_harness,
                                                                                         monkeypatch):
    """``prefect flow-run cancel STEP_RUN``: the step finishes (nothing stops a subflow in its
    parent's process) and is committed, its run ends Cancelled rather than Cancelling for good,
    the campaign run ends Cancelled with the one line, its lease released, and a resume goes on."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    from actions.store import open_store
    from flows.campaign.lease import read_lease
    from flows.campaign.run import rlhf_campaign
    from flows.campaign.state import load_state
    from flows.invokers.inprocess import InProcessInvoker

    invoke, trained = InProcessInvoker.invoke, []

    def cancel_the_first_step(self, action, *args, **kwargs):
        run = FlowRunContext.get().flow_run
        if action == "train_step" and not trained and run.name:
            trained.append(run.name)
            _cancel(run.id)
        return invoke(self, action, *args, **kwargs)

    monkeypatch.setattr(InProcessInvoker, "invoke", cancel_the_first_step)
    cfg = tiny_config("invoker.kind=inprocess", "run_id=cancelled_step", "steps=2")
    state = rlhf_campaign(config=cfg.model_dump(mode="json"), return_state=True)
    assert state.is_cancelled(), state
    assert state.message == (f"stopped after step 1/2: its step run {trained[0]!r} was cancelled; "
                             "resume the run to continue")
    store = open_store(cfg.store.uri)
    assert load_state(store, "cancelled_step").step == 1  # the cancelled step's work was kept
    assert read_lease(store, "cancelled_step") is None
    with get_client(sync_client=True) as client:
        tracking, children = _child_runs(client, state.state_details.flow_run_id)
    steps = [(t.name, children[t.id].name, children[t.id].state.type.value) for t in tracking if t.id in children]
    # Cancelled, not Cancelling for good; the run prepared for step 2 was deleted
    assert steps == [("rlhf-step-0", trained[0], "CANCELLED")]
    monkeypatch.setattr(InProcessInvoker, "invoke", invoke)
    assert rlhf_campaign(config=cfg.model_dump(mode="json"), resume=True)["steps_completed"] == 2


def test_a_prepared_run_cancelled_before_its_call_raises_naming_it_and_its_body_never_runs(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.campaign.prestart import CancelledBeforeStart

    ran = []

    @flow(name="prestart-cancelled-early", validate_parameters=False)
    def child(x: int) -> int:
        ran.append(x)
        return x

    bg = Background()
    starter = FlowRunStarter(child, bg)
    starter.prepare()
    prepared = starter._next.result()
    _cancel(prepared.id)
    with pytest.raises(CancelledBeforeStart) as info:
        starter.run(1)
    assert info.value.flow_run.id == prepared.id and ran == []
    starter.mark_cancelled(info.value.flow_run, "stopped")
    starter.close()
    bg.wait()
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(prepared.id).state.is_cancelled()


def test_a_step_run_cancelled_before_it_started_ends_the_campaign_cancelled_after_the_step_before(
        tiny_config, prefect_harness, monkeypatch):
    from prefect.client.orchestration import get_client

    from actions.store import open_store
    from flows.campaign.run import rlhf_campaign
    from flows.campaign.state import load_state

    run, calls = prestart.FlowRunStarter.run, []

    def cancel_the_second_before_it_starts(self, *args, **kwargs):
        calls.append(self._next)
        if len(calls) == 2:  # step 1's run, its creation started in step 0 (test_no_background_job_starts_...)
            _cancel(self._next.result(timeout=60).id)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(prestart.FlowRunStarter, "run", cancel_the_second_before_it_starts)
    cfg = tiny_config("invoker.kind=inprocess", "run_id=cancelled_early", "steps=3")
    state = rlhf_campaign(config=cfg.model_dump(mode="json"), return_state=True)
    name = calls[1].result().name
    assert state.is_cancelled() and state.message == (f"stopped after step 1/3: its step run {name!r} was "
                                                      "cancelled; resume the run to continue")
    assert load_state(open_store(cfg.store.uri), "cancelled_early").step == 1
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(calls[1].result().id).state.is_cancelled()  # not Cancelling for good
