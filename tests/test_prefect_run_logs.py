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
