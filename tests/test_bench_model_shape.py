"""The GPU benchmark against TRL on a real model shape: its stop-rate calibration and its
length reward (``benchmarks/bench_vs_trl.py``, ``benchmarks/length_reward.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from benchmarks.bench_vs_trl import write_shaped_model
from benchmarks.length_reward import TARGET_TOKENS, length_reward


def test_a_shaped_model_stops_at_the_asked_rate_and_keeps_its_shape(tmp_path):
    config = {"model_type": "qwen2", "vocab_size": 2048, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    folder = write_shaped_model(tmp_path, str(path), stop_rate=0.02, device="cpu")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert model.config.vocab_size == 2048 and model.config.num_key_value_heads == 2
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    ids = torch.randint(0, 2048, (16, 64), generator=torch.Generator().manual_seed(5))  # other contexts
    with torch.no_grad():
        rate = float(torch.softmax(model(input_ids=ids).logits, -1)[..., eos].mean())
    assert 0.01 < rate < 0.04, rate  # untouched, a random model's stop chance is 1 / 2048


def test_the_length_reward_peaks_at_its_target():
    ids = [[1] * n for n in (0, TARGET_TOKENS // 2, TARGET_TOKENS, 2 * TARGET_TOKENS, 3 * TARGET_TOKENS)]
    assert length_reward([""] * len(ids), ids) == [0.0, 0.5, 1.0, 0.0, 0.0]


def test_too_few_steps_are_refused_before_anything_runs():
    """The steps timed are those between the first (warm-up) and the last (it also evaluates):
    fewer than 3 would time none, so the benchmark refuses them with the fix."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_vs_trl.py"), "--steps", "2"],
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 2 and "--steps 2: at least 3" in proc.stderr, proc.stderr[-500:]
