"""A resumed run trains on the data it stored at its start (``flows/campaign/data_copies.py``):
a data file edited since is named in one warning line (the run keeps its copy); the file under
another spelling, or moved, is the same run; another file is refused naming the setting."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import TINY_OVERRIDES

import flows.campaign.run  # noqa: F401  (Prefect sets its logging up here, not under a test's capsys)
from actions.store import open_store
from actions.tasks.source_digest import source_digest
from flows.campaign.state import CampaignRefused, check_resume, load_state
from flows.config import load_config


def _rows(start: int) -> str:
    return "".join(json.dumps({"prompt": f"Write a {i % 6 + 1} times", "answer": "a" * (i % 6 + 1)}) + "\n"
                   for i in range(start, start + 24))


def _args(tmp_path, path: str, steps: int) -> list[str]:
    args = ["train", "--out", str(tmp_path / "run")]
    tiny = [o for o in TINY_OVERRIDES if not o.startswith("data.")]  # they size the generated task
    for o in [*tiny, f"store.uri={tmp_path / 'store'}", "invoker.kind=inprocess", "run_id=data-resume",
              f"steps={steps}", "warmup.steps=0", f"data.train_path={path}", "data.eval_fraction=0.25",
              "reward.functions=[{name: format, pattern: '^.{0,8}$'}]"]:
        args += ["--set", o]
    return args


def _cfg(tmp_path, path: str):
    return load_config(None, _args(tmp_path, path, 1)[4::2])


def test_a_resume_compares_data_paths_by_what_they_hold(tmp_path, monkeypatch, prefect_harness, capsys):
    from flows.commands.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text(_rows(0))
    assert main(_args(tmp_path, "d.jsonl", 1)) == 0, capsys.readouterr()
    store = open_store(str(tmp_path / "store"))
    state = load_state(store, "data-resume")
    assert state.prepared.data["sources"] == {
        "data.train_path": {"path": "d.jsonl", "sha256": source_digest(str(tmp_path / "d.jsonl"))}}

    # the same file spelled otherwise, or moved: the same run, without a warning
    assert check_resume(state, _cfg(tmp_path, str(tmp_path / "d.jsonl")), True, store) == []
    shutil.copy(tmp_path / "d.jsonl", tmp_path / "moved.jsonl")
    assert check_resume(state, _cfg(tmp_path, "moved.jsonl"), True, store) == []
    # another file under another spelling: refused, naming the setting
    (tmp_path / "other.jsonl").write_text(_rows(1))
    with pytest.raises(CampaignRefused, match=r"settings differ: data.train_path: run 'd.jsonl', now 'other.jsonl'"):
        check_resume(state, _cfg(tmp_path, "other.jsonl"), True, store)

    # the file edited in place: one warning line, and the run goes on training on its copy
    (tmp_path / "d.jsonl").write_text(_rows(1))
    [line] = check_resume(state, _cfg(tmp_path, "d.jsonl"), True, store)
    assert line == ("warning: data.train_path 'd.jsonl' holds other data than the copy run 'data-resume' stored at "
                    "its start; the run keeps training on that copy (start a new run, another run_id, to train on "
                    "the file as it is now)")
    capsys.readouterr()
    assert main([*_args(tmp_path, "d.jsonl", 2), "--resume"]) == 0, capsys.readouterr()
    out = capsys.readouterr()
    assert line in out.out + out.err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps_completed"] == 2

    # the file gone: nothing to compare, the run continues on its copy
    (tmp_path / "d.jsonl").unlink()
    assert check_resume(state, _cfg(tmp_path, "d.jsonl"), True, store) == []


def test_a_digest_covers_every_file_of_a_folder(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.parquet").write_bytes(b"one")
    first = source_digest(str(tmp_path / "ds"))
    (tmp_path / "ds" / "b.parquet").write_bytes(b"")  # a new empty shard is a change
    second = source_digest(str(tmp_path / "ds"))
    (tmp_path / "ds" / "a.parquet").write_bytes(b"two")  # same size, other bytes
    assert len({first, second, source_digest(str(tmp_path / "ds"))}) == 3
    assert source_digest(str(tmp_path / "missing")) is None
