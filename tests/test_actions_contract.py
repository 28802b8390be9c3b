"""Action contract tests: JSON in, JSON out, malformed payloads answered with {"error": ...}."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from actions.contracts import ModelRef

ACTIONS = ["warmup", "prefill", "generate", "score", "train_step", "evaluate", "profile"]


@pytest.mark.parametrize("name", ACTIONS)
@pytest.mark.parametrize("payload", [{}, {"model": 3}, {"unexpected": True}])
def test_malformed_payload_returns_error_not_exception(name, payload, capsys):
    result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
    assert isinstance(result, dict) and "error" in result and "field" in result
    json.dumps(result)
    assert capsys.readouterr().out == ""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from tests.conftest import prepare_tiny

    return prepare_tiny(tmp_path_factory.mktemp("store"), "runs/c")


def _call(name, payload):
    result = importlib.import_module(f"actions.{name}").main(json.loads(json.dumps(payload)))
    json.dumps(result)
    assert "error" not in result, result
    return result


def test_generate_score_train_round_trip_changes_every_parameter(prepared):
    cfg, store, p = prepared
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    gen = _call("generate", {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0,
                             "shard": "gen-0", "prompt_ids": [0, 1, 2, 3], "group_size": 4, "max_new_tokens": 8,
                             "temperature": 1.0, "output_key": "runs/c/roll.json"})
    assert len(gen["samples"]) == 16 and gen["prefill_tokens"] * 4 == gen["prefill_tokens_naive"]
    score = _call("score", {"policy": ref.model_dump(), "reference_key": p.init_key, "dataset_key": p.train_key,
                            "rollout_keys": [gen["rollout_key"]], "rewards": [{"name": "repeat"}],
                            "algorithm": cfg.algorithm.model_dump(), "output_key": "runs/c/scored/manifest.json"})
    assert score["num_samples"] == 16
    # A random policy rarely solves the task: give each group mixed rewards so that every
    # parameter receives a gradient (zero-variance groups carry no GRPO signal).
    from actions.store.weights import load_tensors, publish_tensors

    tensors, meta = load_tensors(store, score["scored_key"])
    tensors["rewards"] = torch.tensor([1.0, 0.0] * 8)
    publish_tensors(store, "runs/c/scored2/manifest.json", tensors, meta)
    train = _call("train_step", {"policy": ref.model_dump(), "optimizer_key": None,
                                 "scored_keys": ["runs/c/scored2/manifest.json"], "algorithm": cfg.algorithm.model_dump(),
                                 "seed": 0, "step": 0, "output_prefix": "runs/c/train"})
    assert train["policy_version"] == 1
    assert all(torch.isfinite(torch.tensor(v)) for v in train["metrics"].values())
    before, _ = load_tensors(store, p.init_key)
    after, _ = load_tensors(store, train["policy_key"])
    # Tied embeddings: lm_head shares the embedding matrix, so every stored tensor must move.
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []


def test_prefill_bundle_feeds_generate_with_identical_output(prepared):
    _, store, p = prepared
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    pre = _call("prefill", {"model": ref.model_dump(), "dataset_key": p.train_key, "prompt_ids": [0, 1, 2],
                            "prefix_len": 10, "output_key": "runs/c/kv/manifest.json"})
    assert pre["num_unique_prefixes"] == 1  # the shared instruction template
    base = {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 1, "shard": "g",
            "prompt_ids": [0, 1, 2], "group_size": 2, "max_new_tokens": 8, "temperature": 1.0}
    with_kv = _call("generate", {**base, "kv_bundle_key": pre["bundle_key"], "output_key": "runs/c/a.json"})
    plain = _call("generate", {**base, "output_key": "runs/c/b.json"})
    assert with_kv["kv_bundle_used"] and with_kv["prefill_tokens"] < plain["prefill_tokens"]
    from actions.store import get_json

    assert get_json(store, "runs/c/a.json")["samples"] == get_json(store, "runs/c/b.json")["samples"]


def test_evaluation_counts_as_training_does(prepared, tmp_path, monkeypatch):
    """Lengths include the stop token; the mean reward is over the rows a reward applied to."""
    _, store, p = prepared
    (tmp_path / "half_reward.py").write_text(
        "def every_other(completions, **kwargs):\n"
        "    return [1.0 if i % 2 else None for i in range(len(completions))]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    payload = {"model": ref.model_dump(), "dataset_key": p.eval_key, "max_new_tokens": 6,
               "rewards": [{"name": "half_reward:every_other"}], "output_key": "runs/c/half.json"}
    from actions import evaluate
    from actions.engines.base import EngineStats, SampleOut

    class Scripted:  # even rows stop after one token, odd ones run to the cap of three
        def generate(self, specs, params):
            return [SampleOut(s.prompt_id, 0, [5] if i % 2 == 0 else [5, 6, 7], "stop" if i % 2 == 0 else "length",
                              1 if i % 2 == 0 else None) for i, s in enumerate(specs)], EngineStats()

    _, tokenizer, _ = evaluate.load_engine("torch", ref)
    monkeypatch.setattr(evaluate, "load_engine", lambda *a, **k: (Scripted(), tokenizer, False))
    out = _call("evaluate", payload)
    assert out["reward_mean"] == 1.0  # every applicable row earned 1.0 (not 0.5: None rows are not zeros)
    assert out["mean_length"] == 2.5  # (1 + its stop token) and 3, as training's response_length counts


def test_missing_input_is_an_application_error(prepared):
    _, store, p = prepared
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key="runs/c/nope/manifest.json", policy_version=0)
    out = importlib.import_module("actions.evaluate").main({"model": ref.model_dump(), "dataset_key": p.eval_key,
                                                            "rewards": [{"name": "repeat"}], "max_new_tokens": 4,
                                                            "output_key": "runs/c/e.json"})
    assert "error" in out and "nope" in out["error"]


def test_bad_device_setting_is_an_application_error_naming_it(prepared, monkeypatch):
    _, store, p = prepared
    ref = ModelRef(store_uri=store.uri, base_key=p.base_key, policy_key=p.init_key, policy_version=0)
    payload = {"model": ref.model_dump(), "dataset_key": p.train_key, "run_seed": 0, "step": 0, "shard": "g",
               "prompt_ids": [0], "group_size": 4, "max_new_tokens": 4, "temperature": 1.0,
               "output_key": "runs/c/dev.json"}
    generate = importlib.import_module("actions.generate").main
    monkeypatch.setenv("RLHFLESS_DEVICE", "tpu")
    result = generate(dict(payload))
    assert result["field"] == "RLHFLESS_DEVICE" and "cpu, cuda, cuda:N or auto" in result["error"]
    monkeypatch.setenv("RLHFLESS_DEVICE", "cpu")
    monkeypatch.setenv("RLHFLESS_DTYPE", "float8")
    result = generate(dict(payload))
    assert result["field"] == "RLHFLESS_DTYPE" and "bfloat16" in result["error"]
