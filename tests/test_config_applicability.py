"""Settings that a model folder or a dataset file makes moot keep the run ids runs were committed
with; settings that could only fail later are refused at load; a path setting may start with ``~``."""

from __future__ import annotations

import pytest

from flows.config import load_config


def test_settings_a_folder_or_a_file_makes_moot_stay_in_the_run_id():
    """The tiny model's shape beside ``model.path`` and the generated task's ``max_count``,
    ``num_eval_prompts`` and ``error_rate`` beside a dataset file change nothing a run computes,
    but runs were committed with them in their identity: the ids stay what they were (these are
    the ids the revision before this one derived), and such a config is not refused."""
    def ids(*overrides: str) -> str:
        return load_config(None, list(overrides)).fingerprint()

    assert ids("model.path=/m", "model.hidden_size=512") == "73814972a0a9"
    assert ids("data.train_path=x.jsonl") == "fd5269a6ddb8"
    assert ids("data.train_path=x.jsonl", "data.max_count=3") != ids("data.train_path=x.jsonl")
    load_config(None, ["data.eval_path=e.jsonl", "data.num_eval_prompts=5"])


def test_the_summary_names_an_eval_file_as_the_evaluation_source():
    from actions.tasks.build import evaluation_source

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
