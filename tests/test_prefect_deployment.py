"""prefect.yaml against a real local Prefect server: deploy, run on a process worker, read back.

One server (``prefect server start`` on a free loopback port, SQLite in a temporary
PREFECT_HOME) serves the module. The tests run the operator's commands as subprocesses with
no stdin and CI=true: ``prefect work-pool create``, ``prefect deploy --all`` from the repo root,
``prefect worker start --run-once``; then they read the deployment, flow runs, artifacts,
concurrency limits and events back from the server API. About 60 s on 2 cores (server start
~10 s, the tiny campaign ~25 s on the worker).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from flows.config import load_config

try:
    from conftest import TINY_OVERRIDES
except ImportError:  # tests/ imported as a package
    from tests.conftest import TINY_OVERRIDES

pytestmark = pytest.mark.prefect_server

REPO = Path(__file__).resolve().parents[1]
DEPLOYMENT = "rlhf-campaign/nightly-campaign"
POOL = "rlhfless-process"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPrefectServer:
    """``prefect server start`` in its own session (so teardown ends the uvicorn child too)."""

    def __init__(self, home: Path) -> None:
        self.home, self.port = home, _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_HOME=str(self.home), PREFECT_API_URL=self.url, PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   CI="true", HF_HUB_OFFLINE="1", PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW="ignore",
                   # the scheduler's pass every 2 s, not 60: a schedule turned on shows its runs at once
                   PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2")
        return env

    def start(self, timeout_s: float = 120.0) -> None:
        env = self.env()
        del env["PREFECT_API_URL"]
        log = open(self.home / "server.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                      "--port", str(self.port)], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Prefect server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group this fixture started
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def log_tail(self, n: int = 4000) -> str:
        return (self.home / "server.log").read_text(errors="replace")[-n:]

    def prefect(self, *args: str, cwd: Path = REPO, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """Run a ``prefect`` CLI command (from the repo root), no stdin; fails the test on error."""
        out = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=cwd, env=self.env(),
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
        assert out.returncode == 0, \
            f"prefect {' '.join(args)} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    @contextmanager
    def client(self) -> Iterator[Any]:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.url}):
            with get_client(sync_client=True) as client:
                yield client


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPrefectServer]:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    srv = LocalPrefectServer(tmp_path_factory.mktemp("prefect-home"))
    srv.start()
    yield srv
    # Flush what this process still sends to the server (events, run logs) while it is up, as
    # prefect_test_harness does, so nothing retries against a stopped server at exit.
    EventsWorker.drain_all(timeout=10)
    APILogWorker.drain_all(timeout=10)
    srv.stop()


@pytest.fixture(scope="module")
def deployed(server: LocalPrefectServer) -> LocalPrefectServer:
    """The work pool exists and ``prefect deploy --all`` registered prefect.yaml's deployments."""
    server.prefect("work-pool", "create", POOL, "--type", "process")
    out = server.prefect("--no-prompt", "deploy", "--all")
    assert DEPLOYMENT in out.stdout, out.stdout[-2000:]
    return server


def _tiny(tmp_path: Path, *extra: str) -> dict[str, Any]:
    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={tmp_path / 'store'}", "invoker.num_workers=2", *extra])
    return cfg.model_dump(mode="json")


def _run_worker(server: LocalPrefectServer, timeout_s: float = 300.0) -> str:
    """One polling round of a process worker; returns when the runs it picked up have ended."""
    log = server.home / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once"],
                              cwd=server.home, env=server.env(), stdin=subprocess.DEVNULL, stdout=fh,
                              stderr=subprocess.STDOUT, timeout=timeout_s)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    return text


def test_deploy_registers_pool_schedule_pull_step_and_concurrency_limit(deployed: LocalPrefectServer):
    with deployed.client() as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
    assert dep.work_pool_name == POOL and dep.entrypoint == "flows/campaign/run.py:rlhf_campaign"
    assert [(s.schedule.cron, s.schedule.timezone) for s in dep.schedules] == [("0 2 * * *", "UTC")]
    # Runs of the deployment never overlap: a deployment-level limit of 1, new runs cancelled.
    assert dep.global_concurrency_limit is not None and dep.global_concurrency_limit.limit == 1
    assert dep.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    # The pull step points at the checkout `prefect deploy` ran in, not at a git remote.
    assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    # The parameter schema is CampaignConfig's: the server validates runs against it.
    assert dep.enforce_parameter_schema
    assert "CampaignConfig" in dep.parameter_openapi_schema["definitions"]


