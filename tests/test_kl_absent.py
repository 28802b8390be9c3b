"""Without a KL term (``algorithm.kl_coef: 0``) GRPO logs no ``kl``, as PPO does and as TRL does
with ``beta=0``, rather than a 0.0 that was never measured; every reader of the step metrics
(summary, status, TensorBoard and the trackers, report.md, the Prefect metrics table) copes
with it missing, the table showing a blank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from actions.config.workload import AlgorithmConfig
from actions.rl.grpo_loss import grpo_loss
from actions.rl.update import policy_loss
from flows.campaign.artifacts import metrics_rows


def test_grpo_logs_kl_only_where_a_reference_is_given():
    logp, mask = torch.tensor([[0.0, -1.0]]), torch.ones(1, 2)
    clips = dict(clip_low=0.2, clip_high=0.2)
    _, without = grpo_loss(logp, logp, None, torch.zeros(1), mask, **clips, kl_coef=0.0)
    assert "kl" not in without and {"loss", "loss/policy", "clipfrac", "ratio_mean"} <= set(without)
    _, with_ref = grpo_loss(logp, logp, torch.tensor([[-1.0, 0.0]]), torch.zeros(1), mask, **clips, kl_coef=0.0)
    assert with_ref["kl"] == pytest.approx(0.543081, abs=1e-6)  # measured, though not in the loss


def test_the_update_of_a_grpo_run_without_kl_term_has_no_kl():
    logp, mask = torch.tensor([[-1.0, -2.0]]), torch.ones(1, 2)
    batch = SimpleNamespace(packed=SimpleNamespace(response_mask=mask), old_logp=logp, ref_logp=None,
                            max_new_tokens=None, policy_mask=lambda mask_truncated: mask)
    _, metrics = policy_loss(logp, torch.zeros(1, 2), batch, torch.zeros(1), torch.tensor([0]),
                             AlgorithmConfig(kl_coef=0.0))
    assert "kl" not in metrics and "entropy" in metrics


def test_the_metrics_table_shows_a_missing_metric_blank():
    rows = metrics_rows([{"step": 0, "kl": 0.25, "loss/policy": -0.5}, {"step": 1, "loss/policy": -0.25}])
    assert (rows[0]["kl"], rows[1]["kl"], rows[1]["loss/policy"], rows[1]["step"]) == (0.25, "", -0.25, 2)


def test_a_campaign_without_kl_term_reports_no_kl_anywhere(tiny_config, prefect_harness, tmp_path):
    from actions.store import open_store
    from flows.campaign.run import run_campaign
    from flows.campaign.status import status_report
    from flows.campaign.tensorboard import read_scalars
    from flows.commands.report import write_report

    board = tmp_path / "tb"
    cfg = tiny_config("invoker.kind=inprocess", "steps=1", "run_id=nokl", "algorithm.kl_coef=0",
                      "observability.tensorboard=true", f"observability.tensorboard_dir={board}")
    summary = run_campaign(cfg, progress=lambda m: None)
    (step,) = summary["steps"]
    assert "kl" not in step and "loss/policy" in step
    assert "kl" not in read_scalars(board) and "loss/policy" in read_scalars(board)
    assert "kl" not in status_report(open_store(cfg.store.uri), "nokl")["last_metrics"]
    (tmp_path / "report").mkdir()
    assert tmp_path / "report" / "report.md" in write_report(summary, tmp_path / "report")
    assert metrics_rows(summary["steps"])[0]["kl"] == ""
