"""Observability: TensorBoard scalars, progress helpers, the run report, the metrics table.

The Prefect side of a real run (table, markdown and progress artifacts, read back from the
API) is tested in test_prefect_deployment.py; the metrics table's replaced versions here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
import uuid

import pytest

from flows.campaign.artifacts import (
    TABLE_ROWS,
    _percent,
    plan_rows,
    publish_step_artifacts,
    start_progress,
    update_progress,
)
from flows.campaign.state import EvalRecord
from flows.campaign.tensorboard import ScalarBoard, read_scalars, step_scalars
from flows.commands.report import length_histogram, write_report
from flows.config import load_config

needs_tensorboardx = pytest.mark.skipif(importlib.util.find_spec("tensorboardX") is None,
                                        reason="tensorboardX not installed: pip install 'rlhfless[tensorboard]'")

STEP_METRICS = {"reward/mean": 0.25, "response_length/mean": 7.5, "timing_s/generate": 0.3, "cost/usd": 1e-4,
                "actors/n": 2.0, "kl": 0.01, "loss/policy": -0.2, "entropy": float("nan"), "step": 0.0,
                "plan": {"num_actors": 2}}


def _board(tmp_path, enabled: bool = True) -> ScalarBoard:
    cfg = load_config(None, [f"observability.tensorboard={str(enabled).lower()}",
                             f"observability.tensorboard_dir={tmp_path / 'tb'}"])
    return ScalarBoard.open(cfg, "run")


@needs_tensorboardx
def test_board_writes_architecture_metric_names_per_step(tmp_path):
    board = _board(tmp_path)
    evals = [EvalRecord(step=0, policy_version=0, accuracy=0.3, mean_length=4.0, num_prompts=8)]
    board.add_step(1, STEP_METRICS, evals)
    evals.append(EvalRecord(step=2, policy_version=2, accuracy=0.6, mean_length=4.0, num_prompts=8, reward_mean=0.75,
                            reward_metrics={"hits": 0.5}))
    board.add_step(2, {**STEP_METRICS, "reward/mean": 0.5}, evals)
    board.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["reward/mean"] == [(1, 0.25), (2, 0.5)]
    for name in ("response_length/mean", "timing_s/generate", "cost/usd", "actors/n", "kl", "loss/policy"):
        assert [s for s, _ in scalars[name]] == [1, 2], name
    # TRL's names too, as every tracker logs them (step_scalars): reward, completions/mean_length
    assert scalars["reward"] == scalars["reward/mean"] and scalars["completions/mean_length"] == [(1, 7.5), (2, 7.5)]
    at_1 = {name: v for name, points in scalars.items() for s, v in points if s == 1}
    assert at_1 == pytest.approx(step_scalars(STEP_METRICS))
    # each evaluation once, at the step it was measured (0 = before RL)
    assert [(s, round(v, 3)) for s, v in scalars["eval/accuracy"]] == [(0, 0.3), (2, 0.6)]
    assert scalars["eval/reward_mean"] == [(0, 0.0), (2, 0.75)] and scalars["eval/reward_fn/hits"] == [(2, 0.5)]
    # not scalars: the planner record, the step index, a NaN
    assert not {"plan", "step", "entropy"} & scalars.keys()


def test_disabled_board_writes_nothing(tmp_path):
    board = _board(tmp_path, enabled=False)
    board.add_step(1, STEP_METRICS, [])
    board.close()
    assert not board.enabled and not (tmp_path / "tb").exists()


@needs_tensorboardx
def test_torn_event_file_is_reported(tmp_path):
    board = _board(tmp_path)
    board.add_step(1, STEP_METRICS, [])
    board.close()
    path = next((tmp_path / "tb").glob("events.out.tfevents.*"))
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt record"):
        read_scalars(tmp_path / "tb")


def test_missing_tensorboardx_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    with pytest.raises(ValueError, match=r"observability.tensorboard=true needs the tensorboardX package"):
        _board(tmp_path)


def test_observability_does_not_change_the_run_identity():
    plain = load_config(None, [])
    watched = load_config(None, ["observability.tensorboard=true", "invoker.gpu_concurrency_limit=gpu-actions"])
    assert plain.fingerprint() == watched.fingerprint() and plain.resolved_run_id() == watched.resolved_run_id()


def test_progress_outside_a_flow_run_is_a_no_op():
    assert start_progress("run", 0, 4) is None
    update_progress(None, "run", 1, 4)  # nothing to update, no API needed
    # percent of committed steps; a resumed run past its target shows 100, zero steps is done
    assert [_percent(d, 4) for d in (0, 1, 4, 6)] == [0.0, 25.0, 100.0, 100.0] and _percent(0, 0) == 100.0


def test_the_metrics_table_shows_the_latest_steps_only(monkeypatch):
    """Prefect keeps every version of a keyed artifact: a table of every step after every step
    would grow its database with the square of the run's length."""
    import prefect.artifacts
    import prefect.context

    tables: dict[str, tuple[str, list]] = {}
    run = types.SimpleNamespace(flow_run=types.SimpleNamespace(id=uuid.uuid4()))
    monkeypatch.setattr(prefect.context.FlowRunContext, "get", classmethod(lambda cls: run))
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact",
                        lambda key, table, description: tables.__setitem__(key, (description, table)))
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda key, markdown: None)
    for done in (3, TABLE_ROWS + 50):
        steps = [{**STEP_METRICS, "step": float(s), "timing_s/step": 1.0, "actors/migrated": 0.0,
                  "cost/billed_gpu_seconds": 1.0, "cost/gpu_seconds": 1.0} for s in range(done)]
        assert publish_step_artifacts("Run_1", steps, [], "action-seconds")
        description, rows = tables["run-1-metrics"]
        assert [r["step"] for r in rows] == list(range(max(1, done - TABLE_ROWS + 1), done + 1))
    assert description.startswith(f"per-step metrics of the latest {TABLE_ROWS} of {TABLE_ROWS + 50} steps")