def test_a_schedule_turned_on_creates_its_runs(deployed: LocalPrefectServer):
    """The operator's step (docs/prefect.md): `prefect deployment schedule resume`. The server's
    scheduler then inserts the coming nights' runs; with a SQLAlchemy Prefect 3.8 does not
    support (2.1) every pass failed in the server log and no run ever appeared."""
    with deployed.client() as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
    [schedule] = dep.schedules
    deployed.prefect("deployment", "schedule", "resume", DEPLOYMENT, str(schedule.id))
    try:
        deadline, runs = time.time() + 60, []
        while time.time() < deadline and not runs:
            time.sleep(1)
            with deployed.client() as client:
                runs = [r for r in client.read_flow_runs(limit=20) if r.deployment_id == dep.id
                        and r.state is not None and r.state.type.value == "SCHEDULED"]
        assert runs, f"no scheduled run within 60 s; server log:\n{deployed.log_tail()}"
        assert all(r.expected_start_time.hour == 2 and r.expected_start_time.minute == 0 for r in runs)
    finally:
        deployed.prefect("deployment", "schedule", "pause", DEPLOYMENT, str(schedule.id))
        with deployed.client() as client:  # the other tests count this deployment's runs
            for run in client.read_flow_runs(limit=200):
                if run.deployment_id == dep.id and run.state is not None and run.state.type.value == "SCHEDULED":
                    client.delete_flow_run(run.id)


def test_bad_parameter_is_rejected_naming_the_field(deployed: LocalPrefectServer, tmp_path: Path):
    from prefect.exceptions import PrefectHTTPStatusError

    from flows.campaign.run import rlhf_campaign

    cfg = _tiny(tmp_path, "run_id=bad")
    with deployed.client() as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
        # Field bounds are in the JSON schema: the server refuses to create the run.
        zero = {**cfg, "algorithm": {**cfg["algorithm"], "batch_size": 0}}
        with pytest.raises(PrefectHTTPStatusError, match=r"config\.algorithm\.batch_size"):
            client.create_flow_run_from_deployment(dep.id, parameters={"config": zero})
    # Cross-field rules run in pydantic when the flow starts: the run fails naming the field.
    odd = {**cfg, "algorithm": {**cfg["algorithm"], "batch_size": 18}}
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: deployed.url}):
        state = rlhf_campaign(config=odd, return_state=True)
    assert state.is_failed()
    assert "config.algorithm" in state.message and "group_size=4 does not divide" in state.message
    assert not (tmp_path / "store").exists()  # rejected before anything was written


def _start_and_work(deployed: LocalPrefectServer, cfg: dict) -> tuple[Any, str]:
    """Create a run of the deployment with ``cfg`` and let a worker run it: (the run, its log)."""
    with deployed.client() as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
        run = client.create_flow_run_from_deployment(dep.id, parameters={"config": cfg, "resume": False})
    return run, _run_worker(deployed)


def test_a_deployment_run_refuses_what_train_refuses_before_writing_the_store(deployed: LocalPrefectServer,
                                                                             tmp_path: Path):
    """What pydantic cannot see (here a model folder that is not there) fails the run with the error
    ``rlhfless train`` prints, before the store is written (it failed after set-up had written
    runs/<run>/)."""
    cfg = _tiny(tmp_path, "run_id=no-model", f"model.path={tmp_path / 'missing'}")
    run, worker_log = _start_and_work(deployed, cfg)
    with deployed.client() as client:
        done = client.read_flow_run(run.id)
    assert done.state.is_failed(), f"{done.state!r}\n{worker_log[-4000:]}"
    assert "ValueError: model.path" in done.state.message and "is not a directory" in done.state.message, \
        done.state.message
    assert not (tmp_path / "store").exists()
    # the run's log (the UI's log tab) holds the one line, not the engine's tracebacks of it
    logs = _run_logs(deployed, run.id)
    assert not [m for _, m in logs if "Traceback" in m or "unexpected exception" in m], logs
    assert [m for level, m in logs if level >= 40] == [done.state.message], logs


