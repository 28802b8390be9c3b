"""What a tracker run records beside the metrics: its configuration is every setting the run
uses, as ``rlhfless config`` prints them (not the run id's fingerprint, which leaves defaults out
and records PPO's estimator as older runs did); a database tracking URI whose driver is missing is
refused before anything starts; the docs name what an MLflow file store leaves out.

The trackers' libraries are faked here (``sys.modules``): these tests need none of them.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.campaign import trackers
from flows.campaign.trackers import run_settings, step_scalars, without_path_prefixes
from flows.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def printed_config(capsys, *overrides: str) -> dict[str, Any]:
    from flows.commands.cli import main

    assert main(["config", *[a for o in overrides for a in ("--set", o)]]) == 0
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("overrides", [(), ("algorithm.name=ppo",), ("algorithm.name=ppo", "algorithm.kl_kind=k2"),
                                       ("algorithm.loss_agg=seq_mean_token_mean", "steps=7", "eval_every=3")])
def test_tracker_settings_are_the_configuration_rlhfless_config_prints(capsys, overrides):
    cfg = load_config(None, list(overrides))
    settings = run_settings(cfg, "r1")
    assert settings == {**printed_config(capsys, *overrides), "run_id": "r1"}
    algo = settings["algorithm"]
    assert algo["kl_kind"] == cfg.algorithm.kl_kind  # PPO's k1 and k2 as set, not the fingerprint's k3, ppo-k2
    assert {"loss_agg", "std_scope", "mask_truncated"} <= set(algo)
    assert settings["steps"] == cfg.steps and settings["eval_every"] == cfg.eval_every


def test_a_url_password_in_a_setting_never_reaches_a_tracker():
    # store.uri refuses credentials (check_store_uri); a path setting is not checked for them
    settings = run_settings(load_config(None, ["model.path=https://AKIAXYZ:hunter2secret@host/m"]), "r1")
    assert "hunter2secret" not in str(settings) and settings["model"]["path"].endswith("@host/m")
    with pytest.raises(ValueError, match=r"^store.uri carries credentials"):
        load_config(None, ["store.uri=s3://AKIAXYZ:hunter2secret@bucket/p"])


class _Recorder:
    """A stand-in for wandb, mlflow and trackio: records the configuration each is given."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}

    def module(self, name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="m1"))
        if name == "wandb":
            mod.init = lambda **kw: self.config.update(kw["config"])
        elif name == "trackio":
            mod.init = lambda **kw: self.config.update(kw["config"])
        else:
            mod.get_tracking_uri = lambda: "sqlite:///x.db"
            mod.set_experiment = lambda name: None
            mod.search_runs = lambda **kw: []
            mod.start_run = lambda **kw: run
            mod.log_params = self.config.update
        return mod


@pytest.mark.parametrize("name", ["wandb", "mlflow", "trackio"])
def test_each_tracker_gets_the_resolved_settings(monkeypatch, tmp_path, name):
    recorder = _Recorder()
    monkeypatch.setitem(sys.modules, name, recorder.module(name))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg = load_config(None, ["algorithm.name=ppo", "algorithm.kl_kind=k2", "steps=5"])
    trackers._open_one(name, cfg, "r1", tmp_path, "k")
    flat = recorder.config if name == "mlflow" else trackers._flat(recorder.config)
    want = {k: str(v)[:500] if name == "mlflow" else v for k, v in trackers._flat(run_settings(cfg, "r1")).items()}
    assert flat == want
    assert str(flat["algorithm.kl_kind"]) == "k2" and str(flat["steps"]) == "5"
    assert str(flat["algorithm.loss_agg"]) == "token_mean" and "eval_every" in flat


# ---------------------------------------------------------------- a database URI's driver

needs_sqlalchemy = pytest.mark.skipif(importlib.util.find_spec("sqlalchemy") is None,
                                      reason="sqlalchemy is not installed (pip install 'rlhfless[mlflow]' with it)")


@needs_sqlalchemy
def test_a_database_uri_whose_driver_is_missing_is_refused_naming_the_package(tmp_path):
    from flows.campaign.tracker_env import check_database_driver

    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed here: its URI would pass")
    with pytest.raises(ValueError) as refused:
        check_database_driver("postgresql://bob:hunter2pw@127.0.0.1:9/db", "MLFLOW_TRACKING_URI 'x'")
    message = str(refused.value)
    assert message == ("MLFLOW_TRACKING_URI 'x' needs the database driver 'psycopg2', which is not installed; "
                       "install it (pip install 'psycopg2-binary') or use a database whose driver is, such as "
                       "sqlite:///mlflow.db")
    with pytest.raises(ValueError, match=r"SQLAlchemy cannot open it \(NoSuchModuleError") as unknown:
        check_database_driver("postgresql+nosuch://bob:hunter2pw@h/db", "MLFLOW_TRACKING_URI 'x'")
    assert "hunter2pw" not in str(unknown.value)
    check_database_driver(f"sqlite:///{tmp_path / 'mlflow.db'}", "x")  # its driver is Python's own
    assert not list(tmp_path.iterdir())  # nothing opened, nothing created


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None or importlib.util.find_spec("sqlalchemy") is None
                    or importlib.util.find_spec("psycopg2") is not None,
                    reason="needs mlflow and sqlalchemy installed, psycopg2 not")
def test_check_trackers_refuses_an_mlflow_database_without_its_driver(monkeypatch):
    from flows.campaign.trackers import check_trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://bob:hunter2pw@127.0.0.1:9/db")
    with pytest.raises(ValueError) as refused:
        check_trackers(load_config(None, ["observability.report_to=[mlflow]"]))
    message = str(refused.value)
    assert message.startswith("observability.report_to 'mlflow': MLFLOW_TRACKING_URI 'postgresql://[REDACTED]@")
    assert "'psycopg2'" in message and "hunter2pw" not in message and "\n" not in message


# ---------------------------------------------------------------- the docs

def test_the_docs_name_every_metric_an_mlflow_file_store_leaves_out():
    """What ``without_path_prefixes`` drops from a GRPO and a PPO step is named where docs/prefect.md
    describes the file store."""
    grpo = {"reward/mean": 0.5, "loss": 0.1, "loss/policy": 0.1, "kl": 0.0, "entropy": 1.0}
    ppo = {"reward/mean": 0.5, "loss/policy": 0.1, "loss/value": 0.2, "kl": 0.0}
    dropped = {k for m in (grpo, ppo) for k in set(step_scalars(m)) - set(without_path_prefixes(step_scalars(m)))}
    assert dropped == {"reward", "loss"}
    text = " ".join((ROOT / "docs" / "prefect.md").read_text().split())
    sentence = re.search(r"a file store cannot hold .*? left out", text)
    assert sentence, "docs/prefect.md no longer describes the MLflow file store"
    assert all(f"`{name}`" in sentence.group(0) for name in dropped), sentence.group(0)
