"""The arith task end to end: a short campaign through the generated GSM8K-format rows, the
field mapping, the warm-up demonstrator and the ``gsm8k`` reward.

Much shorter than the measured campaign (docs/results.md, "The arith task"): it checks that
warm-up teaches the GSM8K answer format (``... #### N``) and that the ``gsm8k`` reward credits
some held-out greedy completions, i.e. that the reward path a real GSM8K run uses gives a
nonzero signal on this task. It does not assert an RL gain; that figure needs minutes of CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from flows.config import load_config
from actions.tasks.rewards.gsm8k import final_answer
from flows.campaign.run import run_campaign

SHORT_ARITH = [
    "data.task=arith", "invoker.kind=inprocess", "data.num_eval_prompts=32", "warmup.steps=150",
    "warmup.batch_size=16", "algorithm.batch_size=16", "generation.max_new_tokens=32", "steps=1", "eval_every=0",
]


def test_arith_warmup_gives_gsm8k_format_and_nonzero_reward(tmp_path, prefect_harness):
    cfg = load_config(None, [*SHORT_ARITH, f"store.uri={tmp_path / 'store'}"])
    assert [f.name for f in cfg.reward_functions()] == ["gsm8k"]
    summary = run_campaign(cfg, progress=lambda m: None)
    assert summary["steps_completed"] == 1
    evals = sorted((tmp_path / "store").glob(f"runs/{summary['run_id']}/evals/v000000.json"))
    assert len(evals) == 1
    items = json.loads(Path(evals[0]).read_text())["items"]
    assert len(items) == 32
    # Warm-up taught the format: most greedy completions end in a parseable "#### N".
    formatted = [i for i in items if "\n#### " in i["completion"]
                 and final_answer(i["completion"].rsplit("\n#### ", 1)[1]) is not None]
    assert len(formatted) >= 24, [i["completion"] for i in items]
    # The gsm8k reward credits some of them (eval_accuracy: completions at the maximum reward).
    correct = sum(i["correct"] for i in items)
    assert correct >= 1, [i["completion"] for i in items]
    assert summary["eval_accuracy_first"] == correct / len(items)


def test_arith_campaign_config_file_validates():
    """The measured configuration (docs/results.md) loads and names the task and reward it claims."""
    cfg = load_config(str(Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "arith.yaml"))
    assert cfg.data.task == "arith" and [f.name for f in cfg.reward_functions()] == ["gsm8k"]
    assert cfg.warmup.steps > 0 and cfg.warmup.error_rate == 0.7
    assert cfg.data.max_value == 5 and cfg.data.max_count == 2  # one-digit sums up to 5, 1-2 operations
