"""A resumed run scores with the reward models it stored at its start
(``flows/campaign/reward_copies.py``): a path is compared by what it holds, not by its spelling;
a moved folder does not stop the resume; a folder changed in place is named in one warning;
a folder that does not hold the stored model is refused naming ``reward.models[i].path``."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import LEARNING, TINY_OVERRIDES

import flows.campaign.run  # noqa: F401  (Prefect sets its logging up here, not under a test's capsys)
from actions.store import open_store
from flows.campaign.preflight import check_campaign
from flows.campaign.state import CampaignRefused, check_resume, load_state
from flows.commands.tiny_model_dir import write_tiny_model_dir
from flows.config import load_config


def _args(tmp_path, path: str, steps: int) -> list[str]:
    args = ["train", "--out", str(tmp_path / "run")]
    for o in [*TINY_OVERRIDES, *LEARNING, f"store.uri={tmp_path / 'store'}", "invoker.kind=inprocess",
              "run_id=rm-resume", f"steps={steps}", "algorithm.name=ppo", "warmup.steps=0",
              f"reward.models=[{{path: '{path}', weight: 0.5}}]"]:
        args += ["--set", o]
    return args


def _cfg(tmp_path, path: str):
    return load_config(None, _args(tmp_path, path, 1)[4::2])


def test_a_resume_compares_reward_model_paths_by_what_they_hold(tmp_path, monkeypatch, prefect_harness, capsys):
    from flows.commands.cli import main

    monkeypatch.chdir(tmp_path)
    write_tiny_model_dir(tmp_path / "rm", "qwen2", reward=True)
    assert main(_args(tmp_path, "rm", 1)) == 0, capsys.readouterr()  # spelled relative to the working directory
    store = open_store(str(tmp_path / "store"))
    state = load_state(store, "rm-resume")
    fingerprint = _cfg(tmp_path, "rm").fingerprint()
    assert state.fingerprint == fingerprint  # the identity keeps the path as typed: run ids stay

    # the same folder spelled otherwise: the same run, without a warning
    for spelling in (str(tmp_path / "rm"), "rm/", "./rm", str(tmp_path / "rm") + "/"):
        assert check_resume(state, _cfg(tmp_path, spelling), True, store) == []
    # without the store to compare with, the spelling is all there is (and the sub-field is named)
    with pytest.raises(CampaignRefused, match=r"settings differ: reward.models\[0\].path: run 'rm', now '/.*rm'\)"):
        check_resume(state, _cfg(tmp_path, str(tmp_path / "rm")), True)

    # another model under another spelling: refused, naming the sub-field and both paths
    write_tiny_model_dir(tmp_path / "other", "qwen2", reward=True, seed=1)
    with pytest.raises(CampaignRefused, match=r"settings differ: reward.models\[0\].path 'rm', now '.*other', which "
                                              r"does not hold the model the run stored\); set them back"):
        check_resume(state, _cfg(tmp_path, str(tmp_path / "other")), True, store)

    # the same spelling, other files in the folder: one warning line, and the run goes on with its copy
    shutil.move(tmp_path / "rm", tmp_path / "moved")
    shutil.copytree(tmp_path / "other", tmp_path / "rm")
    [line] = check_resume(state, _cfg(tmp_path, "rm"), True, store)
    assert line.startswith("warning: reward.models[0].path 'rm' holds other files than the copy run 'rm-resume' "
                           "stored at its start; the run keeps scoring with that copy")
    # the folder, moved, under its new name: the same run
    assert check_resume(state, _cfg(tmp_path, str(tmp_path / "moved")), True, store) == []

    # the folder gone: a resume needs only the store's copy; a new run still needs the folder
    shutil.rmtree(tmp_path / "rm")
    with pytest.raises(ValueError, match=r"reward.models\[0\].path 'rm' is not a directory"):
        check_campaign(_cfg(tmp_path, "rm"))
    check_campaign(_cfg(tmp_path, "rm"), resumed=True)
    capsys.readouterr()
    assert main([*_args(tmp_path, "rm", 2), "--resume"]) == 0, capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_completed"] == 2 and all(s["frac_reward_none"] == 0.0 for s in summary["steps"])
    # and a finished run is recognised under another spelling too: nothing to do, nothing written
    capsys.readouterr()
    assert main([*_args(tmp_path, str(tmp_path / "moved") + "/", 2), "--resume"]) == 0
    assert "is complete: 2/2 steps committed" in capsys.readouterr().out


def test_a_resume_that_finds_no_run_under_a_derived_id_names_the_runs_of_the_same_task(tmp_path):
    """A derived run id takes the settings as typed: a resume whose reward model path is spelled
    otherwise finds no run under it, and the note names the runs of the same task and algorithm."""
    from actions.store import LocalStore
    from flows.campaign.status import committed_runs, same_task_runs_hint

    store = LocalStore(tmp_path / "store")
    for run in ("repeat-ppo-ae41408a302e", "repeat-grpo-0123456789ab", "mine"):
        store.put(f"runs/{run}/campaign/commits/step-000000.json", b"{}")
    store.put("runs/orphan/campaign/latest.json", b"{}")  # a hint without a record is no run
    assert committed_runs(store) == ["mine", "repeat-grpo-0123456789ab", "repeat-ppo-ae41408a302e"]
    hint = same_task_runs_hint(store, "repeat-ppo-eee52bdb7a24", explicit=False)
    assert hint.startswith("; the store holds repeat-ppo-ae41408a302e of the same task and algorithm") and \
        hint.endswith("pass --run-id RUN (run_id in a deployment's config) to resume one")
    assert same_task_runs_hint(store, "repeat-ppo-eee52bdb7a24", explicit=True) == ""  # the user named it
    assert same_task_runs_hint(store, "arith-ppo-eee52bdb7a24", explicit=False) == ""
