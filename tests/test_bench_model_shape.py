"""The GPU benchmark against TRL on a real model shape: its shaped model and stop calibration
(``benchmarks/shaped_model.py``), its checks and phase split (``benchmarks/bench_vs_trl.py``)
and its length reward (``benchmarks/length_reward.py``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.bench_vs_trl import phase_medians, write_inputs
from benchmarks.length_reward import TARGET_TOKENS, length_reward
from benchmarks.shaped_model import (
    WorkloadRefused,
    calibrate_stop_shift,
    expected_lengths,
    length_problem,
    write_shaped_model,
)


def test_a_shaped_model_stops_after_the_benchmark_prompts_at_the_asked_mean_length(tmp_path, capsys):
    """Calibrated on the prompts themselves: sampling after them (temperature 1, the whole
    vocabulary) gives completions whose mean length is the one asked for, and lengths vary
    within each prompt's samples, not from prompt to prompt (a random model's stop chance
    otherwise hangs on the prompt's last tokens: 3 in 4 of these completions stopped at their
    first token when only the stop row was scaled to the same mean)."""
    config = {"model_type": "qwen2", "vocab_size": 2048, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    _, data = write_inputs(tmp_path)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()[:8]]
    folder = write_shaped_model(tmp_path, str(path), prompts, mean_length=12.0, max_new_tokens=48, device="cpu")
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["expected_length"] == pytest.approx(12.0, rel=1e-3)
    low, median, high = line["row_expected_length"]  # every prompt alike: the stop chance is the model's
    assert 12.0 / 1.5 < low <= median <= high < 12.0 * 1.5, line["row_expected_length"]
    sampled = line["sampled_length"]  # the pre-flight sample in the systems' dtype (fp32 on the CPU)
    assert sampled["dtype"] == "float32" and sampled["first_logits_finite"] and sampled["stop_first"] < 0.5
    assert 1 <= sampled["min"] <= sampled["mean"] <= sampled["max"] <= 48
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert model.config.vocab_size == 2048 and model.config.num_key_value_heads == 2
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    tok = AutoTokenizer.from_pretrained(folder)
    lengths = []
    torch.manual_seed(3)
    for prompt in prompts:
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]] * 32)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=48, eos_token_id=eos, pad_token_id=eos)[:, ids.shape[1]:]
        for row in out.tolist():
            lengths.append(row.index(eos) + 1 if eos in row else len(row))
    mean = sum(lengths) / len(lengths)
    assert 8.0 < mean < 17.0, mean  # 256 samples of a spread near 12: well inside
    assert min(lengths) < 6 and max(lengths) > 24  # they vary, as a trained model's do


def test_the_expected_length_is_the_geometric_one_and_an_unreachable_mean_is_refused():
    """A stop chance p at every step of 40: expected length (1 - (1 - p)^40) / p, stop included;
    a trace whose constant went negative somewhere is refused, as is a length outside (1, 40)."""
    p = 0.1
    logit = math.log(p / (1 - p))
    full = lambda v: torch.full((40, 3), v, dtype=torch.float64)  # noqa: E731
    trace = torch.stack([full(logit), full(0.5), full(0.0)])  # sigmoid(logit + shift * 0.5 - 0)
    assert expected_lengths(trace, 0.0).tolist() == pytest.approx([(1 - (1 - p) ** 40) / p] * 3)
    shift = calibrate_stop_shift(trace, 5.0)  # a stop chance near 0.2
    assert float(expected_lengths(trace, shift).mean()) == pytest.approx(5.0, rel=1e-6)
    assert shift == pytest.approx((math.log(0.19998 / 0.80002) - logit) / 0.5, abs=0.01)
    bad = trace.clone()
    bad[1, 7, 2] = -0.1
    with pytest.raises(ValueError, match="the constant did not dominate"):
        calibrate_stop_shift(bad, 5.0)
    with pytest.raises(ValueError, match="--mean-length 40: must lie between 1 and the 40"):
        calibrate_stop_shift(trace, 40.0)
    with pytest.raises(ValueError, match="already average 9.9 tokens before any shift"):
        calibrate_stop_shift(trace, 12.0)


def test_a_workload_that_would_generate_nothing_is_refused_before_either_system_runs(tmp_path, monkeypatch, capsys):
    """Where the sample in the systems' dtype stops at once though the fp32 calibration expects
    more (what a GPU run of 2026-11-30 measured: both systems' completions 1 token long), the
    model is refused with the figures, before minutes of device time go by; the benchmark's
    main turns that into exit status 4."""
    import benchmarks.shaped_model as shaped

    config = {"model_type": "qwen2", "vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    monkeypatch.setattr(shaped, "sampled_lengths", lambda *a, **k: {"dtype": "bfloat16", "mean": 1.0, "min": 1,
                                                                    "max": 1, "stop_first": 1.0,
                                                                    "first_logits_finite": True})
    with pytest.raises(WorkloadRefused, match=r"completions sampled in bfloat16 are not the workload: they averaged "
                                              r"1 tokens, under a tenth of the 16 asked for, where the calibration "
                                              r"\(fp32\) expects 16.0"):
        shaped.write_shaped_model(tmp_path, str(path), ["k=3 c=j\n", "k=5 c=b\n"], 16.0, 48, "cpu")


def test_lengths_far_from_the_mean_asked_for_or_without_spread_are_not_the_workload():
    assert length_problem(12.0, 16.0, 1, 40) is None
    assert "under a tenth" in length_problem(1.5, 16.0, 1, 2)
    assert "over twice the 16 asked for" in length_problem(33.0, 16.0, 2, 48)  # every completion near the limit
    assert length_problem(16.0, 16.0, 16, 16) == "every one was 16 tokens long: no spread"


def test_the_phase_medians_name_where_the_timed_steps_went():
    steps = [{"timing_s/train": 9.0, "train/publish_optimizer_s": 6.0, "train/reused_state": 1.0,
              "engine/weight_push_s": 0.5, "engine/graph_captures": 2.0, "loss/policy": 0.1},
             {"timing_s/train": 7.0, "train/publish_optimizer_s": 4.0, "engine/weight_push_s": 0.25},
             {"timing_s/train": 8.0, "train/publish_optimizer_s": 5.0}]
    assert phase_medians(steps) == {"train": 8.0, "train/publish_optimizer_s": 5.0, "engine/weight_push_s": 0.375}


def test_the_length_reward_peaks_at_its_target():
    ids = [[1] * n for n in (0, TARGET_TOKENS // 2, TARGET_TOKENS, 2 * TARGET_TOKENS, 3 * TARGET_TOKENS)]
    assert length_reward([""] * len(ids), ids) == [0.0, 0.5, 1.0, 0.0, 0.0]


def test_a_mean_length_the_size_cannot_reach_is_refused_before_anything_runs(tmp_path):
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_vs_trl.py"), "--size", "small",
                           "--model-config", str(root / "benchmarks" / "configs" / "qwen2.5-0.5b.json")],
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 2, proc.stderr[-500:]
    assert "--mean-length 96: must lie between 1 and the 32 new tokens --size small allows" in proc.stderr


def test_too_few_steps_are_refused_before_anything_runs():
    """The steps timed are those between the first (warm-up) and the last (it also evaluates):
    fewer than 3 would time none, so the benchmark refuses them with the fix."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_vs_trl.py"), "--steps", "2"],
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 2 and "--steps 2: at least 3" in proc.stderr, proc.stderr[-500:]


