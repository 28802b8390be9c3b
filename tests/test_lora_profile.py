"""The planner's transfer inputs of a LoRA run (``actions/profile.py: transfer_facts``): the
same at every policy version, so a resumed run plans as its fresh start did. A warm actor reads
the adapter per new version (its bytes, as the learner publishes them, computed at version 0
where the adapter is built rather than stored); the store's bandwidth is timed on the
backbone's blobs, whose size times bandwidth rather than latency. A full model's inputs stay
the version's weights, read back."""

from __future__ import annotations

import pytest
import torch

from actions.store import read_manifest
from tests.test_lora import _call, _ref, train_one_step

GRID = {"batch_sizes": [1, 2], "contexts": [4, 8], "prefill_shape": [2, 4]}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """(cfg, store, prepared, v0 ModelRef, v1 ModelRef): a prepared tiny LoRA run and the
    adapter version one train step published."""
    from tests.conftest import prepare_tiny

    cfg, store, p = prepare_tiny(tmp_path_factory.mktemp("store"), "runs/lp", "model.lora.r=4")
    v0 = _ref(cfg, store, p, p.init_key, 0)
    train = train_one_step(cfg, store, p, v0, "runs/lp")
    v1 = v0.model_copy(update={"policy_key": train["policy_key"], "policy_version": 1,
                               "weights_sha256": train["weights_sha256"]})
    return cfg, store, p, v0, v1


def _size(store, key: str) -> int:
    return sum(e["size"] for e in read_manifest(store, key)["files"].values())


def _probed(monkeypatch) -> list[str]:
    """The manifest keys the profile action's read probe fetches from."""
    import actions.profile as profile

    keys: list[str] = []
    real = profile.get_artifact
    monkeypatch.setattr(profile, "get_artifact", lambda store, key, *a, **kw: keys.append(key) or real(
        store, key, *a, **kw))
    return keys


@pytest.mark.parametrize("measure_grid", [False, True])
def test_a_lora_run_reports_the_same_transfer_inputs_at_every_version(lora_run, monkeypatch, measure_grid):
    """Version 0 (the policy is the backbone) and a resumed version (the policy is an adapter)
    give the planner the same weight bytes, the adapter's as the learner published them, and
    time the store on the backbone both times."""
    _, store, p, v0, v1 = lora_run
    probed = _probed(monkeypatch)
    fresh = _call("profile", {"model": v0.model_dump(), **GRID, "measure_grid": measure_grid})
    resumed = _call("profile", {"model": v1.model_dump(), **GRID, "measure_grid": measure_grid})
    adapter = _size(store, v1.policy_key)
    assert fresh["weight_bytes"] == resumed["weight_bytes"] == adapter
    assert adapter * 2 < _size(store, p.init_key)  # the adapter, not the backbone
    assert probed == [p.init_key, p.init_key]  # bandwidth measured on the backbone's blobs at both versions
    assert fresh["store_read_bytes_per_s"] > 0 and resumed["store_read_bytes_per_s"] > 0
    if measure_grid:  # the cached grid of the fresh start is the one the resume plans from
        assert resumed["source"] == "cached" and resumed["profile_key"] == fresh["profile_key"]


@pytest.mark.parametrize("dtype,bias", [(torch.bfloat16, "none"), (torch.float32, "all")])
def test_the_adapter_bytes_are_what_a_built_adapter_publishes(lora_run, dtype, bias):
    """In the dtype the learner computes in (bf16 halves the tensors' bytes, the blobs' headers
    stay) and with the biases ``model.lora.bias`` trains: the bytes of the manifest that
    publishing the adapter of a model built on the backbone writes."""
    from actions.config.workload import LoraConfig
    from actions.models.loading import load_base_parts
    from actions.models.lora import adapter_tensors, attach_adapter
    from actions.models.modeling import build_model
    from actions.profile import adapter_bytes
    from actions.store.weights import load_tensors, publish_tensors

    _, store, p, v0, _ = lora_run
    ref = v0.model_copy(update={"lora": LoraConfig(r=4, bias=bias)})
    backbone, _ = load_tensors(store, p.init_key)
    model = attach_adapter(build_model(load_base_parts(store.uri, p.base_key), backbone, dtype=dtype), ref.lora, None)
    key = f"runs/lp/built-{dtype}-{bias}/manifest.json"
    publish_tensors(store, key, adapter_tensors(model))
    assert adapter_bytes(ref, dtype) == _size(store, key)
    assert adapter_bytes(v0, torch.bfloat16) < adapter_bytes(v0, torch.float32)


def test_a_full_model_s_transfer_inputs_are_its_published_weights(lora_run, monkeypatch):
    """Without model.lora: the version's weights as published, read back from its own manifest."""
    _, store, p, v0, _ = lora_run
    probed = _probed(monkeypatch)
    full = v0.model_copy(update={"lora": None, "backbone_key": None})
    out = _call("profile", {"model": full.model_dump(), **GRID, "measure_grid": False})
    assert out["weight_bytes"] == _size(store, p.init_key) and probed == [p.init_key]
    assert out["store_read_bytes_per_s"] > 0


def test_the_start_line_names_the_adapter_a_lora_run_reads_per_version(tiny_config, monkeypatch, lora_run):
    """The flow's profile line gives a LoRA run's adapter in kB (not ``weights 0.0 MB``) and
    plans with its bytes; a full model's line is as it was."""
    from actions.contracts import parse_result
    from actions.store.profile_cache import ProfileRequest, ProfileResult
    from flows.campaign.live_profile import finish_profiling
    from flows.planning.tpot import TpotProfile
    from flows.step import invoke as tasks
    from flows.step.context import RunContext
    from flows.step.invoke import Returned

    _, _, _, v0, _ = lora_run
    monkeypatch.setattr(tasks, "invoke_action", lambda **kw: None)  # the round-trip probes
    grid = TpotProfile((1, 2), (4.0, 8.0), ((0.001, 0.002), (0.002, 0.003)), 1000.0, name="m").to_dict()
    facts = {"model_config_sha256": "0" * 64, "dtype": "float32", "device": "cpu:x", "engine": "torch",
             "threads": 1, "batch_sizes": [1, 2], "contexts": [4, 8], "prefill_shape": [2, 4]}
    out = {"profile": grid, "profile_key": "profiles/k.json", "source": "cached", "facts": facts,
           "weight_bytes": 8128, "kv_bytes_per_token": 64, "store_read_bytes_per_s": 1.2e8, "measure_s": 0.0}

    class Done:
        def result(self):
            return Returned(parse_result("profile", out, ProfileResult), None)

    ctx = RunContext(config=tiny_config(), store=None, invoker=None, run_id="r")  # type: ignore[arg-type]
    lines: dict[str, list[str]] = {"lora": [], "full": []}
    for name, model in (("lora", v0), ("full", v0.model_copy(update={"lora": None, "backbone_key": None}))):
        req = ProfileRequest(model=model, batch_sizes=[1, 2], contexts=[4, 8])
        live = finish_profiling(ctx, (Done(), req), lines[name].append)
        assert live.weight_bytes == 8128 and live.transfer_bandwidth_bytes_per_s == 1.2e8
    assert "store reads 120 MB/s, adapter 8.1 kB per version" in lines["lora"][-1], lines["lora"]
    assert "store reads 120 MB/s, weights 0.0 MB," in lines["full"][-1], lines["full"]
