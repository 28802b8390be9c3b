"""Settings that a model folder or a dataset file makes moot keep the run id; settings that
could only fail later are refused at load; a path setting may start with ``~``."""

from __future__ import annotations

import pytest

from flows.config import load_config


def test_settings_a_folder_or_a_file_replaces_do_not_change_the_run_id():
    """The tiny model's shape beside ``model.path`` and the generated task's ``max_count`` and
    demonstrator ``error_rate`` beside ``data.train_path`` change nothing a run computes: its id
    stays the one without them (so ``--resume`` finds it). Where they apply they are identity."""
    def ids(*overrides: str) -> str:
        return load_config(None, list(overrides)).fingerprint()

    folder = ids("model.path=/m")
    assert ids("model.path=/m", "model.hidden_size=512", "model.num_heads=8", "model.num_layers=9",
               "model.intermediate_size=64", "model.max_positions=64") == folder
    assert ids("model.path=/m", "model.dtype=bfloat16") != folder  # still applies to a folder
    dataset = ids("data.train_path=x.jsonl")
    assert dataset == "fd5269a6ddb8"  # the id such runs already carry (test_datasets.py)
    assert ids("data.train_path=x.jsonl", "data.max_count=3", "warmup.error_rate=0.1") == dataset
    assert ids("data.train_path=x.jsonl", "data.task=arith") == ids("data.train_path=x.jsonl", "data.task=arith",
                                                                    "data.max_count=9")
    for setting in ("model.hidden_size=512", "data.max_count=3", "warmup.error_rate=0.1"):
        assert ids(setting) != ids(), setting  # the tiny default and the generated task use them


def test_num_eval_prompts_beside_an_eval_file_is_refused_and_the_summary_names_the_file():
    from actions.tasks.build import evaluation_source

    with pytest.raises(ValueError, match=r"data.num_eval_prompts=5 sizes the generated evaluation set, but "
                                         r"data.eval_path is set .* remove it"):
        load_config(None, ["data.eval_path=e.jsonl", "data.num_eval_prompts=5"])
    load_config(None, ["data.eval_path=e.jsonl", "data.num_train_prompts=40"])  # the generated train set: fine
    assert evaluation_source(None, "e.jsonl", None) == "eval_path"
    assert evaluation_source(None, None, None) == "task"
    assert evaluation_source("t.jsonl", None, 0.1) == "held_out 0.1 of train_path"


@pytest.mark.parametrize("hidden,heads,fix", [(30, 4, "model.hidden_size=24 or 32"), (20, 4, "16 or 24"),
                                              (8, 8, "model.hidden_size=16,")])
def test_a_tiny_shape_without_an_even_head_dimension_is_refused_at_load(hidden, heads, fix):
    with pytest.raises(ValueError, match=rf"model.hidden_size={hidden} with model.num_heads={heads} gives a head "
                                         rf"dimension of .*whole, even number"):
        load_config(None, [f"model.hidden_size={hidden}", f"model.num_heads={heads}"])
    with pytest.raises(ValueError, match=fix):
        load_config(None, [f"model.hidden_size={hidden}", f"model.num_heads={heads}"])
    load_config(None, [f"model.hidden_size={hidden}", f"model.num_heads={heads}", "model.path=/m"])  # not built


def test_path_settings_expand_a_leading_tilde(monkeypatch, tmp_path):
    """A YAML file is never expanded by a shell: ``~`` is expanded where the setting is read."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, ["model.path=~/m", "data.train_path=~/t.jsonl", "data.eval_path=~/e.jsonl",
                             "reward.models=[{path: ~/rm}]", "scaling.profile=~/p.json", "invoker.log_dir=~/logs",
                             "observability.tensorboard_dir=~/tb"])
    got = (cfg.model.path, cfg.data.train_path, cfg.data.eval_path, cfg.reward.models[0].path, cfg.scaling.profile,
           cfg.invoker.log_dir, cfg.observability.tensorboard_dir)
    assert got == tuple(str(tmp_path / n) for n in ("m", "t.jsonl", "e.jsonl", "rm", "p.json", "logs", "tb"))
    assert load_config(None, ["model.path=Org/name~1"]).model.path == "Org/name~1"  # only a leading ~