def _run_logs(server: LocalPrefectServer, run_id: Any) -> list[tuple[int, str]]:
    """(level, message) of every record of flow run ``run_id`` the server holds (its workers
    send them as the run goes: read until two reads agree)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    seen: list[tuple[int, str]] = []
    for _ in range(10):
        with server.client() as client:
            logs = [(r.level, r.message) for r in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))]
        if logs and logs == seen:
            break
        seen = logs
        time.sleep(0.5)
    return seen


def test_deployment_run_on_worker_publishes_artifacts_and_holds_gpu_slots(deployed: LocalPrefectServer,
                                                                          tmp_path: Path):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.campaign.tensorboard import read_scalars

    limit_name = "gpu-actions"
    board = tmp_path / "tensorboard"
    cfg = _tiny(tmp_path, "run_id=deployed-tiny", f"invoker.gpu_concurrency_limit={limit_name}",
                "observability.tensorboard=true", f"observability.tensorboard_dir={board}")
    deployed.prefect("gcl", "create", limit_name, "--limit", "2")  # the command docs/prefect.md gives
    with deployed.client() as client:
        limit_id = client.read_global_concurrency_limit_by_name(limit_name).id
    run, worker_log = _start_and_work(deployed, cfg)
    with deployed.client() as client:
        done = client.read_flow_run(run.id)
        assert done.state.is_completed(), f"{done.state!r}\n{worker_log[-4000:]}"
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
        limit = client.read_global_concurrency_limit_by_name(limit_name)
    latest = {a.key: a for a in sorted(artifacts, key=lambda a: a.created)}  # the last version of each key
    rows = latest["deployed-tiny-metrics"].data
    rows = rows if isinstance(rows, list) else json.loads(rows)
    assert [r["step"] for r in rows] == [1, 2] and all(r["actors/n"] >= 1 for r in rows)
    assert "# deployed-tiny: step 2" in latest["deployed-tiny-report"].data
    assert latest["deployed-tiny-progress"].type == "progress" and float(latest["deployed-tiny-progress"].data) == 100
    assert latest["deployed-tiny-plan"].type == "table"
    # GPU slots: every GPU activation acquired a slot of the limit and released it.
    assert limit.active_slots == 0
    # warmup, 2 evals, >= 2 generate, >= 2 score, 2 trains (no prefill: nothing shared to dedup);
    # the events arrive asynchronously, so read both kinds until they settle
    acquired, released = [], [None]
    for _ in range(5):
        acquired = _concurrency_events(deployed, limit_id, "acquired", minimum=max(9, len(released)))
        released = _concurrency_events(deployed, limit_id, "released", minimum=len(acquired))
        if len(acquired) == len(released):
            break
    assert len(acquired) == len(released) >= 9
    # TensorBoard scalars under the flows/step/metrics.py names, one point per step.
    scalars = read_scalars(board)
    for name in ("reward/mean", "response_length/mean", "timing_s/generate", "cost/billed_gpu_seconds", "actors/n",
                 "kl", "loss/policy"):
        assert [s for s, _ in scalars[name]] == [1, 2], name
    assert [s for s, _ in scalars["eval/accuracy"]] == [0, 2]


def _concurrency_events(server: LocalPrefectServer, limit_id: Any, phase: str, minimum: int) -> list[dict]:
    """Events the flow run emitted for the limit (they reach the server asynchronously)."""
    body = {"filter": {"event": {"name": [f"prefect.concurrency-limit.{phase}"]},
                       "resource": {"id": [f"prefect.concurrency-limit.{limit_id}"]}}, "limit": 50}
    deadline, events = time.time() + 30, []
    while time.time() < deadline:
        events = httpx.post(f"{server.url}/events/filter", json=body, timeout=10).raise_for_status().json()["events"]
        if len(events) >= minimum:
            break
        time.sleep(1)
    return events


@pytest.mark.slow  # a campaign of 4 steps on the worker, about 40 s
def test_cancelling_a_step_run_commits_that_step_and_cancels_the_campaign_run(deployed: LocalPrefectServer,
                                                                            tmp_path: Path):
    """``prefect flow-run cancel STEP_RUN`` on a deployment run: the step in flight finishes and
    is committed, its run ends Cancelled (not Cancelling for good), the campaign run ends
    Cancelled after it with one line, its lease released and its GPU slots free."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.objects import State, StateType

    from actions.store import open_store
    from flows.campaign.lease import read_lease
    from flows.campaign.state import load_state

    deployed.prefect("gcl", "create", "gpu-cancel", "--limit", "2")
    cfg = _tiny(tmp_path, "run_id=step-cancel", "steps=4", "invoker.gpu_concurrency_limit=gpu-cancel")
    with deployed.client() as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
        run = client.create_flow_run_from_deployment(dep.id, parameters={"config": cfg, "resume": False})
    with open(deployed.home / "worker-cancel.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once"],
                                  cwd=deployed.home, env=deployed.env(), stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        cancelled, deadline = None, time.time() + 240
        mine = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id]))
        while cancelled is None and worker.poll() is None and time.time() < deadline:
            with deployed.client() as client:
                for step in client.read_flow_runs(flow_run_filter=mine):
                    # what `prefect flow-run cancel` proposes; refused if the step has just ended
                    if step.state.is_running() and client.set_flow_run_state(
                            step.id, State(type=StateType.CANCELLING)).status.value == "ACCEPT":
                        cancelled = step
            time.sleep(0.1)
        assert worker.wait(timeout=max(1.0, deadline - time.time())) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert cancelled is not None, "no step run was cancelled while it ran"
    with deployed.client() as client:
        done = client.read_flow_run(run.id)
        step = client.read_flow_run(cancelled.id)
        slots = client.read_global_concurrency_limit_by_name("gpu-cancel").active_slots
    committed = step.parameters["inputs"]["step"] + 1
    assert step.state.is_cancelled(), step.state
    assert done.state.is_cancelled(), f"{done.state!r}\n{(deployed.home / 'worker-cancel.log').read_text()[-4000:]}"
    assert done.state.message == (f"stopped after step {committed}/4: its step run {step.name!r} was cancelled; "
                                  "resume the run to continue")
    store = open_store(cfg["store"]["uri"])
    assert load_state(store, "step-cancel").step == committed and read_lease(store, "step-cancel") is None
    assert slots == 0
    assert not [m for _, m in _run_logs(deployed, run.id) if "Traceback" in m]


