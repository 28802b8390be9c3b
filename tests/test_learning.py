"""Learning is tested: short campaigns whose greedy eval accuracy must rise.

A campaign on the repeat task, small enough for the default suite: the default tiny model, a
short warm-up on the imperfect demonstrator (which miscounts long answers, so greedy decoding
starts wrong on many prompts), then a few RL steps, evaluated on 32 eval prompts before and
after (the task's 60 questions at max_count 6: most are training prompts too, so this tests
that RL fixes the counts it trains on, not generalisation; the arith task's eval questions
are held out, docs/results.md). The thresholds are calibrated with margin from measured runs (figures next to each):
they fail when learning stops. A policy that does not move keeps its first accuracy, and a
broken advantage or loss sign lowers it.
"""

from __future__ import annotations

import pytest

from flows.campaign.run import run_campaign
from flows.config import load_config

LEARNING = [
    "invoker.kind=inprocess", "data.max_count=6", "data.num_eval_prompts=32", "warmup.steps=150",
    "algorithm.batch_size=64", "steps=8", "eval_every=0",
]
GRPO_MIN_GAIN = 0.125
"""Measured 0.375 -> 0.844 (+0.469); the threshold is 4 of 32 prompts (docs/results.md)."""
PPO_MIN_GAIN = 0.125
"""Measured 0.469 -> 0.875 (+0.406); the threshold is 4 of 32 prompts."""


def _campaign(tmp_path, *extra: str) -> dict:
    cfg = load_config(None, [*LEARNING, f"store.uri={tmp_path / 'store'}", *extra])
    summary = run_campaign(cfg, progress=lambda m: None)
    assert summary["steps_completed"] == 8
    return summary


def _gain(summary: dict) -> float:
    return summary["eval_accuracy_last"] - summary["eval_accuracy_first"]


def test_grpo_campaign_raises_held_out_accuracy(tmp_path, prefect_harness):
    summary = _campaign(tmp_path)
    assert _gain(summary) >= GRPO_MIN_GAIN, summary["evals"]


@pytest.mark.slow  # 50 s more than the GRPO one, which keeps the default suite's guard
def test_ppo_campaign_raises_held_out_accuracy(tmp_path, prefect_harness):
    summary = _campaign(tmp_path, "algorithm.name=ppo")
    assert _gain(summary) >= PPO_MIN_GAIN, summary["evals"]