def test_extra_settings_that_change_the_work_are_refused_and_others_reach_the_campaign(tmp_path, monkeypatch):
    from benchmarks import bench_vs_trl

    for kv in ("algorithm.lr=1", "generation.max_new_tokens=8", "model.path=/x", "eval_every=1", "store.uri=/y"):
        problem = bench_vs_trl.extra_setting_problem(kv)
        assert problem and kv.split("=")[0] in problem and "generation.compile_decode" in problem
    assert "expected KEY=VALUE" in bench_vs_trl.extra_setting_problem("generation.compile_decode")
    assert bench_vs_trl.extra_setting_problem("generation.compile_decode=true") is None
    assert bench_vs_trl.extra_setting_problem("generation.max_new_tokens_scale=2") is None  # a key, not a prefix

    seen: list[list[str]] = []

    class Stop(Exception):
        pass

    def popen(cmd, **_):
        seen.append(cmd)
        raise Stop

    with monkeypatch.context() as patch, pytest.raises(Stop):
        patch.setattr(bench_vs_trl.subprocess, "Popen", popen)
        bench_vs_trl.run_rlhfless(tmp_path, tmp_path / "m", tmp_path / "d.jsonl", (2, 2, 4), 3, "0",
                                  extra=("generation.compile_decode=true",))
    # after the benchmark's own settings, so it is the one that holds
    assert seen[0][-2:] == ["--set", "generation.compile_decode=true"]

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_vs_trl.py"), "--set", "algorithm.lr=1"],
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 2 and "algorithm.lr is part of the work both systems do" in proc.stderr, proc.stderr
