"""A campaign run as a Prefect flow (a deployment run) writes its progress lines to the flow
run's log, where the UI and the API show them (``flows/campaign/progress_line.py``)."""

from __future__ import annotations

import asyncio


def test_the_campaign_flow_logs_its_progress_lines(tiny_config, prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    from flows.campaign.run import rlhf_campaign

    cfg = tiny_config("invoker.kind=inprocess", "run_id=logged_1", "steps=1")
    state = rlhf_campaign(config=cfg.model_dump(mode="json"), return_state=True)
    assert state.is_completed()
    APILogHandler().flush()  # the log worker sends what it queued before the read

    async def messages() -> list[str]:
        async with get_client() as client:
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
            return [log.message for log in logs]

    lines = asyncio.run(messages())
    assert any("step 1/1 |" in line for line in lines), lines
    assert any(line.startswith("warning: step 1: ") for line in lines), lines


def _run_as_a_deployment(flow, parameters: dict):
    """Run ``flow`` as a deployment's engine process runs it (``prefect.engine``: a flow run made
    first, then ``run_flow`` with the run's logger for what escapes it); returns the run's state,
    what escaped (None: nothing) and the run's log records as (level, message)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.flow_engine import flow_run_logger, run_flow
    from prefect.logging.handlers import APILogHandler

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(flow, parameters=parameters)
    escaped = None
    try:
        run_flow(flow, flow_run=flow_run, error_logger=flow_run_logger(flow_run=flow_run))
    except BaseException as exc:  # noqa: BLE001 - the engine raises the run's failure after logging it
        escaped = exc
    APILogHandler().flush()

    async def logs():
        async with get_client() as client:
            return await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    return state, escaped, [(log.level, log.message) for log in asyncio.run(logs())]


def _resumed_with_other_epochs(tiny_config, run_id: str):
    """A store holding run ``run_id`` committed with ``algorithm.epochs=2``, and the config
    that resumes it with epochs 1: ``check_resume`` refuses it (CampaignRefused)."""
    from actions.store import open_store
    from flows.campaign.state import commit_state
    from flows.config import fingerprint_of

    try:
        from conftest import bare_state
    except ImportError:  # tests/ imported as a package
        from tests.conftest import bare_state

    made = tiny_config("invoker.kind=inprocess", f"run_id={run_id}", "algorithm.epochs=2")
    identity = made.identity()
    state = bare_state(run_id).model_copy(update={"identity": identity, "fingerprint": fingerprint_of(identity)})
    commit_state(open_store(made.store.uri), state)
    return tiny_config("invoker.kind=inprocess", f"run_id={run_id}")


def test_a_refused_config_fails_the_run_with_one_line_and_no_traceback_in_its_log(tiny_config, prefect_harness,
                                                                                tmp_path):
    from flows.campaign.run import rlhf_campaign
    from flows.campaign.state import CampaignRefused

    missing = tiny_config("invoker.kind=inprocess", "run_id=refused_v5", f"model.path={tmp_path}/nonexistent")
    resumed = _resumed_with_other_epochs(tiny_config, "refused_epochs")
    for cfg, resume, kind, named in [(missing, False, ValueError, "is not a directory"),
                                     (resumed, True, CampaignRefused, "algorithm.epochs")]:
        state, escaped, logs = _run_as_a_deployment(rlhf_campaign, {"config": cfg.model_dump(mode="json"),
                                                                    "resume": resume})
        assert state.is_failed() and state.message.startswith(f"{kind.__name__}: ") and named in state.message
        assert "\n" not in state.message and "Traceback" not in state.message
        assert not [m for _, m in logs if "Traceback" in m or "Encountered exception" in m], logs
        assert [m for level, m in logs if level >= 40] == [state.message]  # the one ERROR line
        assert type(escaped) is kind  # what a direct call (rlhfless train) raises: the refusal itself
