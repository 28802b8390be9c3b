"""Bad input at the CLI: one line naming the problem, exit code 2, nothing written."""

from __future__ import annotations

import json

import pytest

from flows.cli import main


def _bad_dataset(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"prompt_id": 1, "prompt": "x"}) + "\n")
    return str(p)


CASES = {
    "unknown key": (["--set", "algorithm.colour=red"], "algorithm.colour"),
    "zero batch": (["--set", "algorithm.batch_size=0"], "algorithm.batch_size"),
    "negative batch": (["--set", "algorithm.batch_size=-8"], "algorithm.batch_size"),
    "group does not divide": (["--set", "algorithm.group_size=3"], "group_size"),
    "missing model path": (["--set", "model.path=/nonexistent/model"], "model.path"),
    "bad policy": (["--set", "scaling.policy=biggest"], "scaling.policy"),
    "missing config file": (["--config", "/nonexistent.yaml"], "/nonexistent.yaml"),
    "bad --set": (["--set", "steps"], "dotted.key=value"),
    "bad option": (["--stepz", "3"], "unrecognized"),
    "missing dataset": (["--set", "data.train_path=/nonexistent.jsonl"], "data.train_path"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_one_line_exit_2_nothing_written(case, tmp_path, capsys):
    args, needle = CASES[case]
    store = tmp_path / "store"
    code = main(["train", "--set", f"store.uri={store}", "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not store.exists() or not any(store.rglob("*"))


def test_unreadable_yaml_and_dataset_row_missing_field(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm: [unclosed\n")
    assert main(["train", "--config", str(cfg), "--set", f"store.uri={tmp_path / 's'}"]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    code = main(["train", "--set", f"data.train_path={_bad_dataset(tmp_path)}", "--set", f"store.uri={tmp_path / 's'}",
                 "--set", "invoker.kind=inprocess"])
    err = capsys.readouterr().err
    assert code == 2 and "answer" in err and "bad.jsonl:1" in err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").rglob("*"))


@pytest.mark.parametrize("env, needle", [
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "127.0.0.1:9"),
])
def test_unreachable_s3_endpoint_is_one_line_exit_2(env, needle, monkeypatch, capsys):
    for k, v in {**env, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "verysecretvalue123"}.items():
        monkeypatch.setenv(k, v)
    code = main(["train", "--set", "store.uri=s3://bucket/prefix", "--set", "invoker.kind=inprocess"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err, err
    assert "verysecretvalue123" not in err