def test_report_has_plots_and_a_length_histogram(tmp_path):
    steps = [{"step": float(i), "reward/mean": 0.1 * i, "response_length/mean": 5.0 + i, "response_length/max": 9.0,
              "actors/n": 2.0, "actors/migrated": 1.0, "cost/billed_gpu_seconds": 1.5, "cost/gpu_seconds": 1.0,
              "timing_s/step": 0.5} for i in range(3)]
    # prompt -> [[epoch, longest response of the group]]: the latest epoch counts
    history = {"observations": {"0": [[0, 3.0], [1, 4.0]], "1": [[0, 4.0]], "2": [[0, 12.0]]}}
    summary = {"run_id": "r", "steps": steps, "evals": [{"step": 0, "accuracy": 0.3}, {"step": 3, "accuracy": 0.5}],
               "steps_completed": 3, "eval_accuracy_first": 0.3, "eval_accuracy_last": 0.5, "billed_gpu_seconds": 4.5,
               "useful_gpu_seconds": 3.0, "usd": 0.002, "wall_seconds": 9.0, "policy_version": 3,
               "weights_sha256": "ab", "stopped_reason": None, "length_history": history}
    assert length_histogram(summary) == ([4, 12], [2, 1])
    files = write_report(summary, tmp_path)
    names = {p.name for p in files}
    assert {"report.md", "reward.png", "response_length.png", "response_length_hist.png", "fanout.png",
            "cost.png"} <= names
    assert all(p.stat().st_size > 1000 for p in files if p.suffix == ".png")
    report = (tmp_path / "report.md").read_text()
    assert "| 3 | 0.200 |" in report and "![response_length_hist](response_length_hist.png)" in report
    assert length_histogram({}) == ([], [])  # summaries written before the histogram existed


