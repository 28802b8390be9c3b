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
    monkeypatch.setattr(prepare, "validate_inputs", lambda cfg: calls.append(cfg.resolved_run_id()))

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

