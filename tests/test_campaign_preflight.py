"""The flow entry (``rlhf_campaign``, what a deployment run calls) refuses what ``rlhfless train``
refuses, with the same error, before the store is written; and ``train`` does not pay for its
checks twice (``flows/campaign/preflight.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from flows.campaign import preflight
from flows.campaign.preflight import check_campaign, checked
from flows.config import CampaignConfig


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


NO_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                             reason="vLLM is installed: the config would run")
REFUSED = [  # (override, what the refusal names): what pydantic cannot see
    pytest.param("generation.engine=vllm", "generation.engine 'vllm'", marks=NO_VLLM, id="engine-missing"),
    pytest.param("model.path={tmp}/missing", "missing' is not a directory", id="model-missing"),
    pytest.param("scaling.profile={tmp}/none.json", "scaling.profile=", id="profile-missing"),
    pytest.param("scaling.policy=nomod.x:fn", "scaling.policy='nomod.x:fn': cannot import", id="policy-missing"),
    pytest.param("store.uri=/proc/rlhfless-store", "store.uri '/proc/rlhfless-store' cannot be created",
                 id="store-proc", marks=pytest.mark.skipif(not Path("/proc/self/mounts").is_file(), reason="no /proc")),
]


@pytest.mark.parametrize("override,named", REFUSED)
def test_the_flow_refuses_a_config_train_refuses_before_writing_the_store(tiny_config, prefect_harness, tmp_path,
                                                                          override, named):
    from flows.campaign.run import rlhf_campaign
    from flows.commands.cli import _preflight

    cfg = tiny_config("invoker.kind=inprocess", "run_id=v1", "steps=1", override.format(tmp=tmp_path))
    with pytest.raises(ValueError) as by_cli:
        _preflight(cfg, tmp_path / "out", tmp_path / "out" / "summary.json", False, False)
    with pytest.raises(ValueError) as by_flow:  # it failed after prepare (and warm-up) wrote runs/v1/
        rlhf_campaign(config=cfg.model_dump(mode="json"))
    assert type(by_flow.value) is type(by_cli.value)
    assert str(by_flow.value) == str(by_cli.value) and named in str(by_flow.value)
    assert _files(tmp_path / "store") == []  # no run objects, no lease


class _Stop(Exception):
    """Ends the flow right after its checks."""


def test_a_config_train_checked_is_not_checked_again_by_the_flow_it_starts(tiny_config, prefect_harness,
                                                                           monkeypatch):
    from actions import prepare
    from flows.campaign import run

    calls: list[str] = []
    monkeypatch.setattr(prepare, "validate_inputs", lambda cfg, **_: calls.append(cfg.resolved_run_id()))

    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(run, "holding_lease", stop)
    cfg = tiny_config("invoker.kind=inprocess", "run_id=once")
    check_campaign(cfg)  # the CLI's preflight
    with checked(cfg):  # the config as Prefect passes it: validated again from its JSON
        with pytest.raises(_Stop):
            run.rlhf_campaign(config=cfg.model_dump(mode="json"))
        check_campaign(CampaignConfig.model_validate(cfg.model_dump(mode="json")))
        check_campaign(tiny_config("invoker.kind=inprocess", "run_id=other"))  # another config is checked
    assert calls == ["once", "other"]
    with pytest.raises(_Stop):  # only inside the block: a later flow checks again
        run.rlhf_campaign(config=cfg.model_dump(mode="json"))
    assert calls == ["once", "other", "once"] and not preflight._CHECKED



def test_a_model_that_names_no_eos_token_is_refused_before_anything_is_written(tmp_path):
    """Generation could never stop. The actions read the stored copy of the model folder, so
    a run prepared from it would fail at its first generate and again after the folder is
    fixed: ``validate_inputs`` (the CLI and the flow) and ``prepare`` itself refuse it first."""
    import json

    from actions.prepare import validate_inputs
    from flows.commands.tiny_model_dir import write_tiny_model_dir
    from tests.conftest import prepare_tiny

    info = write_tiny_model_dir(tmp_path / "m", "llama", hidden_size=32, num_heads=2, num_kv_heads=1)
    for name, key in (("config.json", "eos_token_id"), ("generation_config.json", "eos_token_id"),
                      ("tokenizer_config.json", "eos_token")):
        path = info.path / name
        path.write_text(json.dumps({**json.loads(path.read_text()), key: None}))
    named = rf"model.path '{info.path}': the model names no EOS token .*; set eos_token_id in config.json"
    cfg, _, _ = prepare_tiny(tmp_path / "ok", "runs/ok")  # the tiny default model names one
    with pytest.raises(ValueError, match=named):
        validate_inputs(cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(info.path)})}))
    with pytest.raises(ValueError, match=named):
        prepare_tiny(tmp_path / "store", "runs/x", f"model.path={info.path}")
    assert _files(tmp_path / "store") == []


def test_a_worker_log_dir_that_cannot_be_made_is_refused_naming_the_setting(tiny_config, tmp_path, monkeypatch):
    """Checked up front for both ways in (the pool made it ~9 s into the flow, and its error
    named only the path), without creating anything."""
    from flows.campaign.preflight import check_directory

    (tmp_path / "taken").write_text("x")
    refused = {"/proc/nope/logs": "'/proc' is on the kernel's proc filesystem",
               f"{tmp_path}/taken/logs": "taken' is a file, not a directory", f"{tmp_path}/taken": "is a file"}
    for kind in ("local", "openwhisk"):  # on OpenWhisk the directory holds prepare's log
        for path, why in refused.items():
            if path.startswith("/proc") and not Path("/proc/self/mounts").is_file():
                continue
            with pytest.raises(ValueError, match="pass a directory path") as info:
                check_campaign(tiny_config(f"invoker.kind={kind}", f"invoker.log_dir={path}"))
            assert str(info.value).startswith(f"invoker.log_dir {path!r}") and why in str(info.value)
    check_campaign(tiny_config("invoker.kind=inprocess", "invoker.log_dir=/proc/nope/logs"))  # never used there
    check_directory(tmp_path / "new" / "logs", "invoker.log_dir")  # can be made
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)  # as for a user without write access
    with pytest.raises(ValueError, match="'.*new' cannot be created: .* is not writable by this process"):
        check_directory(tmp_path / "new", "invoker.log_dir")
    assert not (tmp_path / "new").exists()


def test_a_store_directory_that_cannot_be_written_is_refused_naming_store_uri(tiny_config, tmp_path, monkeypatch):
    """Both ways in (the CLI's preflight and the flow's) refuse a local store the campaign could
    not write, before the lease or anything else is written; an S3 store is not a path."""
    from flows.campaign.preflight import check_store_directory

    if Path("/proc/self/mounts").is_file():
        with pytest.raises(ValueError, match="^store.uri '/proc/rlhfless-store' cannot be created: '/proc' is on the "
                                             "kernel's proc filesystem"):
            check_campaign(tiny_config("invoker.kind=inprocess", "store.uri=/proc/rlhfless-store"))
    check_campaign(tiny_config("invoker.kind=inprocess"))
    check_store_directory("s3://bucket/prefix")
    (tmp_path / "store").mkdir()
    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)  # as for a user without write access
    for uri in (str(tmp_path / "store"), f"file://{tmp_path}/store"):
        with pytest.raises(ValueError, match=rf"^store.uri '{tmp_path}/store' is a directory this process cannot "
                                             "write to; pass one it can"):
            check_campaign(tiny_config("invoker.kind=inprocess", f"store.uri={uri}"))
    assert _files(tmp_path / "store") == []


def test_a_resume_reads_no_data_or_model_file_again_but_imports_the_reward_functions(tiny_config, tmp_path,
                                                                                    monkeypatch):
    """A resumed run trains on the data and model copies its store holds: a data file moved
    since, or a hub id with downloads off, does not stop it; a reward module that no longer
    imports does (the run calls it at every step)."""
    from actions.prepare import validate_inputs
    from flows.config import load_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for moved in (f"data.train_path={tmp_path}/moved.jsonl", "data.train_path=someorg/somedata"):
        cfg = load_config(None, [moved])
        with pytest.raises(ValueError, match="data.train_path"):
            validate_inputs(cfg)
        validate_inputs(cfg, resumed=True)
    gone = tiny_config("reward.functions=[gone_reward_module:score]")
    with pytest.raises(ValueError, match="module 'gone_reward_module' cannot be imported"):
        validate_inputs(gone, resumed=True)


def test_gpus_per_actor_above_the_gpu_limit_is_refused_before_anything_is_written(prefect_harness):
    """Every GPU action asks the named Prefect limit for scaling.gpus_per_actor slots; more than
    it has fails the first one (422) after set-up wrote the store, so preflight refuses it. A
    limit the server does not know is the campaign's to skip, as gpu_slots does."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from flows.campaign.preflight import check_gpu_limit
    from flows.config import load_config

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu-small", limit=2))

    def cfg(name: str, gpus: int):
        return load_config(None, [f"invoker.gpu_concurrency_limit={name}", f"scaling.gpus_per_actor={gpus}"])

    with pytest.raises(ValueError, match=r"^scaling.gpus_per_actor=4 is above the 2 slots of the Prefect GPU limit "
                                         r"invoker.gpu_concurrency_limit='gpu-small'.*prefect gcl update gpu-small "
                                         r"--limit 4\) or lower scaling.gpus_per_actor$"):
        check_gpu_limit(cfg("gpu-small", 4))
    check_gpu_limit(cfg("gpu-small", 2))
    check_gpu_limit(cfg("no-such-limit", 4))