def test_step_figures_read_a_committed_step_by_the_names_the_step_makes():
    from flows.step.metrics import ACTORS_MIGRATED, ACTORS_N, BILLED, REWARD_MEAN, USEFUL, StepFigures, timing_key

    m = {"step": 4.0, REWARD_MEAN: 0.25, "response_length/mean": 7.5, ACTORS_N: 3.0, ACTORS_MIGRATED: 2.0,
         BILLED: 1.5, USEFUL: 1.0, timing_key("generate"): 0.75, timing_key("step"): 2.0, "kl": 0.1}
    f = StepFigures.of(m)
    assert (f.step, f.reward_mean, f.response_length_mean, f.num_actors, f.migrated) == (4, 0.25, 7.5, 3, 2)
    assert (f.billed_gpu_seconds, f.useful_gpu_seconds) == (1.5, 1.0)
    assert f.timing_s == {"generate": 0.75, "step": 2.0}
    assert math.isnan(f.usd) and math.isnan(f.predicted_generate_s)  # not recorded
    with pytest.raises(KeyError):
        StepFigures.of({k: v for k, v in m.items() if k != REWARD_MEAN})


def test_each_metrics_table_replaces_the_one_before_in_prefect(prefect_harness):
    """Every version holds the latest rows: the newest is kept, the database does not grow with
    a version per step (49 KB each at 200 rows)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    def steps(done):
        return [{**STEP_METRICS, "step": float(s), "timing_s/step": 1.0, "actors/migrated": 0.0,
                 "cost/billed_gpu_seconds": 1.0, "cost/gpu_seconds": 1.0} for s in range(done)]

    @flow
    def publish_three():
        for done in (1, 2, 3):
            assert publish_step_artifacts("Replaced_1", steps(done), [], "action-seconds")

    publish_three()
    with get_client(sync_client=True) as client:
        def versions(key):
            return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))

        tables = versions("replaced-1-metrics")
        assert len(tables) == 1 and [r["step"] for r in json.loads(tables[0].data)] == [1, 2, 3]  # the newest
        assert len(versions("replaced-1-plan")) == 3  # the plan's history stays: each is another step's


def test_a_flow_run_replaces_only_its_own_metrics_tables(prefect_harness):
    """Two runs whose ids slug alike (or a run and its resume) in one process keep their tables."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    steps = [{**STEP_METRICS, "step": 0.0, "timing_s/step": 1.0, "actors/migrated": 0.0,
              "cost/billed_gpu_seconds": 1.0, "cost/gpu_seconds": 1.0}]

    @flow
    def publish(run_id: str):
        assert publish_step_artifacts(run_id, steps, [], "action-seconds")

    publish("twin_1")
    publish("twin-1")
    with get_client(sync_client=True) as client:
        tables = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["twin-1-metrics"])))
    assert len(tables) == 2 and len({t.flow_run_id for t in tables}) == 2


def test_the_plan_table_tells_candidates_of_one_fan_out_apart_and_marks_the_chosen():
    """Two candidates of two actions (ranked and round-robin) read alike without their kind."""
    from flows.planning.plan import Candidate, GenerationPlan

    cands = (Candidate(1, 4.0, 4.0, 0.0, 1.0, True, kind="ranked"),
             Candidate(2, 2.5, 5.0, 0.0, 0.5, True, kind="ranked"),
             Candidate(2, 2.5, 5.0, 0.0, None, True, kind="round_robin"))
    plan = GenerationPlan("cost_aware", 2, ((0,), (1,)), 2.5, 5.0, candidates=cands, chosen=1).to_dict()
    rows = plan_rows(plan)
    assert [(r["chosen"], r["n"], r["kind"]) for r in rows] == [(False, 1, "ranked"), (True, 2, "ranked"),
                                                               (False, 2, "round_robin")]
    assert rows[1] != rows[2]
    old = {"candidates": [{k: v for k, v in c.items() if k != "kind"} for c in plan["candidates"]]}
    assert [r["kind"] for r in plan_rows(old)] == ["", "", ""] and not any(r["chosen"] for r in plan_rows(old))