def test_gpu_slots_held_only_by_gpu_actions_and_missing_limit_never_blocks(deployed: LocalPrefectServer,
                                                                            tmp_path: Path):
    """invoke_action against the server with a fake invoker that looks at the limit mid-call (a
    GPU action) and the slot rule alone around a CPU action (no action off the GPU image has a
    result contract to validate)."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from actions.store import LocalStore
    from flows.invokers.base import Activation
    from flows.step.context import RunContext, set_context
    from flows.step.invoke import gpu_slots, invoke_action

    prefilled = {"bundle_key": "k", "num_unique_prefixes": 1, "tokens_computed": 3}

    seen: list[tuple[str, int]] = []

    class PeekingInvoker:
        def __init__(self, limit_name: str) -> None:
            self.limit_name = limit_name

        def invoke(self, action: str, payload: dict, *, timeout_s: float | None = None) -> Activation:
            with deployed.client() as client:
                names = {c.name: c.active_slots for c in client.read_global_concurrency_limits(limit=100)}
            seen.append((action, names.get(self.limit_name, -1)))
            now = time.time()
            return Activation(action=action, activation_id="a", result=dict(prefilled), submitted_at=now, started_at=now,
                              ended_at=now, busy_s=0.0)

        def close(self) -> None:
            pass

    with deployed.client() as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu-unit", limit=4))
    for name in ("gpu-unit", "no-such-limit"):
        cfg = load_config(None, [f"invoker.gpu_concurrency_limit={name}", "scaling.gpus_per_actor=2"])
        set_context(RunContext(config=cfg, store=LocalStore(tmp_path / "s"), invoker=PeekingInvoker(name),
                               run_id="unit"))
        from prefect.settings import PREFECT_API_URL, temporary_settings

        try:
            with temporary_settings(updates={PREFECT_API_URL: deployed.url}):
                assert invoke_action.fn(action="prefill", payload={}, shard="s").result.tokens_computed == 3
                with gpu_slots("noop", cfg):
                    PeekingInvoker(name).invoke("noop", {})
        finally:
            set_context(None)
    # prefill held gpus_per_actor = 2 slots while it ran; noop (CPU) held none; an unknown
    # limit name is skipped (strict=False) instead of blocking.
    assert seen == [("prefill", 2), ("noop", 0), ("prefill", -1), ("noop", -1)]
    with deployed.client() as client:
        assert client.read_global_concurrency_limit_by_name("gpu-unit").active_slots == 0


def test_a_prewarm_takes_only_the_gpu_slots_free_now_and_never_waits(deployed: LocalPrefectServer):
    """spare_gpu_slots: of a limit of 5 with 2 slots taken and 2 GPUs per actor, a pre-warm of 3
    containers may start 1 and holds its 2 slots while it runs; with none free it starts 0 at
    once; where no limit applies it starts them all."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.step.invoke import spare_gpu_slots

    def active() -> int:
        with deployed.client() as client:
            return client.read_global_concurrency_limit_by_name("gpu-prewarm").active_slots

    with deployed.client() as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu-prewarm", limit=5))
    cfg = load_config(None, ["invoker.gpu_concurrency_limit=gpu-prewarm", "scaling.gpus_per_actor=2"])
    with temporary_settings(updates={PREFECT_API_URL: deployed.url}):
        with concurrency("gpu-prewarm", occupy=2):
            with spare_gpu_slots("generate", 3, cfg) as allowed:
                assert (allowed, active()) == (1, 4)
            assert active() == 2
            with concurrency("gpu-prewarm", occupy=2):
                started = time.monotonic()
                with spare_gpu_slots("generate", 3, cfg) as allowed:
                    assert (allowed, active()) == (0, 4)
                assert time.monotonic() - started < 5
        assert active() == 0
        with spare_gpu_slots("prepare", 3, cfg) as allowed:  # a CPU action holds none
            assert (allowed, active()) == (3, 0)
        unknown = load_config(None, ["invoker.gpu_concurrency_limit=no-such-limit"])
        with spare_gpu_slots("generate", 3, unknown) as allowed:
            assert allowed == 3


