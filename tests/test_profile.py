"""`rlhfless profile` writes a TPOT profile the planner can load."""

import json

from flows.commands.cli import main
from flows.planning.tpot import TpotProfile


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


def test_profile_rejects_bad_grid(capsys):
    assert main(["profile", "--batch-sizes", "4,1"]) == 2
    assert "--batch-sizes" in capsys.readouterr().err


def test_profile_builds_a_model_from_a_config_file(tmp_path, capsys):
    """--model-config profiles a randomly initialised model of any shape; nothing is downloaded."""
    config = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
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
