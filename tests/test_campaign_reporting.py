"""What a campaign reports about itself, read from its state: the JSON summary, report.md, the
Prefect report artifact, the spend and wall time across resumes, and ``rlhfless status``."""

from __future__ import annotations

import json
import math

import prefect.artifacts
import prefect.context
import pytest

from flows.campaign.reporting import PROGRESS_PHASES, summarize
from flows.campaign.state import CampaignState, EvalRecord
from flows.commands.report import write_report

RUN = "rep"


def _state(**update) -> CampaignState:
    inputs = {f"{name}_key": f"runs/{RUN}/{name}/manifest.json" for name in ("base", "init", "train", "eval", "tokens")}
    ref = f"runs/{RUN}/policy/v000000/manifest.json"
    return CampaignState(run_id=RUN, fingerprint="f", identity={}, policy_key=ref, reference_key=ref,
                         prepared={**inputs, "model": {}}, **update)


def _step(step: int, **values: float) -> dict:
    return {"step": float(step), "reward/mean": 0.5, "response_length/mean": 6.0, "response_length/max": 9.0,
            "actors/n": 1.0, "actors/migrated": 0.0, "cost/billed_gpu_seconds": 1.0, "cost/gpu_seconds": 0.5,
            "cost/usd": 0.001, **{f"timing_s/{p}": 0.25 for p in PROGRESS_PHASES}, "timing_s/step": 2.0, **values}


def _eval(step: int, **values: float) -> EvalRecord:
    return EvalRecord(**{"step": step, "policy_version": step, "accuracy": 0.5, "reward_mean": 0.25,
                         "mean_length": 4.0, "num_prompts": 4, **values})


def test_a_nan_metric_is_null_in_the_summary_which_is_strict_json(tmp_path):
    # a diverged update: grad_norm NaN (train/skipped_nonfinite), as the step's metrics carry it
    state = _state(step=2, steps=[_step(0, grad_norm=math.nan), _step(1, kl=math.inf, **{"reward/mean": math.nan})],
                   evals=[_eval(0), _eval(2)])
    summary = summarize(state, 3.0, profile={"activation_s": math.nan})
    text = json.dumps(summary, allow_nan=False)  # what the CLI writes: no NaN token
    back = json.loads(text)
    assert back["steps"][0]["grad_norm"] is None and back["steps"][1]["kl"] is None
    assert back["reward_mean_last"] is None and back["profile"] == {"activation_s": None}
    write_report({**back, "profile": None}, tmp_path)  # report.md reads the nulls as NaN
    report = (tmp_path / "report.md").read_text()
    assert "| 2 | nan | 6.0 |" in report and (tmp_path / "reward.png").exists()


@pytest.mark.parametrize("kind, unit", [("local", "action-seconds"), ("openwhisk", "GPU-seconds")])
def test_the_report_artifact_names_the_unit_billed_time_has_on_the_invoker(tiny_config, monkeypatch, kind, unit):
    from flows.campaign.overhead import Background
    from flows.campaign.reporting import Reporter

    reports = []
    monkeypatch.setattr(prefect.context.FlowRunContext, "get", classmethod(lambda cls: object()))
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda **kwargs: None)
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda key, markdown: reports.append(markdown))
    publisher = Background()
    reporter = Reporter(tiny_config(f"invoker.kind={kind}"), RUN, publisher, progress=lambda m: None)
    state = _state(step=1, steps=[_step(0)])
    reporter.committed(state, type("Record", (), {"metrics": state.steps[-1]})())
    publisher.wait()
    reporter.close()
    assert f"- billed 1.00 {unit} ($0.00100), step 2.00 s" in reports[0]