def test_a_prewarm_whose_slots_went_between_read_and_take_starts_none_at_once(
        deployed: LocalPrefectServer, monkeypatch: pytest.MonkeyPatch):
    """spare_gpu_slots: where the limit read says slots are free but they are taken by the time
    it asks for them, one refused request (423) makes it start 0 containers without waiting
    for slots, and it holds nothing."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.step.invoke import spare_gpu_slots

    with deployed.client() as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu-race", limit=4))
    read = SyncPrefectClient.read_global_concurrency_limit_by_name

    def stale(self, name):  # the state before another run took the slots
        return read(self, name).model_copy(update={"active_slots": 0})

    cfg = load_config(None, ["invoker.gpu_concurrency_limit=gpu-race", "scaling.gpus_per_actor=2"])
    with temporary_settings(updates={PREFECT_API_URL: deployed.url}):
        with concurrency("gpu-race", occupy=3):
            monkeypatch.setattr(SyncPrefectClient, "read_global_concurrency_limit_by_name", stale)
            started = time.monotonic()
            with spare_gpu_slots("generate", 2, cfg) as allowed:
                assert allowed == 0
                waited = time.monotonic() - started
            monkeypatch.undo()
            with deployed.client() as client:
                assert client.read_global_concurrency_limit_by_name("gpu-race").active_slots == 3
    assert waited < 10  # it did not wait for the 3 held slots (held until after the check)


def test_deploy_from_a_checkout_elsewhere_points_the_worker_there(deployed: LocalPrefectServer, tmp_path: Path):
    """prefect.yaml holds no path: a clone at any path deploys with its own directory."""
    clone = tmp_path / "elsewhere" / "rlhfless"
    shutil.copytree(REPO / "flows", clone / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "prefect.yaml", clone / "prefect.yaml")
    try:
        deployed.prefect("--no-prompt", "deploy", "--all", cwd=clone)
        with deployed.client() as client:
            dep = client.read_deployment_by_name(DEPLOYMENT)
        pull = {"prefect.deployments.steps.set_working_directory": {"directory": str(clone.resolve())}}
        assert dep.pull_steps == [pull]
    finally:
        deployed.prefect("--no-prompt", "deploy", "--all")  # back to this checkout for other tests


ZOMBIES = REPO / "infra" / "prefect" / "zombie-flow-runs.yaml"


def _unknown_keys(data: dict[str, Any], model: Any) -> set[str]:
    """Keys of ``data`` that are not fields of ``model`` (Prefect's automation models ignore
    them: a misspelt key would pass validation and change nothing)."""
    return set(data) - set(model.model_fields)


def test_the_zombie_automation_file_is_prefects_schema_with_three_missed_heartbeats():
    """``infra/prefect/zombie-flow-runs.yaml`` parses as ``prefect automation create`` parses it,
    every key is one Prefect reads, and it fires after three heartbeats at Prefect's default
    frequency have been missed (docs/prefect.md, "Crashed processes")."""
    import yaml
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.settings.models.flows import FlowsSettings

    data = yaml.safe_load(ZOMBIES.read_text())
    assert not _unknown_keys(data, AutomationCore) and not _unknown_keys(data["trigger"], EventTrigger)
    assert not any(_unknown_keys(action, ChangeFlowRunState) for action in data["actions"])
    automation = AutomationCore.model_validate(data)
    trigger, (action,) = automation.trigger, automation.actions
    assert isinstance(trigger, EventTrigger) and trigger.posture == Posture.Proactive
    assert trigger.after == {"prefect.flow-run.heartbeat"} and trigger.expect == {"prefect.flow-run.*"}
    assert trigger.for_each == {"prefect.resource.id"} and trigger.threshold == 1
    assert trigger.match.model_dump() == {"prefect.resource.id": "prefect.flow-run.*"}
    assert trigger.within.total_seconds() == 3 * FlowsSettings().heartbeat_frequency == 540
    assert isinstance(action, ChangeFlowRunState) and action.state == StateType.CRASHED and not action.force


SLEEPER = """
import time
from prefect import flow
from prefect.runtime import flow_run

@flow
def sleeper():
    print(flow_run.id, flush=True)
    time.sleep(600)

sleeper()
"""


def test_the_zombie_automation_marks_a_killed_flow_run_crashed(server: LocalPrefectServer, tmp_path: Path):
    """The file as the operator applies it (``prefect automation create --from-file``), and what
    it does, in a copy that waits 15 s instead of 540: a flow run whose process is killed (kill
    -9: nothing reports its end) is set Crashed; without it the run would stay Running."""
    import yaml
    from prefect.client.schemas.objects import StateType
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    server.prefect("automation", "create", "--from-file", str(ZOMBIES))
    fast = yaml.safe_load(ZOMBIES.read_text())
    fast["name"], fast["trigger"]["within"] = "zombies-in-15-s", 15
    (tmp_path / "fast.yaml").write_text(yaml.safe_dump(fast))
    server.prefect("automation", "create", "--from-file", str(tmp_path / "fast.yaml"))
    env = {**server.env(), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}  # one heartbeat as it starts
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        run_id = child.stdout.readline().strip()
        with server.client() as client:  # the trigger arms on a heartbeat: wait until the server has one
            def heard():  # a filter's window ends when it is made: make one per look
                return EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                                   resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]))

            deadline = time.time() + 90
            while not client.read_events(heard(), limit=1).events:  # the server takes at most 50
                assert time.time() < deadline, "the flow run sent no heartbeat in 90 s"
                time.sleep(1)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        deadline, state = time.time() + 120, None
        with server.client() as client:
            while time.time() < deadline:
                state = client.read_flow_run(run_id).state
                if state.type != StateType.RUNNING:
                    break
                time.sleep(2)
        assert state is not None and state.type == StateType.CRASHED, state
        assert "No heartbeat" in (state.message or ""), state.message
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        with server.client() as client:  # it would crash a live campaign run of a later test
            for automation in client.read_automations_by_name("zombies-in-15-s"):
                client.delete_automation(automation.id)
